"""The paper's length through the real batch job: one 3.5M-token document against an 8K one.

    python -m benchmarks.long_document --out benchmarks/results/long_document.json \\
        [--long-tokens 3820000] [--short-tokens 8192] [--short-repeats 3] [--model tiny]

Each document is one row of its own Parquet input, read by ``pipelines.batch_qa.run_batch_qa``
(Ray Data on local Ray, one actor, the transformers engine, Parquet out with the memory trace of
every step), one job after the other in the same Ray session. ``--model tiny`` is the 2-layer
random Llama of ``benchmarks.common.build_tiny_llama`` (SmolLM2's tokenizer): every memory update
runs to the ``memory_tokens`` cap, so each chunk costs the same and the figure isolates how the
*job's* cost grows with length (tokenising, chunking, the trace, Arrow and Parquet included).

Per job: the row's own ``seconds`` (agent time in the actor) per 1K context tokens, the peak
resident memory of the actor process and of the whole Ray process tree (sampled every 50 ms),
and the output: the row's bytes in Parquet and as JSON, and its step count. The short document
runs ``--short-repeats`` times (the median counts: a few chunks time noisily).

Headline keys: ``seconds_per_1k_ratio`` (long / short, target <= 1.10) and ``actor_peak_ratio``
(long / short, target <= 1.2).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from benchmarks.common import loadavg, machine, print_table, resolve_bench_model, write_json  # noqa: E402

MB = 2**20


class TreeSampler:
    """Peak RSS of this process's tree, in total and per process (Ray's raylet and workers are children)."""

    def __init__(self, every_s: float = 0.05):
        import psutil

        self.me, self.every_s = psutil.Process(), every_s
        self.total_peak = 0
        self.peaks: dict[int, int] = {}  # pid -> peak RSS
        self.names: dict[int, str] = {}  # pid -> command line
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(self.every_s):
            total = 0
            for p in [self.me, *self.me.children(recursive=True)]:
                try:
                    rss = p.memory_info().rss
                    if "AgentWorker" not in self.names.get(p.pid, ""):  # Ray renames a worker once it holds an actor
                        self.names[p.pid] = " ".join(p.cmdline())
                except psutil.Error:
                    continue
                total += rss
                self.peaks[p.pid] = max(self.peaks.get(p.pid, 0), rss)
            self.total_peak = max(self.total_peak, total)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(timeout=5)
        actors = [pid for pid, name in self.names.items() if "AgentWorker" in name]
        actor_peak = max((self.peaks.get(pid, 0) for pid in actors), default=0)
        return {"tree_peak_mb": round(self.total_peak / MB), "actor_peak_mb": round(actor_peak / MB),
                "actor_processes": len(actors)}


def run_job(row: dict, work: Path, name: str, model_dir: Path, agent: Any, threads: int) -> dict:
    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    from memagent.engines import EngineConfig
    from pipelines.batch_qa import BatchQAConfig, run_batch_qa
    from pipelines.job import JobConfig

    inp, out = work / f"in-{name}", work / f"out-{name}"
    inp.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([{k: row[k] for k in ("id", "question", "context", "answers")}]),
                   inp / "part-0.parquet")
    cfg = BatchQAConfig(input=str(inp), output=str(out), agent=agent,
                        engine=EngineConfig(model=str(model_dir), dtype="fp32"),
                        job=JobConfig(concurrency=1, batch_size=1, torch_threads=threads, progress=False))
    load0 = loadavg()
    sampler = TreeSampler()
    t0 = time.perf_counter()
    summary = run_batch_qa(cfg)
    wall = time.perf_counter() - t0
    mem = sampler.stop()
    table = pads.dataset(str(out), format="parquet").to_table()
    [result] = table.to_pylist()
    if result["error"]:
        raise RuntimeError(f"{name}: the row failed: {result['error']}")
    parquet_bytes = sum(f.stat().st_size for f in out.glob("*.parquet"))
    tokens = result["context_tokens"]
    return {
        "name": name, "context_tokens": tokens, "context_chars": len(row["context"]), "n_chunks": result["n_chunks"],
        "steps": len(result["steps"]), "row_seconds": round(result["seconds"], 2), "job_wall_s": round(wall, 2),
        "seconds_per_1k_tokens": round(result["seconds"] / tokens * 1000, 5),
        **mem, "output_parquet_bytes": parquet_bytes,
        "output_row_json_bytes": len(json.dumps(result, default=str)),
        "rows_out": summary.rows_out, "loadavg_start": load0, "loadavg_end": loadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results/long_document.json")
    p.add_argument("--long-tokens", type=int, default=3_820_000,
                   help="target size; documents are sized by a word count, ~8%% under (3.82M: ~3.5M real tokens)")
    p.add_argument("--short-tokens", type=int, default=8192)
    p.add_argument("--short-repeats", type=int, default=3)
    p.add_argument("--model", default="tiny")
    p.add_argument("--chunk-tokens", type=int, default=4096)
    p.add_argument("--memory-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="torch threads of the actor")
    p.add_argument("--work", default=None, help="work directory (default: a temporary one)")
    args = p.parse_args(argv)

    import ray

    from benchmarks.scaling import long_niah
    from memagent.config import AgentConfig

    work = Path(args.work or tempfile.mkdtemp(prefix="long-doc-"))
    model_dir, label = resolve_bench_model(args.model, work)
    agent = AgentConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens, answer_tokens=16,
                        query_tokens=64)
    t0 = time.perf_counter()
    long_row = long_niah(args.long_tokens, seed=3)
    gen_s = time.perf_counter() - t0
    jobs = []
    try:
        for i in range(args.short_repeats):
            jobs.append(run_job(long_niah(args.short_tokens, seed=3 + i), work, f"short-{i}", model_dir, agent,
                                args.threads))
            print(jobs[-1], flush=True)
        jobs.append(run_job(long_row, work, "long", model_dir, agent, args.threads))
        print(jobs[-1], flush=True)
    finally:
        ray.shutdown()
    shorts, long_ = jobs[:-1], jobs[-1]
    short_s = statistics.median(j["seconds_per_1k_tokens"] for j in shorts)
    short_actor = statistics.median(j["actor_peak_mb"] for j in shorts)
    result = {
        "benchmark": "long_document",
        "seconds_per_1k_ratio": round(long_["seconds_per_1k_tokens"] / short_s, 4),
        "actor_peak_ratio": round(long_["actor_peak_mb"] / short_actor, 4) if short_actor else None,
        "tree_peak_ratio": round(long_["tree_peak_mb"] / statistics.median(j["tree_peak_mb"] for j in shorts), 4),
        "targets": {"seconds_per_1k_ratio": "<= 1.10", "actor_peak_ratio": "<= 1.2"},
        "model": label, "agent": agent.model_dump(mode="json"), "threads": args.threads,
        "long_document_generate_s": round(gen_s, 1), "jobs": jobs, "machine": machine(),
        "command": "python -m benchmarks.long_document " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    write_json(args.out, result)
    print_table(["job", "tokens", "chunks", "s/1K tok", "actor peak MB", "tree peak MB", "row Parquet bytes"],
                [[j["name"], j["context_tokens"], j["n_chunks"], j["seconds_per_1k_tokens"], j["actor_peak_mb"],
                  j["tree_peak_mb"], j["output_parquet_bytes"]] for j in jobs])
    print(f"s/1K ratio {result['seconds_per_1k_ratio']} (<= 1.10), actor peak ratio {result['actor_peak_ratio']} "
          f"(<= 1.2); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
