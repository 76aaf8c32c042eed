"""The memory agent as a served model (``model: "memagent"``): any prompt length, fixed memory.

The conversation before the last user message is the document, the last user message the
question; :func:`memagent.agent.read_document` reads it chunk by chunk over the served engine
(concurrent requests' calls batch together as batch rows do). ``usage`` counts every token the
chain read and wrote; the trace rides in the ``memagent`` extension field; streamed, each memory
update is a reasoning delta before the answer. With ``response_format`` json_schema the extraction
chain runs: the schema's fields are the question, the reply the user's whole object (any schema the
extraction job takes: Pydantic's ``$defs``, nested models, lists of models, records nested back where
the schema has them; the per-record evidence in the extension field). ``json_object`` answers the
question as one JSON object. Cancelling the request (a disconnect) cancels the chain.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

from pydantic import ValidationError

from memagent.agent import InputError, Result, Step, check_config, read_document
from memagent.config import AgentConfig
from memagent.engines.base import Engine
from memagent.extraction.schema import schema_from
from memagent.prompts import parse_json_answer
from memagent.serve.chat import Event, Reply, check_max_tokens, first_line
from memagent.serve.guard import check_schema
from memagent.serve.protocol import APIError, ChatRequest


def split_conversation(req: ChatRequest) -> tuple[str, str]:
    """(document, question): the messages before the last user message, and that message."""
    users = [i for i, m in enumerate(req.messages) if m.role == "user"]
    if not users:
        raise APIError(400, "messages: the memagent model needs a user message (the question)", param="messages")
    last = users[-1]
    if last != len(req.messages) - 1:
        raise APIError(400, "messages: the last message must be the user's question", param="messages")
    document = "\n\n".join(m.text() for m in req.messages[:last] if m.text())
    return document, req.messages[last].text()


class MemAgentModel:
    """Requests read by the memory agent over ``engine`` with ``config`` (default: the paper's budgets)."""

    def __init__(self, engine: Engine, max_tokens: int, config: AgentConfig | None = None):
        self.engine, self.max_tokens = engine, max_tokens
        self.config = config or AgentConfig()

    async def prepare(self, req: ChatRequest) -> tuple[str | None, str, AgentConfig]:
        if req.tools and req.tool_choice != "none":
            raise APIError(400, "the memagent model does not call tools; send tools to the engine's model",
                           param="tools")
        check_max_tokens(req, self.max_tokens)
        document, question = split_conversation(req)
        config = self.config.model_copy(update={"temperature": req.temperature, "top_p": req.top_p})
        asked = req.max_completion_tokens or req.max_tokens
        if asked:
            config = config.model_copy(update={"answer_tokens": asked})
        rf = req.response_format
        if rf is not None and rf.type == "json_object":  # a JSON answer to the question (see _as_object)
            config = config.model_copy(update={"answer_style": "json"})
        if rf is not None and rf.type == "json_schema" and rf.json_schema is not None:
            where = "response_format.json_schema.schema"
            try:
                schema = schema_from(check_schema(rf.json_schema.schema_, where), where)
                config = AgentConfig.model_validate({**config.model_dump(exclude={"extraction", "answer_style"}),
                                                     "extraction": schema})
            except ValidationError as exc:  # the one line pydantic's message is about
                message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
                raise APIError(400, f"response_format: {message}", param="response_format") from None
            except ValueError as exc:
                raise APIError(400, first_line(str(exc)), param="response_format") from None
            question = None
        try:
            await asyncio.to_thread(check_config, self.engine, config)
        except ValueError as exc:
            raise APIError(400, first_line(str(exc))) from None
        return question, document, config

    async def events(self, req: ChatRequest, prepared: tuple) -> AsyncIterator[Event]:
        question, document, config = prepared
        updates: asyncio.Queue[Step] = asyncio.Queue()

        def on_step(step: Step, total: int) -> None:
            if step.kind == "memory":
                updates.put_nowait(step)

        chain = asyncio.ensure_future(read_document(self.engine, question, document, config, on_step=on_step))
        try:
            while not chain.done() or not updates.empty():
                getter = asyncio.ensure_future(updates.get())
                await asyncio.wait({getter, chain}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    step = getter.result()
                    yield "reasoning", f"[memory after chunk {step.chunk_index + 1}]\n{step.memory}\n"
                else:
                    getter.cancel()
            try:
                result = chain.result()
            except (InputError, ValueError) as exc:
                raise APIError(400, first_line(str(exc)), param="messages") from None
            yield "reply", _reply(result, config, req)
        finally:
            chain.cancel()  # a disconnect (the generator closed) stops the chain


def _content(result: Result, config: AgentConfig, req: ChatRequest) -> str:
    """The answer the client parses: an extraction's whole object in the user's schema's shape (records
    nested where the schema has them), a ``json_object`` answer as one JSON object, else the reply's text."""
    schema = config.extraction
    if schema is not None:
        try:
            doc = json.loads(result.response or "")
        except ValueError:
            return result.response  # cut at max_tokens: finish_reason says so
        records = {name: [getattr(r, "values", r) for r in found] for name, found in (result.records or {}).items()}
        return json.dumps(schema.assemble(doc if isinstance(doc, dict) else {}, records), ensure_ascii=False,
                          default=str)
    rf = req.response_format
    if rf is not None and rf.type == "json_object" and result.steps[-1].finish_reason == "stop":
        return _as_object(result.response)
    return result.response


def _as_object(text: str) -> str:
    """A reply as one JSON object: itself when it is one, else ``{"answer": value}`` (json_object promises an
    object; a small model may answer with a bare string or number)."""
    try:
        value = parse_json_answer(text)
    except ValueError:
        value = text.strip()
    return json.dumps(value if isinstance(value, dict) else {"answer": value}, ensure_ascii=False)


def _reply(result: Result, config: AgentConfig, req: ChatRequest) -> Reply:
    answer = result.steps[-1]
    trace: dict[str, Any] = {"steps": [asdict(s) for s in result.steps], "n_chunks": result.n_chunks,
                             "context_tokens": result.context_tokens, "truncated": result.truncated,
                             "prediction": result.prediction}
    if result.records is not None:
        trace["records"] = {name: [asdict(r) if not isinstance(r, dict) else r for r in rows]
                            for name, rows in result.records.items()}
    reasoning = "\n".join(s.memory for s in result.steps if s.kind == "memory")
    return Reply(_content(result, config, req), answer.finish_reason, sum(s.prompt_tokens for s in result.steps),
                 sum(s.completion_tokens for s in result.steps), extra={"memagent": trace}, reasoning=reasoning)
