"""Documents in: a folder, glob or S3 prefix of PDF, HTML, DOCX and text files as a batch job's input.

    the listing (a Ray Data read task walking the input, filtered by :class:`PathFilter`:
        pipelines/documents_listing.py) ─► id = path under the input root ─► the file read, its
        content hash ─► the cached conversion, or convert and cache it
        ─► document rows (id, context, pages, document_sha256, document_error[, question])
        ─► the job's stages, as Parquet rows go (pipelines/batch_qa.py)

Nothing is staged and the driver never holds the lake's listing (it walks only up to the first file
to read: :func:`first_file_to_read`): the rows stream from the files
into the same stages as Parquet rows (the fingerprint, the actors, the writer), so nothing downstream
knows documents. A file that cannot be converted is a row with a null context and its
``document_error``; its output row is an ``input:`` error naming the file and the reason, done (a
rerun skips it) unless the file changes (its hash is part of the row's fingerprint). Conversions are
cached by content hash and converter version (:mod:`pipelines.documents_cache`): a rerun, a resume
after a kill or a second schema over the same files converts nothing again. The plan (which ids are
done, which changed) is pipelines/documents_plan.py.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from memagent.documents import DOCUMENT_SUFFIXES, document_format
from memagent.documents.columns import DOCUMENT_COLUMNS
from pipelines import storage, storage_errors
from pipelines.batch_config import BatchQAConfig
from pipelines.documents_cache import cache_uri, convert_files
from pipelines.documents_listing import read_listing, walk_files

GLOB_CHARS = "*?["
NO_FILES = f"no files found (documents: {', '.join(DOCUMENT_SUFFIXES)}; names starting with _ or . are skipped)"


@dataclass(frozen=True)
class DocumentSource:
    """What the job reads: ``paths`` (the root directory itself, or one file) inside ``fs``, the files
    whose path under ``root`` matches ``pattern`` (a glob; None: all); each document's id is its path
    relative to ``root``."""

    fs: pafs.FileSystem
    root: str
    paths: str | list[str]
    pattern: str | None = None

    def path_of(self, doc_id: str) -> str:
        """The file of document ``doc_id``."""
        return f"{self.root}/{doc_id}" if self.root else doc_id

    def includes(self, doc_id: str) -> bool:
        """Whether the input names document ``doc_id`` (its glob matches it)."""
        return self.pattern is None or _matches(doc_id, self.pattern)


def documents_source(cfg: BatchQAConfig) -> DocumentSource | None:
    """The documents the input names, or None for a Parquet input (a file named ``.parquet``, or a
    directory of Parquet files: read as they always were). Nothing is listed but the directories down
    to the first level that holds files (:func:`_holds_parquet`)."""
    fs, path = storage.filesystem(cfg.input, cfg.s3)
    if any(c in cfg.input for c in GLOB_CHARS):
        fixed = path[: min(path.index(c) for c in GLOB_CHARS if c in path)]
        root = fixed.rsplit("/", 1)[0] if "/" in fixed else ""
        return DocumentSource(fs, root, root or ".", path[len(root) + 1:] if root else path)
    with storage_errors.io_errors("input", cfg.input, storage_errors.s3_endpoint(cfg.s3)):
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            return DocumentSource(fs, path.rsplit("/", 1)[0], [path]) if document_format(path) else None
        if info.type != pafs.FileType.Directory or _holds_parquet(fs, path):
            return None
    return DocumentSource(fs, path.rstrip("/"), path)


def check_documents_job(cfg: BatchQAConfig, source: DocumentSource) -> None:
    """What a documents job needs, refused before anything is taken or converted: a question for every
    document, and an output outside the input (the next run would read it as documents)."""
    if cfg.question is None and cfg.questions is None and cfg.agent.extraction is None:
        raise ValueError(f"input {cfg.input}: documents need a question: --question (one for every document), "
                         "--questions (a file of one per document id) or --schema")
    storage.check_not_nested(cfg.input, source.root, cfg.output, storage.filesystem(cfg.output, cfg.s3)[1])


def _holds_parquet(fs: pafs.FileSystem, path: str) -> bool:
    """Whether a directory is a Parquet input: level by level (names starting with ``_`` or ``.`` skipped),
    the first level that holds files holds a ``.parquet`` file. A documents lake is known by its first
    files, not listed whole (Ray Data's reader lists it once, as it reads)."""
    level = [path.rstrip("/")]
    while level:
        infos = [i for d in level for i in fs.get_file_info(pafs.FileSelector(d, allow_not_found=True))
                 if not i.base_name.startswith(("_", "."))]
        files = [i for i in infos if i.type == pafs.FileType.File]
        if files:
            return any(i.path.lower().endswith(".parquet") for i in files)
        level = [i.path for i in infos if i.type == pafs.FileType.Directory]
    return False


class PathFilter:
    """Which listed files a documents read keeps: those under ``root`` that the glob ``pattern`` matches
    (None: all), not under a name starting with ``_`` or ``.`` (as Parquet inputs skip job markers, hidden
    directories, the conversion cache) and not in ``skip`` (ids done: never read). It travels with the
    listing's read task (pipelines/documents_listing.py), done ids included: nothing is filtered on the driver."""

    def __init__(self, root: str, pattern: str | None, skip: set[str] | frozenset[str] | None = None):
        self.root, self.pattern, self.skip = root, pattern, frozenset(skip or ())

    def doc_id(self, path: str) -> str:
        return path[len(self.root) + 1:] if self.root and path.startswith(self.root + "/") else path

    def listed(self, path: str) -> bool:
        """Whether the input names the file ``path`` (done or not)."""
        doc_id = self.doc_id(path)
        if any(part.startswith(("_", ".")) for part in doc_id.split("/")):
            return False
        return self.pattern is None or _matches(doc_id, self.pattern)

    def accepts(self, path: str) -> bool:
        """Whether the file ``path`` is read: the input names it and its id is not done."""
        return self.listed(path) and self.doc_id(path) not in self.skip


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


def first_file_to_read(source: DocumentSource, keep: PathFilter) -> tuple[bool, bool]:
    """(whether the input names any file, whether one of them is not done), walking the input on the driver
    only until the first file to read: at once for a new job, the whole listing (streamed, nothing held)
    for a rerun with nothing left to do, which then starts no Ray work and loads no model."""
    listed = False
    for path, _ in walk_files(source.fs, source.paths, PathFilter(keep.root, keep.pattern)):  # done or not
        listed = True
        if keep.doc_id(path) not in keep.skip:
            return True, True
    return listed, False


def document_rows(cfg: BatchQAConfig, source: DocumentSource, paths: str | list[str], keep: PathFilter | None,
                  questions: Any = None) -> Any:
    """The Ray dataset of the document rows of ``paths`` (``source.paths``, or files named one by one: a
    missing one is left out), listed and converted as they stream (module doc). Ray is started."""
    schema = DOCUMENT_COLUMNS if questions is None else DOCUMENT_COLUMNS.append(pa.field("question", pa.string()))
    convert = dict(fs=source.fs, root=source.root, cache=cache_uri(cfg), s3=cfg.s3, limits=cfg.document_limits,
                   schema=schema, questions=questions)
    return read_listing(source.fs, paths, keep).map_batches(convert_files, batch_format="pyarrow", batch_size=8,
                                                            fn_kwargs=convert)


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
