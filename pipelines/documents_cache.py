"""Conversion paid once: each file's converted text and page map, cached by content hash and
converter version, and the Ray Data stage that converts a batch of files through the cache.

An entry is one small JSON object at ``<cache>/<converter version>/<sha[:2]>/<sha>.json`` (the
text, the page map, or the reason the file could not be converted: a bad file is not retried
either). The cache is beside the output by default (``<output's parent>/.memagent-documents``),
so every output in the same place shares it: a second schema over the same files converts
nothing again. Entries are written whole or not at all (:func:`pipelines.storage.atomic_put`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from memagent.documents import DocumentError, DocumentLimits, check_file_size, convert, converter_version
from memagent.documents.columns import DOCUMENT_ERROR_COLUMN, DOCUMENT_SHA_COLUMN, PAGES_COLUMN, page_rows
from pipelines import storage
from pipelines.batch_config import BatchQAConfig
from pipelines.storage import S3Options

log = logging.getLogger(__name__)

CACHE_DIR = ".memagent-documents"
STAGED_DIR = "staged"  # under the cache: where an earlier version staged converted rows (a killed run left them)


def cache_uri(cfg: BatchQAConfig) -> str:
    """Where conversions are cached: ``documents_cache``, else beside the output."""
    if cfg.documents_cache:
        return cfg.documents_cache
    parent = cfg.output.rstrip("/").rsplit("/", 1)[0] if "/" in cfg.output.rstrip("/") else "."
    return f"{parent}/{CACHE_DIR}"


def sweep_staged(cfg: BatchQAConfig) -> None:
    """Remove the rows an earlier version staged under the cache (this one stages nothing): what a killed
    run of it left. A store's error is logged: the files are only litter."""
    fs, root = storage.filesystem(cache_uri(cfg), cfg.s3)
    path = f"{root.rstrip('/')}/{STAGED_DIR}"
    try:
        if fs.get_file_info(path).type == pafs.FileType.Directory:
            fs.delete_dir(path)
    except OSError as exc:
        log.warning("documents cache %s: staged rows of an earlier run not removed (%s)", cache_uri(cfg), exc)


class DocumentCache:
    """The cache's entries for this converter version, on ``fs`` under ``path``."""

    def __init__(self, uri: str, s3: S3Options | None):
        self.fs, root = storage.filesystem(uri, s3)
        self.path = f"{root.rstrip('/')}/{converter_version()}"

    def _entry(self, sha: str) -> str:
        return f"{self.path}/{sha[:2]}/{sha}.json"

    def get(self, sha: str) -> dict[str, Any] | None:
        """The entry of a file with content hash ``sha``, or None (never converted, or unreadable)."""
        try:
            with self.fs.open_input_stream(self._entry(sha)) as f:
                entry = json.loads(f.read())
        except (FileNotFoundError, ValueError):
            return None
        except OSError as exc:
            if "not found" in str(exc).lower() or "NoSuchKey" in str(exc):
                return None
            raise
        return entry if isinstance(entry, dict) and {"text", "pages", "error"} <= entry.keys() else None

    def put(self, sha: str, entry: dict[str, Any]) -> None:
        data = json.dumps(entry, ensure_ascii=False).encode()

        def write(target: str) -> None:
            with self.fs.open_output_stream(target) as f:
                f.write(data)

        storage.atomic_put(self.fs, self._entry(sha), write, f"{sha}-{uuid.uuid4().hex[:8]}")


def convert_entry(data: bytes, name: str, limits: DocumentLimits) -> tuple[dict[str, Any], bool]:
    """A cache entry: the converted text and page map, or the reason the file cannot be converted; and whether
    to cache it (an ``oversized`` file is the limit's verdict, not the file's: a raised limit converts it)."""
    try:
        doc = convert(data, name, limits)
    except DocumentError as exc:
        return _error_entry(str(exc)), exc.kind != "oversized"
    return {"text": doc.text, "pages": page_rows(doc.pages), "error": None}, True


def _error_entry(reason: str) -> dict[str, Any]:
    return {"text": None, "pages": None, "error": reason}


def convert_files(batch: pa.Table, fs: pafs.FileSystem, root: str, cache: str, s3: S3Options | None,
                  limits: DocumentLimits, schema: pa.Schema, questions: Any = None) -> pa.Table:
    """Ray Data stage: listing rows (``path``, ``size``: pipelines/documents_listing.py) to document rows of
    ``schema``, one per file, each file read here (one at a time: a worker holds one file's bytes)."""
    if questions is not None and not isinstance(questions, dict):
        import ray

        questions = ray.get(questions)
    store = DocumentCache(cache, s3)
    rows = []
    for path, size in zip(batch.column("path").to_pylist(), batch.column("size").to_pylist()):
        doc_id = path[len(root.rstrip("/")) + 1:] if path.startswith(root.rstrip("/") + "/") else path.rsplit("/", 1)[-1]
        sha, entry = _converted(fs, path, size, doc_id, store, limits)
        row = {"id": doc_id, "context": entry["text"], PAGES_COLUMN: entry["pages"], DOCUMENT_SHA_COLUMN: sha,
               DOCUMENT_ERROR_COLUMN: f"{doc_id}: {entry['error']}" if entry["error"] else None}
        if questions is not None:
            row["question"] = questions.get(doc_id)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=schema)


def _converted(fs: pafs.FileSystem, path: str, size: int | None, doc_id: str, store: DocumentCache,
               limits: DocumentLimits) -> tuple[str | None, dict[str, Any]]:
    """(content hash, cache entry) of one listed file. A file over ``limits.max_bytes`` is hashed as it
    streams and never held whole; a file gone since it was listed is an error row, not a lost row."""
    try:
        try:
            check_file_size(size or 0, limits)
        except DocumentError as exc:
            return _streamed_sha256(fs, path), _error_entry(str(exc))
        with fs.open_input_stream(path) as f:
            data = f.read()
    except FileNotFoundError:
        return None, _error_entry("missing: the file was removed after it was listed")
    sha = hashlib.sha256(data).hexdigest()
    entry = store.get(sha)
    if entry is None:
        entry, cacheable = convert_entry(data, doc_id, limits)
        if cacheable:
            store.put(sha, entry)
    return sha, entry


def _streamed_sha256(fs: pafs.FileSystem, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open_input_stream(path) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
