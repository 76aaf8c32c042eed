"""Where datasets live: local paths or S3 (any endpoint), and what an output already holds.

pyarrow's native S3 filesystem does the bulk Parquet I/O (Ray's own fast path). Credentials
come from AWS's usual sources (environment, profile, instance role); the endpoint and region
are options so a loopback or on-prem S3 works the same as AWS. How a storage failure is worded
is :mod:`pipelines.storage_errors`; which output rows count as written, :mod:`pipelines.commit_rules`;
the input files' schemas, :mod:`pipelines.input_schemas`.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from memagent.data.io import S3Options, check_uri, filesystem, is_s3
from pipelines.storage_errors import worded, output_errors, s3_endpoint

__all__ = ["S3Options", "check_uri", "filesystem", "is_s3"]  # one implementation, in the library

log = logging.getLogger(__name__)

# Where a resume moves output files that are not complete Parquet files.
QUARANTINE_DIR = "_incomplete"


def parquet_files(fs: pafs.FileSystem, path: str) -> list[str]:
    """The input rule (docs/deployment.md "Batch inputs and outputs"): ``path`` itself if it is a
    file; in a directory, every file at any depth whose name ends in ``.parquet`` in any case,
    except below a name (file or directory, under ``path``) starting with ``_`` or ``.``
    (``_SUCCESS``, ``_temporary/``, quarantined output, ``.trash/``). Jobs hand exactly this list
    to the reader, so the files checked are the files read."""
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        return []
    if info.type == pafs.FileType.File:
        return [path]
    selector = pafs.FileSelector(path, recursive=True)
    files = []
    for f in fs.get_file_info(selector):
        rel = f.path[len(path.rstrip("/")) + 1 :]
        if f.type != pafs.FileType.File or not f.path.lower().endswith(".parquet"):
            continue
        if any(part.startswith(("_", ".")) for part in rel.split("/")):
            continue
        files.append(f.path)
    return sorted(files)


def output_file_infos(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    """An output's documents files: the ``.parquet`` files directly in ``path`` (the writer's, one level: the
    ``_records``, ``_progress`` and other ``_``/``.`` names are never listed), sorted by path."""
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return []
    # no allow_not_found: a bucket gone between the check and the listing must raise, not read as empty
    infos = [f for f in fs.get_file_info(pafs.FileSelector(path)) if f.type == pafs.FileType.File
             and f.base_name.lower().endswith(".parquet") and not f.base_name.startswith(("_", "."))]
    return sorted(infos, key=lambda f: f.path)


def output_files(fs: pafs.FileSystem, path: str) -> list[str]:
    """:func:`output_file_infos`' paths."""
    return [f.path for f in output_file_infos(fs, path)]


def complete_parquet_files(fs: pafs.FileSystem, path: str) -> list[str]:
    """Output files that are whole Parquet files; partial ones (no footer) are quarantined.

    A writer killed mid-file leaves bytes without a Parquet footer. Such a file holds no
    committed rows, so it is moved aside (never deleted) and its rows are recomputed. A file that
    cannot be read (a store's error) is not judged: the error is raised, and a rerun reads it again.
    """
    good = []
    for file in output_files(fs, path):
        try:
            with fs.open_input_file(file) as f:
                pq.read_metadata(f)
            good.append(file)
        except pa.ArrowInvalid as exc:  # read whole, and not Parquet: no footer
            target = f"{path.rstrip('/')}/{QUARANTINE_DIR}/{file.rsplit('/', 1)[-1]}"
            log.warning("output file %s is incomplete (%s); moving it to %s", file, exc, target)
            fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
            fs.move(file, target)
    return good


def has_footer(fs: pafs.FileSystem, file: str) -> bool:
    """Whether ``file`` is a whole Parquet file (a writer killed mid-file leaves none)."""
    try:
        with fs.open_input_file(file) as f:
            pq.read_metadata(f)
        return True
    except (OSError, pa.ArrowInvalid):
        return False


def read_column(fs: pafs.FileSystem, files: Iterable[str], column: str) -> pa.ChunkedArray:
    """One column from many Parquet files (only that column's pages are read)."""
    arrays = []
    for file in files:
        with fs.open_input_file(file) as f:
            arrays.extend(pq.read_table(f, columns=[column]).column(column).chunks)
    return pa.chunked_array(arrays, type=arrays[0].type if arrays else pa.string())


def read_columns(fs: pafs.FileSystem, files: Iterable[str], columns: list[str]) -> pa.Table:
    """Several small columns from many Parquet files, concatenated; a column a file lacks (an
    output written by an older version) reads as nulls."""
    tables = []
    for file in files:
        with fs.open_input_file(file) as f:
            pf = pq.ParquetFile(f)
            have = [c for c in columns if c in pf.schema_arrow.names]
            t = pf.read(columns=have)
        tables.append(pa.table({c: t.column(c) if c in have else pa.nulls(len(t)) for c in columns}))
    if not tables:
        return pa.table({c: pa.array([], pa.null()) for c in columns})
    return pa.concat_tables(tables, promote_options="permissive")


def duplicates(ids: pa.ChunkedArray, limit: int = 5) -> list[str]:
    """Up to ``limit`` ids that occur more than once."""
    counts = pc.value_counts(ids.combine_chunks() if ids.num_chunks else ids)
    dup = counts.filter(pc.greater(counts.field("counts"), 1)).field("values")
    return [str(v) for v in dup.to_pylist()[:limit]]


def row_key(row_id: str) -> str:
    """A row's name in file and directory names: ids may hold any character, hashes only hex."""
    return hashlib.sha256(row_id.encode()).hexdigest()[:32]


def is_local(fs: pafs.FileSystem) -> bool:
    """Whether ``fs`` writes to local disk: a ``LocalFileSystem`` or a wrapper of one (pyarrow names a
    ``PyFileSystem`` over a local handler ``py::local``): renames are atomic there, directories real."""
    return fs.type_name.rsplit("::", 1)[-1] == "local"


def atomic_put(fs: pafs.FileSystem, path: str, write: Callable[[str], None], tmp_name: str) -> None:
    """Write ``path`` with ``write(target)`` so a reader sees it whole or not at all: locally a hidden
    ``.{tmp_name}.tmp`` beside it, renamed over it; on S3 one object. pyarrow completes an S3 upload even
    when the write fails half way (apache/arrow#40502): readers validate what they read back."""
    if not is_local(fs):
        write(path)
        return
    directory = path.rsplit("/", 1)[0]
    fs.create_dir(directory, recursive=True)
    tmp = f"{directory}/.{tmp_name}.tmp"
    write(tmp)
    fs.move(tmp, path)


# -- checks before any work ------------------------------------------------------------------


def check_not_nested(input_uri: str, in_path: str, output_uri: str, out_path: str) -> None:
    """Refuse an output inside the input directory (its files would be read as input by the next
    run), unless under a ``_``/``.`` name there (which :func:`parquet_files` skips); and an input
    inside the output directory."""
    if is_s3(input_uri) != is_s3(output_uri):
        return
    inner, outer = in_path.rstrip("/"), out_path.rstrip("/")
    if outer == inner or outer.startswith(inner + "/"):
        below = outer[len(inner) + 1:]
        if not below or not any(part.startswith(("_", ".")) for part in below.split("/")):
            raise ValueError(f"output {output_uri} is inside the input directory {input_uri}: the next run would read "
                             "the output's files as input; give an output outside the input (or under a directory "
                             "named _... there, which input listing skips)")
    elif inner.startswith(outer + "/"):
        raise ValueError(f"input {input_uri} is inside the output directory {output_uri}: its files would be taken "
                         "for output files; give an input outside the output")


def _looks_like_parquet(fs: pafs.FileSystem, path: str) -> bool:
    try:
        with fs.open_input_file(path) as f:
            return f.read(4) == b"PAR1"
    except OSError:
        return path.endswith(".parquet")


def check_output_location(fs: pafs.FileSystem, path: str, uri: str, s3: S3Options | None = None) -> None:
    """Before any work: the output is a directory (or a prefix) that exists or can be made, and is writable."""
    import uuid

    with output_errors(uri, s3):
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            kind = "a Parquet file" if _looks_like_parquet(fs, path) else "a regular file"
            raise ValueError(f"output {uri} is {kind}; give a directory (new, or an earlier output to resume into)")
        if is_s3(uri):
            bucket = path.split("/", 1)[0]
            if fs.get_file_info(bucket).type == pafs.FileType.NotFound:
                raise worded(OSError(f"output {uri}: bucket {bucket!r} does not exist"
                                       + (f" at {s3_endpoint(s3)}" if s3_endpoint(s3) else "")))
        else:
            parent = Path(path)
            while not parent.exists():
                parent = parent.parent
            if not parent.is_dir():
                raise ValueError(f"output {uri}: {parent} is a file, not a directory")
            fs.create_dir(path, recursive=True)
        probe = f"{path.rstrip('/')}/_memagent-write-check-{uuid.uuid4().hex[:8]}"
        try:
            with fs.open_output_stream(probe) as f:
                f.write(b"ok")
        except PermissionError:
            raise worded(OSError(f"output {uri} is not writable (permission denied)")) from None
        finally:  # a failed write (a full disk) can leave the probe behind, 0 bytes: never keep it
            try:
                fs.delete_file(probe)
            except OSError:
                pass
