"""From the final reply to typed columns: validate against the schema, convert, and find each value's evidence.

Columns (all nullable, null in error rows):

- one per schema property, named as the property: ``string``, ``float64`` (number), ``int64``
  (integer), ``bool``, ``date32`` (format date), ``string`` (enum), ``list<string>`` (array);
- ``extraction``: the validated object as JSON text;
- ``field_evidence``: ``list<struct<field, value, step, char_start, char_end>>``, one entry per
  non-null value (one per item for arrays; ``value`` is the JSON text of the value or item):
  ``step`` is the first memory step whose memory holds the value (null when none did) and
  ``char_start:char_end`` its span in the document (null when the document does not hold it;
  booleans have no span). A value occurring several times is cited where the first memory that
  held it read it (inside that step's chunk), else at its first occurrence.

A reply that does not parse or does not validate raises :class:`InvalidOutput`; the batch job
writes it as an ``invalid_output:`` error row (:mod:`memagent.error_kinds`).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from typing import Any, Iterable, Mapping

import pyarrow as pa

from memagent.attribution import _get, answer_spans, memory_steps
from memagent.extraction.schema import ExtractionSchema, FieldKind
from memagent.prompts import parse_json_answer
from memagent.result_schema import EXTRACTION_COLUMN, FIELD_EVIDENCE_COLUMN

EVIDENCE_TYPE = pa.struct([
    ("field", pa.string()), ("value", pa.string()), ("step", pa.int32()),
    ("char_start", pa.int64()), ("char_end", pa.int64()),
])
ARROW_TYPES: dict[FieldKind, pa.DataType] = {
    "string": pa.string(), "enum": pa.string(), "date": pa.date32(), "number": pa.float64(),
    "integer": pa.int64(), "boolean": pa.bool_(), "string_array": pa.list_(pa.string()),
}
MAX_SPANS = 1000  # occurrences of one value looked at (answer_spans' limit)


class InvalidOutput(ValueError):
    """The final reply is not a JSON object of the schema; the message says why."""


def output_fields(schema: ExtractionSchema) -> list[pa.Field]:
    """The extraction's output columns: one per property, then ``extraction`` and ``field_evidence``."""
    return [*(pa.field(f.name, ARROW_TYPES[f.kind]) for f in schema.fields),
            pa.field(EXTRACTION_COLUMN, pa.string()), pa.field(FIELD_EVIDENCE_COLUMN, pa.list_(EVIDENCE_TYPE))]


def null_columns(schema: ExtractionSchema) -> dict[str, None]:
    """The extraction columns of an error row."""
    return {f.name: None for f in output_fields(schema)}


@functools.lru_cache(maxsize=32)
def _validator(decoding_schema_json: str) -> Any:
    from jsonschema import Draft202012Validator

    # The format checker holds dates to RFC 3339's full-date (YYYY-MM-DD), as the date32 column needs.
    return Draft202012Validator(json.loads(decoding_schema_json),
                                format_checker=Draft202012Validator.FORMAT_CHECKER)


def parse_reply(schema: ExtractionSchema, text: str | None) -> dict[str, Any]:
    """The reply as a JSON object valid under the schema; :class:`InvalidOutput` saying why not."""
    try:
        obj = parse_json_answer(text or "")
    except ValueError as exc:
        raise InvalidOutput(str(exc)) from None
    errors = sorted(_validator(schema.decoding_schema_json()).iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = f"field {'.'.join(map(str, e.path))!r}" if e.path else "reply"
        raise InvalidOutput(f"{where} does not match the schema: {e.message}"[:300])
    return obj


def _typed(kind: FieldKind, value: Any) -> Any:
    if value is None:
        return None
    if kind == "date":
        return dt.date.fromisoformat(value)
    if kind == "number":
        return float(value)
    if kind == "integer":
        return int(value)
    return value


def typed_values(schema: ExtractionSchema, obj: Mapping[str, Any]) -> dict[str, Any]:
    """Python values for the property columns (dates as ``datetime.date``, missing keys None)."""
    return {f.name: _typed(f.kind, obj.get(f.name)) for f in schema.fields}


def surface_forms(kind: FieldKind, value: Any) -> list[str]:
    """How a value may be written in a document (searched case-insensitively, at word boundaries)."""
    if kind == "boolean" or value is None:
        return []
    if kind == "date":
        d = dt.date.fromisoformat(value)
        return [d.isoformat(), f"{d:%B} {d.day}, {d.year}", f"{d.day} {d:%B} {d.year}", f"{d:%b} {d.day}, {d.year}",
                f"{d.day} {d:%b} {d.year}", f"{d:%d/%m/%Y}", f"{d:%m/%d/%Y}", f"{d:%Y/%m/%d}"]
    if kind in ("number", "integer"):
        v = float(value)
        if v.is_integer():
            n = int(v)
            return list(dict.fromkeys([str(n), f"{n:,}", f"{v:.2f}", f"{v:,.2f}"]))
        return list(dict.fromkeys([repr(v), f"{v:,}", f"{v:.2f}", f"{v:,.2f}"]))
    text = str(value).strip()
    return [text] if text else []


def _bounded(text: str, start: int, end: int) -> bool:
    """The match does not cut a word (``5`` inside ``2025`` is no occurrence of 5)."""
    return not (start > 0 and text[start - 1].isalnum() or end < len(text) and text[end].isalnum())


def find_spans(context: str | None, forms: list[str]) -> list[tuple[int, int]]:
    """Char spans of any of ``forms`` in ``context`` (case-insensitive, whole words), sorted."""
    if not context or not forms:
        return []
    found = answer_spans(context, forms, limit=MAX_SPANS)
    return [(s["char_start"], s["char_end"]) for s in found if _bounded(context, s["char_start"], s["char_end"])]


def _held(memory: str | None, forms: list[str]) -> bool:
    return bool(memory) and bool(find_spans(memory, forms))


def value_evidence(forms: list[str], steps: Iterable[Any] | None, context: str | None) -> tuple[Any, Any, Any]:
    """(step, char_start, char_end) of one value: the first memory holding it, its span in the document."""
    step = chunk = None
    for s in memory_steps(steps):
        if _held(_get(s, "memory"), forms):
            step, chunk = _get(s, "step"), (_get(s, "char_start"), _get(s, "char_end"))
            break
    spans = find_spans(context, forms)
    if not spans:
        return step, None, None
    if chunk and chunk[0] is not None:
        inside = [sp for sp in spans if chunk[0] <= sp[0] and sp[1] <= chunk[1]]
        spans = inside or spans
    return step, spans[0][0], spans[0][1]


def field_evidence(schema: ExtractionSchema, obj: Mapping[str, Any], steps: Iterable[Any] | None,
                   context: str | None) -> list[dict[str, Any]]:
    """The ``field_evidence`` entries of one validated object (see the module docstring)."""
    steps = list(steps or [])
    out = []
    for f in schema.fields:
        value = obj.get(f.name)
        items = value if f.kind == "string_array" and value is not None else [value]
        for item in items:
            if item is None:
                continue
            kind: FieldKind = "string" if f.kind == "string_array" else f.kind
            step, start, end = value_evidence(surface_forms(kind, item), steps, context)
            out.append({"field": f.name, "value": json.dumps(item, ensure_ascii=False), "step": step,
                        "char_start": start, "char_end": end})
    return out


def extraction_columns(schema: ExtractionSchema, reply: str | None, steps: Iterable[Any] | None,
                       context: str | None) -> dict[str, Any]:
    """All extraction columns of a successful read; raises :class:`InvalidOutput` for a bad reply."""
    obj = parse_reply(schema, reply)
    return {**typed_values(schema, obj), EXTRACTION_COLUMN: json.dumps(obj, ensure_ascii=False),
            FIELD_EVIDENCE_COLUMN: field_evidence(schema, obj, steps, context)}
