"""The served engine as a chat model: a request -> the engine's messages and decoding -> a :class:`Reply`.

Both served models (this one and :mod:`memagent.serve.memagent_model`) produce the same events,
so the app answers them alike, whole or streamed (:mod:`memagent.serve.events`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from memagent.engines.base import Completion, Engine, SamplingParams
from memagent.engines.detokenize import IncrementalText
from memagent.engines.json_schema import MAX_ARRAY_ITEMS, MAX_MAGNITUDE, MAX_STRING_CHARS, NUMBER_STEP
from memagent.engines.special_literals import special_texts
from memagent.engines.stop import final_text
from memagent.serve import tools
from memagent.serve.events import ContentDelta, Done, Event, Reply, ToolCallDelta
from memagent.serve.guard import check_schema, refuse_special_literals
from memagent.serve.protocol import APIError, ChatRequest

T = TypeVar("T")
LARGE_PROMPT_CHARS = 256 * 1024  # prompts longer than this are tokenised one at a time

# OpenAI's JSON mode as a schema: any JSON object, its keys and values bounded like render_schema's
# (keys of at most MAX_KEY_CHARS, strings, arrays, number digits), so that a model caught in a loop
# cannot spend the whole budget inside one key or value. The $defs recursion is optional (an
# object may be empty), so the grammar is finite. (llguidance has no propertyNames; a pattern
# property with additionalProperties false bounds the keys.)
MAX_KEY_CHARS = 64
_MEMBERS = {"patternProperties": {f"^.{{0,{MAX_KEY_CHARS}}}$": {"$ref": "#/$defs/value"}}, "additionalProperties": False}
_VALUE = {"anyOf": [
    {"type": "string", "maxLength": MAX_STRING_CHARS},
    {"type": "number", "minimum": -MAX_MAGNITUDE, "maximum": MAX_MAGNITUDE, "multipleOf": NUMBER_STEP},
    {"type": "boolean"}, {"type": "null"},
    {"type": "array", "items": {"$ref": "#/$defs/value"}, "maxItems": MAX_ARRAY_ITEMS},
    {"type": "object", **_MEMBERS}]}
JSON_OBJECT_SCHEMA = {"type": "object", **_MEMBERS, "$defs": {"value": _VALUE}}

def response_schema(req: ChatRequest, special_tokens: list[str]) -> str | None:
    """The constrained-decoding schema of ``response_format`` (JSON text, None for text); 400 for
    what the engines cannot do (a literal holding one of ``special_tokens``: :func:`refuse_special_literals`)."""
    rf = req.response_format
    if rf and rf.type == "json_schema":
        if not rf.json_schema:
            raise APIError(400, "response_format of type json_schema needs json_schema: {name, schema}",
                           param="response_format")
        where = "response_format.json_schema.schema"
        schema = check_schema(rf.json_schema.schema_, where)
        refuse_special_literals(schema, special_tokens, where, "response_format")
        return json.dumps(schema)
    if rf and rf.type == "json_object":
        return json.dumps(JSON_OBJECT_SCHEMA)
    return None


def check_max_tokens(req: ChatRequest, cap: int) -> None:
    """400 when the request asks for more completion tokens than the server's cap."""
    for name in ("max_completion_tokens", "max_tokens"):
        asked = getattr(req, name)
        if asked is not None and asked > cap:
            raise APIError(400, f"{name} {asked} is over this server's limit of {cap} tokens (--max-tokens)",
                           param=name, code="max_tokens_too_large")


def _too_long(context_window: int, prompt_tokens: int, asked: int | None) -> APIError:
    if asked:
        said = (f"However, you requested {prompt_tokens + asked} tokens ({prompt_tokens} in the messages, {asked} in "
                "the completion). Please reduce the length of the messages or completion.")
    else:
        said = (f"However, your messages resulted in {prompt_tokens} tokens, which leaves no room for the "
                "completion. Please reduce the length of the messages.")
    return APIError(400, f"This model's maximum context length is {context_window} tokens. {said}",
                    param="messages", code="context_length_exceeded")


def sampling(req: ChatRequest, prompt_tokens: int, context_window: int, cap: int | None,
             schema: str | None, stops: list[str] | None = None) -> SamplingParams:
    """Decoding settings; 400 in OpenAI's words when prompt + reply exceed the window. ``stops``: the
    stop strings the engine ends the decode at (default: the request's)."""
    asked = req.max_completion_tokens or req.max_tokens
    max_tokens = asked or context_window - prompt_tokens  # default: the rest of the window (within the cap)
    if not asked and cap is not None:
        max_tokens = min(max_tokens, cap)
    if (asked and prompt_tokens + asked > context_window) or max_tokens < 1:
        raise _too_long(context_window, prompt_tokens, asked)
    return SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, logprobs=req.logprobs,
                          json_schema=schema, seed=req.seed, stop=tuple(req.stops() if stops is None else stops))


def matched_stop(decoded: str, text: str, stops: tuple[str, ...]) -> str | None:
    """The stop string that ended a reply: the one that begins where its ``text`` ends in its tokens'
    ``decoded`` text (which keeps the stop string); None when it ended otherwise (end of turn)."""
    return next((s for s in stops if decoded.startswith(text + s)), None)


def first_line(text: str, limit: int = 500) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "invalid request"
    return line if len(line) <= limit else line[:limit] + " …"


class Settled(Protocol):
    """A request a served model has settled (its decoding fixed, every refusal already raised)."""

    def events(self, *, tool_deltas: bool = False) -> AsyncIterator[Event]:
        """Reasoning and content deltas and, with ``tool_deltas``, tool-call deltas as they are decoded,
        then one :class:`Done` (:mod:`memagent.serve.events`)."""


class ServedModel(Protocol):
    """What every route asks of a served model (:class:`EngineModel`, or the memory agent over it): settle a
    request (an :class:`APIError` for what it cannot serve, before any decoding), then answer it as events."""

    reasons: bool  # whether its runs write reasoning (the memagent model's memory updates) before the reply

    async def prepare(self, req: ChatRequest) -> Settled:
        """The request settled (:class:`Settled`), whose events answer it."""


@dataclass(frozen=True)
class Prepared:
    """What :meth:`EngineModel.prepare` settled for one request (a :class:`Settled`)."""

    model: EngineModel
    req: ChatRequest
    messages: list[dict[str, str]]
    params: SamplingParams
    plan: tools.ToolPlan | None
    prompt_ids: list[int] | None = None  # encoded once, off the event loop (engines that take ids)

    def events(self, *, tool_deltas: bool = False) -> AsyncIterator[Event]:
        return self.model.events(self, tool_deltas=tool_deltas)


class EngineModel:
    """The engine itself, served under its name."""

    reasons = False

    def __init__(self, engine: Engine, max_tokens: int):
        self.engine, self.max_tokens = engine, max_tokens
        self._one_large_prompt = asyncio.Semaphore(1)

    async def _in_thread(self, messages: list[dict[str, str]], work: Callable[[list[dict[str, str]]], T]) -> T:
        """``work(messages)`` in a worker thread (a multi-MB prompt takes seconds to tokenise, and the
        event loop serves every stream meanwhile); large prompts one at a time, so that many of them
        hold one core, not every core the event loop needs too."""
        if sum(len(m["content"]) for m in messages) > LARGE_PROMPT_CHARS:
            async with self._one_large_prompt:
                return await asyncio.to_thread(work, messages)
        return await asyncio.to_thread(work, messages)

    async def count(self, messages: list[dict[str, str]]) -> int:
        """Prompt tokens of ``messages``, counted in a worker thread."""
        return await self._in_thread(messages, self.engine.count_chat_tokens)

    async def encode(self, messages: list[dict[str, str]]) -> tuple[int, list[int] | None]:
        """(prompt tokens, prompt ids) in a worker thread: the ids when the engine takes them (it then
        does not encode the prompt again), else None (the engine is sent the messages)."""
        if self.engine.takes_prompt_ids:
            ids = await self._in_thread(messages, self.engine.encode_chat)
            return len(ids), ids
        return await self.count(messages), None

    def special_tokens(self) -> list[str]:
        """The special-token texts a schema's literals may not hold: the tokenizer's special tokens and added
        vocabulary, unless the engine's grammar keeps them out of a reply (``masks_special_tokens``)."""
        return [] if self.engine.masks_special_tokens else special_texts(self.engine.tokenizer)

    async def prepare(self, req: ChatRequest) -> Prepared:
        """The engine's messages and decoding for ``req``; APIError for what cannot be served."""
        specials = self.special_tokens()
        schema = response_schema(req, specials)
        plan = tools.plan(req, specials)
        if plan is not None:
            schema = json.dumps(plan.schema) if plan.schema is not None else None
        messages = tools.render_messages(req.messages, plan)
        check_max_tokens(req, self.max_tokens)
        try:
            prompt_tokens, prompt_ids = await self.encode(messages)
        except Exception as exc:  # a template that refuses a role or an order of messages
            raise APIError(400, f"messages: the chat template refused them: {first_line(str(exc))}",
                           param="messages") from None
        # A grammar's tool call is JSON: a stop string inside the arguments would break the call.
        # "auto" decodes free text, stopped as any reply (and at the call's end when one is asked for).
        stops = req.stops() if plan is None or plan.mode == "auto" else []
        stops += plan.stops() if plan is not None else []
        params = sampling(req, prompt_tokens, self.engine.context_window, self.max_tokens, schema, stops)
        return Prepared(self, req, messages, params, plan, prompt_ids)

    def _decode(self, prepared: Prepared, on_tokens: Callable[[list[int]], None] | None) -> asyncio.Future[Completion]:
        kw = {"on_tokens": on_tokens} if on_tokens is not None else {}  # only engines that stream are passed it
        if prepared.prompt_ids is not None:
            return asyncio.ensure_future(self.engine.chat_ids(prepared.prompt_ids, prepared.params, **kw))
        return asyncio.ensure_future(self.engine.chat(prepared.messages, prepared.params, **kw))

    async def events(self, prepared: Prepared, *, tool_deltas: bool = False) -> AsyncIterator[Event]:
        """Content deltas as the engine decodes (when it can stream), then :class:`Done`. The
        engine ends the reply at a stop string; until then the text that could still begin one waits
        (:func:`final_text`), so what streams is the reply's prefix. With tools, the calls are read
        out of the text as it grows (:class:`tools.CallStream`); ``tool_deltas``: also yield each
        call's OpenAI delta entries as :class:`ToolCallDelta` s (a consumer that writes them live)."""
        req, params, plan = prepared.req, prepared.params, prepared.plan
        reader = plan.reader() if plan is not None else None
        tokens: asyncio.Queue[list[int] | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        live = req.stream and self.engine.streams_tokens
        call = self._decode(prepared, (lambda ids: loop.call_soon_threadsafe(tokens.put_nowait, list(ids)))
                            if live else None)
        call.add_done_callback(lambda _: tokens.put_nowait(None))
        shown = (lambda event: tool_deltas or not isinstance(event, ToolCallDelta))
        try:
            decoded = IncrementalText(lambda ids: self.engine.tokenizer.decode(ids, skip_special_tokens=True))
            sent = ""
            while (new := await tokens.get()) is not None:
                if not decoded.add(new):  # nothing new, or a UTF-8 character not yet whole
                    continue
                text = final_text(decoded.text, params.stop)
                if reader is not None:
                    for event in reader.feed(text):
                        if shown(event):
                            yield event
                elif len(text) > len(sent) and text.startswith(sent):
                    yield ContentDelta(text[len(sent):])
                    sent = text
            try:
                c = call.result()
            except ValueError as exc:  # the engine rejected this input: its first line, not a parser dump
                raise APIError(400, first_line(str(exc))) from None
            reply = Reply(c.text, c.finish_reason, c.prompt_tokens, c.completion_tokens, logprobs=self._logprobs(c))
            if reader is not None:
                for event in self._read_calls(reply, reader, plan):
                    if shown(event):
                        yield event
            asked = tuple(s for s in params.stop if plan is None or s not in plan.stops())  # not the call's end
            if c.finish_reason == "stop" and asked and c.token_ids:
                reply.stop_sequence = matched_stop(self.engine.tokenizer.decode(c.token_ids, skip_special_tokens=True),
                                                   c.text, asked)
            yield Done(reply)
        finally:
            call.cancel()  # a disconnect (the generator closed) abandons the decode

    @staticmethod
    def _read_calls(reply: Reply, reader: tools.CallStream, plan: tools.ToolPlan) -> list[Event]:
        """Sets the reply's content and tool calls from its text; the events not streamed yet."""
        events, reply.content, reply.tool_calls = reader.finish(reply.content or "", reply.finish_reason)
        if reply.tool_calls and reply.finish_reason != "length":  # a cut call stays "length", as OpenAI's
            reply.finish_reason = "stop" if plan.mode == "named" else "tool_calls"
        return events

    def _logprobs(self, c: Completion) -> dict[str, Any] | None:
        if c.logprobs is None:
            return None
        ids = c.token_ids or []
        tok = self.engine.tokenizer
        tokens = [tok.decode([t]) for t in ids] if len(ids) == len(c.logprobs) else [""] * len(c.logprobs)
        return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
                            for t, lp in zip(tokens, c.logprobs)]}
