"""`memagent serve` against hostile clients, each case as it was found: a lone surrogate in a
message (was a plain-text 500), a recursive ``$ref`` in ``response_format`` (a 500 echoing the
grammar parser's state), a key sent as ``?api_key=`` (refused, but written to the access log),
an over-long prompt (a 400 reporting a negative completion token count). And OpenAI's JSON mode
(``response_format: {"type": "json_object"}``) through the real ``openai`` client.

Real servers on loopback over the tiny random Llama; the engine runs for real.
"""

from __future__ import annotations

import json
import logging
import re
import time

import httpx
import pytest

from tests.test_serve_guard import KEY, bound_socket, error_of, running, served_process  # noqa: F401 (fixture)
from tests.serve_helpers import engine, url  # noqa: F401 (fixtures)

CHAT = "/v1/chat/completions"
JSON = {"content-type": "application/json"}
# The reported schema: an object that requires itself. llguidance compiled it, then failed on the
# first token with "parser error: Too many items ... <state>...</state><grammar>...".
RECURSIVE = {"$defs": {"a": {"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}}, "required": ["x"]}},
             "$ref": "#/$defs/a"}


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}




@pytest.mark.slow
def test_lone_surrogate_is_a_json_400(url):
    # JSON may spell a lone surrogate as an escape; raw surrogate bytes decode to the same.
    bodies = {"messages.0.content": b'{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 2}',
              "raw bytes": b'{"messages": [{"role": "user", "content": "a\xed\xa0\x80b"}], "max_tokens": 2}',
              "model": b'{"model": "\\udfff", "messages": [{"role": "user", "content": "a"}], "max_tokens": 2}',
              "list part": b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
              "schema key": b'{"messages": [{"role": "user", "content": "a"}], "response_format": {"type": '
                            b'"json_schema", "json_schema": {"name": "r", "schema": {"type": "object", "properties": '
                            b'{"\\ud800": {"type": "string"}}}}}}'}
    with httpx.Client(base_url=url, timeout=60) as c:
        for name, body in bodies.items():
            r = c.post(CHAT, content=body, headers=JSON)
            assert r.status_code == 400, (name, r.status_code, r.text[:300])
            err = error_of(r)
            assert err["code"] == "invalid_unicode" and "lone surrogate" in err["message"], (name, err)
            assert err["type"] == "invalid_request_error"
        assert "messages.0.content: not valid Unicode text" in error_of(c.post(CHAT, content=bodies[
            "messages.0.content"], headers=JSON))["message"]
        ok = c.post(CHAT, json={"messages": [{"role": "user", "content": "caf\u00e9 \U0001f600"}], "max_tokens": 2})
        assert ok.status_code == 200, ok.text  # a real non-ASCII text (a surrogate *pair* in JSON) still works


@pytest.mark.slow
def test_recursive_ref_is_a_400_naming_the_cycle(url):
    cases = {
        "#/$defs/a -> #/$defs/a": RECURSIVE,
        "#/$defs/a -> #/$defs/b -> #/$defs/a": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                                "type": "object", "properties": {"q": {"$ref": "#/$defs/a"}}},
        "# -> #": {"type": "object", "properties": {"x": {"$ref": "#"}}},
        "#/$defs/a~1b -> #/$defs/a~1b": {"$defs": {"a/b": {"type": "array", "items": {"$ref": "#/$defs/a~1b"}}},
                                        "$ref": "#/$defs/a~1b"},
    }
    with httpx.Client(base_url=url, timeout=60) as c:
        for cycle, schema in cases.items():
            r = c.post(CHAT, json={"messages": [{"role": "user", "content": "a"}], "max_tokens": 4,
                                   "response_format": schema_format(schema)})
            assert r.status_code == 400, (cycle, r.status_code, r.text[:500])
            err = error_of(r)
            assert err["param"] == "response_format" and err["code"] == "invalid_schema", err
            assert f"recursive $ref ({cycle})" in err["message"], err["message"]
            assert "<state>" not in r.text and "<grammar>" not in r.text
        deep: dict = {"type": "string"}
        for _ in range(200):
            deep = {"type": "array", "items": deep}
        r = c.post(CHAT, json={"messages": [{"role": "user", "content": "a"}], "response_format": schema_format(deep)})
        assert r.status_code == 400 and "nested deeper than 64 levels" in error_of(r)["message"]
        # A $ref that is shared, not recursive, is fine and constrains the reply.
        shared = {"$defs": {"yn": {"type": "string", "enum": ["yes", "no"]}}, "type": "object",
                  "properties": {"x": {"$ref": "#/$defs/yn"}, "y": {"$ref": "#/$defs/yn"}}, "required": ["x", "y"]}
        ok = c.post(CHAT, json={"messages": [{"role": "user", "content": "a"}], "max_tokens": 40, "temperature": 0,
                                "response_format": schema_format(shared)})
        assert ok.status_code == 200, ok.text
        assert set(json.loads(ok.json()["choices"][0]["message"]["content"])) == {"x", "y"}


@pytest.mark.slow
def test_engine_failure_is_a_json_500_without_internals(engine, caplog):
    """Whatever the engine raises, the client gets OpenAI's error shape and none of its text."""
    from memagent.serve import create_app

    async def broken(prompt, params, **kw):
        raise RuntimeError("parser error: Too many items <state>rows: 37502</state><grammar>{secret}</grammar>")

    app = create_app(engine, close_engine=False)
    entry = "chat_ids" if engine.takes_prompt_ids else "chat"  # the entry the server calls (tokenised once)
    original = getattr(engine, entry)
    setattr(engine, entry, broken)
    try:
        with running(app) as url:
            r = httpx.post(url + CHAT, json={"messages": [{"role": "user", "content": "a"}], "max_tokens": 2}, timeout=60)
    finally:
        setattr(engine, entry, original)
    assert r.status_code == 500 and error_of(r)["type"] == "server_error"
    assert "<state>" not in r.text and "37502" not in r.text and "server log" in error_of(r)["message"]


@pytest.mark.slow
def test_over_long_prompt_reports_true_token_counts(url, engine):
    long = "word " * 5000  # over the tiny model's 4096-token window
    with httpx.Client(base_url=url, timeout=120) as c:
        r = c.post(CHAT, json={"messages": [{"role": "user", "content": long}]})  # no max_tokens
        assert r.status_code == 400 and error_of(r)["code"] == "context_length_exceeded"
        message = error_of(r)["message"]
        assert not re.search(r"-\d", message), message  # was "(5031 in the messages, -935 in the completion)"
        prompt = engine.count_chat_tokens([{"role": "user", "content": long}])
        assert f"your messages resulted in {prompt} tokens" in message and "maximum context length is 4096" in message
        r = c.post(CHAT, json={"messages": [{"role": "user", "content": long}], "max_tokens": 7})
        message = error_of(r)["message"]
        assert f"you requested {prompt + 7} tokens ({prompt} in the messages, 7 in the completion)" in message
        fits = c.post(CHAT, json={"messages": [{"role": "user", "content": "word " * 100}], "max_tokens": 1})
        assert fits.status_code == 200


def test_access_log_redactor_masks_query_values_and_the_key():
    from memagent.serve import AccessLogRedactor

    f = AccessLogRedactor("sk-secret/+key")
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                               ("127.0.0.1:5", "GET", "/v1/models?api_key=sk-other&x=1&flag", "1.1", 401), None)
    assert f.filter(record) and record.getMessage() == '127.0.0.1:5 - "GET /v1/models?api_key=***&x=***&*** HTTP/1.1" 401'
    for path in ("/v1/sk-secret/+key/models", "/v1/sk-secret%2F%2Bkey", "/v1/sk-secret/%2Bkey"):
        record.args = ("c", "GET", path, "1.1", 404)
        f.filter(record)
        assert "sk-secret" not in record.getMessage() and "***" in record.getMessage(), record.getMessage()


@pytest.mark.slow
def test_key_in_the_query_string_is_never_logged(served_process):  # noqa: F811 (the fixture)
    """The reported case, through the real command: --log-level debug, the key in ?api_key=, in
    the path, percent-encoded. Each is refused (401) and the log holds the request lines, masked."""
    url, proc, log = served_process
    with httpx.Client(base_url=url, timeout=60) as c:
        for path in (f"/v1/models?api_key={KEY}", f"{CHAT}?key={KEY}&x=1", f"/v1/{KEY}", f"/v1/models?k={KEY[:10]}%2D{KEY[11:]}"):
            r = c.get(path) if "chat" not in path else c.post(path, json={"messages": [{"role": "user", "content": "a"}]})
            assert r.status_code == 401, (path, r.status_code)
        assert c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    time.sleep(0.5)
    proc.terminate()
    proc.wait(timeout=30)
    text = log.read_text(errors="replace")
    assert "GET /v1/models?api_key=*** HTTP/1.1" in text, text[-2000:]  # the line is written, masked
    assert f"POST {CHAT}?key=***&x=*** HTTP/1.1" in text and "GET /v1/*** HTTP/1.1" in text
    assert KEY not in text and KEY[11:] not in text


@pytest.mark.slow
def test_json_mode_through_the_openai_client(engine, monkeypatch):
    """LangExtract's OpenAI provider sends response_format json_object by default (it was a 400)."""
    import openai

    from memagent.serve import ServeConfig, create_app

    monkeypatch.setenv("MEMAGENT_TEST_JSON_KEY", KEY)
    app = create_app(engine, ServeConfig(auth_key_env="MEMAGENT_TEST_JSON_KEY"), close_engine=False)
    with running(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        replies = []
        for seed_text in ("Reply in JSON.", "Give a JSON object with a name.", "JSON please: {"):
            r = client.chat.completions.create(  # greedy: the random model's choices are reproducible
                model="tiny-llama", messages=[{"role": "user", "content": seed_text}],
                response_format={"type": "json_object"}, max_tokens=160, temperature=0)
            replies.append((r.choices[0].finish_reason, r.choices[0].message.content, r.usage.completion_tokens))
        for finish, content, n in replies:
            if finish == "stop":  # a finished reply is one JSON object, whatever the random model chose
                assert isinstance(json.loads(content), dict), content
            else:
                assert finish == "length" and n == 160 and content.lstrip().startswith("{"), (finish, content[:200])
        assert sum(f == "stop" for f, _, _ in replies) >= 2, replies  # JSON objects, finished
        plain = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=5, temperature=0)
        assert plain.choices[0].message.content is not None  # text mode unchanged
        with pytest.raises(openai.BadRequestError, match="response_format"):
            client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}],
                                           response_format={"type": "json_whatever"}, max_tokens=5)
