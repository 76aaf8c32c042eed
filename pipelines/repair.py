"""``memagent repair-output``: keep one row per id in a batch output that holds duplicates.

The batch job refuses to resume into an output holding an id twice (two runs wrote into it at
once, before the lease existed, or on a store that ignored conditional writes). This keeps, for
each duplicated id, the newest complete row: a row without error over an error row, then the
row of the newest file (modification time), then the later row within a file. Rows of other
ids are untouched.

Each affected file is rewritten as a new file holding its kept rows, then the old file is
deleted: a kill in between leaves duplicates (a second repair removes them), never a lost row.
Then each record type's records dataset is exported from the rows kept (pipelines/records_output.py).
The output's lease is held while it works, so it never races a running job.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from pipelines import commit_rules, lease, records_output, storage, storage_errors
from pipelines.storage import S3Options

log = logging.getLogger(__name__)


class RepairConfig(BaseModel):
    """One repair of a batch output."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    output: str = Field(..., description="Batch output directory to repair, local or s3://bucket/prefix.")
    s3: S3Options = Field(default_factory=S3Options)
    force_unlock: str | None = Field(None, description=lease.FORCE_UNLOCK_HELP)


@dataclass
class RepairSummary:
    output: str
    duplicated_ids: int = 0
    rows_removed: int = 0
    files_rewritten: int = 0
    records_files: int = 0  # records dataset files written (pipelines/records_output.export_records)
    examples: list[str] = field(default_factory=list)

    def line(self) -> str:
        if not self.duplicated_ids:
            return f"output {self.output}: no duplicate ids; nothing to repair"
        return (f"output {self.output}: {self.duplicated_ids} duplicated id(s), e.g. {', '.join(self.examples)}: kept "
                f"one row each, removed {self.rows_removed} row(s) from {self.files_rewritten} file(s)")


def rows_to_drop(ids: pa.Array, errors: pa.Array, newness: pa.Array) -> list[int]:
    """Positions of the rows to drop: for each duplicated id, every row but the one to keep.

    Rows come file after file; ``newness`` is each row's file's modification time (ties broken
    by listing order)."""
    n = len(ids)
    table = pa.table({"id": ids, "bad": pc.is_valid(errors) if len(errors) else pa.array([], pa.bool_()),
                      "newness": newness, "pos": pa.array(range(n), pa.int64())})
    counts = pc.value_counts(table.column("id").combine_chunks())
    dup = counts.filter(pc.greater(counts.field("counts"), 1)).field("values")
    rows = table.filter(pc.is_in(table.column("id"), value_set=dup))
    # Best first within an id: no error, newest file, latest row.
    rows = rows.sort_by([("id", "ascending"), ("bad", "ascending"), ("newness", "descending"),
                         ("pos", "descending")])
    drop: list[int] = []
    previous = None
    for rid, pos in zip(rows.column("id").to_pylist(), rows.column("pos").to_pylist()):
        if rid == previous:
            drop.append(pos)
        previous = rid
    return sorted(drop)


def repair_output(cfg: RepairConfig) -> RepairSummary:
    """Remove duplicate ids from ``cfg.output`` (see the module doc)."""
    fs, path = storage.filesystem(cfg.output, cfg.s3)
    summary = RepairSummary(cfg.output)
    with storage_errors.output_errors(cfg.output, cfg.s3):
        if fs.get_file_info(path).type != pafs.FileType.Directory and not storage.is_s3(cfg.output):
            raise ValueError(f"output {cfg.output}: no such directory")
        with lease.hold(cfg.output, cfg.s3, force=cfg.force_unlock):
            files = storage.complete_parquet_files(fs, path)
            commit_rules.committed_and_retry_ids(fs, files)  # refuses a directory that is not a batch output
            record_types = records_output.record_types_in(fs, files)
            infos = fs.get_file_info(files)
            parts, newness, sizes = [], [], []
            for i, (file, info) in enumerate(zip(files, infos)):
                with fs.open_input_file(file) as f:
                    part = pq.read_table(f, columns=["id", "error"])
                parts.append(part.cast(pa.schema([("id", pa.string()), ("error", pa.string())])))
                stamp = info.mtime.timestamp() if info.mtime else 0.0
                newness += [stamp * 1e6 + i] * len(part)  # ties broken by listing order
                sizes.append(len(part))
            if parts:
                _drop_duplicates(fs, path, files, parts, newness, sizes, summary)
            # Each record type's records dataset from the rows kept (a rewritten file's records are exported again).
            summary.records_files = records_output.export_records(cfg.output, cfg.s3, record_types)
    log.info(summary.line())
    return summary


def _drop_duplicates(fs: pafs.FileSystem, path: str, files: list[str], parts: list[pa.Table], newness: list[float],
                     sizes: list[int], summary: RepairSummary) -> None:
    """Rewrite the files holding the rows :func:`rows_to_drop` names without them; counted in ``summary``."""
    table = pa.concat_tables(parts)
    drop = rows_to_drop(table.column("id").combine_chunks(), table.column("error").combine_chunks(),
                        pa.array(newness, pa.float64()))
    if not drop:
        return
    dropped_ids = table.column("id").take(pa.array(drop)).unique()
    summary.duplicated_ids = len(dropped_ids)
    summary.examples = [str(v) for v in dropped_ids.to_pylist()[:5]]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    for i, file in enumerate(files):
        mine = [p - starts[i] for p in drop if starts[i] <= p < starts[i] + sizes[i]]
        if mine:
            _rewrite_without(fs, path, file, mine)
            summary.rows_removed += len(mine)
            summary.files_rewritten += 1


def _rewrite_without(fs: pafs.FileSystem, path: str, file: str, rows: list[int]) -> None:
    """Write ``file`` less ``rows`` as a new file, then delete ``file`` (a kill leaves duplicates, not gaps)."""
    with fs.open_input_file(file) as f:
        table = pq.read_table(f)
    keep = pc.invert(pc.is_in(pa.array(range(len(table)), pa.int64()), value_set=pa.array(rows, pa.int64())))
    kept = table.filter(keep)
    if len(kept):
        name = file.rsplit("/", 1)[-1].removesuffix(".parquet")
        pq.write_table(kept, f"{path.rstrip('/')}/{name}-repaired-{uuid.uuid4().hex[:8]}.parquet", filesystem=fs)
    fs.delete_file(file)
