"""The memory agent: read a document chunk by chunk, overwriting a fixed-size memory, then answer.

    memory = "No previous memory"
    for chunk in chunks(document):                        # K calls, each with a bounded prompt
        memory = LLM(question, memory, chunk)             # the reply *is* the new memory
    answer = LLM(question, memory)                        # no document text in the last call

With ``memory_heads = K > 1`` (:mod:`memagent.heads`) the memory is K labelled heads: each update sees
them all and rewrites the least recently updated one (at most memory_tokens // K tokens), the others
carried verbatim.

With an extraction schema that has record types, each chunk also gets one records call per type
(:mod:`memagent.extraction.reading`): the records that chunk states, emitted per step and merged
after the read (``Result.records``), never carried in the memory.

One coroutine per document; the engine batches the calls of all documents in flight. The
same function serves batch jobs, evaluation and RL rollouts (``keep_completions`` keeps the
token ids and log-probs of every conversation for training).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Awaitable, Callable

from memagent.chunking import Chunk, ChunkedDocument, chunk_document
from memagent.config import AgentConfig
from memagent.engines.base import Completion, Engine, SamplingParams
from memagent.extraction.groups import FieldGroup
from memagent.extraction.reading import ChunkRecords, Emitted, RecordsCall, RecordsTally, finish_records, \
    read_step_records
from memagent.extraction.records import Record
from memagent.extraction.answer_bounds import cut_values
from memagent.extraction.group_answers import answer_groups, reply_object
from memagent.heads import initial_memory, last_updated, records_memory, update_request, written_memory
from memagent.prompts import extract_answer, final_answer_messages
# check_config and template_overhead live beside the window check; imported from here by the jobs and the CLI.
from memagent.window_check import check_config, group_tokens, template_overhead  # noqa: F401


class InputError(ValueError):
    """A document/question the agent cannot read; the message names the field and what was expected."""


class ResumeMismatch(InputError):
    """A resume state that is not a state of this document cut with this config."""


@dataclass
class Step:
    """One conversation of a read. ``kind`` is "memory" (one per chunk) or "answer" (the last).

    For memory steps, ``char_start:char_end`` is the chunk's span in the original text and
    ``memory`` the memory written from it. For the answer step both are None / the memory read.
    """

    step: int
    kind: str
    chunk_index: int | None
    char_start: int | None
    char_end: int | None
    memory: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    seconds: float
    # Prompt-lookup speculation (0 when the engine did not speculate): tokens drafted for this
    # reply and how many of them the model kept.
    draft_tokens: int = 0
    accepted_tokens: int = 0


@dataclass(frozen=True)
class ReadState:
    """A read after ``len(steps)`` memory updates: what a reader needs to go on from there.

    ``next_chunk`` is the position (in the document's list of chunks) of the first chunk not yet
    read, ``char_offset`` where that chunk starts in the text (the document's length once every
    chunk is read; a check that the document is cut the same way on resume), ``memory`` the
    memory the next conversation reads, ``steps`` the memory steps so far; with record types, the
    records the chunks so far stated (``records``) and the records calls' tally (``records_tally``).
    """

    next_chunk: int
    char_offset: int
    memory: str
    steps: tuple[Step, ...]
    records: tuple[Emitted, ...] = ()
    records_tally: RecordsTally = field(default_factory=RecordsTally)


@dataclass
class Result:
    """Everything one read produced."""

    prediction: str | None
    response: str
    memory: str
    steps: list[Step]
    n_chunks: int
    context_tokens: int
    truncated: bool
    completions: list[Completion] | None = field(default=None, repr=False)
    resumed_at_chunk: int | None = None  # the chunk position a checkpoint resumed the read at (None: from the start)
    # Record types (extraction): the document's records per type, merged across chunks, and what the
    # records calls split, left unread, found invalid or (require_grounding) dropped; the records dropped
    # at the end as incomplete, one line each (reading.finish_records).
    records: dict[str, list[Record]] | None = None
    records_tally: RecordsTally = field(default_factory=RecordsTally)
    records_incomplete: list[str] = field(default_factory=list)
    # A wide schema's leaves whose group reply broke even alone, one ``path: why`` each (group_answers).
    unanswered: list[str] = field(default_factory=list)
    # Final-answer values that reached a bound their call's budget set: kept, one ``path: what`` each.
    values_cut: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("completions")
        return d


def validate_inputs(question: object, context: object) -> tuple[str, str]:
    """Check a (question, context) pair; raise :class:`InputError` saying what is wrong."""
    if question is None or not isinstance(question, str) or not question.strip():
        raise InputError(f"question must be a non-empty string, got {_describe(question)}")
    if context is None or not isinstance(context, str):
        raise InputError(f"context must be a string, got {_describe(context)}")
    if not context.strip():
        raise InputError("context is empty (only whitespace): there is nothing to read")
    return question.strip(), context


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, str):
        return "an empty string" if not value.strip() else repr(value[:40])
    return f"a value of type {type(value).__name__}"


def _step(n: int, kind: str, chunk: Chunk | None, memory: str, c: Completion, seconds: float) -> Step:
    return Step(
        step=n,
        kind=kind,
        chunk_index=chunk.index if chunk else None,
        char_start=chunk.char_start if chunk else None,
        char_end=chunk.char_end if chunk else None,
        memory=memory,
        prompt_tokens=c.prompt_tokens,
        completion_tokens=c.completion_tokens,
        finish_reason=c.finish_reason,
        seconds=round(seconds, 4),
        draft_tokens=c.draft_tokens,
        accepted_tokens=c.accepted_tokens,
    )


async def read_document(
    engine: Engine,
    question: str | None,
    context: str,
    config: AgentConfig,
    *,
    on_step: Callable[[Step, int], None] | None = None,
    keep_completions: bool = False,
    logprobs: bool = False,
    resume: ReadState | None = None,
    on_state: Callable[[ReadState], Awaitable[None]] | None = None,
    chunked: ChunkedDocument | None = None,
    seed: int | None = None,
) -> Result:
    """Read ``context`` with the memory agent and answer ``question``. With ``config.extraction`` (a schema)
    the question is its field list (pass ``question=None``) and ``Result.response`` one JSON object under
    it (typed by :func:`memagent.extraction.extraction_columns`).

    Args:
        engine: any :class:`Engine`; its tokenizer cuts the chunks.
        config: budgets, answer style, decoding and the prompt templates (``config.prompts``).
        on_step: called after each conversation with (step, total conversations): progress bars.
        keep_completions: keep every conversation's token ids (RL rollouts).
        logprobs: ask the engine for behaviour log-probs (RL rollouts).
        resume: a state an earlier read of the same document with the same config handed to
            ``on_state``: the read goes on from its next chunk with its memory and trace, and
            ends as the uninterrupted read would have (greedy decoding in fp32: token for token).
        on_state: awaited after each memory update with the read's state (checkpoints).
        chunked: ``context`` already chunked with ``config.chunk_tokens`` and ``config.max_chunks`` by
            ``engine.tokenizer`` (a caller that counted its tokens): not tokenized again.
        seed: every conversation's sampling seed (a seeded request samples the same read; None: the
            engine's shared RNG).

    Raises:
        InputError: empty/missing question or context, a question over ``query_tokens``, or a
            ``resume`` state that does not fit this document's chunks.
    """
    read, doc = await _read_chunks(engine, _question(question, config), context, config, on_step=on_step,
                                   keep_completions=keep_completions, logprobs=logprobs, resume=resume,
                                   on_state=on_state, chunked=chunked, seed=seed)
    reply = await read.answer()  # answer = LLM(question, memory): no document text
    return read.result(reply, doc, resume.next_chunk if resume is not None else None, keep_completions)


@dataclass
class MemoryRead:
    """A document read into the memory, not answered yet (:func:`read_memory`)."""

    question: str
    memory: str
    steps: list[Step]  # the memory updates
    n_chunks: int
    context_tokens: int
    truncated: bool


async def read_memory(engine: Engine, question: str, context: str, config: AgentConfig, *,
                      on_step: Callable[[Step, int], None] | None = None, seed: int | None = None) -> MemoryRead:
    """Read ``context`` into the memory for ``question`` and stop before the final answer: for a caller that
    asks the final answer its own way (the served ``memagent`` model: the engine's model answers from the
    memory with the client's tools, stop strings, seed, logprobs and response format). Not for extraction
    (its answer is the schema's calls). Raises :class:`InputError` as :func:`read_document` does."""
    if config.extraction is not None:
        raise ValueError("read_memory reads for a question; an extraction's answer is read_document's")
    read, doc = await _read_chunks(engine, question, context, config, on_step=on_step, seed=seed)
    return MemoryRead(read.question, read.state.memory, read.steps, len(doc.chunks), doc.context_tokens,
                      doc.truncated)


async def _read_chunks(engine: Engine, question: str | None, context: str, config: AgentConfig, *,
                       on_step: Callable[[Step, int], None] | None = None, keep_completions: bool = False,
                       logprobs: bool = False, resume: ReadState | None = None,
                       on_state: Callable[[ReadState], Awaitable[None]] | None = None,
                       chunked: ChunkedDocument | None = None, seed: int | None = None
                       ) -> tuple[_Read, ChunkedDocument]:
    """The read after every memory update (read_document's arguments), and the document's chunks."""
    question, context = validate_inputs(question, context)
    n_question = len(engine.tokenizer(question, add_special_tokens=False)["input_ids"])
    if n_question > config.query_tokens:
        raise InputError(f"question is {n_question} tokens, over query_tokens={config.query_tokens}; "
                         "shorten it or raise query_tokens")
    # Tokenizing a long document is CPU work: off the event loop the other documents share.
    doc = chunked if chunked is not None else await asyncio.to_thread(
        chunk_document, engine.tokenizer, context, config.chunk_tokens, config.max_chunks)
    if resume is not None:
        check_resume(resume, doc.chunks, len(context), config.memory_heads)
    start = resume or ReadState(next_chunk=0, char_offset=0, memory=initial_memory(config.memory_heads), steps=())
    read = _Read(engine, config, question, context, doc.chunks, start, logprobs, keep_completions, on_step, seed)
    for k in range(read.state.next_chunk, len(doc.chunks)):
        await read.update(k)  # memory = LLM(question, memory, chunk): overwrite, never append
        if on_state:
            await on_state(read.state)
    return read, doc


def _question(question: str | None, config: AgentConfig) -> str | None:
    """The question every call asks: an extraction's field list, else the caller's."""
    schema = config.extraction
    if schema is None:
        return question
    if question is not None:
        raise ValueError("config.extraction is set: the schema's field list is the question; pass question=None")
    return schema.memory_question(config.answer_tokens)


class _Read:
    """One read's running state: the memory, the trace, the records found; one method per conversation."""

    def __init__(self, engine: Engine, config: AgentConfig, question: str, context: str, chunks: list[Chunk],
                 state: ReadState, logprobs: bool, keep_completions: bool,
                 on_step: Callable[[Step, int], None] | None, seed: int | None = None):
        self.engine, self.config, self.question, self.context, self.chunks = engine, config, question, context, chunks
        self.state, self.on_step = state, on_step
        self.steps = list(state.steps)
        self.records_call = _records_call(engine, question, config)  # None: no record types
        self.found = ChunkRecords(list(state.records), replace(state.records_tally))
        self.params = SamplingParams(config.memory_tokens, config.temperature, config.top_p, logprobs, seed=seed,
                                     call="memory")
        # Each reply may carry its prompt's token ids (hf: ~36 bytes a token): kept only when asked for
        # (a long document would otherwise hold every prompt's ids until its answer).
        self.completions: list[Completion] = []
        self.keep = self.completions.append if keep_completions else (lambda _: None)
        self.unanswered: list[str] = []
        self.values_cut: list[str] = []

    def _record(self, kind: str, chunk: Chunk | None, memory: str, reply: Completion, t0: float) -> None:
        self.steps.append(_step(len(self.steps), kind, chunk, memory, reply, time.perf_counter() - t0))
        self.keep(reply)
        if self.on_step:
            schema = self.config.extraction  # a wide schema's final answer is one call per field group
            answers = len(schema.field_groups(self.config.answer_tokens)) if schema and schema.fields else 1
            self.on_step(self.steps[-1], len(self.chunks) + answers)

    async def update(self, k: int) -> None:
        """Chunk ``k``'s memory update, and its records calls beside it (record types)."""
        t0, chunk, memory = time.perf_counter(), self.chunks[k], self.state.memory
        n, heads = len(self.steps), self.config.memory_heads
        priority = -(len(self.chunks) - k + 1)  # the document with most conversations left goes first
        messages, params, head = update_request(self.question, memory, chunk.text, n, self.config, self.params)
        update = asyncio.ensure_future(self.engine.chat(messages, replace(params, priority=priority)))

        async def written() -> str:  # what a split piece's records call reads
            return written_memory(memory, (await update).text, heads, head, n)

        reply, records = await asyncio.gather(update, read_step_records(
            self.records_call, self.steps, memory, self.context, self.chunks, k, priority, written,
            lambda m: records_memory(m, heads)))
        memory = written_memory(memory, reply.text, heads, head, n)
        self._record("memory", chunk, memory, reply, t0)
        self.found.add(records)
        nxt = self.chunks[k + 1].char_start if k + 1 < len(self.chunks) else len(self.context)
        self.state = ReadState(next_chunk=k + 1, char_offset=nxt, memory=memory, steps=tuple(self.steps),
                               records=tuple(self.found.emitted), records_tally=replace(self.found.tally))

    def result(self, reply: Completion, doc: ChunkedDocument, resumed_at: int | None, keep_completions: bool) -> Result:
        """The read's :class:`Result`, ``reply`` its answer (its records merged once the document is read)."""
        config = self.config
        records, tally, incomplete = (finish_records(config.extraction, self.found) if self.records_call
                                      else (None, self.found.tally, []))
        return Result(
            prediction=extract_answer(reply.text, config.answer_style, config.strict_extraction),
            response=reply.text, memory=self.state.memory, steps=self.steps, n_chunks=len(doc.chunks),
            context_tokens=doc.context_tokens, truncated=doc.truncated,
            completions=self.completions if keep_completions else None, resumed_at_chunk=resumed_at,
            records=records, records_tally=tally, records_incomplete=incomplete, unanswered=self.unanswered,
            values_cut=self.values_cut)

    async def answer(self) -> Completion:
        """The final answer from the memory alone; none for a schema of record types only (``{}``). A schema's
        fields are answered in groups (:meth:`ExtractionSchema.field_groups`, one group when they fit), merged
        into one object, each call's grammar bounded to its budget (:mod:`memagent.extraction.answer_bounds`)."""
        schema, config = self.config.extraction, self.config
        if schema is not None and not schema.fields:
            return Completion(text="{}", prompt_tokens=0, completion_tokens=0, finish_reason="stop")
        if schema is not None:
            return await self._group_answers(schema.field_groups(config.answer_tokens))
        t0 = time.perf_counter()
        messages = final_answer_messages(self.question, self.state.memory, config.answer_style, config.instruction,
                                         config.prompts, None)
        params = SamplingParams(config.answer_tokens, config.temperature, config.top_p, self.params.logprobs,
                                priority=-1, call="answer", seed=self.params.seed)
        reply = await self.engine.chat(messages, params)
        self._record("answer", None, self.state.memory, reply, t0)
        return reply

    async def _group_answers(self, groups: tuple[FieldGroup, ...]) -> Completion:
        """One constrained final call per field group, all reading the final memory (one answer step per call,
        the groups in order, then any halves of a group whose reply broke: :mod:`memagent.extraction.group_answers`);
        the reply is the merged object, the leaves left out kept in ``self.unanswered``, the values cut at
        the bound of their call's budget in ``self.values_cut``. A single group is asked as the whole schema
        (the memory's question, the schema's format sentence)."""
        schema, config = self.config.extraction, self.config
        assert schema is not None
        t0 = time.perf_counter()
        cuts: dict[int, list[str]] = {}

        async def ask(group: FieldGroup) -> Completion:
            whole = group.fields == schema.fields
            messages = final_answer_messages(self.question if whole else schema.question(group), self.state.memory,
                                             config.answer_style, config.instruction, config.prompts,
                                             schema.answer_instruction(None if whole else group))
            user, bounded = schema.answer_schemas(group, config.answer_tokens)
            reply = await self.engine.chat(messages, SamplingParams(
                config.answer_tokens, config.temperature, config.top_p, self.params.logprobs, priority=-1,
                seed=self.params.seed, json_schema=json.dumps(bounded, ensure_ascii=False), call="answer"))
            obj = reply_object(reply)
            cuts[id(reply)] = [] if obj is None else cut_values(user, bounded, obj, "", config.answer_tokens)
            return reply

        answers = await answer_groups(ask, groups, config.answer_tokens)
        for reply in answers.replies:
            self._record("answer", None, self.state.memory, reply, t0)
        self.unanswered = list(answers.unanswered)
        self.values_cut = [c for r in answers.replies for c in cuts.get(id(r), [])]
        return Completion(text=json.dumps(answers.merged, ensure_ascii=False),
                          prompt_tokens=sum(r.prompt_tokens for r in answers.replies),
                          completion_tokens=sum(r.completion_tokens for r in answers.replies),
                          finish_reason=answers.broken[-1].finish_reason if answers.broken else "stop")


def _records_call(engine: Engine, question: str, config: AgentConfig) -> RecordsCall | None:
    """The records calls of a read whose schema has record types (a reply has the memory's budget); None: none."""
    schema = config.extraction
    if schema is None or not schema.record_types:
        return None
    params = SamplingParams(config.memory_tokens, config.temperature, config.top_p, call="records")
    return RecordsCall(engine, schema, question, params, config.instruction, config.prompts, config.require_grounding,
                       config.ground_elsewhere, group_tokens(config, engine, question))


def check_resume(state: ReadState, chunks: list[Chunk], text_len: int, heads: int = 1) -> None:
    """Refuse a resume state that is not a state of this document cut into these chunks (nor, with K > 1 heads,
    a memory of K labelled heads)."""
    if heads > 1:
        try:
            last_updated(state.memory, heads)
        except ValueError as e:
            raise ResumeMismatch(f"the resume state's memory does not fit memory_heads={heads}: {e}") from None
    n = len(chunks)
    where = chunks[state.next_chunk].char_start if state.next_chunk < n else text_len
    if state.next_chunk > n or state.char_offset != where or len(state.steps) != state.next_chunk:
        raise ResumeMismatch(f"the resume state (next chunk {state.next_chunk}, char {state.char_offset}, "
                         f"{len(state.steps)} steps) is not a state of this document ({n} chunks)")
