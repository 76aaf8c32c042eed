"""Checkpoints as data: a :class:`memagent.agent.ReadState` (a read's state) stored as a checkpoint log of segments.

The memory agent's whole state after chunk ``k`` is small and textual: the memory written from
it, where the next chunk starts, and the trace so far. :func:`memagent.agent.read_document`
takes one (``resume=``) and hands one out after each memory update (``on_state=``); this
module turns states into stored segments and back. Where they are kept (beside a batch output:
``pipelines.checkpoints``) is the caller's business.

A state is kept as a *log of segments*: each holds only the steps since the previous one, so
a checkpoint of a 700-chunk document costs the same few KB at chunk 10 and at chunk 690, and
the log read back in order is the state. With record types a segment also holds the records its
chunks stated (``records``), so a resumed document keeps them. Reading is defensive: the log is
data from disk.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, ValidationError

from memagent.agent import ReadState, Step
from memagent.extraction.reading import Emitted, RecordsTally

TALLY_FIELDS = frozenset(f.name for f in fields(RecordsTally))
FORMAT = 2  # bump when a segment's fields change meaning; an older log is then ignored, never misread


class SegmentStep(BaseModel):
    """One memory step, as a segment stores it (``memagent.agent.Step``, validated)."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0)
    kind: str
    chunk_index: int | None
    char_start: int | None
    char_end: int | None
    memory: str
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    finish_reason: str
    seconds: float
    draft_tokens: int = Field(0, ge=0)
    accepted_tokens: int = Field(0, ge=0)


class SegmentRecord(BaseModel):
    """One record a chunk of the segment stated (record types: :class:`memagent.extraction.reading.Emitted`)."""

    model_config = ConfigDict(extra="forbid")

    type: str
    step: int = Field(ge=0)
    values: dict[str, Any]
    spans: dict[str, tuple[int, int, str | None] | None]  # (char_start, char_end, grounding)


class Segment(BaseModel):
    """One checkpoint: the steps ``[first_step, first_step + len(steps))`` and the state after them.

    ``key`` identifies what the read reads (the batch job: the row's input fingerprint, which
    covers question, context, model and agent config); a log whose key differs is stale.
    """

    model_config = ConfigDict(extra="forbid")

    format: int
    id: str
    key: str
    # The writer: one read of the row (a retried task, a zombie attempt or a rerun each take a new one),
    # and the attempt whose segment this one continues (None: its own, or the log's start).
    attempt: str = ""
    parent: str | None = None
    first_step: int = Field(ge=0)
    steps: list[SegmentStep]
    next_chunk: int = Field(ge=0)
    char_offset: int = Field(ge=0)
    memory: str
    # Record types: the records the segment's chunks stated, and the records calls' tally after them.
    records: list[SegmentRecord] = []
    records_tally: dict[str, NonNegativeInt] = {}


class BadSegment(ValueError):
    """A segment that is not one (torn, hand-edited, another format); the message says what is wrong."""


def new_segment(row_id: str, key: str, state: ReadState, first_step: int, *, attempt: str = "",
                parent: str | None = None) -> dict[str, Any]:
    """The segment (JSON-able) that takes a log holding ``first_step`` steps to ``state``, written by
    ``attempt`` after a segment of ``parent`` (None: after its own, or at the start)."""
    if not 0 <= first_step <= len(state.steps):
        raise ValueError(f"first_step {first_step} outside the state's {len(state.steps)} steps")
    return dict(format=FORMAT, id=row_id, key=key, attempt=attempt, parent=parent, first_step=first_step,
                steps=[asdict(s) for s in state.steps[first_step:]], next_chunk=state.next_chunk,
                char_offset=state.char_offset, memory=state.memory,
                records=[e.to_json() for e in state.records if e.mention.step >= first_step],
                records_tally=state.records_tally.to_dict())


def parse_segment(data: bytes | str) -> Segment:
    """Validate one stored segment; raise :class:`BadSegment` naming the first problem."""
    try:
        seg = Segment.model_validate_json(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "the segment"
        raise BadSegment(f"{where}: {err['msg']}") from None
    if seg.format != FORMAT:
        raise BadSegment(f"format {seg.format}, this version reads format {FORMAT}")
    for i, s in enumerate(seg.steps):
        if s.step != seg.first_step + i or s.kind != "memory":
            raise BadSegment(f"steps.{i}: expected memory step {seg.first_step + i}, got {s.kind} step {s.step}")
    unknown = sorted(set(seg.records_tally) - TALLY_FIELDS)
    if unknown:
        raise BadSegment(f"records_tally.{unknown[0]}: not a count of the records tally")
    for i, r in enumerate(seg.records):
        if not seg.first_step <= r.step < seg.first_step + len(seg.steps):
            raise BadSegment(f"records.{i}: step {r.step} is not a step of the segment")
    return seg


def _end(seg: Segment) -> int:
    """The step after the segment's last: where a segment continuing it starts."""
    return seg.first_step + len(seg.steps)


def _continues(seg: Segment) -> str:
    """The writer whose segments ``seg`` continues: its ``parent``, else its own ``attempt``."""
    return seg.parent if seg.parent is not None else seg.attempt


Writer = tuple[int, str]  # (step, attempt): a writer's segments at a step, as the segments continuing it name it


def resume_path(segments: Sequence[Segment]) -> tuple[list[Segment], list[Segment]]:
    """The resume path: the longest run of segments from step 0 that one writer after another wrote, and the rest.

    Two attempts at one row (a retried task while the first still runs) may both write from the same
    step; each segment names its writer and the writer it continued, so the log is a tree and a resume
    path is one path down it: ``seg`` follows ``prev`` when it starts at ``prev``'s end and continues
    ``prev.attempt``. Ties go to the path whose attempts sort first (a prefix sorts first), then to
    the one a walk of the log in its order meets first: every reader picks the same.

    Iterative and O(n log n) in the log's segments, so no log is too long to resume (one segment per
    step of a 20,000-chunk document included); a segment of no steps is never on a path (it would
    follow itself) and is returned in the rest.
    """
    usable = [i for i, s in enumerate(segments) if s.steps]
    children: dict[Writer, list[int]] = {}  # (step, writer) -> the segments continuing it there, in log order
    for i in usable:
        children.setdefault((segments[i].first_step, _continues(segments[i])), []).append(i)
    reach = _reach(segments, usable, children)
    roots = [i for i in usable if segments[i].first_step == 0]
    if not roots:
        return [], list(segments)
    end = max(reach[i] for i in roots)
    layers = _least_attempts(segments, [i for i in roots if reach[i] == end], children, reach, end)
    best = [segments[i] for i in _first_in_log_order(segments, layers, children)]
    on_path = {id(s) for s in best}  # by identity: two equal segments are two files
    return best, [s for s in segments if id(s) not in on_path]


def _tip(seg: Segment) -> Writer:
    """The writer a segment continuing ``seg`` names: ``seg``'s end, by ``seg``'s attempt."""
    return _end(seg), seg.attempt


def _reach(segments: Sequence[Segment], usable: list[int], children: dict[Writer, list[int]]) -> dict[int, int]:
    """For each usable segment, the furthest step a path through it ends at.

    A path's steps grow, so taking segments from the last ``first_step`` down finds every
    continuation of a segment done before the segment itself."""
    reach: dict[int, int] = {}
    beyond: dict[Writer, int] = {}  # (step, writer) -> the furthest end of a path continuing it there
    for i in sorted(usable, key=lambda i: -segments[i].first_step):
        seg = segments[i]
        reach[i] = max(_end(seg), beyond.get(_tip(seg), -1))
        key = (seg.first_step, _continues(seg))
        beyond[key] = max(beyond.get(key, -1), reach[i])
    return reach


def _least_attempts(segments: Sequence[Segment], first: list[int], children: dict[Writer, list[int]],
                    reach: dict[int, int], end: int) -> list[list[int]]:
    """Layer ``k``: the ``k``-th segments of the paths to ``end`` whose attempts sort first.

    Greedy, one position at a time: the least attempt among the continuations that still reach
    ``end``. A prefix sorts before its extensions, so the first layer holding a segment ending at
    ``end`` is the last (and keeps only those). Each (step, writer) is expanded once: two layers
    holding one would make a path with two segments ending at the same step.
    """
    layer = _least(segments, first)
    layers = [layer]
    while not any(_end(segments[i]) == end for i in layer):
        tips = dict.fromkeys(_tip(segments[i]) for i in layer)
        layer = _least(segments, [c for t in tips for c in children.get(t, ()) if reach[c] == end])
        layers.append(layer)
    layers[-1] = [i for i in layer if _end(segments[i]) == end]
    return layers


def _least(segments: Sequence[Segment], candidates: list[int]) -> list[int]:
    """The candidates (non-empty) whose attempt sorts first."""
    low = min(segments[i].attempt for i in candidates)
    return [i for i in candidates if segments[i].attempt == low]


def _first_in_log_order(segments: Sequence[Segment], layers: list[list[int]],
                        children: dict[Writer, list[int]]) -> list[int]:
    """The path through ``layers`` (one segment per layer, each continuing the one before) that a
    depth-first walk of the log in its order meets first: the least log position at each layer
    among the segments that lead on to the last layer."""
    leads = [set(layers[-1])]
    for layer in reversed(layers[:-1]):
        wanted = {(segments[c].first_step, _continues(segments[c])) for c in leads[-1]}
        leads.append({i for i in layer if _tip(segments[i]) in wanted})
    leads.reverse()
    path = [min(leads[0])]
    for ok in leads[1:]:
        path.append(min(c for c in children[_tip(segments[path[-1]])] if c in ok))
    return path


def replay(segments: Sequence[Segment], row_id: str, key: str) -> tuple[ReadState | None, str | None]:
    """The state a log of segments (in step order) ends in, and why any part of it was not used.

    Returns ``(None, reason)`` for a log of another row or key (stale: the input or the config
    changed since it was written); otherwise the state of the longest prefix of segments that
    follow each other without a gap (``reason`` says where it stopped, or is None).
    """
    last: Segment | None = None  # the state is built once, from the last segment used: linear in the log
    steps: list[Step] = []
    records: list[Emitted] = []
    for seg in segments:
        if seg.id != row_id or seg.key != key:
            return None, "written for another input or config (stale)"
        if seg.first_step != len(steps):
            return _state(last, steps, records), (f"a gap: a segment starts at step {seg.first_step}, "
                                                  f"the log holds {len(steps)} step(s)")
        steps.extend(Step(**s.model_dump()) for s in seg.steps)
        records.extend(Emitted.from_json(r.model_dump()) for r in seg.records)
        last = seg
    return _state(last, steps, records), None


def _state(last: Segment | None, steps: list[Step], records: list[Emitted]) -> ReadState | None:
    """The state after ``last``, the log read up to it holding ``steps`` and ``records`` (None: no segment)."""
    if last is None:
        return None
    return ReadState(next_chunk=last.next_chunk, char_offset=last.char_offset, memory=last.memory,
                     steps=tuple(steps), records=tuple(records), records_tally=RecordsTally(**last.records_tally))
