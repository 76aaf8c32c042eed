"""The output columns a batch job adds to every input row: their names and types, here only.

:data:`RESULT_SCHEMA` is a result record's; an extraction adds its typed field columns and
:data:`EXTRACTION_COLUMNS`; the batch job (pipelines) adds :data:`JOB_SCHEMA`. It imports nothing
of the project, so every layer that names an output column (the extraction schema keeping
property names off them, the batch record, the pipelines' input checks) reads it from here.
"""

from __future__ import annotations

import pyarrow as pa

STEP_TYPE = pa.struct([
    ("step", pa.int32()), ("kind", pa.string()), ("chunk_index", pa.int32()),
    ("char_start", pa.int64()), ("char_end", pa.int64()), ("memory", pa.string()),
    ("prompt_tokens", pa.int32()), ("completion_tokens", pa.int32()),
    ("finish_reason", pa.string()), ("seconds", pa.float64()),
    ("draft_tokens", pa.int32()), ("accepted_tokens", pa.int32()),  # speculation (0: none)
])

SPAN_TYPE = pa.struct([("char_start", pa.int64()), ("char_end", pa.int64())])

RESULT_SCHEMA = pa.schema([
    ("prediction", pa.string()), ("response", pa.string()), ("memory", pa.string()),
    ("n_chunks", pa.int32()), ("context_tokens", pa.int64()), ("truncated", pa.bool_()),
    ("steps", pa.list_(STEP_TYPE)), ("score", pa.float64()), ("error", pa.string()),
    ("model", pa.string()), ("config", pa.string()), ("seconds", pa.float64()), ("method", pa.string()),
    # Evidence attribution (memagent/attribution.py); null in error rows.
    ("evidence_step", pa.int32()), ("evidence_char_start", pa.int64()), ("evidence_char_end", pa.int64()),
    ("answer_spans", pa.list_(SPAN_TYPE)), ("answer_found_step", pa.int32()), ("answer_lost_step", pa.int32()),
    # Known evidence (memagent/retention.py: NIAH needles, qa_2 supporting paragraphs) the read passed, the memory
    # captured, and the last memory still held; null for rows without known evidence.
    ("evidence_read", pa.int32()), ("evidence_captured", pa.int32()), ("evidence_retained", pa.int32()),
    # Checkpoints (pipelines/checkpoints.py): the chunk a read resumed at (null: read from the start), and
    # why a checkpoint found for the row was not used (stale, unreadable; null: none found or used).
    ("resumed_at_chunk", pa.int32()), ("checkpoint_ignored", pa.string()),
])
RESULT_COLUMNS = tuple(RESULT_SCHEMA.names)
# An input column named like an output column (a generator's ``context_tokens``, an earlier run's ``prediction``)
# is carried to the output under this prefix, so both survive: ``input_context_tokens`` beside ``context_tokens``.
CARRIED_PREFIX = "input_"

# An extraction's validated object (JSON text) and per-field evidence (memagent.extraction.output).
EXTRACTION_COLUMN, FIELD_EVIDENCE_COLUMN = "extraction", "field_evidence"
# Values dropped because they failed the user's own JSON Schema (memagent.extraction.resolve.conform).
SCHEMA_ERRORS_COLUMN = "schema_errors"
# Final-answer values kept though they reached a bound their call's budget set (memagent.extraction.answer_bounds).
VALUES_CUT_COLUMN = "values_cut"
# Record types (memagent.extraction.reading.RecordsTally, one column per count): chunk pieces whose records
# reply overflowed (cut, full, or no JSON) and were split and re-read; pieces left (partly) unread, their
# records missing (still overflowing at the size or depth limit, or running away); of those, pieces whose
# reply ran away (looped, or listed records the piece does not state: never split again); records dropped
# because they did not validate; with require_grounding (AgentConfig), values not found where the record was
# read (removed) and records dropped for it (0 when it is off); merged records dropped at the document's end
# because a required value was never stated (or grounded): never written with null.
RECORD_SPLITS_COLUMN, RECORD_FAILED_COLUMN = "record_splits", "record_failed_pieces"
RECORD_RUNAWAY_COLUMN, RECORD_INVALID_COLUMN = "record_runaway_pieces", "record_invalid_items"
DROPPED_VALUES_COLUMN, DROPPED_RECORDS_COLUMN = "grounding_dropped_values", "grounding_dropped_records"
RECORD_INCOMPLETE_COLUMN = "record_incomplete"
# The records calls a row's read made (groups, types read alone, split pieces) and their tokens: not in ``steps``
# (which holds the memory updates and the final calls), so a row's cost is its steps' tokens plus these.
RECORD_CALLS_COLUMN, RECORD_PROMPT_TOKENS_COLUMN = "record_calls", "record_prompt_tokens"
RECORD_COMPLETION_TOKENS_COLUMN = "record_completion_tokens"
TALLY_COLUMNS = {"splits": RECORD_SPLITS_COLUMN, "failed": RECORD_FAILED_COLUMN, "runaway": RECORD_RUNAWAY_COLUMN,
                 "invalid_items": RECORD_INVALID_COLUMN, "dropped_values": DROPPED_VALUES_COLUMN,
                 "dropped_records": DROPPED_RECORDS_COLUMN,
                 "incomplete": RECORD_INCOMPLETE_COLUMN, "calls": RECORD_CALLS_COLUMN,
                 "prompt_tokens": RECORD_PROMPT_TOKENS_COLUMN,
                 "completion_tokens": RECORD_COMPLETION_TOKENS_COLUMN}  # RecordsTally field -> row column
# Per record type: the row's records (``records_<type>``, a list of structs: pipelines/records_output.py) and
# their count (``n_records_<type>``).
RECORDS_PREFIX, N_RECORDS_PREFIX = "records_", "n_records_"
# The records dataset's own columns, around a record type's value columns (``_records/<type>/``).
RECORD_COLUMNS = ("id", "record_type", "record_index", "record_evidence", "record_conflicts", "first_chunk",
                  "last_chunk", "mentions")
EXTRACTION_COLUMNS = (EXTRACTION_COLUMN, FIELD_EVIDENCE_COLUMN, SCHEMA_ERRORS_COLUMN, VALUES_CUT_COLUMN, *TALLY_COLUMNS.values())

# The batch job's own: which Ray node read the row, and the input fingerprint a resume compares.
NODE_ID_COLUMN, FINGERPRINT_COLUMN = "node_id", "input_fingerprint"
JOB_SCHEMA = pa.schema([(NODE_ID_COLUMN, pa.string()), (FINGERPRINT_COLUMN, pa.string())])

EXTRA_OUTPUT_COLUMNS = (*EXTRACTION_COLUMNS, *JOB_SCHEMA.names)  # besides RESULT_COLUMNS and the field columns
