"""What every route does with a request, whichever API it speaks (chat, Responses, Messages, a batch
line): read the body, name a bad field, find the model, settle the request, and answer it whole or
streamed, stopping the work when the client goes away. A batch line (``pipelines/openai_batch.py``) is
answered by the same :func:`respond` with the chat translation and the chat writer's whole reply.

A surface is a translation of its request into a :class:`ChatRequest` and a :class:`Writer` (the
reply whole, the reply as events); :func:`handle` does the rest, so the surfaces cannot disagree
about a model, a limit or an error. An error about a chat field names the surface's own field
(``Writer.fields``: ``response_format.json_schema.schema`` is ``text.format.schema`` on Responses).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError

from memagent.config import AgentConfig
from memagent.engines.base import Engine
from memagent.serve.chat import EngineModel, ServedModel, Settled
from memagent.serve.events import Done, Event, ReasoningDelta, Reply
from memagent.serve.guard import check_unicode
from memagent.serve.protocol import APIError, ChatRequest

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.5  # how often a waiting request checks that its client is still there
PIECE_CHARS = 16  # text and arguments that arrive whole are streamed in pieces of about this many characters
BodyT = TypeVar("BodyT", bound=BaseModel)


def pieces(text: str) -> list[str]:
    """``text`` in pieces of PIECE_CHARS characters (none for no text)."""
    return [text[i:i + PIECE_CHARS] for i in range(0, len(text), PIECE_CHARS)]


@dataclass
class Answer:
    """A whole run: its memory updates (the memagent model's reasoning) and its reply."""

    reasoning: list[str]
    reply: Reply


class Writer(Protocol):
    """How one surface writes a run: whole, or as its event stream."""

    fields: Mapping[str, str]  # a chat field's path -> this surface's name for it, in error messages
    tool_deltas: bool  # whether the stream writes tool calls live (ToolCallDelta events)

    def whole(self, model: str, answer: Answer) -> Any:
        """The response body of a whole run."""

    def stream(self, model: str, events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
        """The run's server-sent events (an error once begun is an event of the surface's own shape)."""


def validated(model: type[BodyT], body: dict[str, Any]) -> BodyT:
    """``body`` as ``model``, or a 400 naming the field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        message, param = validation_message(exc)
        raise APIError(400, message, param=param) from None


def renamed(exc: APIError, fields: Mapping[str, str]) -> APIError:
    """``exc`` naming the surface's field where its message begins with a chat field's path (longest first)."""
    for chat_path in sorted(fields, key=len, reverse=True):
        if exc.message == chat_path or exc.message.startswith((chat_path + ":", chat_path + ".", chat_path + " ")):
            theirs = fields[chat_path]
            return APIError(exc.status, theirs + exc.message[len(chat_path):], type=exc.type,
                            param=theirs.split(".")[0], code=exc.code)
    return exc


async def settle(chat: ChatRequest, models: Mapping[str, ServedModel], default_model: str) -> tuple[str, Settled]:
    """(the model's name, the request settled by it); a 404 for an unknown model, a 400 for what the
    model cannot serve, before any decoding."""
    name = chat.model or default_model
    if name not in models:
        raise unknown_model(name, models)
    return name, await models[name].prepare(chat)


async def collect(events: AsyncIterator[Event]) -> Answer:
    """The run's memory updates and its reply (what a whole response is written from)."""
    reasoning: list[str] = []
    async for event in events:
        if isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, Done):
            return Answer(reasoning, event.reply)
    raise RuntimeError("the model produced no reply")  # pragma: no cover - every model ends with one


def served_models(engine: Engine, max_tokens: int, agent: AgentConfig | None = None, *,
                  memagent_model: str | None = "memagent", engine_model: str | None = None) -> dict[str, ServedModel]:
    """The models one server answers, by id: the engine under its name (or ``engine_model``) and, unless
    ``memagent_model`` is empty or that name, the memory agent over it reading with ``agent``. The chat routes
    and the Batch API's lines answer from the same dict's models, so a model id means one behaviour."""
    name = engine_model or engine.name
    models: dict[str, ServedModel] = {name: EngineModel(engine, max_tokens)}
    if memagent_model and memagent_model != name:
        from memagent.serve.memagent_model import MemAgentModel  # the agent's imports only where it is served

        models[memagent_model] = MemAgentModel(engine, max_tokens, agent)
    return models


async def respond(translate: Callable[[], ChatRequest], models: Mapping[str, ServedModel], default_model: str,
                  writer: Writer, wait: Callable[[Awaitable[Answer]], Awaitable[Answer]] | None = None) -> Any:
    """The one handler of every request, from a client's route or a batch line: ``translate`` gives it as a
    chat request, ``writer`` writes the run (whole after ``wait``, which may cancel it, or streamed); errors
    about chat fields name the writer's own (:attr:`Writer.fields`)."""
    try:
        chat = translate()
        name, settled = await settle(chat, models, default_model)
    except APIError as exc:
        raise renamed(exc, writer.fields) from None
    if chat.stream:
        return StreamingResponse(writer.stream(name, settled.events(tool_deltas=writer.tool_deltas)),
                                 media_type="text/event-stream")
    work = collect(settled.events())
    return writer.whole(name, await (wait(work) if wait is not None else work))


async def handle(request: Request, translate: Callable[[], ChatRequest], models: Mapping[str, ServedModel],
                 default_model: str, writer: Writer) -> Any:
    """The response to one route's request (:func:`respond`), its run cancelled if the client goes away."""
    return await respond(translate, models, default_model, writer, lambda work: unless_disconnected(request, work))


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    """(``field.path: what is wrong``, the top-level field) of a request model's first error."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{'.'.join(loc) or 'body'}: {msg}", (loc[0] if loc else None)


def load_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 naming what is wrong with it (not UTF-8, not JSON, too deep)."""
    try:
        body = json.loads(raw.decode("utf-8", errors="surrogatepass"))
    except UnicodeDecodeError as exc:
        raise APIError(400, f"request body is not UTF-8 (byte {exc.start})", code="invalid_body") from None
    except json.JSONDecodeError as exc:
        raise APIError(400, f"request body is not JSON: {exc}", code="invalid_body") from None
    except RecursionError:
        raise APIError(400, "request body nested too deeply", code="invalid_body") from None
    if not isinstance(body, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(body).__name__}", code="invalid_body")
    check_unicode(body)
    return body


async def unless_disconnected(request: Request, work: Any) -> Any:
    """Await ``work``, cancelling it when the client goes away (a timed-out client retries: without
    this, an overloaded server would go on generating every abandoned copy)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise APIError(499, "client closed the request", code="client_closed_request")
    except asyncio.CancelledError:
        task.cancel()
        raise


def log_end_user(api: str, model: str, user: str | None) -> None:
    """The end user's id a request names (Responses' ``user``, Messages' ``metadata.user_id``), written to the
    server log with its API and model: where abuse is traced."""
    if user is not None:
        log.info("%s request for model %s from end user %r", api, model, user)


def refuse_reasoning(models: Mapping[str, ServedModel], name: str, field: str) -> None:
    """A 400 naming ``field`` (which asks for reasoning) when ``name`` is a served model that writes none, as
    OpenAI and Anthropic answer for their models that do not reason; an unknown model is left to its 404."""
    model = models.get(name)
    if model is not None and not model.reasons:
        raise APIError(400, f"{field}: the model `{name}` does not reason; only the memagent model does (its memory "
                       "updates are its reasoning): omit it", param=field.split(".")[0])


def unknown_model(name: str, models: Mapping[str, object]) -> APIError:
    """The 404 of a model this server does not serve, naming those it does."""
    return APIError(404, f"The model `{name}` does not exist; this server serves "
                    f"{', '.join(f'`{m}`' for m in models)}.", param="model", code="model_not_found")
