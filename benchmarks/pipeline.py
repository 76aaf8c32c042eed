"""The Ray Data batch job vs the in-process agent on the same documents: what does Ray cost?

    python -m benchmarks.pipeline --out benchmarks/results/pipeline.json

Generates ``--docs`` NIAH documents of ``--tokens`` tokens (the same as benchmarks.concurrency)
into a local Parquet file, then:

1. in-process: one TransformersEngine, all documents read concurrently (``answer_rows``, the
   function each Ray actor calls); engine load timed apart;
2. Ray: ``ray.init`` timed, then a one-row warm-up job (measures the job's fixed cost: Ray Data
   planning, actor start, model load, Parquet I/O: its wall minus its row's read seconds), then
   ``pipelines.batch_qa.run_batch_qa`` over all documents (one actor, ``batch_size`` rows per batch).

Headline key ``ratio`` = pipeline wall *without* Ray startup and model load (the job's wall minus
the fixed cost measured by the warm-up job) / in-process read wall (target <= 1.15). Also
reported: ``ratio_with_startup`` = (ray.init + job wall) / (engine load + in-process read), and
every part. Nothing is excluded silently: each subtraction is its own key.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    add_threads_option,
    bench_model,
    loadavg,
    machine,
    niah_docs,
    print_table,
    set_threads,
    write_json,
)


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=1200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", default="runs/bench/pipeline.json")
    add_threads_option(parser)
    return parser.parse_args()


def run_in_process(engine_cfg: Any, rows: list[dict], config: Any) -> tuple[dict, float, float]:
    """1. One engine reads all documents concurrently: its figures, engine load seconds and read seconds."""
    from memagent.batch import answer_rows
    from memagent.engines import make_engine

    t0 = time.perf_counter()
    engine = make_engine(engine_cfg)
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    records = asyncio.run(answer_rows(engine, rows, config))
    inproc_s = time.perf_counter() - t0
    inproc = {"engine_load_s": round(load_s, 2), "read_s": round(inproc_s, 2),
              "errors": sum(r["error"] is not None for r in records),
              "accuracy": sum(r["score"] or 0 for r in records) / len(records),
              "context_tokens": sum(r["context_tokens"] or 0 for r in records),
              "batch_sizes": dict(engine.stats.batch_sizes), "loadavg_end": loadavg()}
    print(f"in-process: load {load_s:.1f}s, read {inproc_s:.1f}s; load {inproc['loadavg_end']}", flush=True)
    return inproc, load_s, inproc_s


def run_ray(args: argparse.Namespace, work: Path, engine_cfg: Any, config: Any,
            threads: int) -> tuple[dict, Any, dict[str, float]]:
    """2. ray.init, a one-row warm-up job (the fixed cost), then the job over all documents: the pipeline's
    figures, the job's summary and the unrounded seconds."""
    import pyarrow.parquet as pq
    import ray

    from pipelines.batch_qa import BatchQAConfig, run_batch_qa

    t0 = time.perf_counter()
    ray.init(include_dashboard=False, log_to_driver=False)
    ray_init_s = time.perf_counter() - t0

    def job(name: str) -> tuple[float, object, list[dict]]:
        cfg = BatchQAConfig(input=str(work / f"{name}.parquet"), output=str(work / f"out-{name}"), engine=engine_cfg,
                            agent=config, batch_size=args.batch_size, concurrency=1, progress=False,
                            torch_threads=threads)
        t = time.perf_counter()
        summary = run_batch_qa(cfg)
        wall = time.perf_counter() - t
        out = pq.read_table(work / f"out-{name}").select(["id", "seconds", "error"]).to_pylist()
        return wall, summary, out

    warm_s, _, warm_rows = job("warmup")
    fixed_s = warm_s - max(r["seconds"] for r in warm_rows)
    print(f"warm-up job: {warm_s:.1f}s, fixed cost {fixed_s:.1f}s", flush=True)
    job_s, summary, out_rows = job("input")
    ray.shutdown()
    rows_max_s = max(r["seconds"] for r in out_rows)
    without_s = job_s - fixed_s
    pipe = {"ray_init_s": round(ray_init_s, 2), "warmup_job_s": round(warm_s, 2), "fixed_cost_s": round(fixed_s, 2),
            "job_s": round(job_s, 2), "rows_read_max_s": round(rows_max_s, 2),
            "wall_total_s": round(ray_init_s + job_s, 2),
            "wall_without_startup_s": round(without_s, 2), "rows": summary.rows_out, "errors": summary.error_rows,
            "accuracy": summary.accuracy, "context_tokens": summary.context_tokens, "loadavg_end": loadavg()}
    print(f"pipeline: job {job_s:.1f}s (without startup/model load {without_s:.1f}s); load {pipe['loadavg_end']}",
          flush=True)
    return pipe, summary, {"ray_init_s": ray_init_s, "fixed_s": fixed_s, "job_s": job_s, "rows_max_s": rows_max_s,
                           "without_s": without_s}


def write_results(args: argparse.Namespace, threads: int, config: Any, load_start: list[float], inproc: dict,
                  load_s: float, inproc_s: float, pipe: dict, summary: Any, seconds: dict[str, float]) -> None:
    """Write --out (the ratios and every part) and print the two runs."""
    ray_init_s, fixed_s, job_s = seconds["ray_init_s"], seconds["fixed_s"], seconds["job_s"]
    without_s = seconds["without_s"]
    result = {
        "benchmark": "pipeline",
        "ratio": round(without_s / inproc_s, 3),
        "ratio_definition": "(job wall - fixed cost of a 1-row warm-up job [Ray Data planning, actor start, model "
                            "load, Parquet I/O]) / in-process read wall; Ray startup (ray.init) excluded",
        "ratio_with_startup": round((ray_init_s + job_s) / (load_s + inproc_s), 3),
        "ratio_job_incl_model_load": round(job_s / (load_s + inproc_s), 3),
        "ratio_actor_read_time": round(seconds["rows_max_s"] / inproc_s, 3),
        "pipeline": pipe, "in_process": inproc,
        "settings": {"threads": threads, "docs": args.docs, "doc_tokens": args.tokens, "batch_size": args.batch_size,
                     "concurrency": 1, "model": args.model, "preset": args.preset, "agent": config.model_dump()},
        "loadavg_start": load_start, "machine": machine(),
    }
    out = write_json(args.out, result)
    print_table(["run", "wall s", "of which startup + model load s", "without s", "accuracy"], [
        ["in-process", round(load_s + inproc_s, 2), round(load_s, 2), round(inproc_s, 2), round(inproc["accuracy"], 3)],
        ["ray data job", round(ray_init_s + job_s, 2), round(ray_init_s + fixed_s, 2), round(without_s, 2),
         summary.accuracy],
    ])
    print(f"ratio {result['ratio']} (with startup {result['ratio_with_startup']}); wrote {out}")


def main() -> None:
    args = parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq

    from memagent.config import preset
    from memagent.data.demo import niah_row
    from memagent.data.hotpotqa import count_tokens
    from memagent.models import load_tokenizer
    from memagent.engines import EngineConfig

    load_start = loadavg()
    threads = set_threads(args.threads)
    config = preset(args.preset)
    engine_cfg = EngineConfig(model=bench_model(args.model), max_batch_size=max(16, args.batch_size))
    tokenizer = load_tokenizer(engine_cfg.model)
    count = functools.partial(count_tokens, tokenizer)
    rows = niah_docs(tokenizer, args.docs, args.tokens)
    work = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    pq.write_table(pa.Table.from_pylist(rows), work / "input.parquet")
    pq.write_table(pa.Table.from_pylist([niah_row(99, 200, 0.5, seed=1, count=count)]), work / "warmup.parquet")

    inproc, load_s, inproc_s = run_in_process(engine_cfg, rows, config)
    pipe, summary, seconds = run_ray(args, work, engine_cfg, config, threads)
    write_results(args, threads, config, load_start, inproc, load_s, inproc_s, pipe, summary, seconds)


if __name__ == "__main__":
    main()
