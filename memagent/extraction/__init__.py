"""Corpus extraction: a JSON Schema in, one typed value per field out, each with its evidence.

    schema = load_schema("docs/schemas/contract.json")        # checked on load, before any model
    config = AgentConfig(preset="small", answer_tokens=96, extraction=schema)
    result = await read_document(engine, None, text, config)   # one memory chain for all fields
    columns = extraction_columns(schema, result.response, result.steps, text)

The schema's field list is the question of every call; the final answer is decoded under the
schema (``SamplingParams.json_schema``) and validated again here. Batch jobs do this per row
(:func:`memagent.batch.answer_rows` with ``config.extraction`` set).
"""

from memagent.extraction.output import (
    EVIDENCE_TYPE, InvalidOutput, extraction_columns, field_evidence, null_columns, output_fields, parse_reply,
    typed_values,
)
from memagent.extraction.schema import ExtractionSchema, FieldSpec, load_schema, schema_from

__all__ = [
    "EVIDENCE_TYPE", "ExtractionSchema", "FieldSpec", "InvalidOutput", "extraction_columns", "field_evidence",
    "load_schema", "null_columns", "output_fields", "parse_reply", "schema_from", "typed_values",
]
