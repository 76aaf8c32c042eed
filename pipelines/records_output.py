"""The records of an extraction with record types: in the rows, and one Parquet dataset per record type.

    OUTPUT/<documents files>                        each row's ``records_<type>``: its records, list<struct>
    OUTPUT/_records/<record type>/records-<hex>.parquet   each type's records from the rows, in large files

**Exactly once** comes from the row: a document's records are a column of its row, committed with it
by Ray Data's writer; nothing else is written while the job runs, so nothing can be orphaned.

**The records dataset** (one per type; ``<record type>`` percent-quoted, nothing kept) is derived from
the committed rows by :func:`export_records`, under the output's lease at the end of every run and by
``repair-output``: its rows are :func:`memagent.extraction.records_arrow_schema`'s (and, for an output of
converted documents, ``evidence_pages``: each record's spans with their pages), each file holding
the records of whole documents files and naming them (name and size) in its footer. A file is
*current* while every documents file it names is in the output unchanged and no current file names
one of them too. An export adds the committed records of the documents files no current file names
(new rows, files rewritten by a redo or a repair), merges the files under ``records_per_file`` records
into new ones, then removes what is not current: the type's files hold each committed record once,
in a handful of files (one per ``records_per_file`` records and a remainder). A kill between writing
and removing leaves files that are not current: :func:`read_records` ignores them and the next export
removes them. ``pd.read_parquet("OUTPUT/_records/<type>")`` reads the dataset as the last export left
it: read it while no run is writing, or read with :func:`read_records`, which is exact at any time
(the current files, plus the committed rows of the documents files no current file names).

The ``_`` keeps the records out of the documents dataset for every reader (pyarrow, pandas, Spark and
Ray skip ``_`` paths; so does this project's listing rule). A file in a type's folder that is not an
export (no sources in its footer) is named in an error line and left out. An output of the earlier
layout (one records file per document, named by a ``records_file`` column) is refused with what to do.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass
from typing import Iterable
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from memagent.documents.evidence_pages import EVIDENCE_PAGES_COLUMN, EVIDENCE_PAGES_TYPE, record_evidence_pages
from memagent.result_schema import RECORDS_PREFIX
from pipelines import commit_rules, storage, storage_errors
from pipelines.storage import S3Options

log = logging.getLogger(__name__)

RECORDS_DIR = "_records"
RECORDS_PER_FILE = 100_000  # an export file's records, at least (but for the remainder)
SOURCES_KEY = b"memagent.records_sources"  # footer key: the documents files (name -> size) a file holds
_EXPORT = re.compile(r"records-[0-9a-f]{16}\.parquet")
_EARLIER_LAYOUT = re.compile(r"[0-9a-f]{32}-[0-9a-f]{12}\.parquet")  # one file per document and attempt


class EarlierLayout(ValueError):
    """The output holds records in the layout of an earlier version (one file per document)."""


def type_dir(root: str, record_type: str) -> str:
    return f"{root}/{quote(record_type, safe='')}"


@dataclass(frozen=True)
class _ExportFile:
    path: str
    sources: dict[str, int]  # documents file name -> its size when exported
    rows: int


def _documents(fs: pafs.FileSystem, path: str) -> dict[str, int]:
    """The output's documents files (one level: the writer's), name -> size."""
    return {info.base_name: info.size for info in storage.output_file_infos(fs, path)}


def _listed(fs: pafs.FileSystem, directory: str) -> list[pafs.FileInfo]:
    infos = fs.get_file_info(pafs.FileSelector(directory, recursive=False, allow_not_found=True))
    return sorted((f for f in infos if f.type == pafs.FileType.File), key=lambda f: f.path)


def _exports(fs: pafs.FileSystem, directory: str, documents: dict[str, int], record_type: str,
             errors: list[str] | None) -> tuple[list[_ExportFile], list[str]]:
    """(the current export files of a type's folder, the files an export removes: ours but not current,
    or left unfinished); a file that is not an export is named in ``errors`` (raised without it)."""
    found, stale = [], []
    for info in _listed(fs, directory):
        name = info.base_name
        if name.startswith(".") and name.endswith(".tmp"):  # a local write cut short (storage.atomic_put)
            stale.append(info.path)
            continue
        if _EARLIER_LAYOUT.fullmatch(name):
            raise EarlierLayout(f"records file {info.path} is of the earlier records layout (one file per document); "
                                "this version keeps each document's records in its row (records_<type> columns): "
                                "write the job to a new output directory")
        try:
            with fs.open_input_file(info.path) as f:
                meta = pq.read_metadata(f)
            sources = json.loads((meta.metadata or {})[SOURCES_KEY])
            found.append(_ExportFile(info.path, {str(k): int(v) for k, v in sources.items()}, meta.num_rows))
        except (OSError, KeyError, ValueError, pa.ArrowException) as exc:
            if _EXPORT.fullmatch(name):  # ours, cut short (an S3 upload completed half way): not a whole file
                stale.append(info.path)
                continue
            why = "it names no documents files" if isinstance(exc, KeyError) else str(exc).strip()[:200]
            line = f"records file {info.path} of type {record_type!r} is not an export of this output ({why}); left out"
            if errors is None:
                raise ValueError(line) from None
            errors.append(line)
    current, covered = [], set()
    for e in sorted(found, key=lambda e: (-len(e.sources), e.path)):  # a merged file before the parts it replaced
        whole = all(documents.get(name) == size for name, size in e.sources.items())
        if whole and not covered & e.sources.keys():
            current.append(e)
            covered |= e.sources.keys()
        else:
            stale.append(e.path)
    return current, stale


def _row_records(fs: pafs.FileSystem, file: str, record_type: str) -> pa.Table | None:
    """The records of ``record_type`` in the committed rows of one documents file, as dataset rows (empty
    when it has no such column); None while the file has no footer (its writer is at it)."""
    column = RECORDS_PREFIX + record_type
    with fs.open_input_file(file) as f:
        try:
            pf = pq.ParquetFile(f)
        except pa.ArrowInvalid:
            return None
        names = pf.schema_arrow.names
        if "records_file" in names and column not in names:
            raise EarlierLayout(f"output file {file} is of the earlier records layout (a records_file column); this "
                                "version keeps each document's records in its row: write the job to a new output "
                                "directory")
        if column not in names:
            return pa.table({})
        pages = [EVIDENCE_PAGES_COLUMN] if EVIDENCE_PAGES_COLUMN in names else []
        table = pf.read(columns=["id", "error", column, *pages])
    table = table.filter(commit_rules.committed_mask(table.column("error")))
    return flatten(table.column("id"), table.column(column), record_type,
                   table.column(EVIDENCE_PAGES_COLUMN) if pages else None)


def flatten(ids: pa.ChunkedArray | pa.Array, records: pa.ChunkedArray | pa.Array, record_type: str,
            evidence_pages: pa.ChunkedArray | pa.Array | None = None) -> pa.Table:
    """Rows' ``records_<type>`` lists as the records dataset's rows: each record's row id, its type, its fields;
    with the rows' ``evidence_pages`` (a converted document's), each record's own: its spans and their pages."""
    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    records = records.combine_chunks() if isinstance(records, pa.ChunkedArray) else records
    items = pc.list_flatten(records)
    parents = pc.list_parent_indices(records)
    columns = {"id": ids.take(parents).cast(pa.string()),
               "record_type": pa.array([record_type] * len(items), pa.string())}
    columns |= {f.name: items.field(i) for i, f in enumerate(items.type)}
    if evidence_pages is not None:
        column, counts = RECORDS_PREFIX + record_type, pc.list_value_length(records).fill_null(0).to_pylist()
        per_record = [part for entries, n in zip(evidence_pages.to_pylist(), counts)
                      for part in record_evidence_pages(entries, column, n)]
        columns[EVIDENCE_PAGES_COLUMN] = pa.array(per_record, EVIDENCE_PAGES_TYPE)
    return pa.table(columns)


def _sorted(tables: list[pa.Table]) -> pa.Table:
    tables = [t.replace_schema_metadata(None) for t in tables if t.num_columns]
    if not tables:
        return pa.table({})
    table = pa.concat_tables(tables, promote_options="permissive")
    return table.sort_by([("id", "ascending"), ("record_index", "ascending")]) if len(table) else table


def read_records(output: str, record_type: str, s3: S3Options | None = None,
                 errors: list[str] | None = None) -> pa.Table:
    """The committed records of ``record_type`` in ``output``, sorted by ``(id, record_index)``: the current
    export files, plus the committed rows of the documents files none of them holds (exact at any time).

    ``errors``: when given, each file in the type's folder that is not an export of this output is named
    there, one line each, and left out; without it, it raises.
    """
    fs, path = storage.filesystem(output, s3)
    documents = _documents(fs, path)
    directory = type_dir(f"{path.rstrip('/')}/{RECORDS_DIR}", record_type)
    current, _ = _exports(fs, directory, documents, record_type, errors)
    tables = []
    for e in current:
        with fs.open_input_file(e.path) as f:
            tables.append(pq.read_table(f))
    covered = {name for e in current for name in e.sources}
    for name in sorted(set(documents) - covered):
        table = _row_records(fs, f"{path.rstrip('/')}/{name}", record_type)
        if table is not None:
            tables.append(table)
    return _sorted(tables)


def record_types_in(fs: pafs.FileSystem, files: Iterable[str]) -> list[str]:
    """The record types whose ``records_<type>`` columns the documents files hold."""
    types: set[str] = set()
    for file in files:
        with fs.open_input_file(file) as f:
            schema = pq.read_schema(f)
        types |= {field.name.removeprefix(RECORDS_PREFIX) for field in schema
                  if field.name.startswith(RECORDS_PREFIX) and pa.types.is_list(field.type)
                  and pa.types.is_struct(field.type.value_type)}
    return sorted(types)


def export_records(output: str, s3: S3Options | None, record_types: Iterable[str],
                   records_per_file: int = RECORDS_PER_FILE) -> int:
    """Bring each type's records dataset up to the committed rows (module doc); the files it wrote.

    Run under the output's lease (no other export at work). A store's error is logged, not raised: the
    rows hold the records, :func:`read_records` reads them exactly, and the next export finishes the job.
    """
    fs, path = storage.filesystem(output, s3)
    root = f"{path.rstrip('/')}/{RECORDS_DIR}"
    written = 0
    try:
        with storage_errors.output_errors(output, s3):
            documents = _documents(fs, path)
            for record_type in record_types:
                written += _export_type(fs, path, type_dir(root, record_type), record_type, documents,
                                        records_per_file)
    except OSError as exc:
        log.warning("output %s: records dataset not (all) exported (%s); the rows hold the records "
                    "(read_records reads them) and the next run exports them", output, exc)
    return written


def _export_type(fs: pafs.FileSystem, path: str, directory: str, record_type: str, documents: dict[str, int],
                 records_per_file: int) -> int:
    errors: list[str] = []
    current, stale = _exports(fs, directory, documents, record_type, errors)
    for line in errors:
        log.warning("output %s", line)
    covered = {name for e in current for name in e.sources}
    parts: list[tuple[dict[str, int], pa.Table]] = []
    for name in sorted(set(documents) - covered):
        table = _row_records(fs, f"{path.rstrip('/')}/{name}", record_type)
        if table is not None:  # a file its writer is at: the next export takes it
            parts.append(({name: documents[name]}, table))
    small = [e for e in current if e.rows < records_per_file]
    if not parts and len(small) < 2:
        _remove(fs, stale)
        return 0
    for e in small:  # merged with the new records, so that the files stay few and large
        with fs.open_input_file(e.path) as f:
            parts.append((e.sources, pq.read_table(f)))
    written = 0
    for sources, table in _files_of(parts, records_per_file):
        name = f"records-{uuid.uuid4().hex[:16]}.parquet"
        table = table.replace_schema_metadata({SOURCES_KEY: json.dumps(sources, sort_keys=True).encode()})
        storage.atomic_put(fs, f"{directory}/{name}", lambda target, t=table: pq.write_table(t, target, filesystem=fs),
                           name)
        written += 1
    _remove(fs, [*stale, *(e.path for e in small)])
    return written


def _files_of(parts: list[tuple[dict[str, int], pa.Table]],
              records_per_file: int) -> Iterable[tuple[dict[str, int], pa.Table]]:
    """The parts grouped into files of at least ``records_per_file`` records (the last one: the remainder),
    each file's sources the union of its parts'; a group without any column (no records of the type
    anywhere in it) is written only if a later part gives it the type's columns."""
    sources: dict[str, int] = {}
    tables: list[pa.Table] = []
    rows = 0
    for i, (names, table) in enumerate(parts):
        sources |= names
        tables.append(table)
        rows += len(table)
        if rows >= records_per_file or i == len(parts) - 1:
            merged = _sorted(tables)
            if merged.num_columns:
                yield sources, merged
                sources, tables, rows = {}, [], 0


def _remove(fs: pafs.FileSystem, files: Iterable[str]) -> None:
    for file in files:
        try:
            fs.delete_file(file)
        except FileNotFoundError:
            pass
