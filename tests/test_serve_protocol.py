"""`memagent serve` speaks the rest of OpenAI's chat protocol: streaming (SSE chunks, usage,
response_format, a disconnect stopping the decode), ``stop`` and ``seed``, ``GET
/v1/models/{id}``, and OpenAI's error shape on every path (unknown endpoints, bodies that are not
UTF-8 or nest 100,000 deep, image parts, a ``$ref`` through an ``$id``). Each was a 400, a silent
drop or FastAPI's ``{"detail": ...}`` before.

Real servers on loopback over the tiny random Llama; nothing is mocked.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.serve_helpers import engine, url  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # real servers (tests/conftest.py's rule)

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Say hi."}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}},
          "required": ["name", "age"]}




def events(r: httpx.Response) -> list:
    """The SSE data lines of a streamed response, parsed ('[DONE]' kept as text)."""
    out = []
    for line in r.iter_lines():
        if line.startswith("data: "):
            data = line.removeprefix("data: ")
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _data(r: httpx.Response):
    """The parsed SSE data events of a streamed response, as they arrive."""
    for line in r.iter_lines():
        if line.startswith("data: {"):
            yield json.loads(line.removeprefix("data: "))


def error_of(r: httpx.Response) -> dict:
    assert r.headers["content-type"].startswith("application/json"), r.text[:200]
    return r.json()["error"]


def test_stream_matches_the_whole_reply(url):
    """A seeded streamed reply joins to the same text and usage as the same request unstreamed, in OpenAI's chunk order."""
    body = {"messages": HI, "max_tokens": 24, "seed": 7, "temperature": 1.0}
    with httpx.Client(base_url=url, timeout=60) as c:
        whole = c.post(CHAT, json=body).json()
        with c.stream("POST", CHAT, json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            got = events(r)
    assert got[-1] == "[DONE]" and got[0]["choices"][0]["delta"]["role"] == "assistant"
    chunks = got[:-1]
    assert all(ch["object"] == "chat.completion.chunk" and ch["id"] == chunks[0]["id"] for ch in chunks)
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])
    assert text == whole["choices"][0]["message"]["content"]
    finishes = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]]
    assert finishes[-1] == whole["choices"][0]["finish_reason"] and not any(finishes[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]


def test_stream_under_response_format_is_valid_json(url):
    """Streamed under a json_schema response_format, the joined content validates against the schema."""
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    with httpx.stream("POST", url + CHAT, json={"messages": HI, "max_tokens": 200, "stream": True,
                                                "response_format": rf}, timeout=60) as r:
        got = events(r)
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in got[:-1] if ch["choices"])
    jsonschema.validate(json.loads(text), PERSON)


def test_openai_sdk_stream_helper(url):
    """The openai SDK's stream() helper sees content deltas and the stream's end (the reply's whole text)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with client.chat.completions.stream(model="tiny-llama", messages=HI, max_tokens=8) as stream:
        kinds = [e.type for e in stream]
        snapshot = stream.current_completion_snapshot
    assert "content.delta" in kinds and kinds[-1] == "content.done"
    assert snapshot.choices[0].finish_reason in ("stop", "length") and snapshot.choices[0].message.content


def test_disconnect_stops_the_decode(url, engine):
    """Content streams while the row decodes, and a client that goes away then leaves the row far shorter than
    the same seeded reply read whole."""
    forced = {"type": "object", "properties": {"s": {"type": "string", "minLength": 6000, "maxLength": 6000}},
              "required": ["s"]}
    body = {"messages": HI, "max_tokens": 4000, "seed": 1, "temperature": 1.0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": forced}}}
    before = engine.stats.completion_tokens
    whole = httpx.post(url + CHAT, json=body, timeout=300).json()["usage"]["completion_tokens"]
    assert engine.stats.completion_tokens - before == whole
    before, requests = engine.stats.completion_tokens, engine.stats.requests
    with httpx.stream("POST", url + CHAT, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        first = next(e for e in _data(r) if e["choices"] and e["choices"][0]["delta"].get("content"))
        assert first["choices"][0]["delta"]["content"].startswith("{")
        assert engine.stats.requests == requests  # content streams while the row decodes (it is not done)
    # The engine decodes one batch at a time: this reply comes once the abandoned row has stopped.
    assert httpx.post(url + CHAT, json={"messages": HI, "max_tokens": 1}, timeout=300).status_code == 200
    assert engine.stats.completion_tokens - before - 1 < whole / 2


def test_stop_sequences_end_the_decode(url, engine):
    """A stop sequence taken from the free reply ends the decode there (far below max_tokens), the text just
    before it, finish_reason stop; streamed, the same text and usage arrive in pieces."""
    body = {"messages": HI, "max_tokens": 400, "seed": 3, "temperature": 1.0}
    with httpx.Client(base_url=url, timeout=120) as c:
        full = c.post(CHAT, json=body).json()
        text = full["choices"][0]["message"]["content"]
        assert full["usage"]["completion_tokens"] == 400 and len(text) > 40  # the random model runs to the limit
        stop = text[30:34]
        before = engine.stats.completion_tokens
        r = c.post(CHAT, json={**body, "stop": [stop, "\u0000never"]}).json()
        decoded = engine.stats.completion_tokens - before
        with c.stream("POST", CHAT, json={**body, "stop": [stop, "\u0000never"], "stream": True,
                                          "stream_options": {"include_usage": True}}) as s:
            chunks = [e for e in events(s) if e != "[DONE]"]
    assert r["choices"][0]["message"]["content"] == text[: text.index(stop)]
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens"] == decoded < 60  # the tokens decoded, the decode ended at the stop
    pieces = [e["choices"][0]["delta"].get("content") or "" for e in chunks if e["choices"]]
    assert "".join(pieces) == r["choices"][0]["message"]["content"] and sum(map(bool, pieces)) > 1
    assert [e["choices"][0]["finish_reason"] for e in chunks if e["choices"]][-1] == "stop"
    assert chunks[-1]["usage"] == r["usage"]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_seeded_requests_repeat(url, seed):
    """Two requests with the same seed at temperature 1 get the same reply."""
    body = {"messages": HI, "max_tokens": 16, "seed": seed, "temperature": 1.0}
    with httpx.Client(base_url=url, timeout=60) as c:
        a, b = (c.post(CHAT, json=body).json()["choices"][0]["message"]["content"] for _ in range(2))
    assert a == b


def test_models_by_id(url):
    """GET /v1/models/{id} answers each listed model's card and a 404 in OpenAI's shape for others."""
    with httpx.Client(base_url=url, timeout=30) as c:
        listed = [m["id"] for m in c.get("/v1/models").json()["data"]]
        assert "tiny-llama" in listed and "memagent" in listed
        for name in listed:
            assert c.get(f"/v1/models/{name}").json()["id"] == name
        r = c.get("/v1/models/gpt-9")
    assert r.status_code == 404 and error_of(r)["code"] == "model_not_found"


def test_every_error_is_openai_shaped(url):
    """Unknown endpoints, wrong methods, bad bodies and image parts answer {"error": {...}} naming the problem."""
    deep = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    image = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]}
    cases = [("POST", "/v1/completions", {"json": {"prompt": "x"}}, 404, "/v1/completions"),
             ("POST", "/v1/embeddings", {"json": {"input": "x"}}, 404, "/v1/embeddings"),
             ("POST", "/v1/audio/speech", {"json": {"input": "x"}}, 404, "/v1/audio/speech"),
             ("GET", CHAT, {}, 405, "GET"),
             ("POST", CHAT, {"content": b'{"messages": "\xff\xfe"}'}, 400, "UTF-8"),
             ("POST", CHAT, {"content": b'{"messages": ['}, 400, "not JSON"),
             ("POST", CHAT, {"content": deep}, 400, "nested"),
             ("POST", CHAT, {"json": image}, 400, "image_url")]
    with httpx.Client(base_url=url, timeout=60) as c:
        for method, path, kw, status, named in cases:
            r = c.request(method, path, **kw)
            assert r.status_code == status, (path, r.text[:200])
            assert named in error_of(r)["message"], (path, error_of(r))


def test_ref_through_an_absolute_id(url):
    """A $ref through an absolute $id is resolved (a valid reply) when finite, and a 400 naming the cycle when recursive."""
    finite = {"$id": "https://example.com/root", "type": "object", "required": ["who"],
              "properties": {"who": {"$ref": "https://example.com/person"}},
              "$defs": {"p": {"$id": "https://example.com/person", **PERSON}}}
    looped = {"$id": "https://example.com/root", "type": "object", "required": ["x"],
              "properties": {"x": {"$ref": "https://example.com/node"}},
              "$defs": {"n": {"$id": "https://example.com/node", "type": "object", "required": ["next"],
                              "properties": {"next": {"$ref": "https://example.com/node"}}}}}
    remote = {"type": "object", "properties": {"x": {"$ref": "https://example.com/elsewhere"}}}

    def ask(schema):
        rf = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
        return httpx.post(url + CHAT, json={"messages": HI, "max_tokens": 200, "response_format": rf}, timeout=60)

    r = ask(finite)
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), finite)
    r = ask(looped)
    assert r.status_code == 400 and "recursive $ref (#/$defs/n -> #/$defs/n)" in error_of(r)["message"]
    r = ask(remote)
    assert r.status_code == 400 and "https://example.com/elsewhere" in error_of(r)["message"]


@pytest.mark.parametrize("host,warned", [("127.0.0.1", False), ("::1", False), ("localhost", False),
                                         ("0.0.0.0", True), ("10.1.2.3", True)])
def test_exposed_host_without_a_key_warns(host, warned):
    """Listening beyond loopback without --auth-key-env produces a warning; loopback or a key does not."""
    from memagent.serve import ServeConfig

    assert (ServeConfig(host=host).exposure_warning() is not None) == warned
    assert ServeConfig(host=host, auth_key_env="K").exposure_warning() is None


NAMES = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)
LEAVES = st.sampled_from([{"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"enum": ["a", "b"]}])


@settings(max_examples=50, deadline=None)
@given(defs=st.dictionaries(NAMES, LEAVES, min_size=1, max_size=5), base=st.sampled_from(
    ["https://example.com/schemas/", "urn:example:", "https://h.org/a/b/"]))
def test_refs_through_ids_become_local_pointers(defs, base):
    """A schema whose $refs name definitions by their $id resolves to the same schema written with #/$defs pointers."""
    from memagent.engines.json_schema import resolve_refs

    by_id = {"$id": base + "root", "type": "object",
             "properties": {n: {"$ref": base + n} for n in defs},
             "$defs": {n: {"$id": base + n, **leaf} for n, leaf in defs.items()}}
    local = {"type": "object", "properties": {n: {"$ref": f"#/$defs/{n}"} for n in defs}, "$defs": defs}
    assert resolve_refs(by_id) == local
