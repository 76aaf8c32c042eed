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
    assert message["reasoning_content"] == message["reasoning"]


def test_streamed_memory_updates_come_before_the_answer(url):
    """Streamed, each memory update is a reasoning delta (both names) and all come before any content."""
    body = ask(stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", url + CHAT, json=body, timeout=300) as r:
        got = events(r)
    deltas = [c["choices"][0]["delta"] for c in got[:-1] if c["choices"]]
    reasoning = [i for i, d in enumerate(deltas) if "reasoning_content" in d]
    content = [i for i, d in enumerate(deltas) if d.get("content")]
    assert all(deltas[i]["reasoning_content"] == deltas[i]["reasoning"] for i in reasoning)
    final = [c for c in got[:-1] if c["choices"] and c["choices"][0]["finish_reason"]][0]
    assert len(reasoning) == final["memagent"]["n_chunks"]
    assert content and max(reasoning) < min(content)  # an answer was streamed, after every memory update
    assert got[-2]["choices"] == [] and got[-2]["usage"]["prompt_tokens"] > 0


def test_response_format_runs_the_extraction_chain(url):
    """With a json_schema response_format the reply ends with "stop" and is a JSON object the schema accepts."""
    schema = {"type": "object", "properties": {"box": {"type": "integer", "description": "the box number"},
                                               "key": {"type": "string", "description": "its key"}},
              "required": ["box", "key"]}
    rf = {"type": "json_schema", "json_schema": {"name": "found", "schema": schema}}
    r = httpx.post(url + CHAT, json=ask(response_format=rf, max_tokens=60), timeout=300)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "stop"  # the grammar closes the object within max_tokens
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
    """No document, a question not last, or tools answer a 400 in OpenAI's shape naming the field."""
    only_question = {"model": "memagent", "messages": [{"role": "user", "content": "q?"}]}
    not_last = {"model": "memagent", "messages": [{"role": "user", "content": "q?"},
                                                  {"role": "assistant", "content": "a"}]}
    tools = ask(tools=[{"type": "function", "function": {"name": "f"}}])
    with httpx.Client(base_url=url, timeout=60) as c:
        for body, param in ((only_question, "messages"), (not_last, "messages"), (tools, "tools")):
            r = c.post(CHAT, json=body)
            assert r.status_code == 400 and error_of(r)["param"] == param, r.text


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
