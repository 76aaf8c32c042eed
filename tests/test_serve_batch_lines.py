"""A batch line is a chat request: the same body sent to ``POST /v1/chat/completions`` and as a line of a
``/v1/batches`` batch (both through the official openai client, against the real `memagent serve` app with
its Batch API) gets the same reply, or the same refusal, for the ``memagent`` model and the engine's model.

The model is the scripted one (memagent_testing/oracle/scripted_lm.py behind the real hf engine): every
reply is a function of the prompt (a tool call when the prompt lists tools, else text naming the prompt), so
two paths that built different prompts, decoded under other limits or dropped a field would disagree.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from memagent.engines.config import EngineConfig
from memagent_testing.oracle.scripted_lm import MODEL, scripted_engine
from pipelines.openai_batch import BatchRunConfig
from pipelines.openai_batch_api import BatchService, batch_router
from memagent.config import AgentConfig

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}
CITY = {"type": "json_schema", "json_schema": {"name": "City", "schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
LOOPS: set = set()  # the event loops the engine decoded on
AGENT = AgentConfig(chunk_tokens=64, memory_tokens=32, answer_tokens=16, query_tokens=64)  # room for a field
DOCUMENT = ("The weather service covers Paris, Lyon and Nice. " * 12).strip()


def oracle(prompt: str) -> str:
    """A tool call when the prompt lists tools; else a text that names the prompt (by its hash)."""
    if "<tools>" in prompt:
        return CALL
    if '"city"' in prompt:
        return '{"city": "Paris"}'
    return f"Paris is sunny. Note {hashlib.sha256(prompt.encode()).hexdigest()[:8]}.\nEND more text"


def conversation(model: str) -> list[dict[str, str]]:
    if model == "memagent":  # the document before the question, as the memagent model reads it
        return [{"role": "user", "content": DOCUMENT}, {"role": "user", "content": "What is the weather in Paris?"}]
    return [{"role": "user", "content": "What is the weather in Paris?"}]


# Each body's fields beside model and messages: every field the chat route honours, and a refusal.
BODIES: dict[str, dict[str, Any]] = {
    "tools": {"tools": [WEATHER], "tool_choice": "auto", "max_tokens": 60, "temperature": 0, "seed": 7},
    "schema": {"response_format": CITY, "max_tokens": 40, "temperature": 0, "seed": 3},
    "stop": {"stop": ["\nEND"], "max_tokens": 40, "temperature": 0},
    "cut": {"max_tokens": 3, "temperature": 0, "top_p": 0.5},
    "json_object": {"response_format": {"type": "json_object"}, "max_tokens": 20, "temperature": 0},
    "refused": {"response_format": CITY, "tools": [WEATHER], "temperature": 0},  # memagent: tools with a schema
    "too_many": {"max_tokens": 10**6},  # over the server's max_tokens: a 400 naming it
    "unknown": {"frequency_penalty": 0.5},  # a field this server does not take: a 400 naming it
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(an openai client of the app, the batch service behind its /v1/batches)."""
    from memagent.serve import ServeConfig, create_app

    engine = scripted_engine(oracle, EngineConfig(engine="hf", model=MODEL, device="cpu", speculate=False),
                             batch_wait_s=0.01)
    for name in ("chat", "chat_ids"):  # every decode notes the event loop it runs on
        def noting(*args, _decode=getattr(engine, name), **kwargs):
            LOOPS.add(asyncio.get_running_loop())
            return _decode(*args, **kwargs)
        setattr(engine, name, noting)
    cfg = BatchRunConfig(agent=AGENT, engine_model=MODEL, max_tokens=512)

    def no_second_engine(config):
        raise AssertionError("the batch built an engine of its own beside the server's")

    service = BatchService(str(tmp_path_factory.mktemp("batches")), cfg, engine=engine, build_engine=no_second_engine)
    app = create_app(engine, ServeConfig(max_tokens=512), close_engine=False, agent=AGENT,
                     extra_routers=[batch_router(service)], on_startup=[service.attach])  # as `memagent serve`
    with TestClient(app) as http:
        yield openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0), service


def comparable(body: dict[str, Any]) -> dict[str, Any]:
    """A chat.completion without what differs per call by design: its id, time, call ids, step timings and the
    prompt tokens the engine's prefix cache reused (what earlier calls left in it)."""
    body = {k: v for k, v in body.items() if k not in ("id", "created")}
    for choice in body["choices"]:
        for i, call in enumerate(choice["message"].get("tool_calls") or []):
            call["id"] = f"call-{i}"
    for step in (body.get("memagent") or {}).get("steps", []):
        step.pop("seconds", None)
        step.pop("cached_prompt_tokens", None)
    return body


def chat(client: openai.OpenAI, body: dict[str, Any]) -> tuple[str, Any]:
    """("ok", the reply) or ("error", (code, message)) of the body sent to the chat route."""
    try:
        return "ok", comparable(client.chat.completions.create(**body).model_dump(exclude_unset=True))
    except openai.APIStatusError as exc:
        return "error", (exc.body["code"] or exc.body["type"], exc.body["message"])


def batch(client: openai.OpenAI, service: BatchService, bodies: dict[str, dict]) -> dict[str, tuple[str, Any]]:
    """Each body's ("ok", reply) or ("error", (code, message)) as a line of one batch."""
    lines = [{"custom_id": cid, "method": "POST", "url": "/v1/chat/completions", "body": body}
             for cid, body in bodies.items()]
    f = client.files.create(file=("r.jsonl", io.BytesIO("".join(json.dumps(x) + "\n" for x in lines).encode())),
                            purpose="batch")
    created = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    service.run(created.id)  # what the service's runner thread does
    done = client.batches.retrieve(created.id)
    assert done.status == "completed", done
    out: dict[str, tuple[str, Any]] = {}
    for fid in (done.output_file_id, done.error_file_id):
        for raw in (client.files.content(fid).text.splitlines() if fid else []):
            x = json.loads(raw)
            out[x["custom_id"]] = ("ok", comparable(x["response"]["body"])) if x["error"] is None else (
                "error", (x["error"]["code"], x["error"]["message"]))
    return out


@pytest.mark.parametrize("model", ["memagent", MODEL])
def test_a_batch_line_gets_the_chat_routes_reply(served, model):
    """For every body (tools, json_schema, stop, a cut, json_object, greedy and seeded, and two refusals), the
    batch line's reply equals the chat route's, and a refusal is the same code and message (body.FIELD); the lines
    decode on the server's own engine and event loop, as its requests do (no second engine, no second copy)."""
    client, service = served
    bodies = {name: {"model": model, "messages": conversation(model), **fields} for name, fields in BODIES.items()}
    lines = batch(client, service, bodies)
    assert sorted(lines) == sorted(bodies)
    for name, body in bodies.items():
        kind, want = chat(client, body)
        got_kind, got = lines[name]
        assert got_kind == kind, (name, kind, want, got)
        if kind == "error":
            n = list(bodies).index(name) + 1  # the error line names its line, and the field as body.FIELD
            assert got[0] == want[0] and got[1] in (f"line {n}: body.{want[1]}", f"line {n}: {want[1]}"), (name, got)
        else:
            assert got == want, name
    assert lines["tools"][1]["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert lines["stop"][1]["choices"][0]["message"]["content"].endswith(".")  # ended before "\nEND"
    assert lines["cut"][1]["choices"][0]["finish_reason"] == "length"
    assert set(json.loads(lines["schema"][1]["choices"][0]["message"]["content"])) == {"city"}  # the schema's object
    assert len(LOOPS) == 1  # the lines ran on the server's loop and engine, as its requests did: one model copy
    if model == "memagent":
        assert lines["tools"][1]["memagent"]["n_chunks"] >= 2  # the document was read chunk by chunk
        assert lines["refused"][0] == "error" and "tools" in lines["refused"][1][1]
