"""Which rows of an output count as written: a row is done for good once it is in a complete
output file with no error or with one that is not an infrastructure error; ``infra:`` rows are
redone by a rerun, which first takes them out of the output. One rule, here, so that resuming a
job, repairing an output, sweeping checkpoints and exporting records agree on what is committed
(and a caller that removes what no committed row names never removes committed work).
"""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipelines.storage import read_columns

log = logging.getLogger(__name__)


# Where a rerun moves an output file while it rewrites it without rows to redo.
REPLACED_DIR = "_replaced"


def committed_mask(error: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Rows done for good: no error, or one that is not an infrastructure error (those a rerun redoes)."""
    from memagent.error_kinds import INFRA_PREFIX

    if pa.types.is_null(error.type):
        return pa.array([True] * len(error))
    return pc.invert(pc.fill_null(pc.starts_with(error, INFRA_PREFIX), False))


def committed_rows(fs: pafs.FileSystem, file: str, columns: list[str]) -> pa.Table:
    """``columns`` of the done rows of one written output file; none while its writer is at it (no footer).

    A read that fails (``OSError``) is raised, never taken for "no rows": a caller that removes what no
    committed row names (records files, checkpoint logs) would remove committed work."""
    try:
        table = read_columns(fs, [file], [*columns, "error"])
    except pa.ArrowInvalid:
        return pa.table({c: pa.array([], pa.null()) for c in columns})
    return table.filter(committed_mask(table.column("error"))).select(columns)


def committed_and_retry_ids(fs: pafs.FileSystem, files: list[str]) -> tuple[pa.Array, pa.Array]:
    """(ids done for good, ids written as retryable infrastructure errors) of complete output files."""
    if not files:
        empty = pa.array([], pa.string())
        return empty, empty
    for file in files:
        with fs.open_input_file(file) as f:
            names = pq.read_schema(f).names
        lacking = [c for c in ("id", "error") if c not in names]
        if lacking:
            raise ValueError(f"output holds {file}, which is not a batch output (no {lacking[0]!r} column); give "
                             "a new output directory")
    table = read_columns(fs, files, ["id", "error"])
    ids = table.column("id").combine_chunks().cast(pa.string())
    done = committed_mask(table.column("error").combine_chunks())
    return ids.filter(done), ids.filter(pc.invert(done))


def remove_rows(fs: pafs.FileSystem, path: str, files: list[str], ids: pa.Array) -> int:
    """Take the rows whose id is in ``ids`` out of the output files (they are redone); returns how many.

    Exactly once even if killed midway: each affected file is first moved to ``_replaced/``
    (ignored by readers), then its other rows are written back as a new file, then the moved
    file is deleted. A kill between the two steps loses only rows a rerun recomputes (they are
    no longer in the output, so not done).
    """
    if len(ids) == 0:
        return 0
    removed = 0
    for file in files:
        with fs.open_input_file(file) as f:
            table = pq.read_table(f)
        drop = pc.is_in(table.column("id"), value_set=ids)
        n = int(pc.sum(drop).as_py() or 0)
        if not n:
            continue
        name = file.rsplit("/", 1)[-1]
        moved = f"{path.rstrip('/')}/{REPLACED_DIR}/{name}"
        fs.create_dir(moved.rsplit("/", 1)[0], recursive=True)
        fs.move(file, moved)
        kept = table.filter(pc.invert(drop))
        if len(kept):
            import uuid

            target = f"{path.rstrip('/')}/{name.removesuffix('.parquet')}-kept-{uuid.uuid4().hex[:8]}.parquet"
            pq.write_table(kept, target, filesystem=fs)
        fs.delete_file(moved)
        removed += n
        log.info("output file %s: %d row(s) taken out to be redone", file, n)
    return removed

