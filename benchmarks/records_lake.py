"""Records at lake scale: the real batch job writes N documents' records on the loopback S3 server.

    nice python -m benchmarks.records_lake --out benchmarks/results/records_lake.json [--docs 10000] [--more 1000]

A lake of ``--docs`` short statements (1-3 planted payments each, ``tests/records_helpers``) is written
to a moto S3 server on loopback, and the real job (``pipelines.batch_qa.run_batch_qa``: Ray Data, one
actor, the output on S3) reads it with the scripted records engine of tests/records_helpers -- **a
test double, not a model**: it answers each records call with the passage's planted payments, so
the figures measure the records' path (rows, commit, export, read), never extraction. Then:

- ``files``: the documents files and each type's records dataset files (``_records/payments/``);
- ``read_records_s``: ``pipelines.records_output.read_records`` of every record (median of 3), and
  ``read_from_rows_s``: the same records read from the documents files' ``records_payments`` columns
  (what a reader without the export reads: one file per 16 rows);
- ``export_s``: a fresh export of the whole dataset (its files removed first);
- with ``--more``: a second run over ``--more`` new documents, its export reading only their files.

Each figure beside the load average and the driver's peak RSS.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from benchmarks.common import loadavg, machine, print_table, write_json  # noqa: E402

PAYERS = ["Acme Ltd", "Birch Ltd", "Cedar Ltd", "Dune Ltd", "Elm Ltd", "Fern Ltd"]


def lake(n: int, start: int, seed: int) -> list[dict]:
    """``n`` statements of 1-3 planted payments each, ids from ``start``."""
    from memagent_testing.records_helpers import document, payment

    rng = random.Random(seed + start)
    rows = []
    for i in range(start, start + n):
        found = [payment(rng.choice(PAYERS), rng.randint(1, 9999), f"2021-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")
                 for _ in range(rng.randint(1, 3))]
        rows.append({"id": f"doc-{i:06d}", "question": "", "context": document(found, filler=1)})
    return rows


def write_input(fs, path: str, rows: list[dict], files: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    per = -(-len(rows) // files)
    for k in range(0, len(rows), per):
        pq.write_table(pa.Table.from_pylist(rows[k:k + per]), f"{path}/part-{k // per:04d}.parquet", filesystem=fs)


def timed(fn, repeat: int = 3) -> float:
    walls = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
    return round(statistics.median(walls), 3)


def peak_rss_mib() -> float:
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--docs", type=int, default=10_000)
    p.add_argument("--more", type=int, default=1_000, help="documents of a second run (0: none)")
    p.add_argument("--input-files", type=int, default=10)
    a = p.parse_args()

    import pyarrow.fs as pafs
    import ray

    from infra.local_s3 import CREDENTIALS, s3_server
    from pipelines.storage import S3Options

    os.environ.update(CREDENTIALS)
    out: dict = {"benchmark": "records_lake", "machine": machine(), "docs": a.docs, "more": a.more,
                 "command": " ".join(["python -m benchmarks.records_lake", *sys.argv[1:]])}
    with s3_server(buckets=("lake",)) as endpoint:
        s3 = S3Options(endpoint_url=endpoint)
        fs = pafs.S3FileSystem(endpoint_override=endpoint.split("://")[1], scheme="http", region="us-east-1")
        write_input(fs, "lake/in", lake(a.docs, 0, 1), a.input_files)
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            out |= runs(fs, s3, a)
        finally:
            ray.shutdown()
    out["peak_rss_mib_driver"] = peak_rss_mib()
    write_json(a.out, out)
    print_table(["docs", "documents files", "records files", "records", "read_records s", "from rows s", "export s",
                 "job s"],
                [[a.docs, out["files"]["documents"], out["files"]["records"], out["records"], out["read_records_s"],
                  out["read_from_rows_s"], out["export_s"], out["job"]["wall_s"]]])


def runs(fs, s3, a: argparse.Namespace) -> dict:
    """The first run over the lake, its output measured, then (``--more``) a second run over a grown lake."""
    from memagent.engines import EngineConfig
    from memagent.models import resolve_model
    from pipelines import records_output, storage
    from pipelines.batch_qa import BatchQAConfig, run_batch_qa
    from pipelines.job import JobConfig
    from memagent_testing.records_helpers import CONFIG, records_engine

    tokenizer = str(resolve_model("smollm2-135m"))
    build = functools.partial(records_engine, {"tokenizer": tokenizer})

    def job(inp: str) -> BatchQAConfig:
        return BatchQAConfig(input=f"s3://lake/{inp}", output="s3://lake/out", s3=s3, agent=CONFIG,
                             engine=EngineConfig(model=tokenizer), job=JobConfig(progress=False, checkpoint_every_steps=0))

    load0, t0 = loadavg(), time.perf_counter()
    summary = run_batch_qa(job("in"), build_engine=build)
    out = {"job": {"wall_s": round(time.perf_counter() - t0, 1), "rows_out": summary.rows_out,
                   "error_rows": summary.error_rows, "loadavg_start": load0, "loadavg_end": loadavg()}}
    out |= measure(fs, "lake/out", s3, records_output, storage)
    if not a.more:
        return out
    write_input(fs, "lake/more", lake(a.more, a.docs, 2), 1)
    # The second run's input: the first lake plus the new documents (a nightly job over a growing lake).
    for info in storage.output_file_infos(fs, "lake/in"):
        fs.copy_file(info.path, f"lake/more/{info.base_name.replace('part', 'old')}")
    reads: list[str] = []
    real = records_output._row_records
    records_output._row_records = lambda f, file, t: reads.append(file) or real(f, file, t)
    t0 = time.perf_counter()
    try:
        again = run_batch_qa(job("more"), build_engine=build)
    finally:
        records_output._row_records = real
    out["second_run"] = {"wall_s": round(time.perf_counter() - t0, 1), "rows_out": again.rows_out,
                         "skipped": again.skipped, "documents_files_exported": len(reads),
                         "records_files": len(storage.output_files(fs, "lake/out/_records/payments")),
                         "loadavg_end": loadavg()}
    return out


def measure(fs, path: str, s3, records_output, storage) -> dict:
    """Files, and the read and export walls of the output at ``path`` (module doc)."""
    import pyarrow as pa

    output = f"s3://{path}"
    folder = f"{path}/_records/payments"
    documents = storage.output_files(fs, path)
    records = records_output.read_records(output, "payments", s3)
    load0 = loadavg()
    read_s = timed(lambda: records_output.read_records(output, "payments", s3))

    def from_rows() -> pa.Table:
        return pa.concat_tables([records_output._row_records(fs, f, "payments") for f in documents])

    assert len(from_rows()) == len(records)
    rows_s = timed(from_rows, repeat=1)
    exported = storage.output_files(fs, folder)
    for f in exported:
        fs.delete_file(f)
    t0 = time.perf_counter()
    records_output.export_records(output, s3, ["payments"])
    export_s = round(time.perf_counter() - t0, 3)
    return {"files": {"documents": len(documents), "records": len(exported),
                      "records_after_reexport": len(storage.output_files(fs, folder))},
            "records": len(records), "read_records_s": read_s, "read_from_rows_s": rows_s, "export_s": export_s,
            "loadavg_reads": [load0, loadavg()]}


if __name__ == "__main__":
    main()
