"""Reading source files and writing Parquet, on local paths or any URI pyarrow knows (``s3://``).

S3 endpoints come from the environment (``AWS_ENDPOINT_URL`` and the usual credentials), which
pyarrow's native client honours, so the same code reads a local file and an object in a test
S3 server. JSON sources may be one JSON document or JSON Lines (``.jsonl``).
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq


def is_uri(path: str) -> bool:
    return "://" in path


def filesystem(path: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem for ``path`` and the path inside it (local paths made absolute)."""
    if is_uri(path):
        if path.startswith("file://"):
            return pafs.LocalFileSystem(), path[len("file://") :]
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(path))


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
    """One JSON document, or a list of records for ``.jsonl``; errors name the file and line."""
    text = read_text(path)
    if path.endswith(".jsonl"):
        records = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: invalid JSON: {exc.msg}") from None
        return records
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None


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


def load_tokenizer(name_or_path: str = "smollm2-135m") -> Any:
    """The HF tokenizer of a registered model name, model directory or GGUF file (no downloads)."""
    from transformers import AutoTokenizer

    from memagent.models import resolve_model

    return AutoTokenizer.from_pretrained(str(resolve_model(name_or_path)))


def read_records(path: str) -> list[dict]:
    """Rows of a Parquet file/directory, or the records of a JSON/JSONL file."""
    if path.endswith((".json", ".jsonl")):
        data = read_json(path)
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
        return data
    return read_parquet_table(path).to_pylist()
