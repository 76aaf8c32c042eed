"""From the final reply to typed columns: validate against the schema, convert, and find each value's evidence.

Columns (all nullable, null in error rows):

- one per schema property, named as the property: ``string``, ``float64`` (number), ``int64``
  (integer), ``bool``, ``date32`` (format date), ``string`` (enum), ``list<string>`` (array),
  ``struct`` (an object: its properties as struct fields, nested as the schema nests them);
- ``extraction``: the validated object as JSON text, in the user's schema's shape (the batch job nests
  each record type's records where the schema has them);
- ``schema_errors``: ``list<string>``, one ``path: message`` per value dropped because it failed the
  user's own schema (a constraint the grammar could not hold, e.g. a ``format``), after one per leaf
  a wide schema's answer left out because its reply broke even asked alone (:mod:`memagent.extraction.group_answers`);
- ``field_evidence``: ``list<struct<field, value, step, char_start, char_end>>``, one entry per
  non-null value (one per item for arrays; ``field`` a dotted path inside objects, ``lender.name``;
  ``value`` is the JSON text of the value or item):
  ``step`` is the first memory step whose memory holds the value (null when none did) and
  ``char_start:char_end`` its span in the document (null when the document does not hold it;
  booleans have no span). A value occurring several times is cited where the first memory that
  held it read it (inside that step's chunk), else at its first occurrence; the search is
  :func:`memagent.extraction.grounding.value_evidence` (the value as written, then its other
  spellings: ``48,250``, ``March 14, 2021``, case and spacing aside).

Record types have their typed row columns here too (:func:`record_fields`, :func:`typed_record`).
A document's merged records of one type are its row's ``records_<type>`` column (:func:`record_items`,
typed by :func:`record_struct`): a list of structs, one per record, in order: ``record_index``, one typed
field per item property (nested objects as structs), ``record_evidence``
(``list<struct<field, step, char_start, char_end, grounding>>``, one entry per stated leaf, array items as
``field.i``; ``grounding`` says how the span was found: ``exact``/``normalised``/``fuzzy`` in the text the
call read, ``memory`` through the memory, ``elsewhere`` only outside it, null not found),
``record_conflicts`` (``list<struct<field, value, step, char_start, char_end>>``: values mentions stated
that the record does not keep, :mod:`memagent.extraction.records`), ``first_chunk``, ``last_chunk``,
``mentions``. The records dataset of a type (:func:`records_arrow_schema`) is those structs as rows,
after the row's ``id`` and ``record_type``.

A reply that does not parse or does not validate raises :class:`InvalidOutput`; the batch job
writes it as an ``invalid_output:`` error row (:mod:`memagent.error_kinds`).
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

import pyarrow as pa

from memagent.extraction.grounding import value_evidence
from memagent.extraction.kinds import ITEM_KIND, JSON_TEXT_METADATA, KINDS, to_arrow
from memagent.extraction.parse import FieldSpec, ObjectSpec, RecordType, iter_leaves
from memagent.extraction.resolve import without_nulls
from memagent.extraction.schema import ExtractionSchema
from memagent.prompts import parse_json_answer
from memagent.result_schema import (
    EXTRACTION_COLUMN, FIELD_EVIDENCE_COLUMN, N_RECORDS_PREFIX, RECORDS_PREFIX, SCHEMA_ERRORS_COLUMN, TALLY_COLUMNS,
    VALUES_CUT_COLUMN,
)

EVIDENCE_TYPE = pa.struct([
    ("field", pa.string()), ("value", pa.string()), ("step", pa.int32()),
    ("char_start", pa.int64()), ("char_end", pa.int64()),
])
RECORD_EVIDENCE_TYPE = pa.struct([
    ("field", pa.string()), ("step", pa.int32()), ("char_start", pa.int64()), ("char_end", pa.int64()),
    ("grounding", pa.string()),
])
RECORD_CONFLICT_TYPE = pa.struct([
    ("field", pa.string()), ("value", pa.string()), ("step", pa.int32()),
    ("char_start", pa.int64()), ("char_end", pa.int64()),
])


class InvalidOutput(ValueError):
    """The final reply is not a JSON object of the schema; the message says why."""


def output_fields(schema: ExtractionSchema) -> list[pa.Field]:
    """The extraction's output columns: one per document-level field, ``extraction``, ``field_evidence``,
    ``schema_errors``, ``values_cut``, one ``n_records_<type>`` per record type, the records calls' tally (``record_splits``,
    ``record_failed_pieces``, ``record_runaway_pieces``, ``record_invalid_items``,
    ``grounding_dropped_values``, ``grounding_dropped_records``, ``record_incomplete``, ``record_calls``,
    ``record_prompt_tokens``, ``record_completion_tokens``) and one
    ``records_<type>`` per record type (the records themselves)."""
    return [*(_arrow_field(f) for f in schema.fields),
            pa.field(EXTRACTION_COLUMN, pa.string()), pa.field(FIELD_EVIDENCE_COLUMN, pa.list_(EVIDENCE_TYPE)),
            pa.field(SCHEMA_ERRORS_COLUMN, pa.list_(pa.string())), pa.field(VALUES_CUT_COLUMN, pa.list_(pa.string())),
            *(pa.field(N_RECORDS_PREFIX + r.name, pa.int32()) for r in schema.record_types),
            *(pa.field(c, pa.int32()) for c in TALLY_COLUMNS.values()),
            *(pa.field(RECORDS_PREFIX + r.name, pa.list_(record_struct(r))) for r in schema.record_types)]


def _arrow_field(spec: FieldSpec | ObjectSpec) -> pa.Field:
    if isinstance(spec, ObjectSpec):
        return pa.field(spec.name, pa.struct([_arrow_field(f) for f in spec.fields]))
    return pa.field(spec.name, KINDS[spec.kind].arrow, metadata=JSON_TEXT_METADATA if spec.kind == "json" else None)


def record_fields(record: RecordType) -> list[pa.Field]:
    """The typed columns of a record type's rows: one per item property, nested objects as structs."""
    return [_arrow_field(f) for f in record.fields]


def _typed_object(fields: tuple[FieldSpec | ObjectSpec, ...], obj: Any) -> dict[str, Any] | None:
    if not isinstance(obj, Mapping):
        return None
    return {f.name: _typed_object(f.fields, obj.get(f.name)) if isinstance(f, ObjectSpec)
            else to_arrow(f.kind, obj.get(f.name)) for f in fields}


def typed_record(record: RecordType, obj: Mapping[str, Any]) -> dict[str, Any]:
    """Python values of a record's columns (dates as ``datetime.date``, nested objects as dicts, missing None)."""
    return _typed_object(record.fields, obj) or {}


def record_struct(record: RecordType) -> pa.StructType:
    """One record in its row's ``records_<type>`` column (the module docstring)."""
    return pa.struct([pa.field("record_index", pa.int32()), *record_fields(record),
                      pa.field("record_evidence", pa.list_(RECORD_EVIDENCE_TYPE)),
                      pa.field("record_conflicts", pa.list_(RECORD_CONFLICT_TYPE)), pa.field("first_chunk", pa.int32()),
                      pa.field("last_chunk", pa.int32()), pa.field("mentions", pa.int32())])


def record_items(record: RecordType, records: Iterable[Any]) -> list[dict[str, Any]]:
    """One document's merged records (:class:`memagent.extraction.records.Record`) of one type as the
    values of its row's ``records_<type>`` column."""
    return [{"record_index": i, **typed_record(record, r.values), "record_evidence": r.evidence_rows(),
             "record_conflicts": r.conflict_rows(), "first_chunk": r.first_chunk, "last_chunk": r.last_chunk,
             "mentions": r.mentions} for i, r in enumerate(records)]


def records_arrow_schema(record: RecordType) -> pa.Schema:
    """The columns of a record type's records dataset: ``id``, ``record_type``, then :func:`record_struct`'s."""
    return pa.schema([pa.field("id", pa.string()), pa.field("record_type", pa.string()), *record_struct(record)])


def null_columns(schema: ExtractionSchema) -> dict[str, None]:
    """The extraction columns of an error row."""
    return {f.name: None for f in output_fields(schema)}


def parse_reply(schema: ExtractionSchema, text: str | None) -> dict[str, Any]:
    """The reply as a JSON object valid under the schema; :class:`InvalidOutput` saying why not."""
    try:
        obj = without_nulls(parse_json_answer(text or ""))
    except ValueError as exc:
        raise InvalidOutput(str(exc)) from None
    errors = schema.reply_errors(obj)
    if errors:
        e = errors[0]
        where = f"field {'.'.join(map(str, e.path))!r}" if e.path else "reply"
        raise InvalidOutput(f"{where} does not match the schema: {e.message}"[:300])
    return obj


def typed_values(schema: ExtractionSchema, obj: Mapping[str, Any]) -> dict[str, Any]:
    """Python values for the property columns (dates as ``datetime.date``, objects as dicts, missing None)."""
    return _typed_object(schema.fields, obj) or {}


def field_evidence(schema: ExtractionSchema, obj: Mapping[str, Any], steps: Iterable[Any] | None,
                   context: str | None) -> list[dict[str, Any]]:
    """The ``field_evidence`` entries of one validated object (see the module docstring)."""
    steps = list(steps or [])
    out = []
    for path, f, value in iter_leaves(schema.fields, obj):
        items = value if f.kind == "string_array" and value is not None else [value]
        for item in items:
            if item is None:
                continue
            step, start, end = value_evidence(ITEM_KIND.get(f.kind, f.kind), item, steps, context)
            out.append({"field": path, "value": json.dumps(item, ensure_ascii=False), "step": step,
                        "char_start": start, "char_end": end})
    return out


def extraction_columns(schema: ExtractionSchema, reply: str | None, steps: Iterable[Any] | None,
                       context: str | None, unanswered: Iterable[str] = (),
                       values_cut: Iterable[str] = ()) -> dict[str, Any]:
    """All extraction columns of a successful read; raises :class:`InvalidOutput` for a bad reply.
    ``unanswered``: ``path: why`` of the leaves a wide schema's broken group replies left out
    (``Result.unanswered``), listed in ``schema_errors`` before the values the schema dropped; ``values_cut``:
    the values kept at a bound their call's budget set (``Result.values_cut``)."""
    unanswered = list(unanswered)
    try:
        obj, dropped = conform_reply(schema, parse_reply(schema, reply))
    except InvalidOutput as exc:
        if unanswered:  # name the left-out leaf the schema missed (a required one), else the first
            named = [u for u in unanswered if f"'{u.split(':', 1)[0].rsplit('.', 1)[-1]}'" in str(exc)]
            raise InvalidOutput(f"{exc}; left out: {(named or unanswered)[0]}") from exc
        raise
    return {**typed_values(schema, obj), EXTRACTION_COLUMN: json.dumps(obj, ensure_ascii=False),
            FIELD_EVIDENCE_COLUMN: field_evidence(schema, obj, steps, context),
            SCHEMA_ERRORS_COLUMN: unanswered + dropped, VALUES_CUT_COLUMN: list(values_cut)}


def conform_reply(schema: ExtractionSchema, obj: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The validated reply held to the user's own schema: each value that fails it dropped (``path: message``),
    nullable fields absent as null; :class:`InvalidOutput` when a required value fails (nothing to drop)."""
    obj, dropped = schema.resolved.conform_document(obj)
    left = schema.resolved.document_errors(obj)
    if left:
        raise InvalidOutput(f"the reply does not match the schema: {left[0]}")
    return obj, dropped
