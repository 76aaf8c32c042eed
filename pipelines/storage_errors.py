"""How a storage failure is told to the user: one line naming the input or output, the cause and
what to do (a full disk, a permission, a missing bucket, an S3 error), instead of pyarrow's or the
AWS SDK's multi-line text and Ray's tracebacks. Kept apart from the I/O itself so every layer that
touches storage (planning, writing, the lease, checkpoints) words and classifies failures the same
way, and so a failure already worded (:func:`worded`) is passed on, not wrapped twice.
"""

from __future__ import annotations

import errno
import logging
import re
from contextlib import contextmanager
from typing import Iterator

from memagent.data.io import S3Options, is_s3


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


# Write failures: errno, the words OS/Arrow errors say it with, what the user is told.
_WRITE_CAUSES = ((errno.ENOSPC, "No space left on device", "no space left on device", "free some space"),
                 (errno.EDQUOT, "Disk quota exceeded", "disk quota exceeded", "free some quota"),
                 (errno.EROFS, "Read-only file system", "read-only file system", "make it writable"),
                 (errno.EACCES, "Permission denied", "permission denied", "fix its permissions"))
_S3_WRITES = ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "DeleteObject")
RERUN_ADVICE = "run the same command again: rows already written are kept"


def error_causes(exc: BaseException) -> list[BaseException]:
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
    causes = error_causes(exc)
    cause = _write_cause(" ".join(str(e) for e in causes), {e.errno for e in causes if isinstance(e, OSError)}, uri)
    if cause is None:
        return None
    where = f" at {endpoint}" if endpoint and is_s3(uri) else ""
    return worded(OSError(f"output {uri}{where}: {cause[0]}; {cause[1]}"))


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
        raise worded(OSError(f"{self.what} {self.uri}{where}: {_short_reason(exc)}")) from None


def output_errors(uri: str, s3: S3Options | None) -> io_errors:
    """:class:`io_errors` for work on the output ``uri``: one line naming it (a write failure's cause and fix)."""
    return io_errors("output", uri, s3_endpoint(s3))


def worded(exc: OSError) -> OSError:
    """``exc``, marked as one line naming the path already: :func:`io_errors` passes it on unwrapped."""
    exc._memagent_checked = True  # type: ignore[attr-defined]
    return exc


def s3_endpoint(s3: S3Options | None) -> str | None:
    return (s3 or S3Options()).endpoint()

