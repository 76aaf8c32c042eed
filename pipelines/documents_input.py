"""Documents in: a folder, glob or S3 prefix of PDF, HTML, DOCX and text files as a batch job's input.

    read_binary_files (Ray Data, streamed) ─► id = path under the input root ─► content hash
        ─► the cached conversion, or convert and cache it ─► staged Parquet rows
           (id, context, pages, document_sha256, document_error[, question])

The staged rows are an ordinary Parquet input: the job reads them as it reads any (resume by id,
the fingerprint check, checkpoints, error rows), so nothing downstream knows documents. A
file that cannot be converted is a row with a null context and its ``document_error``; its output
row is an ``input:`` error naming the file and the reason, done (a rerun skips it) unless the
file changes (its hash is part of the row's fingerprint). Conversions are cached by content hash
and converter version (:mod:`pipelines.documents_cache`): a rerun, a resume after a kill or a
second schema over the same files converts nothing again. The staged rows are written under the
cache and removed when the job ends.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import uuid
from dataclasses import dataclass
from typing import Iterator

import pyarrow as pa
import pyarrow.fs as pafs

from memagent.documents import DOCUMENT_SUFFIXES, document_format
from memagent.documents.columns import DOCUMENT_COLUMNS
from pipelines import storage, storage_errors
from pipelines.batch_config import BatchQAConfig
from pipelines.documents_cache import cache_uri, convert_files

GLOB_CHARS = "*?["
STAGED_DIR = "staged"  # under the cache: one directory per run, removed when it ends


@dataclass(frozen=True)
class DocumentSource:
    """What the job reads: ``paths`` (the root directory itself, or the files a glob matched) inside
    ``fs``; each document's id is its path relative to ``root``."""

    fs: pafs.FileSystem
    root: str
    paths: str | list[str]


def documents_source(cfg: BatchQAConfig) -> DocumentSource | None:
    """The documents the input names, or None for a Parquet input (a file named ``.parquet``, or a
    directory holding Parquet files: those inputs are read as they always were)."""
    fs, path = storage.filesystem(cfg.input, cfg.s3)
    if any(c in cfg.input for c in GLOB_CHARS):
        return _glob_source(fs, path, cfg.input)
    with storage_errors.io_errors("input", cfg.input, storage_errors.s3_endpoint(cfg.s3)):
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            return DocumentSource(fs, path.rsplit("/", 1)[0], [path]) if document_format(path) else None
        if info.type != pafs.FileType.Directory or storage.parquet_files(fs, path):
            return None
    return DocumentSource(fs, path.rstrip("/"), path)


def _glob_source(fs: pafs.FileSystem, path: str, uri: str) -> DocumentSource:
    """The files a glob matches (``*`` within a name, ``**`` across directories), under the glob's
    fixed directory: the ids are relative to it."""
    fixed = path[: min(path.index(c) for c in GLOB_CHARS if c in path)]
    root = fixed.rsplit("/", 1)[0] if "/" in fixed else fixed
    pattern = path[len(root) + 1:]
    with storage_errors.io_errors("input", uri, None):
        infos = fs.get_file_info(pafs.FileSelector(root, recursive="/" in pattern or "**" in pattern,
                                                   allow_not_found=True))
    matches = sorted(i.path for i in infos if i.type == pafs.FileType.File and _matches(i.path[len(root) + 1:], pattern))
    if not matches:
        raise ValueError(f"input {uri}: no files match")
    return DocumentSource(fs, root, matches)


def _matches(relative: str, pattern: str) -> bool:
    """Whether a path matches a glob, name by name: ``*``, ``?`` and ``[...]`` within one name,
    a ``**`` name for any number of directories (none too)."""
    return _match_parts(relative.split("/"), pattern.split("/"))


def _match_parts(parts: list[str], patterns: list[str]) -> bool:
    if not patterns:
        return not parts
    if patterns[0] == "**":
        return any(_match_parts(parts[i:], patterns[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], patterns[0]) and _match_parts(parts[1:], patterns[1:])


def read_questions(cfg: BatchQAConfig) -> dict[str, str] | None:
    """The questions file (JSON Lines, ``{"id": ..., "question": ...}`` per line) as id -> question."""
    if cfg.questions is None:
        return None
    fs, path = storage.filesystem(cfg.questions, cfg.s3)
    with storage_errors.io_errors("questions", cfg.questions, storage_errors.s3_endpoint(cfg.s3)):
        with fs.open_input_stream(path) as f:
            lines = f.read().decode("utf-8").splitlines()
    questions: dict[str, str] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            doc_id, question = item["id"], item["question"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"questions {cfg.questions}: line {n} is not a JSON object with string fields "
                             f'"id" and "question": {line[:80]!r}') from None
        if not isinstance(doc_id, str) or not isinstance(question, str) or not question.strip():
            raise ValueError(f"questions {cfg.questions}: line {n}: id and question must be non-empty strings")
        questions[doc_id] = question
    return questions


@contextlib.contextmanager
def staged_input(cfg: BatchQAConfig, source: DocumentSource) -> Iterator[str]:
    """Convert (or take from the cache) every document of ``source`` into a Parquet input under the
    cache; yields its URI, removed afterwards. Ray is started by the caller."""
    import ray

    # As for Parquet inputs: an output inside the input would be read as documents by the next run.
    storage.check_not_nested(cfg.input, source.root, cfg.output, storage.filesystem(cfg.output, cfg.s3)[1])
    cache = cache_uri(cfg)
    staged = f"{cache.rstrip('/')}/{STAGED_DIR}/{uuid.uuid4().hex[:12]}"
    fs, staged_path = storage.filesystem(staged, cfg.s3)
    questions = read_questions(cfg)
    try:
        try:
            ds = ray.data.read_binary_files(source.paths, filesystem=source.fs, include_paths=True,
                                            partitioning=None, ignore_missing_paths=False)
        except ValueError as exc:
            if "No files found" not in str(exc):
                raise
            raise ValueError(f"input {cfg.input}: no files found (documents: {', '.join(DOCUMENT_SUFFIXES)}; "
                             "names starting with _ or . are skipped)") from None
        schema = DOCUMENT_COLUMNS if questions is None else DOCUMENT_COLUMNS.append(pa.field("question", pa.string()))
        ds = ds.map_batches(convert_files, batch_format="pyarrow", batch_size=8, fn_kwargs=dict(
            root=source.root, cache=cache, s3=cfg.s3, limits=cfg.document_limits, schema=schema,
            questions=ray.put(questions) if questions is not None else None))
        ds.write_parquet(staged_path, filesystem=fs)
        if not storage.parquet_files(fs, staged_path):  # files only under _ or . names
            raise ValueError(f"input {cfg.input}: no documents found (looked for {', '.join(DOCUMENT_SUFFIXES)})")
        yield staged
    finally:
        with contextlib.suppress(OSError):
            fs.delete_dir(staged_path)
