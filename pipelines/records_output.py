"""The records output of an extraction with record types: one Parquet dataset per record type.

    OUTPUT/_records/<record type>/<stem>.parquet     one file per document and type (its records)

``<record type>`` is the type's name, percent-quoted (``urllib.parse.quote``, nothing kept); a
file's rows are :func:`memagent.extraction.output.records_table`'s. A file there that is not one of
the type's (another type's rows, other columns) is named in an error line and left out, never
taken for the type's columns (:func:`read_records`). The ``_`` keeps the records
out of the documents dataset for every reader (pyarrow, pandas, Spark and Ray skip ``_`` paths;
so does this project's listing rule), so ``pd.read_parquet(OUTPUT)`` still reads documents only.

**Exactly once.** The actor writes a document's records files first, under a stem new to this
attempt (``<sha256(id)[:32]>-<random>``), each with :func:`pipelines.storage.atomic_put` (local: a
hidden file, then rename; S3: one object, which pyarrow completes even when a write fails half way:
only the committed-stem rule below keeps such a file out), and only then returns the document's
row, which names the stem (``records_file``).
The row is committed when its documents file lands, so the committed rows name exactly the
records that count: :func:`read_records` reads only the files whose stem a committed (not
``infra:``) row names. Files of an attempt whose row never landed (a killed task, a retried
call, a row taken out to be redone) are orphans: ignored by :func:`read_records`, removed by
:func:`remove_orphans` under the output's lease before a run starts and after it ends (no actor
is writing then). A rerun skips ids already in the documents dataset, so their records stay as
committed; a redone id writes new files under a new stem and the old ones become orphans.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from typing import Callable, TypeVar
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from memagent.extraction import ExtractionSchema, Record, records_table
from memagent.result_schema import RECORDS_FILE_COLUMN
from pipelines import storage
from pipelines.storage import S3Options

log = logging.getLogger(__name__)
T = TypeVar("T")

RECORDS_DIR = "_records"


def type_dir(root: str, record_type: str) -> str:
    return f"{root}/{quote(record_type, safe='')}"


class RecordsWriter:
    """Writes documents' records beside an output (inside the actors): ``answer_row``'s ``on_records``."""

    def __init__(self, output: str, s3: S3Options | None, schema: ExtractionSchema):
        self.fs, path = storage.filesystem(output, s3)
        self.root = f"{path.rstrip('/')}/{RECORDS_DIR}"
        self.schema = schema

    def write(self, row_id: str, records: dict[str, list[Record]]) -> str | None:
        """Write one document's records; the stem its files are named by (None: it has none)."""
        if not any(records.values()):
            return None
        stem = f"{storage.row_key(row_id)}-{uuid.uuid4().hex[:12]}"
        for record in self.schema.record_types:
            found = records.get(record.name) or []
            if found:
                self._put(type_dir(self.root, record.name), stem, records_table(record, row_id, found))
        return stem

    def _put(self, directory: str, stem: str, table: pa.Table) -> None:
        storage.atomic_put(self.fs, f"{directory}/{stem}.parquet",
                           lambda target: pq.write_table(table, target, filesystem=self.fs), stem)

    async def __call__(self, row_id: str, records: dict[str, list[Record]]) -> str | None:
        return await asyncio.to_thread(self.write, row_id, records)


def committed_stems(fs: pafs.FileSystem, path: str) -> set[str]:
    """The ``records_file`` stems the committed, done rows of the documents dataset name."""
    stems: set[str] = set()
    for file in storage.parquet_files(fs, path):  # a file without a footer yet (its writer is at it) commits nothing
        stems.update(s for s in storage.committed_rows(fs, file, [RECORDS_FILE_COLUMN]).column(RECORDS_FILE_COLUMN)
                     .to_pylist() if isinstance(s, str))
    return stems


def _record_files(fs: pafs.FileSystem, root: str, recursive: bool = True) -> list[pafs.FileInfo]:
    """The files under ``root``; ``recursive=False``: only those directly in it (a record type's folder
    is that type's alone, not the folders below it)."""
    return [f for f in fs.get_file_info(pafs.FileSelector(root, recursive=recursive, allow_not_found=True))
            if f.type == pafs.FileType.File]


def read_records(output: str, record_type: str, s3: S3Options | None = None,
                 stems: set[str] | None = None, errors: list[str] | None = None) -> pa.Table:
    """The committed records of ``record_type`` in ``output`` (orphans of unfinished attempts left out);
    ``stems``: :func:`committed_stems` of the output, when the caller has them already.

    A type's folder holds that type's files only: a committed file that is not one of them (not Parquet;
    no ``id``, ``record_index`` and ``record_type`` columns; rows of another type; columns that clash with
    those most of the type's files have) is left out, whatever its name sorts before, and never hides the
    others. ``errors``: when given, each such file is named there, one line each; without it, it raises.
    """
    fs, path = storage.filesystem(output, s3)
    stems = committed_stems(fs, path) if stems is None else stems
    directory = type_dir(f"{path.rstrip('/')}/{RECORDS_DIR}", record_type)
    read: list[tuple[str, pa.Table]] = []
    for info in sorted(_record_files(fs, directory, recursive=False), key=lambda f: f.path):
        name = info.base_name
        if name.endswith(".parquet") and not name.startswith(".") and name.removesuffix(".parquet") in stems:
            table = _guarded(info.path, record_type, errors, lambda file=info.path: _read_one(fs, file, record_type))
            if table is not None:
                read.append((info.path, table))
    tables = _same_columns(read, record_type, errors)
    if not tables:
        return pa.table({})
    return _sorted_concat(tables)


def _same_columns(read: list[tuple[str, pa.Table]], record_type: str, errors: list[str] | None) -> list[pa.Table]:
    """The tables whose columns agree with those most of them have (the type's own; ties: the first file's),
    each the others' too; the rest named in ``errors`` (module: :func:`read_records`)."""
    counts = Counter(t.schema.remove_metadata() for _, t in read)
    if not counts:
        return []
    unified = max(counts, key=lambda schema: counts[schema])
    kept = []
    for file, table in read:
        merged = _guarded(file, record_type, errors, lambda schema=table.schema: pa.unify_schemas(
            [unified, schema], promote_options="permissive"))
        if merged is not None:
            unified = merged
            kept.append(table)
    return kept


def _one_document(table: pa.Table) -> str | None:
    """The id of a table holding one document's records in ``record_index`` order (else None)."""
    ids, index = table.column("id"), table.column("record_index")
    if len(table) == 0 or len(ids.unique()) != 1 or index.null_count:
        return None
    return ids[0].as_py() if len(table) == 1 or pc.all(pc.less(index[:-1], index[1:])).as_py() else None


def _sorted_concat(tables: list[pa.Table]) -> pa.Table:
    """The tables as one, sorted by ``(id, record_index)``: each file holds one document's records in
    order, so ordering the files is enough (concatenation copies nothing); a sort only otherwise."""
    ids = [_one_document(t) for t in tables]
    if None not in ids and len(set(ids)) == len(ids):
        return pa.concat_tables([t for _, t in sorted(zip(ids, tables), key=lambda p: p[0])],
                                promote_options="permissive")
    table = pa.concat_tables(tables, promote_options="permissive")
    return table.sort_by([("id", "ascending"), ("record_index", "ascending")]) if len(table) else table


def _read_one(fs: pafs.FileSystem, file: str, record_type: str) -> pa.Table:
    """``file``'s table when it holds records of ``record_type``; else a ValueError saying why not."""
    with fs.open_input_file(file) as f:
        table = pq.read_table(f)
    if not {"id", "record_index", "record_type"} <= set(table.column_names):
        raise ValueError("it has no id, record_index and record_type columns")
    types = set(table.column("record_type").unique().to_pylist())
    if types - {record_type}:
        raise ValueError(f"its rows are of record type {sorted(map(str, types - {record_type}))[0]!r}")
    return table


def _guarded(file: str, record_type: str, errors: list[str] | None, step: Callable[[], T]) -> T | None:
    """``step()``, or None and a line in ``errors`` naming ``file`` when it fails (it raises without ``errors``)."""
    try:
        return step()
    except (OSError, ValueError, pa.ArrowException) as exc:
        if errors is None:
            raise
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        errors.append(f"records file {file} of type {record_type!r} is not a records file of this output "
                      f"({why[:200]}); left out")
        return None


def remove_orphans(output: str, s3: S3Options | None = None, *, forced: bool = False) -> int:
    """Remove records files no committed row names (run only while no actor writes: under the lease).

    ``forced``: the lease was taken with ``--force-unlock`` from a run that looked alive; it may still
    commit a documents file naming its records, so none is removed (a later run's sweep does it)."""
    if forced:
        log.warning("output %s: the lease was forced; records files of rows not committed are kept, since the "
                    "run it was taken from may still commit them (the next run removes those it never did)", output)
        return 0
    fs, path = storage.filesystem(output, s3)
    root = f"{path.rstrip('/')}/{RECORDS_DIR}"
    removed = 0
    try:
        with storage.output_errors(output, s3):
            files = _record_files(fs, root)
            stems = committed_stems(fs, path) if files else set()  # unknown (an error): nothing is removed
            for info in files:
                stem = info.base_name.removeprefix(".").removesuffix(".tmp").removesuffix(".parquet")
                if stem not in stems or info.base_name.startswith("."):
                    fs.delete_file(info.path)
                    removed += 1
    except OSError as exc:  # orphans are never read: a sweep the store cut short is the next run's to finish
        log.warning("output %s: records files of rows never committed not (all) removed (%s); the next run "
                    "removes them", output, exc)
    if removed:
        log.info("output %s: removed %d records file(s) of rows never committed", output, removed)
    return removed

