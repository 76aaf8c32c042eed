"""A lake's listing: the driver's memory and the time to the first row, Ray Data's reader against the streamed listing.

    python -m benchmarks.documents_listing --files 100000 --out benchmarks/results/documents_listing.json

A folder of ``--files`` tiny text files in 100 sub-folders. Each way runs in a fresh process (its own local
Ray, 2 CPUs): Ray Data's ``read_binary_files`` (what the documents input used: the driver lists every path
and its size as it plans the read) and the documents input's listing (pipelines/documents_listing.py: the
driver walks to the first file, a read task lists the rest as rows stream). Each process plans the read,
takes the first batch of 256 rows (``first_row_s``, from the call that builds the dataset) and then counts
every row (``all_rows_s``); the driver's peak RSS growth is measured from just after ``ray.init``
(``driver_rss_mb``: /proc/self/status VmHWM). A third process streams as many rows with no files
(``ray.data.range``): the driver's cost of the streaming itself. Headline: ``driver_rss_mb`` of each way.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import loadavg, machine, print_table, write_json

FOLDERS = 100


def make_lake(root: Path, files: int) -> None:
    for i in range(files):
        folder = root / f"f{i % FOLDERS:03d}"
        if i < FOLDERS:
            folder.mkdir(parents=True)
        (folder / f"n{i:07d}.txt").write_text(f"Note {i}: {i % 97} units.")


def _hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(way: str, lake: str) -> dict:
    """One way, in this (fresh) process: plan, first batch, every row; the driver's memory."""
    import pyarrow.fs as pafs
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    base = _hwm_mb()
    t0 = time.perf_counter()
    if way == "no listing (ray.data.range)":  # the driver's cost of streaming as many rows, no files
        ds = ray.data.range(int(lake.rsplit(":", 1)[1]) if ":" in lake else 0)
    elif way == "ray read_binary_files":
        ds = ray.data.read_binary_files(lake, include_paths=True, partitioning=None).select_columns(["path"])
    else:
        from pipelines.documents_input import DocumentSource, PathFilter, first_file_to_read
        from pipelines.documents_listing import read_listing

        source = DocumentSource(pafs.LocalFileSystem(), lake, lake)
        keep = PathFilter(lake, None)
        first_file_to_read(source, keep)
        ds = read_listing(source.fs, source.paths, keep)
    rows = 0
    first = None
    for batch in ds.iter_batches(batch_size=256, batch_format="pyarrow"):
        first = first if first is not None else time.perf_counter() - t0
        rows += batch.num_rows
    result = {"way": way, "rows": rows, "first_row_s": round(first or 0.0, 2),
              "all_rows_s": round(time.perf_counter() - t0, 2), "driver_rss_mb": round(_hwm_mb() - base, 1)}
    ray.shutdown()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--out", default="benchmarks/results/documents_listing.json")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        lake = Path(tmp) / "lake"
        t0 = time.perf_counter()
        make_lake(lake, args.files)
        made = time.perf_counter() - t0
        runs = []
        for way in ("no listing (ray.data.range)", "ray read_binary_files", "streamed listing"):
            load = loadavg()
            where = f"rows:{args.files}" if way.startswith("no listing") else str(lake)
            out = subprocess.run([sys.executable, "-m", "benchmarks.documents_listing", "--child", way, where],
                                 capture_output=True, text=True, check=True)
            runs.append({**json.loads(out.stdout.strip().splitlines()[-1]), "loadavg_before": load})
    keys = ["way", "rows", "first_row_s", "all_rows_s", "driver_rss_mb"]
    print_table(keys, [[r[k] for k in keys] for r in runs])
    write_json(args.out, {"headline": {r["way"]: r["driver_rss_mb"] for r in runs}, "files": args.files,
                          "folders": FOLDERS, "lake_written_s": round(made, 1), "runs": runs, "machine": machine()})


if __name__ == "__main__":
    main()
