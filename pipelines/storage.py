"""Where datasets live: local paths or S3 (any endpoint), and what an output already holds.

pyarrow's native S3 filesystem does the bulk Parquet I/O (Ray's own fast path). Credentials
come from the usual AWS chain (environment, profile, instance role); the endpoint and region
are options so a loopback or on-prem S3 works the same as AWS.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

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


# Where a rerun moves an output file while it rewrites it without rows to redo.
REPLACED_DIR = "_replaced"


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


# -- checks before any work ------------------------------------------------------------------


def _short_reason(exc: BaseException) -> str:
    """pyarrow/AWS error text in a few words (the SDK's multi-line advice dropped)."""
    text = " ".join(str(exc).split("\n")[0].split())
    text = re.sub(r"(Detail: )?\[[Ee]rrno \d+\] ", "", text)
    for marker, reason in (("NETWORK_CONNECTION", "cannot reach the S3 endpoint"),
                           ("NO_SUCH_BUCKET", "the bucket does not exist"),
                           ("ACCESS_DENIED", "access denied (check the credentials and their permissions)"),
                           ("INVALID_ACCESS_KEY_ID", "the access key id is not valid"),
                           ("SIGNATURE_DOES_NOT_MATCH", "the secret key does not match")):
        if marker in text:
            detail = text.split("operation:", 1)[-1].strip() if "operation:" in text else ""
            return f"{reason}{f' ({detail})' if detail and marker == 'NETWORK_CONNECTION' else ''}"
    return text


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


# Write failures: errno, the words OS/Arrow errors say it with, what the user is told.
_WRITE_CAUSES = ((errno.ENOSPC, "No space left on device", "no space left on device", "free some space"),
                 (errno.EDQUOT, "Disk quota exceeded", "disk quota exceeded", "free some quota"),
                 (errno.EROFS, "Read-only file system", "read-only file system", "make it writable"),
                 (errno.EACCES, "Permission denied", "permission denied", "fix its permissions"))
_S3_WRITES = ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "DeleteObject")
RERUN_ADVICE = "run the same command again: rows already written are kept"


def error_chain(exc: BaseException) -> list[BaseException]:
    """``exc``, its causes and contexts, and the original of a Ray task error (``.cause``)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or any(e is s for s in seen):
            continue
        seen.append(e)
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]
    return [e for e in seen if isinstance(e, BaseException)]


def _write_cause(text: str, errnos: set[int], uri: str) -> tuple[str, str] | None:
    """(cause, what to do) of a failed write, from the errors' errnos and text; None if not one."""
    for code, words, reason, fix in _WRITE_CAUSES:
        if code in errnos or words in text:
            return reason, f"{fix} (or give another output) and {RERUN_ADVICE}"
    if not is_s3(uri):
        return None
    bucket = re.search(r"Bucket '([^']+)' not found", text)
    missing = bucket.group(1) if bucket else None
    if missing is None and ("NO_SUCH_BUCKET" in text or "NoSuchBucket" in text):
        # Any S3 call on the output (a listing, a read) once the bucket is gone; an input bucket's
        # error names that bucket, not this output's.
        ours = uri.removeprefix("s3://").split("/", 1)[0]
        named = re.search(r"in bucket '([^']+)'", text)
        missing = ours if named is None or named.group(1) == ours else None
    if missing:
        return f"bucket {missing!r} does not exist", f"create it (or give another output) and {RERUN_ADVICE}"
    if "AWS Error" in text and any(op in text for op in _S3_WRITES):
        line = next(t for t in text.split("\n") if "AWS Error" in t)
        return f"S3 error while writing: {_short_reason(Exception(line))}", f"fix it and {RERUN_ADVICE}"
    return None


def write_failure(exc: BaseException, uri: str, endpoint: str | None = None) -> OSError | None:
    """One line for a failure to write the output (full disk, permission, quota, S3 error),
    naming the output, the cause and what to do; None when ``exc`` is not one."""
    chain = error_chain(exc)
    cause = _write_cause(" ".join(str(e) for e in chain), {e.errno for e in chain if isinstance(e, OSError)}, uri)
    if cause is None:
        return None
    where = f" at {endpoint}" if endpoint and is_s3(uri) else ""
    return _checked(OSError(f"output {uri}{where}: {cause[0]}; {cause[1]}"))


class _HideWriteFailure(logging.Filter):
    """Drops a console handler's error records once one shows a write failure."""

    def __init__(self, uri: str):
        super().__init__()
        self.uri, self.seen = uri, False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        text = record.getMessage() + (logging.Formatter().formatException(record.exc_info) if record.exc_info else "")
        # The job says each of these in one line: a failed write, a lost lease, a failed input read
        # (Ray Data's read operator; the line names the file and row group).
        self.seen = (self.seen or _write_cause(text, set(), self.uri) is not None
                     or "its lease was taken over by" in text
                     or 'operator "ReadFiles' in text or "Failed to read fragment" in text)
        return not self.seen


@contextmanager
def quiet_write_failures(uri: str, logger: str = "ray.data") -> Iterator[None]:
    """While the job writes: Ray Data's console tracebacks of a write failure, a lost lease or a
    failed input read are hidden (its log file keeps them), since the job turns each into one line
    (:func:`write_failure`, ``pipelines.batch_qa.lease_lost``, ``pipelines.input_plan.unreadable_input``)."""
    hide = _HideWriteFailure(uri)
    handlers = [h for h in logging.getLogger(logger).handlers if isinstance(h, logging.StreamHandler)
                and not isinstance(h, logging.FileHandler)]
    for h in handlers:
        h.addFilter(hide)
    try:
        yield
    finally:
        for h in handlers:
            h.removeFilter(hide)


class io_errors:
    """Turn a filesystem error into one line naming what and where: ``input s3://x: cannot reach ...``."""

    def __init__(self, what: str, uri: str, endpoint: str | None = None):
        self.what, self.uri, self.endpoint = what, uri, endpoint

    def __enter__(self) -> io_errors:
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is None or not isinstance(exc, OSError) or getattr(exc, "_memagent_checked", False):
            return False
        mapped = write_failure(exc, self.uri, self.endpoint) if self.what == "output" else None
        if mapped is not None:
            raise mapped from None
        where = f" at {self.endpoint}" if self.endpoint and is_s3(self.uri) else ""
        raise _checked(OSError(f"{self.what} {self.uri}{where}: {_short_reason(exc)}")) from None


def output_errors(uri: str, s3: S3Options | None) -> io_errors:
    """:class:`io_errors` for work on the output ``uri``: one line naming it (a write failure's cause and fix)."""
    return io_errors("output", uri, s3_endpoint(s3))


def _checked(exc: OSError) -> OSError:
    exc._memagent_checked = True  # type: ignore[attr-defined]  # already one line naming the path
    return exc


def s3_endpoint(s3: S3Options | None) -> str | None:
    return (s3 or S3Options()).endpoint()


def read_schemas(fs: pafs.FileSystem, files: list[str], uri: str) -> list[tuple[str, pa.Schema]]:
    """Each input file's schema; a file that is not Parquet (or is cut short) is named."""
    out = []
    for file in files:
        try:
            with fs.open_input_file(file) as f:
                out.append((file, pq.read_schema(f)))
        except (pa.ArrowInvalid, OSError) as exc:
            if isinstance(exc, OSError) and not isinstance(exc, pa.ArrowInvalid) and "Parquet" not in str(exc):
                raise
            shown = file if not is_s3(uri) else "s3://" + file
            raise ValueError(f"input file {shown} is not a readable Parquet file "
                             f"({' '.join(str(exc).split()).replace(chr(39) + '<Buffer>' + chr(39), 'it')})") from None
    return out


def unify_schemas(schemas: list[tuple[str, pa.Schema]], uri: str) -> pa.Schema:
    """One schema for all input files: columns of every file kept (nulls where a file lacks one),
    compatible types widened (int32 + int64 -> int64, int + float -> double, string + large_string);
    incompatible types are an error naming the column and both files."""
    fields: dict[str, tuple[pa.DataType, str]] = {}
    for file, schema in schemas:
        for f in schema:
            if f.name not in fields:
                fields[f.name] = (f.type, file)
                continue
            have, first = fields[f.name]
            if have == f.type:
                continue
            try:
                merged = pa.unify_schemas([pa.schema([(f.name, have)]), pa.schema([(f.name, f.type)])],
                                          promote_options="permissive").field(f.name).type
            except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
                s3 = "s3://" if is_s3(uri) else ""
                raise ValueError(f"input column {f.name!r} is {have} in {s3}{first} but {f.type} in {s3}{file}: the "
                                 "files disagree; cast the column to one type in every file") from None
            fields[f.name] = (merged, first)
    return pa.schema([(name, t) for name, (t, _) in fields.items()])


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
                raise _checked(OSError(f"output {uri}: bucket {bucket!r} does not exist"
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
            raise _checked(OSError(f"output {uri} is not writable (permission denied)")) from None
        finally:  # a failed write (a full disk) can leave the probe behind, 0 bytes: never keep it
            try:
                fs.delete_file(probe)
            except OSError:
                pass
