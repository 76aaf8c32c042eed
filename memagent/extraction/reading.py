"""Reading records per chunk: one constrained call per record type, grounded, split when it overflows.

For each chunk the memory agent reads (:func:`memagent.agent.read_document` with a schema that has
record types), :func:`read_chunk_records` asks once per record type for the records that chunk
states, a JSON array under :meth:`ExtractionSchema.records_schema` (``SamplingParams.json_schema``),
given the memory the chunk's update reads. The prompt is the memory update's up to its chunk, then
the records request (:func:`memagent.prompts.records_messages`): the two calls share their prefix.

A reply cut at its budget (``finish_reason`` "length") or one that is not a valid array is never
truncated or guessed at: the text is split in two halves (at a whitespace near the middle) and
each half (cut at the paragraph, line, sentence or word break nearest the middle) is read
again with the same memory, recursively down to :data:`MIN_SPLIT_CHARS`; every
split is counted. A piece still failing at that size yields no records and is counted as failed.

A sentence cut by a chunk boundary is read whole, once (:func:`records_reach`): a chunk's records
call reads on past its end to the end of the sentence the boundary cuts (at most
:data:`TAIL_CHARS`), and the next chunk's call drops a record whose values grounded in its
window all lie in that finished sentence (the earlier call owned it). The chunk text itself
stays the memory update's, so the two calls still share their prefix.

Each record is grounded in the piece's char window (:func:`ground_chunk`) and kept as a
:class:`~memagent.extraction.records.Mention` of its step; records are never written into the
memory. :func:`merge_mentions` merges a read's mentions per record type.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Protocol, Sequence

from memagent.engines.base import Engine, SamplingParams
from memagent.extraction.grounding import Span, ground_chunk
from memagent.extraction.output import _validator
from memagent.extraction.records import Mention, Record, merge_records
from memagent.extraction.schema import ExtractionSchema
from memagent.prompts import PromptTemplates, parse_json_answer, records_messages, strip_thinking

MIN_SPLIT_CHARS = 64  # a piece this short is not split again
TAIL_CHARS = 400  # how far a records call reads past its chunk to finish a cut sentence
_SENTENCE_END = re.compile(r"\n|[.!?](?=\s)|[。！？]")  # a line break, or a sentence's last character


class HasCharSpan(Protocol):
    char_start: int
    char_end: int


def sentence_end(text: str, pos: int, limit: int) -> int:
    """Where the sentence that ``pos`` cuts ends: ``pos`` itself when a sentence or line ends there
    (or at the text's end), else after the first sentence end in ``(pos, min(limit, pos + TAIL_CHARS)]``,
    else ``pos`` (no end near: the cut stays where it is)."""
    if pos <= 0 or pos >= len(text):
        return pos
    m = _SENTENCE_END.search(text, pos - 1, min(limit, pos + TAIL_CHARS, len(text)))
    return m.end() if m is not None else pos


def records_reach(text: str, chunks: Sequence[HasCharSpan], k: int) -> tuple[int, int, int]:
    """``(start, owned_from, end)``: chunk ``k``'s records call reads ``text[start:end]`` (the chunk and the
    rest of the sentence its end cuts) and leaves out the records whose values grounded in that text
    all lie before ``owned_from`` (the end of the sentence its start cuts, read whole by the call before).

    Each boundary's sentence end is computed the same way from both sides, so the owned parts
    ``[owned_from, end)`` of consecutive chunks tile the text. A boundary where chunks are not
    contiguous (the middle dropped by ``max_chunks``) is not crossed.
    """
    c = chunks[k]
    owned_from = c.char_start
    if k > 0 and chunks[k - 1].char_end == c.char_start:
        owned_from = sentence_end(text, c.char_start, c.char_end)
    end = c.char_end
    if k + 1 < len(chunks) and chunks[k + 1].char_start == c.char_end:
        end = sentence_end(text, c.char_end, chunks[k + 1].char_end)
    return c.char_start, owned_from, end


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
class ChunkRecords:
    """What the records calls of one chunk produced, or (summed with :meth:`add`) of a read so far:
    carried in :class:`memagent.agent.ChainState`, never in the memory."""

    emitted: list[Emitted] = field(default_factory=list)
    splits: int = 0  # pieces split in two because a reply overflowed or did not parse
    failed: int = 0  # pieces of MIN_SPLIT_CHARS or less whose reply still failed (no records from them)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    dropped_values: int = 0  # require_grounding: values not found in the document, removed from their record
    dropped_records: int = 0  # require_grounding: records whose key values were not all found

    def add(self, other: ChunkRecords) -> None:
        self.emitted += other.emitted
        self.splits += other.splits
        self.failed += other.failed
        self.dropped_values += other.dropped_values
        self.dropped_records += other.dropped_records
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens


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


def _parse(schema: ExtractionSchema, name: str, text: str) -> list[dict[str, Any]] | None:
    """The reply as a list of records valid under the records schema, or None."""
    try:
        obj = parse_json_answer(strip_thinking(text))
    except ValueError:
        return None
    if not isinstance(obj, list) or any(True for _ in _validator(schema.records_schema_json(name)).iter_errors(obj)):
        return None
    return obj


_BREAKS = ("\n\n", "\n", ". ", "。", " ")  # preferred cuts: paragraph, line, sentence, word


def split_point(text: str) -> int:
    """Where to cut ``text`` in two: after the break nearest the middle, paragraphs before lines before
    sentences before words, within the middle half; the middle itself when there is none."""
    mid, lo, hi = len(text) // 2, len(text) // 4, 3 * len(text) // 4
    for sep in _BREAKS:
        best = None
        i = text.find(sep, lo)
        while i != -1 and i + len(sep) <= hi:
            if best is None or abs(i + len(sep) - mid) < abs(best - mid):
                best = i + len(sep)
            i = text.find(sep, i + 1)
        if best is not None and 0 < best < len(text):
            return best
    return mid


async def _read_piece(call: RecordsCall, name: str, memory: str, context: str, start: int, end: int,
                      step: int, priority: int, owned_from: int) -> ChunkRecords:
    """The records of type ``name`` in ``context[start:end]``; halves re-read when the reply fails. A record
    whose values grounded in the window all lie before ``owned_from`` is the call before's (:func:`records_reach`)."""
    text = context[start:end]
    messages = records_messages(call.question, memory, text, call.schema.records_instruction(name),
                                call.instruction, call.prompts)
    params = replace(call.params, json_schema=call.schema.records_schema_json(name), priority=priority)
    reply = await call.engine.chat(messages, params)
    out = ChunkRecords(prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens)
    records = _parse(call.schema, name, reply.text) if reply.finish_reason != "length" else None
    if records is None:
        if end - start <= MIN_SPLIT_CHARS:
            out.failed += 1
            return out
        cut = start + split_point(text)
        out.splits += 1
        halves = await asyncio.gather(*(_read_piece(call, name, memory, context, a, b, step, priority, owned_from)
                                        for a, b in ((start, cut), (cut, end))))
        for h in halves:
            out.add(h)
        return out
    grounded = ground_chunk(call.schema.record_type(name), records, context, (start, end),
                            require_grounding=call.require_grounding)
    out.dropped_values, out.dropped_records = grounded.dropped_values, grounded.dropped_records
    for values, spans in zip(grounded.records, grounded.spans):
        # Only spans in this window count (a name resolved through the memory may be grounded chunks
        # before), and all of them must lie in the finished sentence: one value that also occurs
        # there (a bank, a date) does not make a later sentence's record the call before's.
        here = [s.start for s in spans.values() if s is not None and start <= s.start < end]
        if not here or max(here) >= owned_from:
            out.emitted.append(Emitted(name, Mention(step, values, _plain_spans(spans))))
    return out


def _plain_spans(spans: Mapping[str, Span | None]) -> dict[str, tuple[int, int] | None]:
    return {k: (s.start, s.end) if s is not None else None for k, s in spans.items()}


async def read_chunk_records(call: RecordsCall, memory: str, context: str, start: int, end: int, step: int,
                             priority: int = 0, owned_from: int | None = None) -> ChunkRecords:
    """Every record type's records in ``context[start:end]`` (memory step ``step``), concurrently; those
    grounded only before ``owned_from`` are left to the call before (:func:`records_reach`)."""
    owned = start if owned_from is None else owned_from
    parts = await asyncio.gather(*(_read_piece(call, r.name, memory, context, start, end, step, priority, owned)
                                   for r in call.schema.record_types))
    out = ChunkRecords()
    for p in parts:  # record-type order, then piece order: deterministic
        out.add(p)
    return out


def merge_mentions(schema: ExtractionSchema, emitted: Sequence[Emitted]) -> dict[str, list[Record]]:
    """The document's records per record type (:func:`merge_records`, the rule in its module)."""
    return {r.name: merge_records(r, [e.mention for e in emitted if e.record_type == r.name])
            for r in schema.record_types}
