"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``) as a
translation onto the one chat run.

A request becomes a :class:`~memagent.serve.protocol.ChatRequest` (``system`` and the messages'
text, ``tool_use`` and ``tool_result`` blocks become chat messages, ``tools``/``tool_choice`` the
chat's function tools, ``stop_sequences`` its ``stop``, ``output_config.format`` its ``response_format``) and runs through the served model's
``prepare``/``events`` as a chat completion does: the same decode, limits and error wording, every
error in Anthropic's shape (``{"type": "error", "error": {"type", "message"}}``). Server tools
(``web_search_…``, ``bash_…``, ``text_editor_…``: the client's own) are skipped, as on
``/v1/responses``. The memagent model's memory updates are a ``thinking`` block (unless ``thinking`` is
disabled); thinking asked of the engine's model, which does not think, is a 400.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import jiter
from fastapi import FastAPI, Request

from memagent.serve import tools as chat_tools
from memagent.serve.chat import EngineModel, ServedModel, first_line
from memagent.serve.events import ContentDelta, Done, Event, ReasoningDelta, Reply
from memagent.serve.guard import anthropic_body
from memagent.serve.handling import (
    Answer, handle, load_body, log_end_user, pieces, refuse_reasoning, unknown_model, validated,
)
from memagent.serve.messages_request import CountTokensRequest, Message, MessagesRequest
from memagent.serve.protocol import APIError, ChatRequest, JSONBytes

log = logging.getLogger(__name__)


def _text_of(content: Any, where: str) -> str:
    """The text of a string or of a list of text blocks; 400 for any other block."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{where}: expected a string or a list of text blocks", param="messages")
    texts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        if kind != "text" or not isinstance(block.get("text"), str):
            raise APIError(400, f"{where}.{j}: a block of type {kind!r}: this server's models read text only (no "
                           "images or documents); send text blocks", param="messages")
        texts.append(block["text"])
    return "".join(texts)


def _turn(m: Message, i: int) -> list[dict[str, Any]]:
    """The chat messages of one Messages turn: tool results as tool messages, tool uses as tool calls."""
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    out: list[dict[str, Any]] = []
    texts, calls = [], []
    for j, block in enumerate(m.content):
        where, kind = f"messages.{i}.content.{j}", block.get("type")
        if kind == "text":
            texts.append(_text_of([block], f"messages.{i}.content"))
        elif kind == "tool_use" and m.role == "assistant":
            calls.append({"id": str(block.get("id", "")), "type": "function", "function": {
                "name": str(block.get("name", "")), "arguments": json.dumps(block.get("input", {}))}})
        elif kind == "tool_result" and m.role == "user":
            result = _text_of(block.get("content", ""), f"{where}.content")
            out.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")),
                        "content": f"Error: {result}" if block.get("is_error") else result})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # earlier thinking sent back: the chat templates do not show it to the model
        else:
            raise APIError(400, f"{where}: a block of type {kind!r} in a {m.role} message is not served (text, "
                           "tool_use in assistant messages, tool_result in user messages, thinking)", param="messages")
    if m.role == "assistant":
        out.append({"role": "assistant", "content": "".join(texts) or (None if calls else ""), "tool_calls": calls or None})
    elif texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _tools(req: CountTokensRequest) -> tuple[list[dict[str, Any]] | None, Any]:
    """The chat's function tools (server tools skipped) and its ``tool_choice`` (``disable_parallel_tool_use`` is
    the chat's ``parallel_tool_calls: false``, set by :func:`to_chat`)."""
    tools = []
    for i, tool in enumerate(req.tools or []):
        if tool.get("type") not in (None, "custom"):
            continue  # a server tool (web_search_..., bash_..., text_editor_...): skipped
        if not isinstance(tool.get("name"), str):
            raise APIError(400, f"tools.{i}.name: a tool needs a name", param="tools")
        fn = {"name": tool["name"], "description": tool.get("description"), "parameters": tool.get("input_schema")}
        tools.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    choice = req.tool_choice or {"type": "auto"}
    kind = choice.get("type")
    unknown = sorted(set(choice) - {"type", "name", "disable_parallel_tool_use"})
    if unknown:
        raise APIError(400, f"tool_choice.{unknown[0]}: Extra inputs are not permitted", param="tool_choice")
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise APIError(400, 'tool_choice: {"type": "tool"} needs the tool\'s name', param="tool_choice")
        return tools or None, {"type": "function", "function": {"name": choice["name"]}}
    mapped = {"auto": "auto", "any": "required", "none": "none"}.get(kind)
    if mapped is None:
        raise APIError(400, f"tool_choice.type: expected auto, any, tool or none, got {kind!r}", param="tool_choice")
    return tools or None, (None if not tools and mapped != "required" else mapped)


def to_chat(req: CountTokensRequest) -> ChatRequest:
    """The chat request that answers ``req`` (a :class:`MessagesRequest`, or a count's fields)."""
    system = req.system if isinstance(req.system, str) or req.system is None else _text_of(req.system, "system")
    messages = [{"role": "system", "content": system}] if system else []
    for i, m in enumerate(req.messages):
        messages += _turn(m, i)
    tools, choice = _tools(req)
    body: dict[str, Any] = {"model": req.model, "messages": messages, "tools": tools, "tool_choice": choice}
    if tools and (req.tool_choice or {}).get("disable_parallel_tool_use") is True:
        body["parallel_tool_calls"] = False  # at most one tool_use
    if isinstance(req, MessagesRequest):
        body |= {"max_tokens": req.max_tokens, "stop": req.stop_sequences, "stream": req.stream}
        body |= {k: v for k, v in (("temperature", req.temperature), ("top_p", req.top_p)) if v is not None}
        if req.top_k is not None:  # sampling is temperature and top_p's; top_k 1 is greedy, which they say too
            if req.top_k != 1:
                raise APIError(400, f"top_k: {req.top_k} is not served: this server samples with temperature and "
                                    "top_p (top_k 1, greedy, is)", param="top_k")
            body["temperature"] = 0.0
        fmt = req.output_config.format if req.output_config else None
        if fmt is not None:  # the reply's text block is JSON under the schema's grammar
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt.schema_}}
    return validated(ChatRequest, body)


def _stop_reason(reply: Reply) -> str:
    if reply.finish_reason == "length":  # a tool call cut by max_tokens too: its tool_use holds what was decoded
        return "max_tokens"
    if reply.tool_calls:
        return "tool_use"
    return "stop_sequence" if reply.stop_sequence is not None else "end_turn"


def _usage(reply: Reply) -> dict[str, Any]:
    return {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "service_tier": "standard"}


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object ``tool_use.input`` must be: parsed, or, for arguments cut by
    max_tokens or malformed, as far as they parse (``{"city": "Par`` -> ``{"city": "Par"}``; none: ``{}``)."""
    try:
        value = jiter.from_json(arguments.encode(), partial_mode="trailing-strings")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
            "input": tool_input(call["function"]["arguments"])}


def message_body(model: str, reasoning: list[str], reply: Reply) -> dict[str, Any]:
    """A whole ``message`` answering ``reply`` (its memory updates a thinking block first)."""
    content: list[dict[str, Any]] = []
    if reasoning:
        content.append({"type": "thinking", "thinking": "".join(reasoning), "signature": ""})
    if reply.tool_calls:
        content += [_tool_use(c) for c in reply.tool_calls]
    else:
        content.append({"type": "text", "text": reply.content or ""})
    return {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": _stop_reason(reply), "stop_sequence": reply.stop_sequence,
            "usage": _usage(reply), **reply.extra}


def _sse(kind: str, **data: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()


class _Blocks:
    """The content blocks a stream has opened: their count, the one open now and its text so far."""

    def __init__(self) -> None:
        self.count, self.open, self.text = 0, None, ""

    def start(self, block: dict[str, Any]) -> list[bytes]:
        out = self.stop()
        self.open, self.text = block["type"], ""
        self.count += 1
        return out + [_sse("content_block_start", index=self.count - 1, content_block=block)]

    def delta(self, delta: dict[str, Any]) -> bytes:
        return _sse("content_block_delta", index=self.count - 1, delta=delta)

    def stop(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [_sse("content_block_stop", index=self.count - 1)]


async def stream_message(model: str, events: AsyncIterator[Event], thinking: bool = True) -> AsyncIterator[bytes]:
    """Anthropic's event stream of one run (its memory updates a thinking block unless not ``thinking``); an
    error once begun is an ``error`` event."""
    start = {"id": f"msg_{uuid.uuid4().hex}", "type": "message", "role": "assistant", "model": model, "content": [],
             "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
    yield _sse("message_start", message=start)
    yield _sse("ping")
    blocks = _Blocks()
    try:
        async for event in events:
            if isinstance(event, ReasoningDelta):
                if not thinking:
                    continue
                if blocks.open != "thinking":
                    for chunk in blocks.start({"type": "thinking", "thinking": "", "signature": ""}):
                        yield chunk
                yield blocks.delta({"type": "thinking_delta", "thinking": event.text})
            elif isinstance(event, ContentDelta):
                for chunk in _text(blocks, event.text):
                    yield chunk
            elif isinstance(event, Done):
                value = event.reply
                for chunk in _finish(blocks, value):
                    yield chunk
                stop = {"stop_reason": _stop_reason(value), "stop_sequence": value.stop_sequence}
                yield _sse("message_delta", delta=stop, usage=_usage(value))
                yield _sse("message_stop")
    except APIError as exc:
        yield f"event: error\ndata: {anthropic_body(exc).decode()}\n\n".encode()
    except Exception:
        log.exception("streamed message failed")
        failed = APIError(500, "the engine failed; details are in the server log", type="server_error")
        yield f"event: error\ndata: {anthropic_body(failed).decode()}\n\n".encode()


def _text(blocks: _Blocks, text: str) -> list[bytes]:
    out = blocks.start({"type": "text", "text": ""}) if blocks.open != "text" else []
    if text:
        blocks.text += text
        out.append(blocks.delta({"type": "text_delta", "text": text}))
    return out


def _finish(blocks: _Blocks, reply: Reply) -> list[bytes]:
    """The blocks the reply adds to what streamed: the rest of its text, or its tool uses."""
    out: list[bytes] = []
    if reply.tool_calls:
        for call in reply.tool_calls:
            block = _tool_use(call)
            out += blocks.start({**block, "input": {}})
            out += [blocks.delta({"type": "input_json_delta", "partial_json": p})
                    for p in pieces(json.dumps(block["input"]))]
        return out + blocks.stop()
    content = reply.content or ""
    streamed = blocks.text if blocks.open == "text" else ""
    rest = content[len(streamed):] if content.startswith(streamed) else content
    out += _text(blocks, "")
    for piece in pieces(rest):
        out += _text(blocks, piece)
    return out + blocks.stop()


def _anthropic_errors(handler: Any) -> Any:
    """``handler`` answering its errors in Anthropic's shape (the app's handlers answer OpenAI's)."""

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Any:
        try:
            return await handler(request)
        except APIError as exc:
            return JSONBytes(anthropic_body(exc), status_code=exc.status)
        except Exception as exc:
            log.error("request failed: %s", type(exc).__name__, exc_info=exc)
            failed = APIError(500, "the engine failed; details are in the server log", type="server_error")
            return JSONBytes(anthropic_body(failed), status_code=500)

    return wrapped


class MessageWriter:
    """The Messages surface's writer (:class:`~memagent.serve.handling.Writer`): a ``message``, or
    Anthropic's event stream."""

    tool_deltas = False  # a tool_use block is written once the reply ends

    def __init__(self, req: CountTokensRequest):
        self.thinking = req.thinking is None or req.thinking.shown  # the memagent model thinks unless disabled
        custom = [i for i, t in enumerate(req.tools or []) if t.get("type") in (None, "custom")]  # as _tools keeps
        self.fields = {"stop": "stop_sequences", "response_format.json_schema.schema": "output_config.format.schema",
                       "response_format": "output_config.format"}
        self.fields |= {f"tools.{k}.function.parameters": f"tools.{i}.input_schema" for k, i in enumerate(custom)}

    def whole(self, model: str, answer: Answer) -> dict[str, Any]:
        return message_body(model, answer.reasoning if self.thinking else [], answer.reply)

    def stream(self, model: str, events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
        return stream_message(model, events, self.thinking)


def check_thinking(req: CountTokensRequest, models: dict[str, ServedModel], default_model: str) -> None:
    """A 400 for thinking asked of a model that does not think (as Anthropic answers for such models), or with a
    budget not under ``max_tokens`` (as Anthropic checks it)."""
    if req.thinking is None or not req.thinking.shown:
        return
    budget = req.thinking.budget_tokens
    if isinstance(req, MessagesRequest) and budget is not None and budget >= req.max_tokens:
        raise APIError(400, f"thinking.budget_tokens: {budget} must be less than max_tokens ({req.max_tokens})",
                       param="thinking")
    refuse_reasoning(models, req.model or default_model, "thinking")


def add_routes(app: FastAPI, default_model: str, models: dict[str, ServedModel]) -> None:
    """``POST /v1/messages`` and ``/v1/messages/count_tokens`` on ``app``, answered by ``models``."""

    @app.post("/v1/messages")
    @_anthropic_errors
    async def create_message(request: Request) -> Any:
        req = validated(MessagesRequest, load_body(await request.body()))
        check_thinking(req, models, default_model)
        log_end_user("messages", req.model or default_model, req.metadata.user_id if req.metadata else None)
        return await handle(request, lambda: to_chat(req), models, default_model, MessageWriter(req))

    @app.post("/v1/messages/count_tokens")
    @_anthropic_errors
    async def count_tokens(request: Request) -> Any:
        """The prompt's tokens as the engine's chat template renders it (tools included)."""
        req = validated(CountTokensRequest, load_body(await request.body()))
        check_thinking(req, models, default_model)
        chat = to_chat(req)
        if (chat.model or default_model) not in models:
            raise unknown_model(chat.model or default_model, models)
        rendered = chat_tools.render_messages(chat.messages, chat_tools.plan(chat))
        engine_model = models[default_model]
        assert isinstance(engine_model, EngineModel)  # the default model is the engine's own
        try:
            return {"input_tokens": await engine_model.count(rendered)}
        except Exception as exc:  # a template that refuses a role or an order of messages
            raise APIError(400, f"messages: the chat template refused them: {first_line(str(exc))}",
                           param="messages") from None
