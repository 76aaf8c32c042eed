"""The conformance table: every request field of every surface (Chat, Responses, Messages, count_tokens,
Files, Batches) sent through the official openai and anthropic clients to one app, each either honoured
(its check on the reply, or on the server's log for an end user's id, holds) or refused (a 400 naming it): no
field accepted and ignored. The docs list exactly the table's fields: each surface's
page holds a ``Request fields:`` line that must name the same set (and the request models declare it).

The model is the scripted one (memagent_testing/oracle/scripted_lm.py behind the real hf engine): a tool call
when the prompt lists tools, else a fixed two-line text, so each check reads what the field must change.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient

from memagent.config import AgentConfig
from memagent.engines.config import EngineConfig
from memagent_testing.oracle.scripted_lm import MODEL, scripted_engine

ROOT = Path(__file__).resolve().parents[1]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TEXT = "Sunny in Paris today.\nMore later."
WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
HI = [{"role": "user", "content": "Weather?"}]
REFUSED = "refused"
MCP = {"type": "url", "url": "https://mcp.example.com/sse", "name": "example"}
LOG: list[str] = []  # the server's log lines (an end user's id is written there)


class _Lines(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        LOG.append(record.getMessage())


def logged(text: str) -> bool:
    return any(text in line for line in LOG)
AGENT = AgentConfig(chunk_tokens=64, memory_tokens=32, answer_tokens=16, query_tokens=64)  # fits the window


def oracle(prompt: str) -> str:
    return CALL if "<tools>" in prompt else TEXT


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    served = logging.getLogger("memagent.serve")
    lines, level = _Lines(), served.level
    served.addHandler(lines)
    served.setLevel(logging.INFO)
    from memagent.serve import create_app
    from pipelines.openai_batch import BatchRunConfig
    from pipelines.openai_batch_api import BatchService, batch_router

    engine = scripted_engine(oracle, EngineConfig(engine="hf", model=MODEL, device="cpu", speculate=False),
                             batch_wait_s=0.01)
    service = BatchService(str(tmp_path_factory.mktemp("batches")), BatchRunConfig(engine_model=MODEL), engine=engine)
    app = create_app(engine, close_engine=False, agent=AGENT, extra_routers=[batch_router(service)])
    try:
        with TestClient(app) as http:
            yield (openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0),
                   anthropic.Anthropic(base_url="http://testserver", api_key="none", http_client=http, max_retries=0))
    finally:
        served.removeHandler(lines)
        served.setLevel(level)


def _chat(oai, claude, **kw):
    kw.setdefault("messages", HI)
    return oai.chat.completions.create(**{"model": MODEL, **kw})


def _responses(oai, claude, **kw):
    kw.setdefault("input", "Weather?")
    return oai.responses.create(**{"model": MODEL, **kw})


def _messages(oai, claude, **kw):
    kw.setdefault("messages", HI)
    kw.setdefault("max_tokens", 32)
    return claude.messages.create(**{"model": MODEL, **kw})


def _count(oai, claude, **kw):
    kw.setdefault("messages", HI)
    return claude.messages.count_tokens(**{"model": MODEL, **kw})


def _files(oai, claude, **kw):
    kw.setdefault("file", ("r.jsonl", io.BytesIO(b"")))
    kw.setdefault("purpose", "batch")
    return oai.files.create(**kw)


def _batches(oai, claude, **kw):
    if "input_file_id" not in kw:
        kw["input_file_id"] = _files(oai, claude).id
    kw.setdefault("endpoint", "/v1/chat/completions")
    kw.setdefault("completion_window", "24h")
    return oai.batches.create(**kw)


def _stream_chat(oai, claude, **kw):
    return list(_chat(oai, claude, stream=True, **kw))


def _stream_messages(oai, claude, **kw):
    return list(_messages(oai, claude, stream=True, **kw))


def _stream_responses(oai, claude, **kw):
    return list(_responses(oai, claude, stream=True, **kw))


def _content(r) -> str:
    return r.choices[0].message.content or ""


TOOL = {"type": "function", "function": WEATHER}
RESPONSES_TOOL = {"type": "function", **WEATHER}
MESSAGES_TOOL = {"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "City", "schema": CITY}}
Check = Callable[[Any], bool]
# surface -> field -> (the call, its keyword arguments, a check of the reply that the field was honoured, or
# REFUSED: a 400 naming the field).
TABLE: dict[str, dict[str, tuple[Callable, dict, Check | str]]] = {  # str: REFUSED
    "chat": {
        "model": (_chat, {"model": "memagent", "messages": HI * 2, "max_tokens": 8},
                  lambda r: r.model == "memagent" and "memagent" in r.model_dump()),
        "messages": (_chat, {"messages": [{"role": "system", "content": "Be brief."}, *HI]},
                     lambda r: r.usage.prompt_tokens > 10),
        "max_tokens": (_chat, {"max_tokens": 2}, lambda r: r.choices[0].finish_reason == "length"
                       and r.usage.completion_tokens == 2),
        "max_completion_tokens": (_chat, {"max_completion_tokens": 2},
                                  lambda r: r.choices[0].finish_reason == "length"),
        "temperature": (_chat, {"temperature": 0}, lambda r: _content(r) == TEXT),
        "top_p": (_chat, {"top_p": 0.5, "temperature": 1}, lambda r: _content(r) == TEXT),
        "logprobs": (_chat, {"logprobs": True, "max_tokens": 3}, lambda r: len(r.choices[0].logprobs.content) == 3),
        "top_logprobs": (_chat, {"logprobs": True, "top_logprobs": 2}, REFUSED),
        "n": (_chat, {"n": 2}, REFUSED),
        "stream": (_stream_chat, {}, lambda chunks: "".join(c.choices[0].delta.content or "" for c in chunks
                                                            if c.choices) == TEXT),
        "stream_options": (_stream_chat, {"stream_options": {"include_usage": True}},
                           lambda chunks: chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0),
        "stop": (_chat, {"stop": ["\n"]}, lambda r: _content(r) == TEXT.split("\n")[0]),
        "seed": (_chat, {"seed": 5, "temperature": 1}, lambda r: _content(r) == TEXT),
        "response_format": (_chat, {"response_format": JSON_SCHEMA},
                            lambda r: set(json.loads(_content(r))) == {"city"}),
        "tools": (_chat, {"tools": [TOOL]},
                  lambda r: r.choices[0].message.tool_calls[0].function.name == "get_weather"),
        "tool_choice": (_chat, {"tools": [TOOL], "tool_choice": "none"}, lambda r: not r.choices[0].message.tool_calls),
        "parallel_tool_calls": (_chat, {"tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False},
                                lambda r: len(r.choices[0].message.tool_calls) == 1),
    },
    "responses": {
        "model": (_responses, {"model": "memagent", "input": HI * 2, "max_output_tokens": 8},
                  lambda r: r.model == "memagent"),
        "input": (_responses, {"input": HI}, lambda r: r.output_text == TEXT),
        "instructions": (_responses, {"instructions": "Be brief."}, lambda r: r.usage.input_tokens > 10),
        "tools": (_responses, {"tools": [RESPONSES_TOOL]}, lambda r: r.output[0].type == "function_call"),
        "tool_choice": (_responses, {"tools": [RESPONSES_TOOL], "tool_choice": "none"},
                        lambda r: r.output[0].type == "message"),
        "text": (_responses, {"text": {"format": {"type": "json_schema", "name": "City", "schema": CITY}}},
                 lambda r: set(json.loads(r.output_text)) == {"city"}),
        "max_output_tokens": (_responses, {"max_output_tokens": 2}, lambda r: r.status == "incomplete"),
        "temperature": (_responses, {"temperature": 0}, lambda r: r.output_text == TEXT),
        "top_p": (_responses, {"top_p": 0.5}, lambda r: r.output_text == TEXT),
        "parallel_tool_calls": (_responses, {"tools": [RESPONSES_TOOL], "tool_choice": "required",
                                             "parallel_tool_calls": False},
                                lambda r: [o.type for o in r.output] == ["function_call"]),
        "stream": (_stream_responses, {}, lambda events: events[-1].type == "response.completed"),
        "store": (_responses, {"store": True}, REFUSED),
        "previous_response_id": (_responses, {"previous_response_id": "resp_1"}, REFUSED),
        "conversation": (_responses, {"conversation": "conv_1"}, REFUSED),
        "metadata": (_responses, {"metadata": {"k": "v"}}, lambda r: r.metadata == {"k": "v"}),
        "reasoning": (_responses, {"model": "memagent", "input": HI * 2, "max_output_tokens": 8,
                                   "reasoning": {"summary": "auto"}},
                      lambda r: r.reasoning.summary == "auto" and r.output[0].type == "reasoning"
                      and r.output[0].summary),
        "user": (_responses, {"user": "u-responses"}, lambda r: logged("end user 'u-responses'")),
        "include": (_responses, {"include": ["reasoning.encrypted_content"]}, REFUSED),
        "truncation": (_responses, {"truncation": "auto"}, REFUSED),
    },
    "messages": {
        "model": (_messages, {"model": "memagent", "messages": [*HI, {"role": "assistant", "content": "ok"}, *HI]},
                  lambda r: r.model == "memagent"),
        "system": (_messages, {"system": "Be brief."}, lambda r: r.usage.input_tokens > 10),
        "messages": (_messages, {}, lambda r: r.content[0].text == TEXT),
        "tools": (_messages, {"tools": [MESSAGES_TOOL]}, lambda r: r.content[-1].type == "tool_use"),
        "tool_choice": (_messages, {"tools": [MESSAGES_TOOL], "tool_choice": {"type": "none"}},
                        lambda r: r.content[0].type == "text"),
        "max_tokens": (_messages, {"max_tokens": 2}, lambda r: r.stop_reason == "max_tokens"),
        "stop_sequences": (_messages, {"stop_sequences": ["\n"]}, lambda r: r.stop_reason == "stop_sequence"
                           and r.stop_sequence == "\n"),
        # This anthropic SDK's create() no longer takes these: sent as the API defines them, in the body.
        "temperature": (_messages, {"extra_body": {"temperature": 0}}, lambda r: r.content[0].text == TEXT),
        "top_p": (_messages, {"extra_body": {"top_p": 0.5}}, lambda r: r.content[0].text == TEXT),
        "stream": (_stream_messages, {}, lambda events: events[-1].type == "message_stop"),
        "output_config": (_messages, {"extra_body": {"output_config": {"format": {"type": "json_schema",
                                                                                    "schema": CITY}}}},
                          lambda r: set(json.loads(r.content[0].text)) == {"city"}),
        "top_k": (_messages, {"extra_body": {"top_k": 5}}, REFUSED),
        "metadata": (_messages, {"metadata": {"user_id": "u-messages"}}, lambda r: logged("end user 'u-messages'")),
        "thinking": (_messages, {"model": "memagent", "messages": [*HI, {"role": "assistant", "content": "ok"}, *HI],
                                 "thinking": {"type": "disabled"}}, lambda r: [b.type for b in r.content] == ["text"]),
        "service_tier": (_messages, {"service_tier": "standard_only"}, lambda r: r.usage.service_tier == "standard"),
        "container": (_messages, {"extra_body": {"container": "c1"}}, REFUSED),
        "mcp_servers": (_messages, {"extra_body": {"mcp_servers": [MCP]}}, REFUSED),
    },
    "count_tokens": {
        "model": (_count, {"model": "memagent"}, lambda r: r.input_tokens > 0),
        "system": (_count, {"system": "Be brief."}, lambda r: r.input_tokens > 10),
        "messages": (_count, {}, lambda r: r.input_tokens > 0),
        "tools": (_count, {"tools": [MESSAGES_TOOL]}, lambda r: r.input_tokens > 40),
        "tool_choice": (_count, {"tools": [MESSAGES_TOOL], "tool_choice": {"type": "auto"}},
                        lambda r: r.input_tokens > 40),
        "thinking": (_count, {"thinking": {"type": "enabled", "budget_tokens": 1024}}, REFUSED),
        "mcp_servers": (_count, {"extra_body": {"mcp_servers": [MCP]}}, REFUSED),
    },
    "files": {
        "file": (_files, {"file": ("named.jsonl", io.BytesIO(b"{}\n"))},
                 lambda f: f.filename == "named.jsonl" and f.bytes == 3),
        "purpose": (_files, {"purpose": "assistants"}, REFUSED),
    },
    "batches": {
        "input_file_id": (_batches, {"input_file_id": "file-nope"}, lambda exc: exc == 404),
        "endpoint": (_batches, {"endpoint": "/v1/embeddings"}, REFUSED),
        "completion_window": (_batches, {"completion_window": "1h"}, REFUSED),
        "metadata": (_batches, {"metadata": {"k": "v"}}, lambda b: b.metadata == {"k": "v"}),
    },
}
ROWS = [(surface, name) for surface, fields in TABLE.items() for name in fields]
DOCS = {"chat": "serve.md", "responses": "serve-responses.md", "messages": "serve-messages.md",
        "count_tokens": "serve-messages.md", "files": "serve-batches.md", "batches": "serve-batches.md"}


@pytest.mark.parametrize(("surface", "name"), ROWS, ids=[f"{s}.{n}" for s, n in ROWS])
def test_each_field_is_honoured_or_refused(clients, surface, name):
    """The field's check holds on the reply, or the request is a 400 naming the field."""
    call, kwargs, expect = TABLE[surface][name]
    if expect == REFUSED:
        with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as exc:
            call(*clients, **kwargs)
        body = exc.value.body
        error = body["error"] if isinstance(body.get("error"), dict) else body
        assert name in error["message"] or error.get("param") == name, error
        return
    try:
        reply = call(*clients, **kwargs)
    except openai.NotFoundError as exc:  # a field whose honouring is a 404 (an unknown file)
        reply = exc.status_code
    assert expect(reply), reply


def _documented(page: str, surface: str) -> set[str]:
    """The fields a docs page's ``Request fields (SURFACE):`` line names."""
    text = (ROOT / "docs" / page).read_text()
    line = re.search(rf"^Request fields \({re.escape(surface)}\): (.+)$", text, re.M)
    assert line, f"docs/{page} has no 'Request fields ({surface}):' line"
    return set(re.findall(r"`([a-z_]+)`", line.group(1)))


@pytest.mark.parametrize("surface", sorted(TABLE))
def test_the_docs_list_exactly_the_tables_fields(surface):
    """docs/serve*.md's 'Request fields' line of each surface names the table's fields, no more, no fewer."""
    assert _documented(DOCS[surface], surface) == set(TABLE[surface])


def test_the_request_models_declare_exactly_the_tables_fields():
    """Each surface's request model takes exactly the table's fields (any other is a 400 by extra=forbid)."""
    from memagent.serve.messages_request import CountTokensRequest, MessagesRequest
    from memagent.serve.protocol import ChatRequest
    from memagent.serve.responses_request import ResponsesRequest
    from pipelines.openai_batch_api import CREATE_FIELDS

    declared = {"chat": set(ChatRequest.model_fields), "responses": set(ResponsesRequest.model_fields),
                "messages": set(MessagesRequest.model_fields), "count_tokens": set(CountTokensRequest.model_fields),
                "files": {"file", "purpose"}, "batches": set(CREATE_FIELDS)}
    for surface, fields in TABLE.items():
        assert declared[surface] == set(fields), surface
