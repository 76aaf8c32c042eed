"""Where datasets live: local paths or S3 (any endpoint), and what an output already holds.

pyarrow's native S3 filesystem does the bulk Parquet I/O (Ray's own fast path). Credentials
come from the usual AWS chain (environment, profile, instance role); the endpoint and region
are options so a loopback or on-prem S3 works the same as AWS.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from memagent.data.io import S3Options, check_uri, filesystem, is_s3

__all__ = ["S3Options", "check_uri", "filesystem", "is_s3"]  # one implementation, in the library

log = logging.getLogger(__name__)

# Where a resume moves output files that are not complete Parquet files.
QUARANTINE_DIR = "_incomplete"


def parquet_files(fs: pafs.FileSystem, path: str) -> list[str]:
    """Parquet files under ``path`` (a file or a directory), skipping quarantined and hidden ones."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return []
    if info.type == pafs.FileType.File:
        return [path]
    selector = pafs.FileSelector(path, recursive=True)
    files = []
    for f in fs.get_file_info(selector):
        rel = f.path[len(path.rstrip("/")) + 1 :]
        if f.type != pafs.FileType.File or not f.path.endswith(".parquet"):
            continue
        if any(part.startswith(("_", ".")) for part in rel.split("/")):
            continue
        files.append(f.path)
    return sorted(files)


def complete_parquet_files(fs: pafs.FileSystem, path: str) -> list[str]:
    """Output files that are whole Parquet files; partial ones (no footer) are quarantined.

    A writer killed mid-file leaves bytes without a Parquet footer. Such a file holds no
    committed rows, so it is moved aside (never deleted) and its rows are recomputed.
    """
    good = []
    for file in parquet_files(fs, path):
        try:
            with fs.open_input_file(file) as f:
                pq.read_metadata(f)
            good.append(file)
        except (OSError, pa.ArrowInvalid) as exc:
            target = f"{path.rstrip('/')}/{QUARANTINE_DIR}/{file.rsplit('/', 1)[-1]}"
            log.warning("output file %s is incomplete (%s); moving it to %s", file, exc, target)
            fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
            fs.move(file, target)
    return good


def read_column(fs: pafs.FileSystem, files: Iterable[str], column: str) -> pa.ChunkedArray:
    """One column from many Parquet files (only that column's pages are read)."""
    arrays = []
    for file in files:
        with fs.open_input_file(file) as f:
            arrays.extend(pq.read_table(f, columns=[column]).column(column).chunks)
    return pa.chunked_array(arrays, type=arrays[0].type if arrays else pa.string())


def read_columns(fs: pafs.FileSystem, files: Iterable[str], columns: list[str]) -> pa.Table:
    """Several small columns from many Parquet files, concatenated."""
    tables = []
    for file in files:
        with fs.open_input_file(file) as f:
            tables.append(pq.read_table(f, columns=columns))
    return pa.concat_tables(tables) if tables else pa.table({c: pa.array([], pa.null()) for c in columns})


def duplicates(ids: pa.ChunkedArray, limit: int = 5) -> list[str]:
    """Up to ``limit`` ids that occur more than once."""
    counts = pc.value_counts(ids.combine_chunks() if ids.num_chunks else ids)
    dup = counts.filter(pc.greater(counts.field("counts"), 1)).field("values")
    return [str(v) for v in dup.to_pylist()[:limit]]


# Where a rerun moves an output file while it rewrites it without rows to redo.
REPLACED_DIR = "_replaced"


def output_ids(fs: pafs.FileSystem, files: list[str]) -> tuple[pa.Array, pa.Array]:
    """(ids done for good, ids written as retryable infrastructure errors) of complete output files."""
    from memagent.error_kinds import INFRA_PREFIX

    if not files:
        empty = pa.array([], pa.string())
        return empty, empty
    table = read_columns(fs, files, ["id", "error"])
    ids, error = table.column("id").combine_chunks(), table.column("error").combine_chunks()
    if pa.types.is_null(error.type):
        return ids.cast(pa.string()), pa.array([], pa.string())
    retry = pc.fill_null(pc.starts_with(error, INFRA_PREFIX), False)
    return ids.filter(pc.invert(retry)), ids.filter(retry)


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
