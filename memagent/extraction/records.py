"""Merging the records each chunk emitted into one list per record type: pure and deterministic.

Input: :class:`Mention` s, the records one chunk's call returned (its step, the record's values,
the char span of each value: :func:`memagent.extraction.record_grounding.ground_chunk`). Output:
:class:`Record` s. **The rule**, per record type:

- Mentions are taken in step order (stable: within a step, in the order the reply listed them).
- **With a key** (``x-key``): mentions whose key values are equal after normalisation are one
  record. Strings compare case-folded with whitespace runs as one space (and compatibility
  forms folded: full-width letters); numbers by value (``1250`` = ``1250.0`` = ``"1,250.00"``);
  dates by value (``2021-03-14`` = ``March 14, 2021``). A mention with a key value missing or empty
  is a record of its own (it cannot be identified; it is kept, not dropped).
- A field (a leaf: ``amount``, ``address.city``; an array of strings as a whole) takes a later
  mention's value only when that mention states it (not null, not absent, not ``[]``) and it
  differs from the current value after normalisation; it then takes that mention's step and span
  as well, and the value it replaces goes to the record's ``conflicts`` (with its own evidence), so
  a disagreement is never silent: an amendment and a second record that shares the key look
  alike, and the user decides which it was. An equal restatement keeps the first value, as first
  written, and its evidence. So an amendment in a later chunk replaces what it changes and
  nothing else.
- ``mentions`` counts the merged mentions; ``first_chunk``/``last_chunk`` are the least and
  greatest step among them. Records come out in the order their first mention was emitted.
- **A default key** (the record type holds child types but names no ``x-key``: its first required scalar ties
  the children to it, :mod:`memagent.extraction.resolve`) is no identity by itself: a mention joins the first
  record of its key whose stated values it agrees with (none differs), else it is a record of its own. Seven
  citations that share only ``year`` stay seven; a later mention adding a value to one of them joins it.
- **Without a key**: every mention is a record, except that an exact duplicate of an earlier
  record of the same step (equal values, as JSON) is dropped and counted in that record's
  ``mentions``. Equal records of different chunks are kept: nothing says they are one.

The same mentions in any order of steps give the same records (one sort by step, no hashing of
unordered sets into the output).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from memagent.extraction.grounding import Span
from memagent.extraction.kinds import KINDS
from memagent.extraction.parse import FieldSpec, RecordType


@dataclass(frozen=True)
class Mention:
    """One record as one chunk's reply stated it: ``spans`` maps leaf paths (``a.b``, items ``tags.0``)
    to ``(char_start, char_end[, grounding])`` or a :class:`~memagent.extraction.grounding.Span` (None: not
    found)."""

    step: int
    values: Mapping[str, Any]
    spans: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Evidence:
    """Where one field's value came from: the step that stated it, its char span (None: not found) and how
    it was grounded (:attr:`memagent.extraction.grounding.Span.grounding`: ``exact``, ``normalised``,
    ``fuzzy`` in the window read, ``memory``, ``elsewhere``; None: not found, or not recorded)."""

    step: int
    char_start: int | None = None
    char_end: int | None = None
    grounding: str | None = None


@dataclass(frozen=True)
class Conflict:
    """A value a mention stated for a field of a record that the record does not keep (a later mention
    stated another): the value and where it was stated."""

    field: str
    value: Any
    evidence: Evidence


@dataclass
class Record:
    """One merged record: its values (nested as the schema), per-leaf evidence and mention counts."""

    type: str
    values: dict[str, Any]
    evidence: dict[str, Evidence]
    mentions: int
    first_chunk: int
    last_chunk: int
    conflicts: list[Conflict] = field(default_factory=list)

    def evidence_rows(self) -> list[dict[str, Any]]:
        """``[{"field", "step", "char_start", "char_end", "grounding"}]`` sorted by field path (a list column's rows)."""
        return [{"field": k, "step": e.step, "char_start": e.char_start, "char_end": e.char_end,
                 "grounding": e.grounding} for k, e in sorted(self.evidence.items())]

    def conflict_rows(self) -> list[dict[str, Any]]:
        """``[{"field", "value", "step", "char_start", "char_end"}]`` in the order the values were replaced;
        ``value`` is JSON text."""
        return [{"field": c.field, "value": json.dumps(c.value, ensure_ascii=False, default=str),
                 "step": c.evidence.step, "char_start": c.evidence.char_start, "char_end": c.evidence.char_end}
                for c in self.conflicts]


def _stated(value: Any) -> bool:
    return value is not None and value != [] and value != ""


def record_key(record: RecordType, values: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The normalised key of a record's values, or None (no key, or a key value missing or empty)."""
    if not record.key:
        return None
    out = []
    for name in record.key:
        spec = record.field(name)
        value = values.get(name)
        if not _stated(value) or not isinstance(spec, FieldSpec):
            return None
        out.append(KINDS[spec.kind].normalise(value))
    return tuple(out)


def _span(value: Any) -> tuple[int | None, int | None, str | None]:
    """``(char_start, char_end, grounding)`` of a stored span (a :class:`Span`, a 2- or 3-tuple, a mapping)."""
    if isinstance(value, Span):
        return value.start, value.end, value.grounding
    if isinstance(value, (tuple, list)) and len(value) in (2, 3):
        return value[0], value[1], (value[2] if len(value) == 3 else None)
    if isinstance(value, Mapping):
        return value.get("char_start"), value.get("char_end"), value.get("grounding")
    return None, None, None


def _evidence(mention: Mention, path: str, spec: FieldSpec, value: Any) -> dict[str, Evidence]:
    """The evidence entries of one stated leaf (array items one each: ``path.i``)."""
    if spec.kind == "string_array":
        return {f"{path}.{i}": Evidence(mention.step, *_span(mention.spans.get(f"{path}.{i}")))
                for i in range(len(value))}
    return {path: Evidence(mention.step, *_span(mention.spans.get(path)))}


def _set(values: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = values
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value


def _start(record: RecordType, mention: Mention) -> Record:
    values: dict[str, Any] = {}
    evidence: dict[str, Evidence] = {}
    for path, spec, value in record.leaves(mention.values):
        if _stated(value):
            _set(values, path, list(value) if isinstance(value, list) else value)
            evidence.update(_evidence(mention, path, spec, value))
    return Record(record.name, values, evidence, 1, mention.step, mention.step)


def _amend(record: RecordType, into: Record, mention: Mention) -> None:
    current = dict(((p, v) for p, _, v in record.leaves(into.values)))
    for path, spec, value in record.leaves(mention.values):
        if not _stated(value):
            continue
        old = current.get(path)
        if _stated(old) and KINDS[spec.kind].normalise(old) == KINDS[spec.kind].normalise(value):
            continue  # restated as it was: the first statement keeps its evidence
        if _stated(old):
            into.conflicts.append(Conflict(path, old, into.evidence.get(path) or _first_item(into.evidence, path)))
        _set(into.values, path, list(value) if isinstance(value, list) else value)
        for k in [k for k in into.evidence if k == path or k.startswith(path + ".")]:
            del into.evidence[k]
        into.evidence.update(_evidence(mention, path, spec, value))
    into.mentions += 1
    into.first_chunk = min(into.first_chunk, mention.step)
    into.last_chunk = max(into.last_chunk, mention.step)


def _first_item(evidence: Mapping[str, Evidence], path: str) -> Evidence:
    """An array's evidence: its first item's (the array is replaced whole)."""
    return next((e for k, e in sorted(evidence.items()) if k.startswith(path + ".")), Evidence(-1))


def _agrees(record: RecordType, into: Record, mention: Mention) -> bool:
    """No value the mention states differs from one the record holds (after normalisation)."""
    current = {p: v for p, _, v in record.leaves(into.values)}
    for path, spec, value in record.leaves(mention.values):
        old = current.get(path)
        if _stated(value) and _stated(old) and KINDS[spec.kind].normalise(old) != KINDS[spec.kind].normalise(value):
            return False
    return True


def _canonical(values: Mapping[str, Any]) -> str:
    return json.dumps(values, sort_keys=True, ensure_ascii=False, default=str)


def merge_records(record: RecordType, mentions: Iterable[Mention]) -> list[Record]:
    """The records of one record type from every chunk's mentions (the rule: the module docstring)."""
    ordered = sorted(mentions, key=lambda m: m.step)  # stable: a step's own order is kept
    out: list[Record] = []
    by_key: dict[tuple[Any, ...], list[Record]] = {}
    seen: dict[tuple[int, str], Record] = {}  # unkeyed: (step, canonical values) -> record
    for mention in ordered:
        key = record_key(record, mention.values)
        if key is not None:
            same = by_key.setdefault(key, [])
            into = next((r for r in same if not record.default_key or _agrees(record, r, mention)), None)
            if into is not None:
                _amend(record, into, mention)
            else:
                same.append(_start(record, mention))
                out.append(same[-1])
            continue
        ident = (mention.step, _canonical(mention.values))
        if ident in seen:
            seen[ident].mentions += 1
            continue
        rec = _start(record, mention)
        seen.setdefault(ident, rec)
        out.append(rec)
    return out
