"""``memagent report``: one self-contained HTML page for a batch output or an eval run directory.

    build_report("runs/demo/answers")   # batch output dir -> runs/demo/answers/_report.html
    build_report("runs/eval")           # eval run dir (predictions/<method>/, ...) -> runs/eval/report.html
    build_report("s3://bucket/out", s3=S3Options(endpoint_url=...))   # written next to the output

Rows are read file by file (local or S3 via pyarrow); each row's context is read only to
measure it and cut short snippets around its spans, so the page stays small at 10,000 rows.
Records are read before any text: then one more pass reads ``id`` and ``context`` alone and cuts
each shown record's snippets as its document goes by (a text is read, never kept). A records
file that cannot be read is named in an ``error:`` line (stderr and the page) and left out.
Outputs written before the attribution columns existed still load (attribution is computed).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
import sys
import time
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from memagent.report import html as rh
from memagent.report.fields import fields_html, is_number, schema_fields
from memagent.report.records import Wanted, add_snippets, records_view, schema_record_types
from memagent.report import retention_view
from pipelines import records_output, storage
from pipelines.storage import S3Options

log = logging.getLogger(__name__)

REPORT_NAME = "report.html"  # in an eval run dir
# In a batch output dir: Parquet readers (pandas, pyarrow datasets, Spark) skip "_" files; any
# other file there would make `pd.read_parquet(output)` fail.
BATCH_REPORT_NAME = "_report.html"
# Columns the page uses; others (passthrough inputs) are not read.
ROW_COLUMNS = ["id", "question", "answers", "context", "prediction", "response", "n_chunks", "context_tokens",
               "truncated", "steps", "score", "error", "model", "config", "seconds", "method", "task", "length",
               "metric", "evidence_step", "evidence_char_start", "evidence_char_end", "answer_spans",
               "answer_found_step", "answer_lost_step", "extraction", "field_evidence", "gold_positions",
               "pages"]  # a converted document's page map: snippets say their pages
EVAL_IMAGES = [("heatmap.png", "Accuracy heatmap: method · task × length"),
               ("accuracy_vs_length.png", "Accuracy against document length (95% intervals)")]


def _join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


def _exists(fs: pafs.FileSystem, path: str, kind: pafs.FileType = pafs.FileType.File) -> bool:
    return fs.get_file_info(path).type == kind


def _read_bytes(fs: pafs.FileSystem, path: str) -> bytes | None:
    if not _exists(fs, path):
        return None
    with fs.open_input_stream(path) as f:
        return f.read()


def iter_rows(fs: pafs.FileSystem, files: list[str], batch_rows: int = 256) -> Iterator[dict[str, Any]]:
    """Output rows with the columns the report uses, one file and one batch at a time."""
    for file in files:
        try:
            with fs.open_input_file(file) as f:
                pf = pq.ParquetFile(f)
                cols = [c for c in ROW_COLUMNS if c in pf.schema_arrow.names]
                for batch in pf.iter_batches(batch_size=batch_rows, columns=cols):
                    yield from batch.to_pylist()
        except (OSError, pa.ArrowInvalid) as exc:  # a partial file (writer killed): skip it, the job redoes its rows
            log.warning("skipping unreadable output file %s: %s", file, exc)


def read_views(fs: pafs.FileSystem, path: str, metric: str, method: str | None = None) -> tuple[list[dict], dict]:
    """Row views of one batch output directory, and its first row's model/config."""
    views, meta = [], {}
    for row in iter_rows(fs, storage.parquet_files(fs, path)):
        if method and not row.get("method"):
            row["method"] = method
        if not meta and row.get("config"):
            meta = {"model": row.get("model"), "config": row.get("config")}
        key = f"{row.get('method')}/{row.get('id')}" if method else None
        views.append(rh.row_view(row, key, metric))
    views.sort(key=lambda v: (v.get("m") or "", v["id"]))
    return views, meta


def read_record_views(fs: pafs.FileSystem, path: str, run: str, s3: S3Options,
                      config: Any) -> tuple[list[dict], list[str]]:
    """The records view's data (:func:`memagent.report.records.records_view`) per record type of the
    schema in ``config``, from the committed records of the output, with the snippets of the records
    shown; and the records files that could not be read, one line each (printed as ``error:`` lines)."""
    types = schema_record_types(config)
    if not types:
        return [], []
    views, wanted, errors = [], {}, []
    for name in types:
        table = records_output.read_records(run, name, s3, errors)
        rows = (row for batch in table.to_batches(max_chunksize=256) for row in batch.to_pylist())
        views.append(records_view(name, rows, wanted=wanted))  # a batch of rows at a time as Python objects
    _cut_snippets(fs, path, wanted)
    for line in errors:
        print(f"error: {line}", file=sys.stderr)
    return views, errors


def _cut_snippets(fs: pafs.FileSystem, path: str, wanted: Wanted, batch_rows: int = 64) -> None:
    """Read ``id`` and ``context`` of the output's rows and cut the snippets of the wanted documents."""
    for file in storage.parquet_files(fs, path):
        if not wanted:
            return
        try:
            with fs.open_input_file(file) as f:
                pf = pq.ParquetFile(f)
                if "context" not in pf.schema_arrow.names:
                    continue
                for batch in pf.iter_batches(batch_size=batch_rows, columns=["id", "context"]):
                    ids = batch.column("id").to_pylist()
                    for i in (i for i, doc in enumerate(ids) if str(doc) in wanted):
                        add_snippets(wanted, str(ids[i]), batch.column("context")[i].as_py())
        except (OSError, pa.ArrowInvalid) as exc:  # as iter_rows: a partial file's rows are redone by the job
            log.warning("skipping unreadable output file %s: %s", file, exc)


def _number(x: Any) -> float:
    """``x`` if it is a number, else 0 (a hand-edited output may hold text in a numeric column)."""
    return x if is_number(x) else 0


def _tokens_per_second(views: list[dict], seconds: float | None, job: dict[str, Any] | None = None) -> str:
    if job and job.get("seconds"):  # the job that just ran (a resumed run read only part of the rows)
        return (f"{job['context_tokens'] / job['seconds']:,.1f} (the last run: {job['context_tokens']:,} context "
                f"tokens in {job['seconds']:,.1f} s)")
    tokens = sum(_number(v.get("ct")) for v in views if not v.get("e"))
    if seconds:
        return f"{tokens / seconds:,.1f} ({tokens:,} context tokens in {seconds:,.1f} s of job time)"
    row_s = sum(_number(v.get("sec")) for v in views if not v.get("e"))
    if not row_s:
        return "n/a"
    return (f"{tokens / row_s:,.1f} per row in flight ({tokens:,} tokens over {row_s:,.1f} row-seconds; rows are "
            "read concurrently, so the job's throughput is higher)")


def _summary_items(run: str, kind: str, views: list[dict], meta: dict, tps: list[tuple[str, str]],
                   extra: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    errors = sum(1 for v in views if v.get("e"))
    items = [("run", f"<code>{rh._e(run)}</code> ({kind})"), ("rows", f"{len(views):,}"),
             ("error rows", f'<a href="#filter=status=error">{errors:,}</a>' if errors else "0")]
    methods = sorted({v.get("m") for v in views if v.get("m")}) if kind == "eval" else []
    if methods:
        for m in methods:
            items.append((f"accuracy · {m}", rh.fmt_acc(rh.accuracy(v for v in views if v.get("m") == m))))
    else:
        items.append(("accuracy", rh.fmt_acc(rh.accuracy(views))))
    items += retention_view.summary_items(views, by_method=bool(methods))
    items += tps + [("model", rh._e(meta.get("model") or "?"))]
    return items + [(k, rh._e(v)) for k, v in extra]


def _eval_parts(fs: pafs.FileSystem, path: str, metric: str) -> tuple[list, dict, list, list, list, str]:
    """An evaluation run's ``(views, meta, tokens/s items, extra items, images, results table)``."""
    pred_dir = _join(path, "predictions")
    views: list[dict] = []
    meta: dict[str, Any] = {}
    summary = json.loads(_read_bytes(fs, _join(path, "summary.json")) or b"{}")
    methods = sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(pred_dir))
                     if i.type == pafs.FileType.Directory and not i.base_name.startswith(("_", ".")))
    for m in methods:
        v, mt = read_views(fs, _join(pred_dir, m), metric, method=m)
        views += v
        meta = meta or mt
    seconds = summary.get("seconds_per_method") or {}
    tps = [(f"tokens/s · {m}", _tokens_per_second([v for v in views if v.get("m") == m], seconds.get(m)))
           for m in methods]
    if summary.get("config"):
        meta["config"] = json.dumps(summary["config"])
    extra: list[tuple[str, Any]] = []
    if summary.get("full_context_window"):
        extra.append(("full-context window", f"{summary['full_context_window']} tokens"))
    extra += [("note", n) for n in summary.get("notes", [])]
    images = [(caption, "data:image/png;base64," + base64.b64encode(data).decode())
              for name, caption in EVAL_IMAGES if (data := _read_bytes(fs, _join(path, name)))]
    results = _read_bytes(fs, _join(path, "results.csv"))
    table = rh.eval_table_html(list(csv.DictReader(io.StringIO(results.decode())))) if results else ""
    return views, meta, tps, extra, images, table


def build_report(run: str, out: str | None = None, s3: S3Options = S3Options(), *,
                 job_summary: dict[str, Any] | None = None, metric: str = "sub_em") -> str:
    """Write the HTML report of ``run`` (batch output or eval run dir, local or s3://) and return its path.

    Args:
        out: where to write (local or s3://); default ``<run>/report.html`` for an eval run and
            ``<run>/_report.html`` for a batch output (so Parquet readers of the directory skip it).
        job_summary: the batch job's summary (``context_tokens``, ``seconds``), for the job's tokens/s;
            without it the rate is estimated from the rows' own times.
        metric: how rows without a ``metric`` column were scored (only used for old outputs).
    """
    t0 = time.perf_counter()
    storage.check_uri(run, "run")
    fs, path = storage.filesystem(run, s3)
    if not _exists(fs, path, pafs.FileType.Directory) and not _exists(fs, path):
        raise FileNotFoundError(f"run {run!r} does not exist")
    pred_dir = _join(path, "predictions")
    if _exists(fs, pred_dir, pafs.FileType.Directory):
        kind, (views, meta, tps, extra, images, eval_table), record_views = "eval", _eval_parts(fs, path, metric), []
    else:
        kind, images, eval_table = "batch output", [], ""
        views, meta = read_views(fs, path, metric)
        if not views:
            raise ValueError(f"run {run!r}: no output rows (no readable Parquet files)")
        tps = [("tokens/s", _tokens_per_second(views, None, job_summary))]
        record_views, errors = read_record_views(fs, path, run, s3, meta.get("config"))
        extra = [("error", line) for line in errors]
    groups = rh.group_errors(views)
    items = _summary_items(run, kind, views, meta, tps, extra)
    summary_html = rh.summary_html(items, groups, rh.attribution_counts(views), meta.get("config"),
                                   fields_html(views, schema_fields(meta.get("config"))))
    title = f"MemAgent report — {run.rstrip('/').rsplit('/', 1)[-1]}"
    page = rh.render(title, f"{kind} · {len(views):,} rows · generated {time.strftime('%Y-%m-%d %H:%M:%S')}",
                     summary_html, views, images, eval_table, record_views)
    target = out or _join(run, REPORT_NAME if kind == "eval" else BATCH_REPORT_NAME)
    out_fs, out_path = storage.filesystem(target, s3)
    if not storage.is_s3(target):
        out_fs.create_dir(out_path.rsplit("/", 1)[0], recursive=True)
    with out_fs.open_output_stream(out_path) as f:
        f.write(page.encode())
    log.info("report of %d rows: %s (%.0f KiB, %.1f s)", len(views), target, len(page) / 1024, time.perf_counter() - t0)
    return target if storage.is_s3(target) else out_path
