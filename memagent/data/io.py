"""Where data lives (local paths or S3, any endpoint), reading source files and writing Parquet.

:func:`filesystem` is the one place a path becomes a pyarrow filesystem: pyarrow's native S3
client does the bulk I/O (Ray's own fast path); credentials come from AWS's usual sources, the
endpoint and region from :class:`S3Options` or the environment (``AWS_ENDPOINT_URL``), so a
loopback S3 server works like AWS. JSON sources may be one JSON document or JSON Lines.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field


class S3Options(BaseModel):
    """S3 connection settings; credentials come from AWS's usual sources, never from here."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoint_url: str | None = Field(None, description="S3 endpoint URL, e.g. http://127.0.0.1:5055 (default: AWS or "
                                     "$AWS_ENDPOINT_URL)", json_schema_extra={"flag": "s3-endpoint"})
    region: str | None = Field(None, description="S3 region (default: $AWS_REGION/$AWS_DEFAULT_REGION or us-east-1)",
                               json_schema_extra={"flag": "s3-region"})

    def endpoint(self) -> str | None:
        """The endpoint in force: this option, else ``$AWS_ENDPOINT_URL``, else AWS (None)."""
        return self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL")

    def region_name(self) -> str:
        """The region in force: this option, else ``$AWS_REGION``, ``$AWS_DEFAULT_REGION``, else us-east-1."""
        return self.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def check_uri(uri: str, what: str = "path") -> str:
    """Accept a local path or ``s3://bucket/prefix``; anything else is a clear error."""
    if not uri or not uri.strip():
        raise ValueError(f"{what}: must not be empty")
    if "://" in uri and not is_s3(uri) and not uri.startswith("file://"):
        scheme = uri.split("://", 1)[0]
        raise ValueError(f"{what} {uri!r}: unsupported scheme {scheme!r}; only local paths and s3:// URIs are "
                         "supported")
    if is_s3(uri) and not uri[len("s3://"):].strip("/"):
        raise ValueError(f"{what} {uri!r}: give a bucket, e.g. s3://bucket/prefix")
    return uri


def filesystem(uri: str, s3: S3Options | None = None) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem for ``uri`` (a local path, ``file://`` or ``s3://``) and the path inside it."""
    check_uri(uri)
    if uri.startswith("file://"):
        uri = uri[len("file://"):]
    if not is_s3(uri):
        return pafs.LocalFileSystem(), str(Path(uri).expanduser().resolve())
    s3 = s3 or S3Options()
    endpoint = s3.endpoint()
    kwargs: dict = {"region": s3.region_name()}
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kwargs.update(endpoint_override=host or scheme, scheme=scheme if host else "https")
    # No explicit credentials: a pickled S3FileSystem carries them in clear text to every Ray
    # task. Each process finds the AWS credentials itself (local workers share the driver's env).
    return pafs.S3FileSystem(**kwargs), uri[len("s3://") :]


def read_bytes(path: str) -> bytes:
    """Whole file; a missing file raises ``FileNotFoundError`` naming it."""
    fs, inner = filesystem(path)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no such file: {path}")
    if info.type != pafs.FileType.File:
        raise IsADirectoryError(f"{path} is not a file")
    with fs.open_input_stream(inner) as f:
        return f.read()


def read_text(path: str) -> str:
    """A UTF-8 text file (the essay haystack)."""
    try:
        return read_bytes(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text: {exc}") from None


def read_json(path: str) -> Any:
    """One JSON document, or a list of records for ``.jsonl`` (and for a ``.json`` file holding
    JSON Lines); errors say ``FILE:LINE: what is wrong``."""
    text = read_text(path).removeprefix("\ufeff")  # a byte-order mark is not JSON
    if path.endswith(".jsonl"):
        return [record for _, record in read_json_lines(path, text)]
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and text.lstrip().startswith("{"):  # one JSON object a line
            return [record for _, record in read_json_lines(path, text)]
        raise ValueError(f"{path}:{exc.lineno}: invalid JSON at column {exc.colno}: {exc.msg}") from None


def read_json_lines(path: str, text: str | None = None) -> list[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of a JSON Lines file; a bad line is a
    ``ValueError`` saying ``FILE:LINE: invalid JSON ...``."""
    if text is None:
        text = read_text(path).removeprefix("\ufeff")
    records = []
    # split("\n"), not splitlines(): JSON strings may hold U+2028 and the like, which end no line here.
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            records.append((lineno, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: invalid JSON at column {exc.colno}: {exc.msg}") from None
    return records


def parquet_file_path(path: str) -> str:
    """Where :func:`write_parquet` puts rows: ``path`` itself if it ends in ``.parquet``, else a
    ``part-00000.parquet`` inside it (the layout Ray Data's writers also produce: a directory)."""
    return path if path.endswith(".parquet") else path.rstrip("/") + "/part-00000.parquet"


def write_parquet(rows: Iterable[dict], path: str, schema: pa.Schema | None = None) -> str:
    """Write ``rows`` as one Parquet file (see :func:`parquet_file_path`); returns the file written.

    With ``schema`` the columns are cast to it (missing keys become nulls; extra keys are an
    error naming them), so empty sets and all-null columns keep their types.
    """
    rows = list(rows)
    if schema is not None:
        extra = sorted({k for r in rows for k in r} - set(schema.names))
        if extra:
            raise ValueError(f"rows have columns not in the schema: {', '.join(extra)}")
        table = pa.Table.from_pylist(rows, schema=schema)
    else:
        table = pa.Table.from_pylist(rows)
    target = parquet_file_path(path)
    fs, inner = filesystem(target)
    parent = inner.rsplit("/", 1)[0]
    if parent:
        fs.create_dir(parent, recursive=True)
    pq.write_table(table, inner, filesystem=fs)
    return target


def read_parquet_table(path: str) -> pa.Table:
    """A Parquet file or a directory of them (as Ray Data writes)."""
    fs, inner = filesystem(path)
    if fs.get_file_info(inner).type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no such file or directory: {path}")
    return pq.read_table(inner, filesystem=fs)


def read_records(path: str) -> list[dict]:
    """Rows of a Parquet file/directory, or the records of a JSON/JSONL file."""
    if path.endswith((".json", ".jsonl")):
        data = read_json(path)
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
        return data
    return read_parquet_table(path).to_pylist()
