"""Read many rows concurrently through one engine and turn each into an output record.

This is the unit of work of every batch job: a Ray Data actor calls :func:`answer_rows` on
each batch it receives; the demo and tests call it in-process. One coroutine per row, so the
engine batches the calls of all rows in flight. A row that cannot be read becomes an error
record (``error`` set, results null) and never stops the others.

Output record: ``id``, passthrough columns, ``prediction``,
``response``, ``memory``, ``n_chunks``, ``context_tokens``, ``truncated``, ``steps``,
``score`` (when ``answers`` are given), ``error``, ``model``, ``config``, ``method``, and the
evidence attribution columns of :mod:`memagent.attribution` (null in error rows).

Two reading methods share this path: ``memagent`` (the memory agent) and ``full-context``
(the baseline: the whole document in one prompt, middle dropped to fit the window).

Corpus extraction (``config.extraction``, a JSON Schema): the field list is every row's question,
and the record adds one typed column per field, ``extraction`` and ``field_evidence`` (:func:`result_schema`,
:mod:`memagent.extraction.output`); a reply that does not match the schema is an ``invalid_output:`` error row.
Record types add ``n_records_<type>``, the records calls' tally (``TALLY_COLUMNS`` of
:mod:`memagent.result_schema`) and the records themselves, ``records_<type>`` (a list of structs: the batch job
commits them with the row and derives each type's records dataset from them: pipelines/records_output.py).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from typing import Any, Awaitable, Callable, Literal, Mapping, Sequence

import pyarrow as pa

from memagent.agent import ReadState, InputError, ResumeMismatch, Result, read_document
from memagent.attribution import attribute
from memagent.chunking import ChunkedDocument
from memagent.config import AgentConfig
from memagent.documents.columns import DOCUMENT_ERROR_COLUMN
from memagent.engines.base import Engine
from memagent.error_kinds import INVALID_OUTPUT_PREFIX, engine_is_dead, error_prefix
from memagent.extraction import InvalidOutput, extraction_columns, null_columns, output_fields, record_items
from memagent.extraction.model_check import model_checked, records_kept
from memagent.extraction.output import typed_values
from memagent.full_context import read_full_context
from memagent.replies import parse_json_answer
from memagent.result_schema import (
    EXTRACTION_COLUMN, N_RECORDS_PREFIX, RECORDS_PREFIX, RESULT_COLUMNS, RESULT_SCHEMA, SCHEMA_ERRORS_COLUMN,
    TALLY_COLUMNS,
)
from memagent.retention import retention_columns
from memagent.verify import METRICS
from memagent.verify import score as score_metric

log = logging.getLogger(__name__)

Method = Literal["memagent", "full-context"]
READERS = {"memagent": read_document, "full-context": read_full_context}

def result_schema(config: AgentConfig) -> pa.Schema:
    """The result columns of a job with ``config``: with an extraction schema, its typed columns,
    ``extraction`` and ``field_evidence`` follow :data:`RESULT_SCHEMA` (memagent.extraction.output)."""
    if config.extraction is None:
        return RESULT_SCHEMA
    return pa.schema([*RESULT_SCHEMA, *output_fields(config.extraction)])


def _answers(row: Mapping[str, Any]) -> list[str] | None:
    value = row.get("answers")
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    answers = [str(a) for a in list(value)]
    return answers or None


def result_record(
    row: Mapping[str, Any], result: Result, config: AgentConfig, model: str, metric: str, seconds: float,
    method: Method = "memagent",
) -> dict[str, Any]:
    """The output record of a successful read (passthrough columns kept).

    With an extraction schema: the typed field columns, ``extraction`` (the validated object,
    also the ``prediction``) and ``field_evidence``; no score or answer attribution. A reply that
    does not match the schema keeps its trace and is an ``invalid_output:`` error row.
    """
    if config.extraction is not None:
        return _extraction_record(row, result, config, model, seconds, method)
    record = dict(row)
    error = None
    prediction: str | None = result.prediction
    if config.answer_style == "json":
        try:
            prediction = json.dumps(parse_json_answer(result.response), ensure_ascii=False)
        except ValueError as exc:
            prediction, error = None, f"answer: {exc}"
    answers = _answers(row)
    record.update(
        prediction=prediction,
        response=result.response,
        memory=result.memory,
        n_chunks=result.n_chunks,
        context_tokens=result.context_tokens,
        truncated=result.truncated,
        steps=[vars(s) for s in result.steps],
        score=score_metric(metric, prediction, answers) if answers and error is None else None,
        error=error,
        model=model,
        config=config.model_dump_json(),
        seconds=round(seconds, 3),
        method=method,
    )
    record.update(attribute(result.steps, prediction, answers, row.get("context"), metric).columns())
    record.update(retention_columns(row, result.steps))
    record.update(resumed_at_chunk=result.resumed_at_chunk)
    return record


def _extraction_record(row: Mapping[str, Any], result: Result, config: AgentConfig, model: str, seconds: float,
                       method: Method) -> dict[str, Any]:
    schema = config.extraction
    assert schema is not None
    record = dict(row)
    try:
        columns = extraction_columns(schema, result.response, result.steps, row.get("context"), result.unanswered,
                                     result.values_cut)
        error = None
    except InvalidOutput as exc:
        columns, error = null_columns(schema), f"{INVALID_OUTPUT_PREFIX}{exc}"
        if result.steps and result.steps[-1].kind == "answer" and result.steps[-1].finish_reason == "length":
            error += f" (the reply stopped at answer_tokens={config.answer_tokens}: raise answer_tokens)"
    record.update({c: None for c in RESULT_COLUMNS})
    record.update(
        prediction=columns["extraction"], response=result.response, memory=result.memory, n_chunks=result.n_chunks,
        context_tokens=result.context_tokens, truncated=result.truncated, steps=[vars(s) for s in result.steps],
        error=error, model=model, config=config.model_dump_json(), seconds=round(seconds, 3), method=method,
        resumed_at_chunk=result.resumed_at_chunk, **columns,
    )
    records = result.records or {}
    if schema.record_types:
        record.update({column: getattr(result.records_tally, name) for name, column in TALLY_COLUMNS.items()})
        _records_columns(record, schema, records)
        if error is None:
            _nest_records(record, schema, records, result.records_incomplete)
    if error is None and schema.model is not None:
        _model_checked(record, schema, json.loads(columns[EXTRACTION_COLUMN]), records)  # the fields, unnested
    return record


def _records_columns(record: dict[str, Any], schema: Any, records: Mapping[str, Sequence[Any]]) -> None:
    record.update({N_RECORDS_PREFIX + r.name: len(records.get(r.name, ())) for r in schema.record_types})
    record.update({RECORDS_PREFIX + r.name: record_items(r, records.get(r.name, ())) for r in schema.record_types})


def _model_checked(record: dict[str, Any], schema: Any, doc: Mapping[str, Any],
                   records: Mapping[str, Sequence[Any]]) -> None:
    """The row held to the user's Pydantic model too (:mod:`memagent.extraction.model_check`): each value its
    validators reject dropped from ``extraction``, the field columns and the records columns, and named in
    ``schema_errors``."""
    check = model_checked(schema.model, json.loads(record[EXTRACTION_COLUMN]))
    if check.rejected:
        record[EXTRACTION_COLUMN] = record["prediction"] = json.dumps(check.obj, ensure_ascii=False, default=str)
        record.update(typed_values(schema, check.obj))
        record[SCHEMA_ERRORS_COLUMN] = [*(record.get(SCHEMA_ERRORS_COLUMN) or []), *check.rejected]
    if check.removed and schema.record_types:
        _records_columns(record, schema, records_kept(schema.resolved, doc, records, check.removed))


def _nest_records(record: dict[str, Any], schema: Any, records: Mapping[str, Any],
                  incomplete: Sequence[str] = ()) -> None:
    """The ``extraction`` column as the user's whole object: the records nested where the schema has them;
    the records dropped as incomplete (the fields they lack) and what the set of records fails (an array's
    ``minItems``, say) are listed in ``schema_errors``."""
    values = {name: [getattr(r, "values", r) for r in found] for name, found in records.items()}
    whole = schema.assemble(json.loads(record[EXTRACTION_COLUMN]), values)
    record[EXTRACTION_COLUMN] = record["prediction"] = json.dumps(whole, ensure_ascii=False, default=str)
    record[SCHEMA_ERRORS_COLUMN] = [*(record.get(SCHEMA_ERRORS_COLUMN) or []), *incomplete, *schema.errors(whole)]


def error_record(row: Mapping[str, Any], message: str, config: AgentConfig, model: str,
                 method: Method = "memagent") -> dict[str, Any]:
    """The output record of a row that could not be read: ``error`` set, results null."""
    record = dict(row)
    record.update({c: None for c in RESULT_COLUMNS})
    if config.extraction is not None:
        record.update(null_columns(config.extraction))
    record.update(error=message, model=model, config=config.model_dump_json(), method=method)
    return record


def failure_record(row: Mapping[str, Any], exc: Exception, config: AgentConfig, model: str,
                   method: Method = "memagent", doing: str | None = None) -> dict[str, Any]:
    """The error record of an exception raised while reading ``row`` (``doing`` says at what, when not
    reading the document itself): ``infra:`` is redone by a rerun (its message says it all), ``agent:``
    is the row's own failure, done for good (:func:`memagent.error_kinds.error_kind` judges which)."""
    kind = error_prefix(exc)
    log.warning("row %s failed%s: %s", row.get("id"), f" {doing}" if doing else "", exc, exc_info=kind == "agent")
    what = f"{doing}: " if doing else ""
    return error_record(row, f"{kind}: {what}{type(exc).__name__}: {exc}", config, model, method)


def _row_question(row: Mapping[str, Any], config: AgentConfig, question: str | None, method: Method) -> str | None:
    """The question a row is read with: the job's, else the row's; none with an extraction schema."""
    if config.extraction is None:
        return question if question is not None else row.get("question")
    if question is not None or method != "memagent":
        raise ValueError("an extraction schema is the question and is read by method 'memagent': "
                         "give no job-level question and no other method with it")
    return None


async def answer_row(
    engine: Engine,
    row: Mapping[str, Any],
    config: AgentConfig,
    *,
    question: str | None = None,
    metric: str = "sub_em",
    method: Method = "memagent",
    resume: ReadState | None = None,
    on_state: Callable[[ReadState], Awaitable[None]] | None = None,
    checkpoint_ignored: str | None = None,
    chunked: ChunkedDocument | None = None,
) -> dict[str, Any]:
    """Read one row; any failure of the row itself becomes an error record.

    ``question`` overrides/supplies the question for every row. With an extraction schema
    (``config.extraction``) the schema's field list is the question: a ``question`` column is
    not read (it passes through). A ``metric`` column, when the row has one, overrides
    ``metric`` for that row (evaluation sets mix tasks scored differently).

    An engine that died (:func:`memagent.error_kinds.engine_is_dead`) is raised, not recorded.

    Checkpoints (method ``memagent``): ``resume`` goes on from a checkpointed state (one
    that does not fit the document is ignored and the row read from the start), ``on_state``
    receives each new state, ``checkpoint_ignored`` says why a checkpoint found was not used.
    ``chunked``: the row's context already chunked by ``config`` (the batch worker's count of a long
    document), so that it is not tokenized again.
    """
    t0 = time.perf_counter()
    if row.get(DOCUMENT_ERROR_COLUMN):  # a file that could not be converted: its reason, not "no context"
        return {**error_record(row, f"input: {row[DOCUMENT_ERROR_COLUMN]}", config, engine.name, method),
                "checkpoint_ignored": checkpoint_ignored}
    q = _row_question(row, config, question, method)
    row_metric = row.get("metric") or metric
    if row_metric not in METRICS:
        return error_record(row, f"input: metric {row_metric!r} is not one of {', '.join(METRICS)}",
                            config, engine.name, method)
    reader = _reader(method, resume, on_state, chunked)
    try:
        try:
            result = await reader(engine, q, row.get("context"), config)  # type: ignore[arg-type]
        except ResumeMismatch as exc:  # a checkpoint of another cut of the document: read it from the start
            checkpoint_ignored = str(exc)
            result = await read_document(engine, q, row.get("context"), config, on_state=on_state, chunked=chunked)
    except Exception as exc:  # noqa: BLE001 - a row's failure must not end the job
        record = _failed_read_record(row, exc, config, engine, method)
    else:
        record = result_record(row, result, config, engine.name, row_metric, time.perf_counter() - t0, method)
    return {**record, "checkpoint_ignored": checkpoint_ignored}


def _reader(method: Method, resume: ReadState | None, on_state: Callable[[ReadState], Awaitable[None]] | None,
            chunked: ChunkedDocument | None) -> Callable[..., Awaitable[Result]]:
    """How ``method`` reads a row; the memory agent's read goes on from ``resume`` and reports to ``on_state``."""
    if method == "memagent":
        return functools.partial(read_document, resume=resume, on_state=on_state, chunked=chunked)
    return READERS[method]


def _failed_read_record(row: Mapping[str, Any], exc: Exception, config: AgentConfig, engine: Engine,
                        method: Method) -> dict[str, Any]:
    """The error record of a read that raised ``exc``: ``input:`` for bad input, else :func:`failure_record`'s.
    An engine that died is raised, not recorded: not the row's failure, the caller replaces the engine and
    reads the row again."""
    if isinstance(exc, InputError):
        return error_record(row, f"input: {exc}", config, engine.name, method)
    if engine_is_dead(exc):
        raise exc
    return failure_record(row, exc, config, engine.name, method)


async def answer_rows(
    engine: Engine,
    rows: Sequence[Mapping[str, Any]],
    config: AgentConfig,
    *,
    question: str | None = None,
    metric: str = "sub_em",
    method: Method = "memagent",
    on_done: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Read all ``rows`` concurrently with ``method``; records come back in input order."""

    async def one(row: Mapping[str, Any]) -> dict[str, Any]:
        record = await answer_row(engine, row, config, question=question, metric=metric, method=method)
        if on_done:
            on_done(record)
        return record

    return list(await asyncio.gather(*(one(r) for r in rows)))
