"""The plan phase of a batch job: validate the input and the output before any work, find committed ids.

Nothing here starts Ray or loads a model: a bad input or output is refused in seconds, naming
the file, column or row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memagent.batch import result_schema
from memagent.documents.columns import PAGES_COLUMN
from memagent.documents.evidence_pages import EVIDENCE_PAGES_COLUMN, EVIDENCE_PAGES_TYPE
from memagent.result_schema import CARRIED_PREFIX, JOB_SCHEMA
from pipelines import commit_rules, fingerprint, input_schemas, storage, storage_errors
from pipelines.batch_config import BatchQAConfig

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("id", "context")


@dataclass
class InputPlan:
    """What the up-front validation found."""

    schema: pa.Schema
    total_rows: int | None  # None: a documents input with files to read, its rows counted as they stream
    committed_ids: pa.Array  # ids already committed to the output: skipped
    skipped: int  # input ids already in the output
    output_schema: pa.Schema
    redo_ids: pa.Array = field(default_factory=lambda: pa.array([], pa.string()))  # in the output, to redo
    files: list[str] = field(default_factory=list)  # the input files checked: exactly what the job reads
    # Input columns named like output columns -> the names they are carried under (CARRIED_PREFIX)
    carried: dict[str, str] = field(default_factory=dict)
    # A documents input: its rows as a Ray dataset, converted as they stream (pipelines/documents_plan.py)
    documents: Any = None


def plan_input(cfg: BatchQAConfig) -> InputPlan:
    """Validate input and output before any work; find committed ids. Phases: input, output, resume."""
    storage.check_not_nested(cfg.input, storage.filesystem(cfg.input, cfg.s3)[1], cfg.output,
                             storage.filesystem(cfg.output, cfg.s3)[1])
    source = check_input(cfg)
    done_files = check_output(cfg)
    done, redo = resume_state(cfg, source, done_files)
    skipped = int(pc.sum(pc.is_in(source.ids, value_set=done)).as_py() or 0) if len(done) else 0
    return InputPlan(schema=source.schema, total_rows=len(source.ids), committed_ids=done, skipped=skipped,
                     output_schema=output_schema(cfg, source.schema, source.carried), redo_ids=redo,
                     files=source.files, carried=source.carried)


@dataclass(frozen=True)
class CheckedInput:
    """The input as :func:`check_input` found it."""

    files: list[str]
    schema: pa.Schema  # every file's columns, unified
    ids: pa.ChunkedArray
    carried: dict[str, str] = field(default_factory=dict)  # input columns renamed in the output (carried_names)


def check_input(cfg: BatchQAConfig) -> CheckedInput:
    """Every file readable (a corrupt one is named), the required columns in *every* file (a file
    lacking one is named), the files' schemas unified (columns of every file kept, nulls where a
    file lacks an optional one; compatible types widened; incompatible types name the column and
    both files), ids strings, non-null, not blank, unique. A column named like an output column is
    carried under :data:`CARRIED_PREFIX` (:func:`carried_names`)."""
    endpoint = storage_errors.s3_endpoint(cfg.s3)
    in_fs, in_path = storage.filesystem(cfg.input, cfg.s3)
    with storage_errors.io_errors("input", cfg.input, endpoint):
        files = storage.parquet_files(in_fs, in_path)
        if not files:
            raise ValueError(f"input {cfg.input}: no Parquet files found")
        schemas = input_schemas.read_schemas(in_fs, files, cfg.input)
    # With an extraction schema the field list is the question: a question column is not needed.
    required = [*REQUIRED_COLUMNS, *(["question"] if cfg.question is None and cfg.agent.extraction is None else [])]
    for file, file_schema in schemas:
        missing = [c for c in required if c not in file_schema.names]
        if missing:
            named = [c if c != "question" else "question (or a job-level --question)" for c in missing]
            where = f"input {cfg.input}" if len(files) == 1 else f"input file {file}"
            raise ValueError(f"{where}: missing column(s) {', '.join(named)}; have {', '.join(file_schema.names)}")
    schema = input_schemas.unify_schemas(schemas, cfg.input)
    if "question" in schema.names and cfg.question is not None:
        raise ValueError("input has a question column and a job-level question was given: drop one of them")
    if not (pa.types.is_string(schema.field("id").type) or pa.types.is_large_string(schema.field("id").type)):
        raise ValueError(f"input column id must be strings, got {schema.field('id').type}; cast the ids to strings")
    carried = carried_names(schema, [*result_schema(cfg.agent).names, *JOB_SCHEMA.names])
    with storage_errors.io_errors("input", cfg.input, endpoint):
        ids = storage.read_column(in_fs, files, "id")
    if ids.null_count:
        raise ValueError(f"input column id has {ids.null_count} null value(s); every row needs an id")
    blank = pc.equal(pc.utf8_trim_whitespace(ids), "")
    if pc.any(blank).as_py():
        row = pc.index(blank, True).as_py()
        raise ValueError(f"input column id: row {row} has the blank id {ids[row].as_py()!r}; every row needs an id "
                         "with a visible character")
    dup = storage.duplicates(ids)
    if dup:
        raise ValueError(f"input column id has duplicates, e.g. {', '.join(dup)}; ids must be unique")
    return CheckedInput(files, schema, ids, carried)


def carried_names(schema: pa.Schema, output_names: list[str]) -> dict[str, str]:
    """Input columns named like an output column -> ``CARRIED_PREFIX + name``, the name the output
    carries them under (a generator's ``context_tokens`` becomes ``input_context_tokens``); refused
    only when that name is taken by another input column too."""
    carried = {c: CARRIED_PREFIX + c for c in output_names if c in schema.names}
    taken = [new for new in carried.values() if new in schema.names or new in output_names]
    if taken:
        old = next(c for c, new in carried.items() if new == taken[0])
        raise ValueError(f"input column {old!r} is named like an output column and is carried as {taken[0]!r}, "
                         f"but the input has a column {taken[0]!r} too; rename one of them")
    return carried


def check_output(cfg: BatchQAConfig) -> list[str]:
    """The output is a directory or prefix (never a file), writable (a probe object is written and
    deleted), holding only batch outputs; returns its complete Parquet files."""
    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    storage.check_output_location(out_fs, out_path, cfg.output, cfg.s3)
    with storage_errors.output_errors(cfg.output, cfg.s3):
        return storage.complete_parquet_files(out_fs, out_path)


def resume_state(cfg: BatchQAConfig, source: CheckedInput, done_files: list[str]) -> tuple[pa.Array, pa.Array]:
    """The ids already answered (skipped) and those in the output to redo (infrastructure errors,
    and with ``redo_changed`` rows whose input changed); refuses a changed input otherwise."""
    in_fs, _ = storage.filesystem(cfg.input, cfg.s3)

    def changed_of(out_fs: object, done: pa.Array, retry: pa.Array) -> pa.Array:
        if not len(done):
            return pa.array([], pa.string())
        return fingerprint.changed_ids(in_fs, source.files, out_fs, done_files, done, fingerprint.job_question(cfg),
                                       fingerprint.answer_key(cfg))

    return committed_state(cfg, done_files, changed_of, lambda: source.ids.combine_chunks())


# (output filesystem, done ids, ids to retry) -> the done ids whose input changed
ChangedIds = Callable[[Any, pa.Array, pa.Array], pa.Array]


def committed_state(cfg: BatchQAConfig, done_files: list[str], changed_of: ChangedIds,
                    input_ids: Callable[[], pa.Array]) -> tuple[pa.Array, pa.Array]:
    """:func:`resume_state` for any input: ``changed_of`` finds the done ids whose input changed (called once,
    first), ``input_ids`` then gives (at least) the output's ids the input still has (a row to redo that
    the input lacks is left)."""
    out_fs, _ = storage.filesystem(cfg.output, cfg.s3)
    with storage_errors.output_errors(cfg.output, cfg.s3):
        # Rows written as infrastructure errors (`infra:`) are not done: a rerun takes them out and redoes them.
        done, retry = commit_rules.committed_and_retry_ids(out_fs, done_files)
        dup = storage.duplicates(pa.chunked_array([done, retry.cast(pa.string())], pa.string()))
        if dup:  # not trusting the lease alone: two writers, or a store ignoring conditional writes
            raise ValueError(f"output {cfg.output} holds duplicate ids, e.g. {', '.join(sorted(dup))}; repair it with: "
                             f"memagent repair-output --output {cfg.output}")
        # Resume checks what it skips: same question, context and answer-changing settings?
        changed = changed_of(out_fs, done, retry.cast(pa.string()))
        if len(changed) and not cfg.redo_changed:
            raise ValueError(f"{len(changed)} id(s) already in {cfg.output} were answered from a different input "
                             "(question, context, schema or answer-changing settings), "
                             f"e.g. {changed[0].as_py()!r}; "
                             "use a new output, or --redo-changed to answer them again")
        if len(changed):
            log.warning("%d id(s) in %s changed since they were answered: redoing them", len(changed), cfg.output)
            done = done.filter(pc.invert(pc.is_in(done, value_set=changed)))
            retry = pa.concat_arrays([retry.cast(pa.string()), changed])
    retry = retry.filter(pc.is_in(retry, value_set=input_ids())) if len(retry) else retry
    return done, retry


def output_schema(cfg: BatchQAConfig, schema: pa.Schema, carried: dict[str, str] | None = None) -> pa.Schema:
    """The input's columns (those named like an output column under their ``carried`` names), then the
    result columns (with a converted document's page map: ``evidence_pages``), then the job's own."""
    carried = carried or {}
    inputs = [f.with_name(carried.get(f.name, f.name)) for f in schema]
    pages = [pa.field(EVIDENCE_PAGES_COLUMN, EVIDENCE_PAGES_TYPE)] if PAGES_COLUMN in schema.names and \
        EVIDENCE_PAGES_COLUMN not in [f.name for f in inputs] else []
    return pa.schema([*inputs, *result_schema(cfg.agent), *pages, *JOB_SCHEMA])


def take_out_redo_rows(cfg: BatchQAConfig, plan: InputPlan) -> None:
    """Remove from the output the rows this run redoes (infrastructure errors of an earlier run)."""
    if not len(plan.redo_ids):
        return
    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    with storage_errors.output_errors(cfg.output, cfg.s3):
        n = commit_rules.remove_rows(out_fs, out_path, storage.complete_parquet_files(out_fs, out_path), plan.redo_ids)
    log.warning("%d row(s) in %s failed on the infrastructure in an earlier run: redoing them", n, cfg.output)


def unreadable_input(cfg: BatchQAConfig, files: list[str], exc: BaseException) -> ValueError | None:
    """One line naming the input file and row group that made the job's read fail, or None.

    The plan reads every footer and the ``id`` column, not every page (that would read the whole
    input twice): a corrupt data page elsewhere fails Ray Data's read task instead. Only then are
    row groups read one by one, the file the read named first (all the planned files if none).
    """
    causes = storage_errors.error_causes(exc)
    if not any(isinstance(e, (OSError, pa.ArrowException)) for e in causes):
        return None
    text = "\n".join(str(e) for e in causes)
    named = [f for f in files if f in text]
    in_fs, _ = storage.filesystem(cfg.input, cfg.s3)
    for file in named or files:
        found = _bad_row_group(in_fs, file)
        if found is not None:
            shown = f"s3://{file}" if storage.is_s3(cfg.input) else file
            return ValueError(f"input file {shown}: {found}; rewrite the file or take it out of the input, then run "
                              f"the same command again (rows already written are kept)")
    return None


def _bad_row_group(fs: object, file: str) -> str | None:
    """'row group i of n (rows a-b) is unreadable (why)' for the first row group that fails to read."""
    try:
        with fs.open_input_file(file) as f:  # type: ignore[attr-defined]
            pf = pq.ParquetFile(f)
            first = 0
            for i in range(pf.num_row_groups):
                rows = pf.metadata.row_group(i).num_rows
                try:
                    pf.read_row_group(i)
                except (OSError, pa.ArrowException) as exc:
                    why = " ".join("".join(c if c.isprintable() else " " for c in str(exc)).split())
                    return (f"row group {i} of {pf.num_row_groups} (rows {first}-{first + rows - 1} of the file) is "
                            f"unreadable ({why})")
                first += rows
    except (OSError, pa.ArrowException) as exc:
        return f"unreadable ({' '.join(str(exc).split())})"
    return None
