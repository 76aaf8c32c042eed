"""OpenAI's Responses API (``POST /v1/responses``) as a translation onto the one chat run.

A request becomes a :class:`~memagent.serve.protocol.ChatRequest` (``instructions`` and the
``input`` items become messages, function tools and ``tool_choice`` become the chat's, ``text.format``
its ``response_format``, ``max_output_tokens`` its ``max_tokens``) and runs through the served
model's ``prepare``/``events`` as a chat completion does: the same decode, limits and error wording.
The events are then written as a ``response`` object, or streamed as Responses events.

Stateless: nothing is stored (``store: true`` is a 400), so ``previous_response_id`` and
``conversation`` are a 400. As llama.cpp's server does, tool types other than ``function`` (web
search, file search, computer use: the client's hosted tools) are skipped, and an empty ``input``
(a client's probe) is answered as an empty user turn. The memagent model's memory updates are one
``reasoning`` item, one summary part per update (sent once: its ``content`` is empty).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request

from memagent.serve.chat import ServedModel
from memagent.serve.events import ContentDelta, Done, Event, ReasoningDelta, Reply
from memagent.serve.handling import Answer, handle, load_body, log_end_user, pieces, refuse_reasoning, validated
from memagent.serve.protocol import APIError, ChatRequest
from memagent.serve.responses_request import ResponsesRequest

log = logging.getLogger(__name__)

# What chat fields are called here (errors about them name the client's own field).
FIELDS = {"response_format.json_schema.schema": "text.format.schema", "response_format": "text.format",
          "max_tokens": "max_output_tokens"}
TEXT_PARTS = ("input_text", "output_text", "text")


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _part_text(part: Any, where: str) -> str:
    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
    if kind in TEXT_PARTS and isinstance(part.get("text"), str):
        return part["text"]
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return part["refusal"]
    raise APIError(400, f"{where}: a part of type {kind!r}: this server's models read text only (no images, audio "
                   f"or files); send parts of type {', '.join(TEXT_PARTS)}", param="input")


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_part_text(p, f"{where}.{j}") for j, p in enumerate(content))
    raise APIError(400, f"{where}: expected a string or a list of text parts", param="input")


def _field(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise APIError(400, f"{where}.{name}: expected a string, got {type(value).__name__}", param="input")
    return value


def _item_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of ``input`` items; a function call joins the assistant message before it."""
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise APIError(400, f"{where}.role: expected user, system, developer or assistant, got {role!r}",
                               param="input")
            out.append({"role": role, "content": _content_text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {"id": _field(item, "call_id", where), "type": "function",
                    "function": {"name": _field(item, "name", where), "arguments": _field(item, "arguments", where)}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": _field(item, "call_id", where),
                        "content": _content_text(output, f"{where}.output")})
        elif kind == "reasoning":
            continue  # earlier reasoning sent back: the chat templates do not show it to the model
        else:
            raise APIError(400, f"{where}: items of type {kind!r} are not supported (this server is stateless and "
                           "serves message, function_call, function_call_output and reasoning items)", param="input")
    return out


def _tools(req: ResponsesRequest) -> tuple[list[dict[str, Any]] | None, Any]:
    """The chat's function tools (other tool types skipped) and its ``tool_choice``."""
    tools = []
    for i, tool in enumerate(req.tools or []):
        if tool.get("type") != "function":
            continue  # a hosted tool (web_search, file_search, ...): skipped, as llama.cpp's server does
        if not isinstance(tool.get("name"), str):
            raise APIError(400, f"tools.{i}.name: a function tool needs a name", param="tools")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        tools.append({"type": "function", "function": fn})
    choice = req.tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise APIError(400, f"tool_choice: {json.dumps(choice)[:200]} is not served: send none, auto, required "
                           'or {"type": "function", "name": NAME}', param="tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return tools or None, (None if choice == "auto" and not tools else choice)


def to_chat(req: ResponsesRequest) -> ChatRequest:
    """The chat request that answers ``req``; 400 for what a stateless server cannot serve."""
    for name in ("previous_response_id", "conversation"):
        if getattr(req, name):
            raise APIError(400, f"{name}: this server stores no responses or conversations (it is stateless): send "
                           "the whole conversation in `input`", param=name, code="stateless_server")
    messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        messages += _item_messages(req.input)
    if not any(m["role"] != "system" for m in messages):
        messages.append({"role": "user", "content": ""})  # a probe: an empty turn, answered as one
    tools, choice = _tools(req)
    body: dict[str, Any] = {"model": req.model, "messages": messages, "max_tokens": req.max_output_tokens,
                            "stream": req.stream, "tools": tools, "tool_choice": choice,
                            "parallel_tool_calls": req.parallel_tool_calls}
    body |= {k: v for k, v in (("temperature", req.temperature), ("top_p", req.top_p)) if v is not None}
    fmt = req.text.format if req.text else None
    if fmt is not None and fmt.type == "json_schema":
        if fmt.schema_ is None:
            raise APIError(400, "text.format: a json_schema format needs `schema`", param="text")
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_,
                                                                          "strict": fmt.strict}}
    elif fmt is not None:
        body["response_format"] = {"type": fmt.type}
    return validated(ChatRequest, body)


def _usage(reply: Reply) -> dict[str, Any]:
    steps = reply.extra.get("memagent", {}).get("steps", [])
    reasoning = sum(s["completion_tokens"] for s in steps if s.get("kind") == "memory")
    return {"input_tokens": reply.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": reply.completion_tokens, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens}


class ResponseWriter:
    """One response's id, items and events (a :class:`~memagent.serve.handling.Writer`): :meth:`whole`
    for a reply, :meth:`stream` for SSE."""

    tool_deltas = False  # a call's arguments are written once the reply ends

    def __init__(self, req: ResponsesRequest, fields: dict[str, str]):
        self.req, self.model, self.fields = req, req.model or "", fields
        self.id, self.created = _new_id("resp"), int(time.time())
        self.output: list[dict[str, Any]] = []
        self.seq = 0

    def body(self, status: str, reply: Reply | None = None) -> dict[str, Any]:
        """The ``response`` object as it stands."""
        incomplete = reply is not None and reply.finish_reason == "length"
        fmt = self.req.text.format.model_dump(by_alias=True, exclude_none=True) if self.req.text else {"type": "text"}
        body = {"id": self.id, "object": "response", "created_at": self.created, "model": self.model,
                "status": "incomplete" if incomplete else status, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "instructions": self.req.instructions, "max_output_tokens": self.req.max_output_tokens,
                "output": self.output, "parallel_tool_calls": self.req.parallel_tool_calls is not False,
                "previous_response_id": None, "store": False,
                "reasoning": {"effort": None, "summary": self.req.reasoning.summary if self.req.reasoning else None},
                "temperature": self.req.temperature if self.req.temperature is not None else 1.0,
                "top_p": self.req.top_p if self.req.top_p is not None else 1.0, "text": {"format": fmt},
                "tool_choice": self.req.tool_choice or "auto", "tools": self.req.tools or [], "truncation": "disabled",
                "metadata": self.req.metadata or {}, "usage": _usage(reply) if reply is not None else None}
        return body | (reply.extra if reply is not None else {})

    def whole(self, model: str, answer: Answer) -> dict[str, Any]:
        self.model, reasoning, reply = model, answer.reasoning, answer.reply
        if reasoning:
            self.output.append(_reasoning_item(_new_id("rs"), reasoning, "completed"))
        if reply.tool_calls:
            self.output += [_call_item(c, c["function"]["arguments"], "completed") for c in reply.tool_calls]
        else:
            self.output.append(_message_item(_new_id("msg"), reply.content or "", "completed"))
        return self.body("completed", reply)

    def _event(self, kind: str, **fields: Any) -> bytes:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()

    async def stream(self, model: str, events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
        """The Responses event stream of one run (an error once begun is an ``error`` event)."""
        self.model = model
        yield self._event("response.created", response=self.body("in_progress"))
        yield self._event("response.in_progress", response=self.body("in_progress"))
        state = _Open()
        try:
            async for event in events:
                if isinstance(event, ReasoningDelta):
                    for chunk in self._reasoning(state, event.text):
                        yield chunk
                elif isinstance(event, ContentDelta):
                    for chunk in self._text(state, event.text):
                        yield chunk
                elif isinstance(event, Done):
                    for chunk in self._finish(state, event.reply):
                        yield chunk
        except APIError as exc:
            yield self._event("error", code=exc.code, message=exc.message, param=exc.param)
        except Exception:
            log.exception("streamed response failed")
            yield self._event("error", code="server_error", message="the engine failed; details are in the server log",
                              param=None)

    def _reasoning(self, state: _Open, text: str) -> list[bytes]:
        out = []
        if state.reasoning_id is None:
            state.reasoning_id = _new_id("rs")
            item = _reasoning_item(state.reasoning_id, [], "in_progress")
            out.append(self._event("response.output_item.added", output_index=len(self.output), item=item))
        at, n = {"item_id": state.reasoning_id, "output_index": len(self.output)}, len(state.reasoning)
        part = {"type": "summary_text", "text": text}
        out += [self._event("response.reasoning_summary_part.added", **at, summary_index=n, part={**part, "text": ""}),
                self._event("response.reasoning_summary_text.delta", **at, summary_index=n, delta=text),
                self._event("response.reasoning_summary_text.done", **at, summary_index=n, text=text),
                self._event("response.reasoning_summary_part.done", **at, summary_index=n, part=part)]
        state.reasoning.append(text)
        return out

    def _close_reasoning(self, state: _Open) -> list[bytes]:
        if state.reasoning_id is None or state.reasoning_closed:
            return []
        state.reasoning_closed = True
        item = _reasoning_item(state.reasoning_id, state.reasoning, "completed")
        self.output.append(item)
        return [self._event("response.output_item.done", output_index=len(self.output) - 1, item=item)]

    def _text(self, state: _Open, text: str) -> list[bytes]:
        out = self._close_reasoning(state)
        if state.message_id is None:
            state.message_id = _new_id("msg")
            item = _message_item(state.message_id, None, "in_progress")
            at = {"output_index": len(self.output)}
            out += [self._event("response.output_item.added", **at, item=item),
                    self._event("response.content_part.added", **at, item_id=state.message_id, content_index=0,
                                part=_text_part(""))]
        if text:
            out.append(self._event("response.output_text.delta", item_id=state.message_id,
                                   output_index=len(self.output), content_index=0, delta=text, logprobs=[]))
            state.text += text
        return out

    def _finish(self, state: _Open, reply: Reply) -> list[bytes]:
        out = self._close_reasoning(state)
        for call in reply.tool_calls or []:
            args, at = call["function"]["arguments"], {"output_index": len(self.output)}
            item = _call_item(call, "", "in_progress")
            out.append(self._event("response.output_item.added", **at, item=item))
            out += [self._event("response.function_call_arguments.delta", **at, item_id=item["id"], delta=p)
                    for p in pieces(args)]
            out.append(self._event("response.function_call_arguments.done", **at, item_id=item["id"],
                                   name=item["name"], arguments=args))
            item = {**item, "arguments": args, "status": "completed"}
            self.output.append(item)
            out.append(self._event("response.output_item.done", **at, item=item))
        if not reply.tool_calls:
            content = reply.content or ""
            rest = content[len(state.text):] if content.startswith(state.text) else content
            out += self._text(state, "")
            for piece in pieces(rest):
                out += self._text(state, piece)
            at = {"item_id": state.message_id, "output_index": len(self.output), "content_index": 0}
            out += [self._event("response.output_text.done", **at, text=state.text, logprobs=[]),
                    self._event("response.content_part.done", **at, part=_text_part(state.text))]
            item = _message_item(state.message_id, state.text, "completed")
            self.output.append(item)
            out.append(self._event("response.output_item.done", output_index=len(self.output) - 1, item=item))
        body = self.body("completed", reply)
        return out + [self._event(f"response.{body['status']}", response=body)]


class _Open:
    """What a stream has begun: the reasoning item and the message, and their text so far."""

    def __init__(self) -> None:
        self.reasoning_id: str | None = None
        self.reasoning: list[str] = []
        self.reasoning_closed = False
        self.message_id: str | None = None
        self.text = ""


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(item_id: str, text: str | None, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [] if text is None else [_text_part(text)]}


def _reasoning_item(item_id: str, texts: list[str], status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "status": status,
            "summary": [{"type": "summary_text", "text": t} for t in texts], "content": []}


def _call_item(call: dict[str, Any], arguments: str, status: str) -> dict[str, Any]:
    return {"id": _new_id("fc"), "type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
            "arguments": arguments, "status": status}


def fields(req: ResponsesRequest) -> dict[str, str]:
    """FIELDS, and each chat tool's parameters named as the request's function tool (hosted tools are skipped)."""
    functions = [i for i, t in enumerate(req.tools or []) if t.get("type") == "function"]
    return FIELDS | {f"tools.{k}.function.parameters": f"tools.{i}.parameters" for k, i in enumerate(functions)}


def add_routes(app: FastAPI, default_model: str, models: dict[str, ServedModel]) -> None:
    """``POST /v1/responses`` on ``app``, answered by ``models`` (``default_model`` when none is named)."""

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Any:
        req = validated(ResponsesRequest, load_body(await request.body()))
        if req.reasoning is not None and req.reasoning.summary is not None:
            refuse_reasoning(models, req.model or default_model, "reasoning.summary")
        log_end_user("responses", req.model or default_model, req.user)
        return await handle(request, lambda: to_chat(req), models, default_model, ResponseWriter(req, fields(req)))
