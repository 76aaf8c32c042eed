"""Corpus extraction: a JSON Schema in, typed values and records out, each with its evidence.

    schema = load_schema("docs/schemas/contract.json")        # checked on load, before any model
    config = AgentConfig(preset="small", answer_tokens=96, extraction=schema)
    result = await read_document(engine, None, text, config)   # one read for all fields
    columns = extraction_columns(schema, result.response, result.steps, text)

The schema's field list is the question of every call; the final answer is decoded under the
schema (``SamplingParams.json_schema``) and validated again here. Batch jobs do this per row
(:func:`memagent.batch.answer_rows` with ``config.extraction`` set). Record types (arrays of
objects) are emitted per chunk under :meth:`ExtractionSchema.records_schema`, grounded
(:mod:`memagent.extraction.grounding`) and merged by key (:mod:`memagent.extraction.records`).
"""

from memagent.extraction.grounding import FUZZY_THRESHOLD, Span, locate
from memagent.extraction.kinds import KINDS, Kind
from memagent.extraction.output import (
    EVIDENCE_TYPE, InvalidOutput, extraction_columns, field_evidence, null_columns, output_fields, parse_reply,
    record_fields, record_items, record_struct, records_arrow_schema, typed_record, typed_values,
)
from memagent.extraction.parse import ObjectSpec, RecordType
from memagent.extraction.record_grounding import GroundedChunk, MemoryTrail, ground_chunk
from memagent.extraction.records import Mention, Record, merge_records, record_key
from memagent.extraction.schema import ExtractionSchema, FieldSpec, load_schema, schema_from

__all__ = [
    "EVIDENCE_TYPE", "FUZZY_THRESHOLD", "KINDS", "ExtractionSchema", "FieldSpec", "GroundedChunk", "InvalidOutput",
    "Kind", "MemoryTrail", "Mention", "ObjectSpec", "Record", "RecordType", "Span", "extraction_columns",
    "field_evidence", "ground_chunk", "load_schema", "locate", "merge_records", "null_columns", "output_fields",
    "parse_reply", "record_fields", "record_items", "record_key", "record_struct", "records_arrow_schema",
    "schema_from", "typed_record", "typed_values",
]
