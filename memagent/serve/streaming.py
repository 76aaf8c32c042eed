"""Server-sent events in OpenAI's ``chat.completion.chunk`` format.

The first chunk carries the role; reasoning events (the memagent model's memory updates) follow
under one delta field (``reasoning_content`` by default, ``serve --reasoning-field``); then the
content (pieces as the engine decodes them, then whatever the final reply adds), and the tool
calls as OpenAI sends them, live as they are decoded (:class:`ToolCallDelta` events: the id, type
and name first, then the arguments in pieces; whatever was not streamed live follows from the
reply, in pieces); then a chunk with ``finish_reason``; with ``stream_options.include_usage`` a last
chunk with empty ``choices`` and the usage; then ``data: [DONE]``. An error once the stream has
begun is an ``{"error": ...}`` event (as vLLM sends it). When the client goes away Starlette
cancels this generator, and with it the decode it awaits.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from memagent.serve.events import ContentDelta, Event, ReasoningDelta, Reply, ToolCallDelta
from memagent.serve.handling import Answer, pieces
from memagent.serve.protocol import APIError, chunk, completion_body, completion_id

log = logging.getLogger(__name__)


def _sse(body: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(body)}\n\n".encode()


class ChatWriter:
    """The Chat Completions surface's writer (:class:`memagent.serve.handling.Writer`): a ``chat.completion``,
    or ``chat.completion.chunk`` events with tool calls written live."""

    tool_deltas = True

    def __init__(self, reasoning_field: str = "reasoning_content", include_usage: bool = False):
        self.reasoning_field, self.include_usage = reasoning_field, include_usage
        self.fields: dict[str, str] = {}  # the chat surface names its own fields

    def whole(self, model: str, answer: Answer) -> dict[str, Any]:
        reply = answer.reply
        return completion_body(model, reply.message(self.reasoning_field), reply.finish_reason, reply.usage(),
                               reply.logprobs, **reply.extra)

    def stream(self, model: str, events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
        return sse(events, model, self.include_usage, self.reasoning_field)


def reply_deltas(reply: Reply, streamed: str = "", sent_args: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """The deltas that spell ``reply`` after the role chunk, the content ``streamed`` so far and the
    tool calls streamed live (``sent_args``: each call's index -> the arguments sent)."""
    sent_args = sent_args or {}
    if reply.tool_calls:
        deltas = [{"content": p} for p in _rest(reply.content or "", streamed)]
        for i, call in enumerate(reply.tool_calls):
            if i not in sent_args:
                head = {"index": i, "id": call["id"], "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""}}
                deltas.append({"tool_calls": [head]})
            deltas += [{"tool_calls": [{"index": i, "function": {"arguments": p}}]}
                       for p in _rest(call["function"]["arguments"], sent_args.get(i, "")) if p]
        return deltas
    content = reply.content or ""
    rest = content[len(streamed):] if content.startswith(streamed) else content
    return [{"content": p} for p in pieces(rest) or [""]] if rest or not streamed else []


def _rest(text: str, sent: str) -> list[str]:
    """What of ``text`` is left to send after ``sent`` (a prefix of it), in pieces; none when all was sent."""
    rest = text[len(sent):] if text.startswith(sent) else text
    return pieces(rest)


async def sse(events: AsyncIterator[Event], model: str, include_usage: bool,
              reasoning_field: str = "reasoning_content") -> AsyncIterator[bytes]:
    """The event stream of one request, as SSE bytes."""
    cid, created = completion_id(), int(time.time())
    yield _sse(chunk(cid, model, created, {"role": "assistant", "content": ""}))
    streamed = ""
    sent_args: dict[int, str] = {}  # tool calls sent live: index -> arguments so far
    try:
        async for event in events:
            if isinstance(event, ReasoningDelta):
                yield _sse(chunk(cid, model, created, {reasoning_field: event.text}))
                continue
            if isinstance(event, ContentDelta):
                streamed += event.text
                yield _sse(chunk(cid, model, created, {"content": event.text}))
                continue
            if isinstance(event, ToolCallDelta):
                index = event.entry["index"]
                sent_args[index] = sent_args.get(index, "") + event.entry["function"].get("arguments", "")
                yield _sse(chunk(cid, model, created, {"tool_calls": [event.entry]}))
                continue
            value = event.reply
            for delta in reply_deltas(value, streamed, sent_args):
                yield _sse(chunk(cid, model, created, delta))
            last = chunk(cid, model, created, {}, value.finish_reason)
            last.update(value.extra)
            yield _sse(last)
            if include_usage:
                yield _sse(chunk(cid, model, created, None, use=value.usage()))
    except APIError as exc:
        yield _sse(exc.payload())
    except Exception:
        log.exception("streamed chat completion failed")
        yield _sse(APIError(500, "the engine failed; details are in the server log", type="server_error").payload())
    yield b"data: [DONE]\n\n"
