"""Reading records per chunk: one constrained call per group of record types, grounded, split when it overflows.

For each chunk the memory agent reads (:func:`memagent.agent.read_document` with a schema that has
record types), :func:`read_chunk_records` asks once per group of record types
(:mod:`memagent.extraction.record_groups`; a group of one type: a JSON array under
:meth:`ExtractionSchema.records_schema`, ``SamplingParams.json_schema``) for the records that chunk
states, given the memory the chunk's update reads. A group's type whose reply overflows is read alone,
as below. The prompt is the memory update's up to its chunk, then
the records request (:func:`memagent.prompts.records_messages`): the two calls share their prefix.

**Overflow.** A reply cut at its budget (``finish_reason`` "length"), one that fills the call's
limit (:data:`~memagent.extraction.schema.RECORDS_PER_CALL` records: there may be more), or one
that is not a JSON array is never taken as complete: the piece is split in two (at the paragraph,
line, sentence or word break nearest the middle) and each part is read again with the same memory,
recursively, at most :data:`MAX_SPLIT_DEPTH` times and down to :data:`MIN_SPLIT_CHARS`. Every split
is counted. A piece still overflowing there is counted as failed (its records may be missing; the
records of a full, valid reply are kept). A reply that **runs away** is a model failure, counted as
failed and runaway, never split again: it repeats itself (:func:`repeats_itself`), or most of the
records it completed before overflowing are not in the piece (:func:`runs_away`: splitting a
passage does not stop a model that writes records the passage does not state).

**Validation per item.** Each item is validated on its own against the record type's item schema
(formats included): an invalid item is dropped and counted (``invalid_items``), its neighbours kept.

A sentence cut by a boundary (a chunk's end, or a split point) is read whole, once
(:func:`records_reach`): the earlier call reads on to the end of that sentence (at most
:data:`TAIL_CHARS`), and the later call drops a record whose values grounded in its window all lie
in that finished sentence (the earlier call owned it), unless its own part states each of them again.

Each record is grounded where it was read (:func:`~memagent.extraction.record_grounding.ground_chunk`: the
piece's window, or through the memory for an alias) and kept as a
:class:`~memagent.extraction.records.Mention` of its step; records are never written into the
memory. :func:`merge_mentions` merges a read's mentions per record type.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field, fields, replace
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence

from memagent.engines.base import Completion, Engine, SamplingParams
from memagent.extraction.grounding import Span
from memagent.extraction.pieces import (  # noqa: F401
    TAIL_CHARS, HasCharSpan, Piece, halves, records_reach, sentence_end, split_point,
)
from memagent.extraction.record_groups import RecordGroup, read_group_reply
from memagent.extraction.record_grounding import MemoryTrail, ground_chunk
from memagent.extraction.records import Mention, Record, merge_records
from memagent.extraction.schema import RECORDS_PER_CALL, ExtractionSchema
from memagent.prompts import PromptTemplates, parse_json_answer, records_messages, strip_thinking

MIN_SPLIT_CHARS = 64  # a piece this short is not split again
MAX_SPLIT_DEPTH = 6  # a chunk's records call becomes at most 2**6 pieces (a 5,000-token chunk: ~350 characters each)
RUNAWAY_RECORDS = 3  # dropped records that make an overflowing reply a runaway (runs_away)
LOOP_MAX_PERIOD = 200  # characters: the longest unit a looping reply is checked for
LOOP_MIN_CHARS = 64  # a repeated tail shorter than this is not a loop


@dataclass(frozen=True)
class Emitted:
    """One record one chunk stated: its type and the mention (values and their spans as ``(start, end)``)."""

    record_type: str
    mention: Mention

    def to_json(self) -> dict[str, Any]:
        m = self.mention
        return {"type": self.record_type, "step": m.step, "values": dict(m.values),
                "spans": {k: (list(v) if v is not None else None) for k, v in m.spans.items()}}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Emitted:
        spans = {k: (tuple(v) if v is not None else None) for k, v in dict(data["spans"]).items()}
        return Emitted(str(data["type"]), Mention(int(data["step"]), dict(data["values"]), spans))


@dataclass
class RecordsTally:
    """What a read's records calls did besides emitting records; carried whole (read state, checkpoint
    segments, result, output row, job summary), summed with :meth:`add`."""

    splits: int = 0  # pieces split in two: the reply was cut, filled the call's limit, or did not parse
    failed: int = 0  # pieces left (partly) unread: still overflowing at the size or depth limit, or running away
    runaway: int = 0  # of ``failed``: the reply looped or listed records the piece does not state (never split)
    invalid_items: int = 0  # records dropped because they did not validate against the item schema
    dropped_values: int = 0  # require_grounding: values not found where the record was read, removed
    dropped_records: int = 0  # require_grounding: records whose key values (or all values) were not found there
    incomplete: int = 0  # merged records dropped at the document's end: a required value never stated (or grounded)
    calls: int = 0  # records calls made (a group's, a type read alone, each split piece's)
    prompt_tokens: int = 0  # their prompt tokens, as the engine counted them
    completion_tokens: int = 0  # their reply tokens

    def add(self, other: RecordsTally) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class ChunkRecords:
    """What the records calls of one chunk produced, or (summed with :meth:`add`) of a read so far:
    carried in :class:`memagent.agent.ReadState`, never in the memory."""

    emitted: list[Emitted] = field(default_factory=list)
    tally: RecordsTally = field(default_factory=RecordsTally)

    @staticmethod
    def of_call(completion: Completion) -> ChunkRecords:
        """Nothing found yet, one call counted with its tokens."""
        return ChunkRecords(tally=RecordsTally(calls=1, prompt_tokens=completion.prompt_tokens,
                                               completion_tokens=completion.completion_tokens))

    def add(self, other: ChunkRecords) -> None:
        self.emitted += other.emitted
        self.tally.add(other.tally)


@dataclass(frozen=True)
class RecordsCall:
    """The fixed parts of one document's records calls."""

    engine: Engine
    schema: ExtractionSchema
    question: str
    params: SamplingParams
    instruction: str | None = None
    prompts: PromptTemplates | None = None
    require_grounding: bool = False  # AgentConfig.require_grounding: drop what is not found in the text, counted
    ground_elsewhere: bool = False  # AgentConfig.ground_elsewhere: search the whole document for what the window lacks
    group_tokens: int | None = None  # a group call's reply budget (group_reply_tokens); None: params' (one type's)


@dataclass(frozen=True)
class ChunkRead:
    """One chunk's records calls: the memory they read (and the memory steps behind it), the document, the step.

    ``written_memory`` awaits the memory written from this chunk (its ``chunk`` span): a split piece reads that
    memory, so names the chunk defines before the piece (an alias) are known to it, joined with the lines
    of the memory before the chunk that the update dropped (:func:`joined_memory`: a half record the
    chunk completed leaves a memory-keeping reader's memory, yet a later piece must join it).
    """

    call: RecordsCall
    trail: MemoryTrail
    context: str
    step: int
    priority: int = 0
    written_memory: Callable[[], Awaitable[str]] | None = None
    chunk: tuple[int, int] = (0, 0)

    async def memory_for(self, piece: Piece) -> MemoryTrail:
        """The memory a piece's call reads (see the class docstring) and the memory steps that ground through it."""
        if piece.depth == 0 or self.written_memory is None:
            return self.trail
        memory = await self.written_memory()
        return MemoryTrail(joined_memory(self.trail.memory, memory), (*self.trail.steps, (memory, *self.chunk)))


def joined_memory(before: str, after: str) -> str:
    """``after`` (the memory written from a chunk), then the lines of ``before`` (the memory the chunk was read
    with) that ``after`` no longer holds, in their order."""
    kept = set(after.splitlines())
    dropped = [line for line in before.splitlines() if line.strip() and line not in kept]
    return "\n".join([after, *dropped]) if dropped else after


@dataclass(frozen=True)
class RecordsReply:
    """A records reply read: its valid items (None: no JSON array), whether it overflowed (cut at its
    budget, or as many items as the call allows), and how many items failed validation."""

    items: list[dict[str, Any]] | None
    overflow: bool
    invalid: int = 0


def read_reply(schema: ExtractionSchema, name: str, reply: Completion, limit: int = RECORDS_PER_CALL) -> RecordsReply:
    """The records of one reply, validated item by item (see the module docstring)."""
    if reply.finish_reason == "length":
        return RecordsReply(None, True)
    try:
        obj = parse_json_answer(strip_thinking(reply.text))
    except ValueError:
        return RecordsReply(None, False)
    if not isinstance(obj, list):
        return RecordsReply(None, False)
    valid, invalid = schema.valid_records(name, obj)
    return RecordsReply(valid, len(obj) >= limit, invalid)


def repeats_itself(text: str, max_period: int = LOOP_MAX_PERIOD, min_chars: int = LOOP_MIN_CHARS) -> bool:
    """The text ends in a loop: its last ``max(min_chars, len/3)`` characters repeat one unit of at most
    ``max_period`` characters, at least three times (periodic: ``t[i] == t[i - p]`` throughout)."""
    tail = max(min_chars, len(text) // 3)
    if len(text) < tail:
        return False
    for period in range(1, min(max_period, tail // 3) + 1):
        if text[len(text) - tail:] == text[len(text) - tail - period:len(text) - period]:
            return True
    return False


def complete_items(text: str) -> list[Any]:
    """The items a JSON array cut anywhere completed before the cut (``[{...}, {...}, {"pa`` -> two)."""
    start = text.find("[")
    if start < 0:
        return []
    decoder, pos, out = json.JSONDecoder(), start + 1, []
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            item, pos = decoder.raw_decode(text, pos)
        except ValueError:
            return out
        out.append(item)


def runs_away(read: ChunkRead, name: str, piece: Piece, text: str, trail: MemoryTrail) -> bool:
    """An overflowing reply most of whose completed records, three at least, are not where it read them (a record
    dropped by grounding): the model writes what the passage does not state, and a smaller passage will not stop
    it. Fewer are no verdict: a record whose sentence this passage only finishes (stated before it) is dropped
    here too, so one invention beside it would lose the passage's real records unread; the piece is split
    instead (its halves' replies fit, and grounding drops the invention there)."""
    schema = read.call.schema
    items, _ = schema.valid_records(name, [x for x in complete_items(strip_thinking(text)) if isinstance(x, dict)])
    if not items:
        return False
    grounded = ground_chunk(schema.record_type(name), items, read.context, (piece.start, piece.end), trail=trail,
                            require_grounding=True)
    return grounded.dropped_records >= RUNAWAY_RECORDS and 2 * grounded.dropped_records > len(items)


async def _ask(read: ChunkRead, name: str, piece: Piece, trail: MemoryTrail) -> Completion:
    call = read.call
    messages = records_messages(call.question, trail.memory, read.context[piece.start:piece.end],
                                call.schema.records_instruction(name), call.instruction, call.prompts)
    params = replace(call.params, json_schema=call.schema.records_schema_json(name), priority=read.priority)
    return await call.engine.chat(messages, params)


async def _read_piece(read: ChunkRead, name: str, piece: Piece) -> ChunkRecords:
    """The records of type ``name`` in ``piece``; its halves re-read when the reply overflows (module docstring)."""
    trail = await read.memory_for(piece)
    completion = await _ask(read, name, piece, trail)
    out = ChunkRecords.of_call(completion)
    reply = read_reply(read.call.schema, name, completion)
    # Grounding searches the document (CPU work): off the event loop the other documents share.
    if reply.items is not None and not reply.overflow:
        await asyncio.to_thread(_emit, read, name, piece, reply, out, trail)
        return out
    runaway = repeats_itself(completion.text) or await asyncio.to_thread(runs_away, read, name, piece,
                                                                          completion.text, trail)
    if runaway or piece.end - piece.start <= MIN_SPLIT_CHARS or piece.depth >= MAX_SPLIT_DEPTH:
        out.tally.failed += 1
        out.tally.runaway += int(runaway)
        if reply.items is not None and not runaway:  # a full reply at the limit: its records are real
            await asyncio.to_thread(_emit, read, name, piece, reply, out, trail)
        return out
    out.tally.splits += 1
    for part in await asyncio.gather(*(_read_piece(read, name, p) for p in halves(read.context, piece))):
        out.add(part)
    return out


def _emit(read: ChunkRead, name: str, piece: Piece, reply: RecordsReply, out: ChunkRecords, trail: MemoryTrail) -> None:
    """Ground a reply's records in the piece and keep those the piece owns."""
    call = read.call
    grounded = ground_chunk(call.schema.record_type(name), reply.items or [], read.context, (piece.start, piece.end),
                            trail=trail, require_grounding=call.require_grounding, elsewhere=call.ground_elsewhere)
    out.tally.invalid_items += reply.invalid
    out.tally.dropped_values += grounded.dropped_values
    out.tally.dropped_records += grounded.dropped_records
    for values, spans in zip(grounded.records, grounded.spans):
        # Only spans in this window count (a name resolved through the memory lies chunks before), and
        # all of them must lie in the finished sentence: one value that also occurs there (a bank, a
        # date) does not make a later sentence's record the call before's.
        here = [s.start for s in spans.values() if s is not None and s.where == "window"]
        if here and max(here) < piece.owned_from:
            spans = _restated(read, name, piece, values, spans, trail)
        if spans is not None:
            out.emitted.append(Emitted(name, Mention(read.step, values, _plain_spans(spans))))


def _restated(read: ChunkRead, name: str, piece: Piece, values: dict[str, Any], spans: Mapping[str, Span | None],
              trail: MemoryTrail) -> Mapping[str, Span | None] | None:
    """A record grounded only in the finished sentence: its spans where the piece's own part states every one
    of those values again (the same record restated, e.g. a correction reverted: a later statement, so it
    counts), else None (the call before read it)."""
    call = read.call
    owned = ground_chunk(call.schema.record_type(name), [values], read.context, (piece.owned_from, piece.end),
                         trail=trail)
    again = owned.spans[0]
    stated = [p for p, s in spans.items() if s is not None and s.where == "window"]
    if all(again.get(p) is not None and again[p].where == "window" for p in stated):
        return again
    return None


def _plain_spans(spans: Mapping[str, Span | None]) -> dict[str, tuple[int, int, str] | None]:
    return {k: (s.start, s.end, s.grounding) if s is not None else None for k, s in spans.items()}


async def _read_group(read: ChunkRead, names: tuple[str, ...], piece: Piece) -> ChunkRecords:
    """The records of the types ``names`` in ``piece``, one call for them all (a single type: :func:`_read_piece`).

    The types whose arrays the reply closed are complete; the one it was writing when cut, or whose array filled
    the call's limit, overflowed and is read alone (split by piece as a single type is); the types after it are
    asked again as a group, unless the cut reply loops (:func:`repeats_itself`: the rest are read alone, each
    call at the memory's budget). A reply that closed no array is asked again in two halves of the types."""
    if len(names) == 1:
        return await _read_piece(read, names[0], piece)
    call, group = read.call, RecordGroup(names)
    trail = await read.memory_for(piece)
    messages = records_messages(call.question, trail.memory, read.context[piece.start:piece.end],
                                call.schema.group_records_instruction(group), call.instruction, call.prompts)
    params = replace(call.params, max_tokens=call.group_tokens or call.params.max_tokens, json_schema=call.schema.group_records_schema_json(group),
                     priority=read.priority)
    completion = await call.engine.chat(messages, params)
    out = ChunkRecords.of_call(completion)
    reply = read_group_reply(group, strip_thinking(completion.text))
    alone: list[str] = []
    for name, items in reply.arrays.items():
        if len(items) >= RECORDS_PER_CALL:  # full: there may be more
            alone.append(name)
            continue
        valid, invalid = call.schema.valid_records(name, items)
        await asyncio.to_thread(_emit, read, name, piece, RecordsReply(valid, False, invalid), out, trail)
    rest = tuple(n for n in names if n not in reply.arrays)
    if rest and completion.finish_reason == "length" and repeats_itself(completion.text):
        alone += rest  # a looping model would loop again over the whole budget: the rest read alone, bounded
        rest = ()
    elif rest and reply.arrays:  # the first unfinished type overflowed: alone; the others as a group again
        alone.append(rest[0])
        rest = rest[1:]
    parts = [_read_piece(read, n, piece) for n in alone]
    if rest:
        mid = len(rest) // 2 if not reply.arrays else len(rest)  # no progress: halve the types
        parts += [_read_group(read, g, piece) for g in (rest[:mid], rest[mid:]) if g]
    for part in await asyncio.gather(*parts):
        out.add(part)
    return out


async def read_chunk_records(read: ChunkRead, start: int, end: int, owned_from: int | None = None) -> ChunkRecords:
    """Every record type's records in ``context[start:end]`` (memory step ``read.step``): one call per group of
    types (:meth:`ExtractionSchema.record_groups`), concurrently; those grounded only before ``owned_from`` are
    left to the call before (:func:`records_reach`)."""
    piece = Piece(start, start if owned_from is None else owned_from, end)
    groups = read.call.schema.record_groups(read.call.group_tokens or read.call.params.max_tokens)
    parts = await asyncio.gather(*(_read_group(read, g.names, piece) for g in groups))
    out = ChunkRecords()
    for p in parts:  # group order (record-type order), then piece order: deterministic
        out.add(p)
    return out


class MemoryStep(Protocol):
    """A step of the read so far, as records reading sees it (:class:`memagent.agent.Step`)."""

    kind: str
    memory: str
    char_start: int | None
    char_end: int | None


async def read_step_records(call: RecordsCall | None, steps: Sequence[MemoryStep], memory: str, context: str,
                            chunks: Sequence[HasCharSpan], k: int, priority: int,
                            written_memory: Callable[[], Awaitable[str]],
                            shown: Callable[[str], str] = lambda memory: memory) -> ChunkRecords:
    """The records chunk ``k`` states (none without record types), read with the memory its update reads
    (and the memory steps behind it, which ground a value resolved through the memory); a split piece
    reads the memory ``written_memory`` awaits (the update's). Every memory is read as ``shown`` makes it
    (K heads: without labels, :func:`memagent.heads.records_memory`, so a label's digits ground nothing)."""
    if call is None:
        return ChunkRecords()
    trail = MemoryTrail(shown(memory), tuple((shown(s.memory), s.char_start or 0, s.char_end or 0) for s in steps
                                             if s.kind == "memory"))

    async def written() -> str:
        return shown(await written_memory())

    start, owned_from, end = records_reach(context, chunks, k)
    read = ChunkRead(call, trail, context, len(steps), priority, written, (chunks[k].char_start, chunks[k].char_end))
    return await read_chunk_records(read, start, end, owned_from)


def merge_mentions(schema: ExtractionSchema, emitted: Sequence[Emitted]) -> dict[str, list[Record]]:
    """The document's records per record type (:func:`merge_records`, the rule in its module)."""
    return {r.name: merge_records(r, [e.mention for e in emitted if e.record_type == r.name])
            for r in schema.record_types}


def finish_records(schema: ExtractionSchema, found: ChunkRecords) -> tuple[dict[str, list[Record]], RecordsTally,
                                                                           list[str]]:
    """A whole read's records, its tally and what it dropped as incomplete, once the document is read.

    Mentions stay pending while the document is read (a record's values may be stated chunks apart, in
    any order); merged here, a record still lacking a required value (never stated, or removed by
    ``require_grounding``) is dropped, never written with null: ``tally.incomplete`` counts them, and
    each is one ``type[i]: incomplete record dropped, lacks a, b`` line (``i``: its place among the merged
    records). Invariant: every record returned passes its item in the user's schema.
    """
    merged = merge_mentions(schema, found.emitted)
    tally = replace(found.tally)
    notes: list[str] = []
    out: dict[str, list[Record]] = {}
    for name, records in merged.items():
        out[name] = []
        for i, rec in enumerate(records):
            lacks = schema.incomplete_fields(name, rec.values)
            if lacks:
                tally.incomplete += 1
                notes.append(f"{name}[{i}]: incomplete record dropped, lacks {', '.join(lacks)}")
            else:
                out[name].append(rec)
    return out, tally, notes
