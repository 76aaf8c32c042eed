"""Grounding records where they were read: each value's span in the text its call read, or through the memory.

A value of a record (:func:`ground_chunk`) is grounded

- in the **window** its call read (the chunk piece and the rest of the sentence it cuts), or
- through the **memory**, for every kind of value: the memory the call read holds it (a string as
  written, case- and space-insensitive: an alias ``the Carrier`` resolved to ``Harlow Freight Ltd``;
  a number as a number and a date as a date, however either is spelled: an invoice's amount and
  issue date carried from the chunk that stated them to the one that states its settlement), and
  the span is where the read met it, inside the chunk of the first memory step whose memory
  holds it (:class:`MemoryTrail`; labelled ``memory``, kept under ``require_grounding``).

Elsewhere in the document is searched only on request (``elsewhere``: ``AgentConfig.ground_elsewhere``),
since it costs a scan of the whole document for every value the window lacks; a value found only
there is labelled ``elsewhere`` (never ``exact``): small numbers, years and common names occur
somewhere in a long document, so such a match proves nothing. By default such a value has no span.
With ``require_grounding`` it counts as not found either way: free values (string, date, number,
integer, array items; not enum labels or booleans, which the schema bounds) without a span are
removed, and a record is dropped when a key value is not found in the window (a text key: or
through the memory, an alias) or when no value at all lies in the window (the passage does not
state it); both are counted.

The values of one record are placed in one sentence (:func:`anchored`): a payer named on many lines
of a table takes the line that holds the record's other values.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from memagent.extraction.grounding import FUZZY_THRESHOLD, Span, locate, occurrences
from memagent.extraction.kinds import ITEM_KIND, KINDS, FieldKind
from memagent.extraction.parse import RecordType

ALIASED_KINDS = ("string", "string_array")  # a key carried by the memory identifies a record as a name only

SENTENCE_END = re.compile(r"\n|[.!?](?=\s)|[。！？]")  # a line break, or a sentence's last character


def one_sentence(text: str, spans: Sequence[Span]) -> bool:
    """The spans lie in one sentence (no sentence end between the first start and the last end)."""
    lo, hi = min(s.start for s in spans), max(s.end for s in spans)
    return SENTENCE_END.search(text, lo, max(lo, hi - 1)) is None


def _sentence(text: str, pos: int, lo: int, hi: int) -> tuple[int, int]:
    """The bounds of the sentence holding ``pos`` inside ``[lo, hi)``."""
    start = lo
    for m in SENTENCE_END.finditer(text, max(lo, pos - 2000), pos):
        start = m.end()
    m = SENTENCE_END.search(text, pos, hi)
    return start, (m.end() if m else hi)


def anchored(leaf: Mapping[str, tuple[FieldKind, Any]], spans: dict[str, Span | None], text: str,
             window: tuple[int, int], trail: MemoryTrail | None = None) -> dict[str, Span | None]:
    """A record's window spans moved into one sentence when the first occurrences do not share one (a
    payer named on many lines of a table): the sentence holding the most of its values wins (the
    earliest among equals), and every value takes its occurrence there. A value not written there was
    resolved from elsewhere (an alias): its span is where the read met it (memory) when the memory
    holds it, else its first occurrence in the window."""
    here = {p: s for p, s in spans.items() if s is not None and s.where == "window" and s.method != "fuzzy"}
    if len(here) < 2 or one_sentence(text, list(here.values())):
        return spans
    occ = {path: occurrences(*leaf[path], text, window) or [here[path]] for path in here}
    held: dict[tuple[int, int], set[str]] = {}
    for path, os in occ.items():
        for o in os:
            held.setdefault(_sentence(text, o.start, *window), set()).add(path)
    lo, hi = max(held, key=lambda b: (len(held[b]), -b[0]))
    out = dict(spans)
    for path, os in occ.items():
        inside = [o for o in os if lo <= o.start and o.end <= hi]
        kind, value = leaf[path]
        if inside:
            out[path] = inside[0] if inside[0].start != here[path].start else here[path]
        elif trail is not None and (via := trail.locate(ITEM_KIND.get(kind, kind), value, text)) is not None:
            out[path] = via
    return out


def _leaf_values(record: RecordType, values: Mapping[str, Any]) -> dict[str, tuple[FieldKind, Any]]:
    """``path -> (kind, value)`` of every leaf of a record, array items one each (``tags.0``)."""
    out: dict[str, tuple[FieldKind, Any]] = {}
    for path, spec, value in record.leaves(values):
        if spec.kind == "string_array" and isinstance(value, list):
            out.update({f"{path}.{i}": (spec.kind, item) for i, item in enumerate(value)})
        else:
            out[path] = (spec.kind, value)
    return out


# -- records ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryTrail:
    """What a records call's memory can show: the memory it read, and the memory steps behind it as
    ``(memory written, char_start, char_end of the chunk it was written from)`` in step order."""

    memory: str = ""
    steps: tuple[tuple[str, int, int], ...] = ()

    def locate(self, kind: FieldKind, value: Any, text: str) -> Span | None:
        """The value's span where the read met it, when the memory the call read holds it (an alias
        resolved through the memory): inside the chunk of the first memory step that holds it, or the
        chunk before (a sentence the boundary cut, finished by that step). Every kind: a carried value
        is compared as its kind (numbers and dates by value), never fuzzily; the chunk must state it too,
        so a memory that merely happens to hold a number proves nothing by itself."""
        if not self.memory or locate(kind, value, self.memory, fuzzy=False) is None:
            return None
        for i, (memory, start, end) in enumerate(self.steps):
            if locate(kind, value, memory, fuzzy=False) is not None:
                lo = self.steps[i - 1][1] if i > 0 else start
                span = locate(kind, value, text, (lo, end), fuzzy=False, document=False)
                if span is not None:
                    return Span(span.start, span.end, span.method, span.score, "memory")
        return None


@dataclass
class GroundedChunk:
    """One chunk's records after grounding: ``spans[i]`` maps record ``i``'s leaf paths (``a.b``; array
    items ``tags.0``) to their :class:`Span` or None; the drops are counted, never silent."""

    records: list[dict[str, Any]] = field(default_factory=list)
    spans: list[dict[str, Span | None]] = field(default_factory=list)
    dropped_values: int = 0
    dropped_records: int = 0


def _drop(values: dict[str, Any], path: str) -> None:
    *parents, last = path.split(".")
    node = values
    for p in parents:
        node = node.get(p) or {}
    node.pop(last, None)


def ground_value(kind: FieldKind, value: Any, text: str, window: tuple[int, int], trail: MemoryTrail | None,
                 *, elsewhere: bool = False, threshold: float = FUZZY_THRESHOLD) -> Span | None:
    """One record value's span: in the window, else through the memory, else (``elsewhere``) anywhere in
    the document, labelled so (see the module docstring); None when not found."""
    span = locate(kind, value, text, window, threshold=threshold, document=False)
    if span is None:
        span = _cut_at_start(kind, value, text, window)
    if span is None and trail is not None:
        span = trail.locate(ITEM_KIND.get(kind, kind), value, text)
    if span is None and elsewhere:
        found = locate(kind, value, text, threshold=threshold)
        span = Span(found.start, found.end, found.method, found.score, "elsewhere") if found else None
    return span


def _cut_at_start(kind: FieldKind, value: Any, text: str, window: tuple[int, int]) -> Span | None:
    """The value written across the window's start (``37837|8376.35``: the boundary cut the number), found in
    the sentence that start cuts: the call read its rest, the memory steps its beginning. Only a match that spans
    the boundary counts (one wholly before it was the chunk before's to read)."""
    lo = window[0]
    if lo <= 0 or lo >= window[1]:
        return None
    # From the sentence's start, or 200 characters back: an abbreviation's period (``Mar. 28, 20|20``) is no
    # sentence end, and a hit must cross the boundary anyway.
    start = min(_sentence(text, lo, 0, window[1])[0], max(0, lo - 200))
    hits = occurrences(kind, value, text, (start, min(window[1], lo + 200))) if start < lo else []
    return next((h for h in hits if h.start < lo < h.end), None)


def _grounded(span: Span | None) -> bool:
    return span is not None and span.where != "elsewhere"


def _identifies(span: Span | None, kind: FieldKind) -> bool:
    """A key value identifies its record where it was read: in the window, or through the memory as a name
    (an alias). A number or a date the memory carries grounds a value, never a key: a record made up of a
    key stated elsewhere would otherwise pass (a date a memory's unfinished line holds)."""
    return span is not None and (span.where == "window" or span.where == "memory" and kind in ALIASED_KINDS)


def ground_chunk(record: RecordType, records: Sequence[Mapping[str, Any]], text: str,
                 window: tuple[int, int], *, trail: MemoryTrail | None = None, require_grounding: bool = False,
                 elsewhere: bool = False, threshold: float = FUZZY_THRESHOLD) -> GroundedChunk:
    """Spans of every value of the records one call emitted after reading ``text[window[0]:window[1]]``;
    ``elsewhere``: a value the window and the memory lack is searched for in the whole document.

    With ``require_grounding``: a record is dropped when a key value does not identify it (the window; a text
    key also the memory: :func:`_identifies`) or no value lies in the window; an ungrounded free value is
    removed from its record (an array loses the item); both counted.
    """
    out = GroundedChunk()
    for rec in records:
        values = _copy(rec)
        leaves = {path: kv for path, kv in _leaf_values(record, values).items()
                  if kv[1] is not None and KINDS[ITEM_KIND.get(kv[0], kv[0])].grounded}
        # What require_grounding drops is never searched for elsewhere: the search would be wasted.
        spans = {path: ground_value(kind, value, text, window, trail, elsewhere=elsewhere and not require_grounding,
                                    threshold=threshold) for path, (kind, value) in leaves.items()}
        spans = anchored(leaves, spans, text, window, trail)
        ungrounded = [(path, leaves[path][0]) for path, span in spans.items() if not _grounded(span)]
        if require_grounding:
            keys = set(record.key)
            if any(not _identifies(spans[p], leaves[p][0]) for p in keys if p in spans) \
                    or not any(s and s.where == "window" for s in spans.values()):
                out.dropped_records += 1
                continue
            drop = [(w, kd) for w, kd in ungrounded if KINDS[ITEM_KIND.get(kd, kd)].droppable]
            for where, kind in sorted(drop, key=lambda t: _item_order(t[0]), reverse=True):
                _remove(values, where, kind)
                spans.pop(where, None)
                out.dropped_values += 1
            spans = _renumber(spans, values, record)
        out.records.append(values)
        out.spans.append(spans)
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    return list(value) if isinstance(value, list) else value


def _item_order(path: str) -> tuple[str, int]:
    head, _, tail = path.rpartition(".")
    return (head, int(tail)) if tail.isdigit() else (path, -1)


def _remove(values: dict[str, Any], where: str, kind: FieldKind) -> None:
    head, _, tail = where.rpartition(".")
    if kind == "string_array" and tail.isdigit():
        node = values
        for p in head.split(".")[:-1]:
            node = node.get(p) or {}
        items = node.get(head.split(".")[-1])
        if isinstance(items, list) and int(tail) < len(items):
            items.pop(int(tail))
    else:
        _drop(values, where)


def _renumber(spans: dict[str, Span | None], values: dict[str, Any], record: RecordType) -> dict[str, Span | None]:
    """Array item spans keyed by the items' positions after some were dropped."""
    out: dict[str, Span | None] = {}
    for path, spec, value in record.leaves(values):
        if spec.kind == "string_array":
            kept = [s for w, s in spans.items() if w.rpartition(".")[0] == path and w.rpartition(".")[2].isdigit()]
            out.update({f"{path}.{i}": s for i, s in enumerate(kept[: len(value or [])])})
        elif path in spans:
            out[path] = spans[path]
    return out
