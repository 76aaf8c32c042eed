"""The memory agent as a served model (``model: "memagent"``): an OpenAI client sends a document as
the conversation and a question as its last message, and gets the chain's answer, with usage
counting every token the chain read, the trace in the ``memagent`` extension field, memory
updates streamed as reasoning deltas before the answer, the extraction chain under
``response_format``, and concurrent requests sharing the engine. Before: ``model: memagent`` was a 404.

A real server on loopback over the tiny random Llama with small budgets (the wording is random;
the tests assert the protocol and the chain's accounting).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import pytest

from tests.test_serve_guard import running
from tests.test_serve_protocol import error_of, events

pytestmark = pytest.mark.slow  # real servers (tests/conftest.py's rule)

CHAT = "/v1/chat/completions"
DOC = " ".join(f"Line {i}: the key of box {i} is {i * 7 % 13}." for i in range(60))


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine

    return TransformersEngine.from_config(EngineConfig(model=str(tiny_llama_dir)), batch_wait_s=0.02, name="tiny-llama")


@pytest.fixture(scope="module")
def url(engine):
    from memagent.config import AgentConfig
    from memagent.serve import create_app

    agent = AgentConfig(chunk_tokens=200, memory_tokens=48, answer_tokens=12, query_tokens=64)
    with running(create_app(engine, close_engine=False, agent=agent)) as url:
        yield url


def ask(doc: str = DOC, question: str = "What is the key of box 5?", **kw) -> dict:
    return {"model": "memagent", "messages": [{"role": "system", "content": doc},
                                              {"role": "user", "content": question}], **kw}


def test_usage_counts_every_token_the_chain_read(url, engine):
    """usage equals the sum over the trace's steps, and the document's chunks are all in the trace."""
    from memagent.chunking import chunk_document

    r = httpx.post(url + CHAT, json=ask(), timeout=300)
    assert r.status_code == 200, r.text
    body = r.json()
    trace = body["memagent"]
    steps = trace["steps"]
    assert body["usage"]["prompt_tokens"] == sum(s["prompt_tokens"] for s in steps)
    assert body["usage"]["completion_tokens"] == sum(s["completion_tokens"] for s in steps)
    n = len(chunk_document(engine.tokenizer, DOC, 200, None).chunks)
    assert trace["n_chunks"] == n and [s["kind"] for s in steps] == ["memory"] * n + ["answer"]
    assert body["usage"]["prompt_tokens"] > trace["context_tokens"]  # every chunk was read
    message = body["choices"][0]["message"]
    assert isinstance(message["content"], str) and body["choices"][0]["finish_reason"] == steps[-1]["finish_reason"]
    assert message["reasoning_content"].startswith("[memory after chunk 1]\n") and "reasoning" not in message


def test_streamed_memory_updates_come_before_the_answer(url):
    """Streamed, each memory update is one reasoning delta (one field name), all before any content, and the
    streamed reasoning and answer are the whole reply's (greedy, the same request)."""
    body = ask(stream=True, stream_options={"include_usage": True}, temperature=0)
    with httpx.stream("POST", url + CHAT, json=body, timeout=300) as r:
        got = events(r)
    deltas = [c["choices"][0]["delta"] for c in got[:-1] if c["choices"]]
    reasoning = [i for i, d in enumerate(deltas) if "reasoning_content" in d]
    content = [i for i, d in enumerate(deltas) if d.get("content")]
    assert not any("reasoning" in d for d in deltas)
    final = [c for c in got[:-1] if c["choices"] and c["choices"][0]["finish_reason"]][0]
    assert len(reasoning) == final["memagent"]["n_chunks"]
    assert content and max(reasoning) < min(content)  # an answer was streamed, after every memory update
    assert got[-2]["choices"] == [] and got[-2]["usage"]["prompt_tokens"] > 0
    whole = httpx.post(url + CHAT, json=ask(temperature=0), timeout=300).json()["choices"][0]["message"]
    assert "".join(deltas[i]["reasoning_content"] for i in reasoning) == whole["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == whole["content"]


def test_the_answer_takes_what_the_engines_model_takes(url):
    """The final answer is the engine's model's with the client's fields: a named tool call under its schema,
    a stop string that ends the answer where it occurs, logprobs per answer token, and a seeded sampled
    request that repeats; usage still sums the whole chain."""
    params = {"type": "object", "properties": {"box": {"type": "integer"}}, "required": ["box"]}
    tools = [{"type": "function", "function": {"name": "open_box", "parameters": params}}]
    with httpx.Client(base_url=url, timeout=300) as c:
        called = c.post(CHAT, json=ask(tools=tools, tool_choice={"type": "function", "function": {"name": "open_box"}},
                                       max_tokens=24, temperature=0)).json()
        call = called["choices"][0]["message"]["tool_calls"][0]["function"]
        assert call["name"] == "open_box" and called["choices"][0]["finish_reason"] == "stop"
        jsonschema.validate(json.loads(call["arguments"]), params)
        steps = called["memagent"]["steps"]
        assert called["usage"]["completion_tokens"] == sum(s["completion_tokens"] for s in steps)
        assert steps[-1]["kind"] == "answer" and steps[-1]["finish_reason"] == "stop"

        plain = c.post(CHAT, json=ask(temperature=0, max_tokens=24, logprobs=True)).json()
        text = plain["choices"][0]["message"]["content"]
        lps = plain["choices"][0]["logprobs"]["content"]
        assert len(lps) == plain["memagent"]["steps"][-1]["completion_tokens"] and lps
        assert len(text) >= 6, repr(text)
        stop = text[3:6]  # ends the answer at its first occurrence, however early
        stopped = c.post(CHAT, json=ask(temperature=0, max_tokens=24, stop=[stop])).json()
        assert stopped["choices"][0]["message"]["content"] == text[:text.find(stop)]
        assert stopped["choices"][0]["finish_reason"] == "stop"
        decoded = [r["memagent"]["steps"][-1]["completion_tokens"] for r in (stopped, plain)]
        assert decoded[0] < decoded[1], decoded  # the decode ended at the stop string, not at max_tokens

        seeded = [c.post(CHAT, json=ask(temperature=1.0, seed=11, max_tokens=12)).json() for _ in range(2)]
        assert seeded[0]["choices"][0]["message"] == seeded[1]["choices"][0]["message"]


def test_response_format_runs_the_extraction_chain(url):
    """With a json_schema response_format whose object the schema bounds below max_tokens (at most 4 bytes a
    character, a token each), the reply ends with "stop" and is a JSON object the schema accepts, whatever the
    random model writes (its greedy text changes with the CPU's kernels)."""
    schema = {"type": "object",
              "properties": {"box": {"type": "integer", "minimum": 0, "maximum": 99, "description": "the box number"},
                             "key": {"type": "string", "maxLength": 8, "description": "its key"}},
              "required": ["box", "key"]}
    rf = {"type": "json_schema", "json_schema": {"name": "found", "schema": schema}}
    r = httpx.post(url + CHAT, json=ask(response_format=rf, max_tokens=60), timeout=300)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "stop"  # <= 46 tokens: the grammar closes it within 60
    jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), schema)
    assert body["memagent"]["steps"][-1]["kind"] == "answer"


def test_concurrent_requests_share_the_engine(url, engine):
    """Four concurrent memagent requests all answer, and some engine forward held more than one of their rows."""
    before = engine.stats.batch_sizes.copy()  # batch size -> forwards of that size

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=300) as c:
            return await asyncio.gather(*(c.post(CHAT, json=ask(question=f"Key of box {i}?")) for i in range(4)))

    replies = asyncio.run(run())
    assert all(r.status_code == 200 for r in replies)
    assert any(size > 1 for size in engine.stats.batch_sizes - before)  # some forward held two requests


def test_memagent_input_errors(url):
    """No document, a question not last, or a tool the engine's model refuses (a name outside OpenAI's
    pattern) answer a 400 in OpenAI's shape naming the field, before any reading."""
    only_question = {"model": "memagent", "messages": [{"role": "user", "content": "q?"}]}
    not_last = {"model": "memagent", "messages": [{"role": "user", "content": "q?"},
                                                  {"role": "assistant", "content": "a"}]}
    tools = ask(tools=[{"type": "function", "function": {"name": "open box!"}}])
    with httpx.Client(base_url=url, timeout=60) as c:
        for body, param in ((only_question, "messages"), (not_last, "messages"), (tools, "tools")):
            r = c.post(CHAT, json=body)
            assert r.status_code == 400 and error_of(r)["param"] == param, r.text


def test_one_message_holding_the_document_is_read_as_the_document(url):
    """A lone user message longer than query_tokens is read as document and question (split at its last blank
    line); one that cannot be split is a 400 saying where the document goes, never the context-length error."""
    body = {"model": "memagent", "max_tokens": 4,
            "messages": [{"role": "user", "content": f"{DOC}\n\nWhat is the key of box 5?"}]}
    with httpx.Client(base_url=url, timeout=120) as c:
        r = c.post(CHAT, json=body)
        assert r.status_code == 200, r.text
        assert r.json()["memagent"]["n_chunks"] > 1  # the document was read, chunk by chunk
        body["messages"][0]["content"] = DOC  # no blank line: no question to take
        r = c.post(CHAT, json=body)
    error = error_of(r)
    assert r.status_code == 400 and error["code"] == "question_too_long"
    assert "before the last user message" in error["message"]


def test_one_message_rule():
    """A question within query_tokens is kept; a longer lone message splits at its last blank line when the
    question after it fits; anything else is a 400."""
    from memagent.serve.memagent_model import one_message
    from memagent.serve.protocol import APIError

    words = lambda text: len(text.split())  # noqa: E731 - a token counter the test can reason about
    assert one_message("", "a b c", words, 3) == ("", "a b c")
    assert one_message("", "d o c u\n\nx\n\nq q", words, 3) == ("d o c u\n\nx", "q q")
    for document, question in (("", "a b c d"), ("doc", "a b c d"), ("", "a\n\nb c d e")):
        with pytest.raises(APIError, match="question_too_long|query_tokens=3"):
            one_message(document, question, words, 3)


def test_disconnect_stops_the_chain(url, engine):
    """A client that goes away after the first memory update leaves the chain's later calls unmade."""
    from memagent.chunking import chunk_document

    n = len(chunk_document(engine.tokenizer, DOC * 4, 200, None).chunks)
    before = engine.stats.requests
    with httpx.stream("POST", url + CHAT, json=ask(doc=DOC * 4, stream=True), timeout=300) as r:
        for line in r.iter_lines():
            if "reasoning_content" in line:
                break
    # The same read again, whole: an abandoned chain left running would batch along with it to its end.
    assert httpx.post(url + CHAT, json=ask(doc=DOC * 4), timeout=300).status_code == 200
    assert engine.stats.requests - before < (n + 1) * 3 / 2


def test_reasoning_field_option_names_the_one_field(engine):
    """``--reasoning-field reasoning`` sends the memory updates under ``reasoning`` only, whole and streamed."""
    from memagent.config import AgentConfig
    from memagent.serve import ServeConfig, create_app

    agent = AgentConfig(chunk_tokens=200, memory_tokens=16, answer_tokens=4, query_tokens=64)
    app = create_app(engine, ServeConfig(reasoning_field="reasoning"), close_engine=False, agent=agent)
    with running(app) as url:
        message = httpx.post(url + CHAT, json=ask(temperature=0), timeout=300).json()["choices"][0]["message"]
        with httpx.stream("POST", url + CHAT, json=ask(temperature=0, stream=True), timeout=300) as r:
            deltas = [c["choices"][0]["delta"] for c in events(r)[:-1] if c["choices"]]
    assert message["reasoning"].startswith("[memory after chunk 1]") and "reasoning_content" not in message
    assert "".join(d.get("reasoning", "") for d in deltas) == message["reasoning"]
    assert not any("reasoning_content" in d for d in deltas)


def test_instructor_default_mode_gets_a_validated_model_from_the_memory_agent(url):
    """instructor's default mode (TOOLS: a named function call) returns its validated model from ``memagent``
    on the first attempt; before, the memagent model refused tools with a 400."""
    import instructor
    from openai import OpenAI
    from pydantic import BaseModel

    class Box(BaseModel):
        box: int

    client = instructor.from_openai(OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300))
    got = client.chat.completions.create(model="memagent", response_model=Box, max_retries=0, max_tokens=48,
                                         temperature=0, messages=[{"role": "system", "content": DOC},
                                                                  {"role": "user", "content": "Which box has key 5?"}])
    assert isinstance(got, Box)
