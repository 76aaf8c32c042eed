"""What chain checkpoints cost and what they save: one long document through the real batch job.

    nice python -m benchmarks.checkpoints --out benchmarks/results/checkpoints.json \\
        [--long-tokens 40000] [--chunk-tokens 32] [--model tiny]

One document (a needle in a haystack of ``--long-tokens``, ``--chunk-tokens`` chunks) is read by
``pipelines.batch_qa.run_batch_qa`` (local Ray, one actor, the transformers engine in fp32,
greedy), four times, each into a fresh output:

- ``uninterrupted``: checkpoints at the default interval (``JobConfig.checkpoint_every_steps``);
- ``no_checkpoints``: the same with checkpoints off (``--checkpoint-every-steps 0``);
- ``killed``: the actor kills its own process (``os._exit``, through the job's ``build_engine``
  seam) at 75% of the document's chunks; Ray restarts it and the read resumes from its last
  checkpoint;
- ``killed_no_checkpoints``: the same kill with checkpoints off: the read starts over.

Headline keys: ``interrupted_wall_ratio`` (killed / uninterrupted job wall, target <= 1.1;
without checkpoints ~1.75; ``restart_s``: the part of the difference that is the actor's restart,
a fixed cost, against ``read_again_s``, the chunks read again), ``checkpoint_overhead`` (the checkpoint writes' own time over the
row's read time, from timing ``CheckpointLog.write`` on the very states the run wrote: a wall
difference of two runs is below a shared CPU's noise) next to ``wall_overhead`` (uninterrupted /
no_checkpoints - 1, noisy), and ``bytes_per_checkpoint`` (the segments seen under ``_progress/``
while the job ran). Record the load average: on a shared CPU expect 2x run-to-run differences.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import loadavg, machine, print_table, resolve_bench_model, write_json  # noqa: E402
# The engine that kills its own actor at its n-th call, once: the crash tests' build_engine seam.
from memagent_testing.engine_faults import CrashOnce as KillAt  # noqa: E402


class SegmentWatcher:
    """Sizes of the checkpoint segments that appear under ``out/_progress`` (polled every 20 ms)."""

    def __init__(self, out: Path):
        self.root, self.sizes = out / "_progress", {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            for f in self.root.glob("*/*.json"):
                try:
                    self.sizes[f.name] = f.stat().st_size
                except OSError:
                    pass

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.sizes


def run_job(row: dict, work: Path, name: str, model_dir: Path, agent: Any, every: int | None,
            kill_at: int | None = None) -> dict:
    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.parquet as pq

    from memagent.engines import EngineConfig
    from pipelines.batch_qa import BatchQAConfig, run_batch_qa
    from pipelines.job import JobConfig

    inp, out = work / f"in-{name}", work / f"out-{name}"
    inp.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([row]), inp / "part-0.parquet")
    fields = {} if every is None else {"checkpoint_every_steps": every}
    cfg = BatchQAConfig(input=str(inp), output=str(out), agent=agent,
                        engine=EngineConfig(model=str(model_dir), dtype="fp32"),
                        job=JobConfig(concurrency=1, batch_size=1, torch_threads=1, progress=False, **fields))
    marker = work / f"killed-{name}"
    load0 = loadavg()
    watcher = SegmentWatcher(out)
    t0 = time.perf_counter()
    summary = run_batch_qa(cfg, build_engine=KillAt(kill_at, marker) if kill_at else None)
    wall = time.perf_counter() - t0
    sizes = watcher.stop()
    [result] = pads.dataset(str(out), format="parquet", ignore_prefixes=["_", "."]).to_table().to_pylist()
    if result["error"]:
        raise RuntimeError(f"{name}: the row failed: {result['error']}")
    if kill_at and not marker.exists():
        raise RuntimeError(f"{name}: the actor was not killed")
    return {"name": name, "checkpoint_every_steps": cfg.job.checkpoint_every_steps, "kill_at_call": kill_at,
            "job_wall_s": round(wall, 2), "row_seconds": round(result["seconds"], 2),
            "n_chunks": result["n_chunks"], "steps": len(result["steps"]),
            "resumed_at_chunk": result["resumed_at_chunk"], "resumed_rows": summary.resumed_rows,
            "segments_seen": len(sizes), "segment_bytes": sorted(sizes.values()),
            "loadavg_start": load0, "loadavg_end": loadavg(), "_row": result}


def write_cost(row: dict, every: int, work: Path) -> dict:
    """Time ``CheckpointLog.write`` for the segments a read of ``row`` writes every ``every`` steps."""
    from memagent.agent import ReadState, Step
    from pipelines.checkpoints import CheckpointLog

    steps = tuple(Step(**{k: s[k] for k in Step.__dataclass_fields__ if k in s})
                  for s in row["steps"] if s["kind"] == "memory")
    chains = CheckpointLog(str(work / "write-cost"), None, every, 300.0)
    seconds, written = [], 0
    for end in range(every, len(steps) + 1, every):
        state = ReadState(next_chunk=end, char_offset=steps[end - 1].char_end or 0, memory=steps[end - 1].memory,
                          steps=steps[:end])
        t0 = time.perf_counter()
        chains.write(row["id"], "k" * 64, state, written)
        seconds.append(time.perf_counter() - t0)
        written = end
    return {"segments": len(seconds), "write_s_total": round(sum(seconds), 4),
            "write_s_median": round(statistics.median(seconds), 6) if seconds else None,
            "bytes_total": chains.bytes_written,
            "bytes_per_segment": round(chains.bytes_written / max(1, chains.segments_written))}


def restart_figures(result: dict) -> dict:
    """Where the killed run's extra wall went: chunks read again (from the last checkpoint to the
    kill) and the rest, the actor's restart (a new process, imports, the model load): a fixed cost
    that a longer document dilutes, unlike the chunks read again without checkpoints."""
    by = {j["name"]: j for j in result["jobs"]}
    base, killed = by["uninterrupted"], by["killed"]
    per_chunk = base["row_seconds"] / base["n_chunks"]
    again = (killed["kill_at_call"] - 1) - (killed["resumed_at_chunk"] or 0)
    extra = killed["job_wall_s"] - base["job_wall_s"]
    return {"extra_wall_s": round(extra, 2), "chunks_read_again": again,
            "read_again_s": round(again * per_chunk, 2), "restart_s": round(extra - again * per_chunk, 2)}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results/checkpoints.json")
    p.add_argument("--long-tokens", type=int, default=40000)
    p.add_argument("--chunk-tokens", type=int, default=32)
    p.add_argument("--memory-tokens", type=int, default=6)
    p.add_argument("--kill-at", type=float, default=0.75, help="fraction of the chunks read when the actor dies")
    p.add_argument("--model", default="tiny")
    p.add_argument("--work", default=None, help="work directory (default: a temporary one)")
    return p.parse_args(argv)


def run_jobs(row: dict, work: Path, model_dir: Path, agent: Any, kill_at: float) -> list[dict]:
    """On a local Ray, after a warm-up job: the row uninterrupted, without checkpoints, killed, killed without."""
    import ray

    from memagent.data.demo import niah_row

    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    try:
        # Ray's first job starts its worker processes: a short warm-up job keeps that out of the figures.
        w = niah_row(1, 640, depth=0.5, seed=12)
        run_job({"id": "warm/0", **{k: w[k] for k in ("question", "context", "answers")}}, work, "warm-up",
                model_dir, agent, None)
        base = run_job(row, work, "uninterrupted", model_dir, agent, None)
        print({k: v for k, v in base.items() if k not in ("_row", "segment_bytes")}, flush=True)
        kill_call = int(base["n_chunks"] * kill_at) + 1  # dies reading chunk int(0.75 n)
        jobs = [base]
        for name, ev, kill in (("no_checkpoints", 0, None), ("killed", None, kill_call),
                               ("killed_no_checkpoints", 0, kill_call)):
            jobs.append(run_job(row, work, name, model_dir, agent, ev, kill))
            print({k: v for k, v in jobs[-1].items() if k not in ("_row", "segment_bytes")}, flush=True)
    finally:
        ray.shutdown()
    return jobs


def write_results(args: argparse.Namespace, argv: list[str] | None, jobs: list[dict], every: int, work: Path,
                  label: str, agent: Any) -> None:
    """Write --out (the headline ratios, the write cost, every job) and print the jobs' table and the headline."""
    base = jobs[0]
    by = {j["name"]: j for j in jobs}
    cost = write_cost(base["_row"], every, work)
    sizes = base["segment_bytes"]
    result = {
        "benchmark": "checkpoints",
        "interrupted_wall_ratio": round(by["killed"]["job_wall_s"] / base["job_wall_s"], 3),
        "interrupted_wall_ratio_no_checkpoints": round(by["killed_no_checkpoints"]["job_wall_s"] / base["job_wall_s"],
                                                       3),
        "checkpoint_overhead": round(cost["write_s_total"] / base["row_seconds"], 5),
        "wall_overhead": round(base["job_wall_s"] / by["no_checkpoints"]["job_wall_s"] - 1, 4),
        "bytes_per_checkpoint": round(statistics.mean(sizes)) if sizes else None,
        "bytes_per_checkpoint_max": max(sizes) if sizes else None,
        "default_interval_steps": every,
        "targets": {"interrupted_wall_ratio": "<= 1.1", "checkpoint_overhead": "<= 0.02"},
        "write_cost": cost, "model": label, "agent": agent.model_dump(mode="json"),
        "context_tokens": base["_row"]["context_tokens"], "kill_at_fraction": args.kill_at,
        "jobs": [{k: v for k, v in j.items() if k != "_row"} for j in jobs], "machine": machine(),
        "command": "nice python -m benchmarks.checkpoints " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    result.update(restart_figures(result))
    write_json(args.out, result)
    print_table(["job", "every", "chunks", "resumed at", "job wall s", "row s", "segments"],
                [[j["name"], j["checkpoint_every_steps"], j["n_chunks"], j["resumed_at_chunk"], j["job_wall_s"],
                  j["row_seconds"], j["segments_seen"]] for j in jobs])
    print(f"interrupted/uninterrupted wall {result['interrupted_wall_ratio']} (<= 1.1; without checkpoints "
          f"{result['interrupted_wall_ratio_no_checkpoints']}); checkpoint writes {result['checkpoint_overhead']:.3%} "
          f"of the read (wall difference {result['wall_overhead']:.1%}); {result['bytes_per_checkpoint']} bytes per "
          f"checkpoint every {every} steps; wrote {args.out}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    from memagent.config import AgentConfig
    from memagent.data.demo import niah_row
    from pipelines.job import JobConfig

    work = Path(args.work or tempfile.mkdtemp(prefix="checkpoints-"))
    model_dir, label = resolve_bench_model(args.model, work)
    agent = AgentConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens, answer_tokens=4,
                        query_tokens=64, temperature=0.0)
    r = niah_row(0, args.long_tokens, depth=0.5, seed=11)
    row = {"id": "long/0", "question": r["question"], "context": r["context"], "answers": r["answers"]}
    every = JobConfig().checkpoint_every_steps
    jobs = run_jobs(row, work, model_dir, agent, args.kill_at)
    write_results(args, argv, jobs, every, work, label, agent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
