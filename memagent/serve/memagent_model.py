"""The memory agent as a served model (``model: "memagent"``): any prompt length, fixed memory.

The conversation before the last user message is the document, the last user message the
question; :func:`memagent.agent.read_document` reads it chunk by chunk over the served engine
(concurrent requests' calls batch together as batch rows do). When nothing comes before it, the last
user message holds both (:func:`one_message`): with ``response_format`` json_schema it is all document
(LangExtract's shape: the schema is the question); otherwise, when it is longer than ``query_tokens``,
its last paragraph (the text after its last blank line) is the question and the rest the document. A
question still over ``query_tokens`` is a 400 that says where the document goes. ``usage`` counts every
token the read took and wrote; the trace rides in the ``memagent`` extension field; streamed, each memory
update is a reasoning delta before the answer. The final answer is the engine's model's, asked with
the client's tools, stop strings, seed, logprobs and ``json_object`` over the memory (so it streams,
calls tools and stops as the engine's model does). With ``response_format`` json_schema an
extraction read runs: the schema's fields are the question, the reply the user's whole object (any
schema the extraction job takes: Pydantic's ``$defs``, nested models, lists of models, records nested
back where the schema has them; the per-record evidence in the extension field). Cancelling the
request (a disconnect) cancels the read.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import ValidationError

from memagent.agent import InputError, MemoryRead, Result, Step, check_config, read_document, read_memory
from memagent.config import AgentConfig
from memagent.engines.base import Engine
from memagent.extraction.schema import schema_from
from memagent.prompts import extract_answer, final_answer_messages
from memagent.serve.chat import EngineModel, check_max_tokens, first_line
from memagent.serve.events import Done, Event, ReasoningDelta, Reply
from memagent.serve.guard import check_schema, refuse_special_literals
from memagent.serve.protocol import APIError, ChatMessage, ChatRequest


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


def one_message(document: str, question: str, tokens: Callable[[str], int], query_tokens: int) -> tuple[str, str]:
    """(document, question) of a conversation whose question may hold the document too (the module's rule);
    a question over ``query_tokens`` that the rule cannot split is a 400 saying where the document goes."""
    n = tokens(question)
    if n <= query_tokens:
        return document, question
    if not document.strip():
        head, _, tail = question.strip().rpartition("\n\n")
        if head.strip() and tail.strip() and tokens(tail) <= query_tokens:
            return head, tail
    raise APIError(400, f"messages: the question (the last user message) is {n} tokens, over this model's "
                   f"query_tokens={query_tokens}. The memagent model reads the messages before the last user message "
                   "as the document, any length: send the document there and only the question last (or, in one "
                   "message, the document, a blank line, then the question)", param="messages",
                   code="question_too_long")


def memory_note(step: Step) -> str:
    """One memory update as the client reads it (each a reasoning delta; the whole reasoning is their join)."""
    return f"[memory after chunk {step.chunk_index + 1}]\n{step.memory}\n"


@dataclass(frozen=True)
class Run:
    """What :meth:`MemAgentModel.prepare` settled for one request (a :class:`~memagent.serve.chat.Settled`)."""

    model: MemAgentModel
    req: ChatRequest
    question: str | None  # None: an extraction (the schema's fields are the question)
    document: str
    config: AgentConfig

    def events(self, *, tool_deltas: bool = False) -> AsyncIterator[Event]:
        return self.model.events(self, tool_deltas=tool_deltas)


class MemAgentModel:
    """Requests read by the memory agent over ``engine`` with ``config`` (default: the paper's budgets).

    The final answer is asked of the engine's own model (:class:`EngineModel`) with the request's
    tools, ``tool_choice``, ``stop``, ``seed``, ``logprobs`` and ``json_object``, over the answer prompt
    (question and memory, no document): whatever the engine's model takes, the memory agent's answer
    takes; the memory updates are sampled with the request's temperature and seed. ``json_schema``
    runs an extraction read instead (its answer is the schema's calls)."""

    reasons = True  # the memory updates are its reasoning (thinking, reasoning summaries)

    def __init__(self, engine: Engine, max_tokens: int, config: AgentConfig | None = None):
        self.engine, self.max_tokens = engine, max_tokens
        self.config = config or AgentConfig()
        self.answerer = EngineModel(engine, max_tokens)

    async def prepare(self, req: ChatRequest) -> Run:
        check_max_tokens(req, self.max_tokens)
        document, question = split_conversation(req)
        config = self.config.model_copy(update={"temperature": req.temperature, "top_p": req.top_p})
        rf = req.response_format
        if rf is not None and rf.type == "json_schema" and rf.json_schema is not None:
            return await self._prepare_extraction(req, document or question, config)
        document, question = await asyncio.to_thread(one_message, document, question, self._tokens,
                                                      config.query_tokens)
        if rf is not None and rf.type == "json_object":  # the answer prompt asks for JSON; the grammar an object
            config = config.model_copy(update={"answer_style": "json"})
        await self._check(config)
        # What the engine's model refuses (a bad tool, a stop list too long, an answer over the window) is
        # refused before the read: the answer request checked with an empty memory.
        await self.answerer.prepare(self._answer_request(req, question, "", config))
        return Run(self, req, question, document, config)

    async def _prepare_extraction(self, req: ChatRequest, document: str, config: AgentConfig) -> Run:
        for name, asked in (("tools", req.tools and req.tool_choice != "none"), ("stop", req.stops()),
                            ("logprobs", req.logprobs)):
            if asked:
                raise APIError(400, f"{name}: the memagent model's extraction (response_format json_schema) answers "
                               "in the schema's own calls; send it without " + name, param=name)
        asked_tokens = req.max_completion_tokens or req.max_tokens
        if asked_tokens:
            config = config.model_copy(update={"answer_tokens": asked_tokens})
        assert req.response_format is not None and req.response_format.json_schema is not None
        where = "response_format.json_schema.schema"
        try:
            checked = check_schema(req.response_format.json_schema.schema_, where)
            refuse_special_literals(checked, self.answerer.special_tokens(), where, "response_format")
            schema = schema_from(checked, where)
            config = AgentConfig.model_validate({**config.model_dump(exclude={"extraction", "answer_style"}),
                                                 "extraction": schema})
        except ValidationError as exc:  # the one line pydantic's message is about
            message = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
            raise APIError(400, f"response_format: {message}", param="response_format") from None
        except ValueError as exc:
            raise APIError(400, first_line(str(exc)), param="response_format") from None
        await self._check(config)
        return Run(self, req, None, document, config)

    def _tokens(self, text: str) -> int:
        return len(self.engine.tokenizer.encode(text, add_special_tokens=False))

    async def _check(self, config: AgentConfig) -> None:
        try:
            await asyncio.to_thread(check_config, self.engine, config)
        except ValueError as exc:
            raise APIError(400, first_line(str(exc))) from None

    def _answer_request(self, req: ChatRequest, question: str, memory: str, config: AgentConfig) -> ChatRequest:
        """The final answer as a request to the engine's model: the answer prompt, the client's other fields."""
        messages = final_answer_messages(question, memory, config.answer_style, config.instruction, config.prompts)
        return req.model_copy(update={"model": self.engine.name, "messages": [ChatMessage(**m) for m in messages],
                                      "max_tokens": req.max_completion_tokens or req.max_tokens or config.answer_tokens,
                                      "max_completion_tokens": None})

    async def events(self, run: Run, *, tool_deltas: bool = False) -> AsyncIterator[Event]:
        """A :class:`ReasoningDelta` per memory update as it is written, then the answer's events (content
        and, with ``tool_deltas``, tool-call deltas as they are decoded), then :class:`Done`."""
        req, notes = run.req, list[str]()
        updates: asyncio.Queue[str] = asyncio.Queue()

        def on_step(step: Step, total: int) -> None:
            if step.kind == "memory":
                notes.append(memory_note(step))
                updates.put_nowait(notes[-1])

        if run.question is None:
            reading = read_document(self.engine, None, run.document, run.config, on_step=on_step, seed=req.seed)
        else:
            reading = read_memory(self.engine, run.question, run.document, run.config, on_step=on_step, seed=req.seed)
        read = asyncio.ensure_future(reading)
        try:
            async for note in _as_written(read, updates):
                yield ReasoningDelta(note)
            try:
                done = read.result()
            except InputError as exc:  # the request's document or question: the client's to fix
                raise APIError(400, first_line(str(exc)), param="messages") from None
            except ValueError as exc:  # a model reply the read could not use (e.g. JSON that does not parse)
                yield Done(_unreadable(exc, "".join(notes)))
                return
        finally:
            read.cancel()  # a disconnect (the generator closed) stops the read
        if isinstance(done, Result):
            yield Done(_reply(done, run.config, "".join(notes)))
            return
        answer_req = self._answer_request(req, done.question, done.memory, run.config)
        t0 = time.perf_counter()
        prepared = await self.answerer.prepare(answer_req)
        async for event in prepared.events(tool_deltas=tool_deltas):
            yield event if not isinstance(event, Done) else \
                Done(_answered(done, event.reply, run.config, "".join(notes), time.perf_counter() - t0))


async def _as_written(read: asyncio.Future, updates: asyncio.Queue[str]) -> AsyncIterator[str]:
    """Each memory note as the read writes it, until the read has ended and every note was sent."""
    while not read.done() or not updates.empty():
        getter = asyncio.ensure_future(updates.get())
        await asyncio.wait({getter, read}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            yield getter.result()
        else:
            getter.cancel()


def _answered(read: MemoryRead, answer: Reply, config: AgentConfig, reasoning: str, seconds: float) -> Reply:
    """The engine's answer as the memory agent's reply: usage and trace over the whole read."""
    step = Step(step=len(read.steps), kind="answer", chunk_index=None, char_start=None, char_end=None,
                memory=read.memory, prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens,
                finish_reason=answer.finish_reason, seconds=round(seconds, 4))
    steps = [*read.steps, step]
    answer.prompt_tokens = sum(s.prompt_tokens for s in steps)
    answer.completion_tokens = sum(s.completion_tokens for s in steps)
    answer.reasoning = reasoning
    prediction = extract_answer(answer.content, config.answer_style, config.strict_extraction) \
        if answer.content else None
    answer.extra = {"memagent": {"steps": [asdict(s) for s in steps], "n_chunks": read.n_chunks,
                                 "context_tokens": read.context_tokens, "truncated": read.truncated,
                                 "prediction": prediction}}
    return answer


def _unreadable(exc: ValueError, reasoning: str) -> Reply:
    """The reply of a read whose model wrote what the read could not use: never the client's error (a 400)
    nor the server's (a 5xx), but an empty answer whose ``memagent.error`` says what failed, as the batch
    job's error row does."""
    return Reply("", "stop", 0, 0, extra={"memagent": {"error": f"agent: {first_line(str(exc))}"}},
                 reasoning=reasoning)


def _content(result: Result, config: AgentConfig) -> str:
    """An extraction's whole object in the user's schema's shape (records nested where the schema has them)."""
    schema = config.extraction
    assert schema is not None
    try:
        doc = json.loads(result.response or "")
    except ValueError:
        return result.response  # cut at max_tokens: finish_reason says so
    records = {name: [getattr(r, "values", r) for r in found] for name, found in (result.records or {}).items()}
    return json.dumps(schema.assemble(doc if isinstance(doc, dict) else {}, records), ensure_ascii=False, default=str)


def _reply(result: Result, config: AgentConfig, reasoning: str) -> Reply:
    answer = result.steps[-1]
    trace: dict[str, Any] = {"steps": [asdict(s) for s in result.steps], "n_chunks": result.n_chunks,
                             "context_tokens": result.context_tokens, "truncated": result.truncated,
                             "prediction": result.prediction}
    if result.records is not None:
        trace["records"] = {name: [asdict(r) if not isinstance(r, dict) else r for r in rows]
                            for name, rows in result.records.items()}
    return Reply(_content(result, config), answer.finish_reason, sum(s.prompt_tokens for s in result.steps),
                 sum(s.completion_tokens for s in result.steps), extra={"memagent": trace}, reasoning=reasoning)
