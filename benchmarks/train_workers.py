"""Seconds per training step with 1 and 2 workers on the same data (``pipelines/train_job.py``); one JSON file.

    .venv/bin/python -m benchmarks.train_workers --steps 4 --out benchmarks/results/train_workers.json

Modes: ``inproc`` (``train()`` in this process, torch's default threads), ``ray1`` and ``ray2``
(Ray Train, 1 or 2 workers of one CPU each on a local Ray). The same data, batch and group
size in every mode; rank r of W rolls out ``batch / W`` questions. Per mode: each step's
``step_s`` / ``rollout_s`` / ``update_s`` (the merged record: the slowest rank), their median
over the steps after the first (warm-up), and the wall time of the whole call (start-up of Ray,
workers, model loads included). Load average before and after each mode. Numbers are
measurements, never asserted; on a shared machine read them with the load average.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from benchmarks.common import build_tiny_llama, machine, median, print_table, write_json


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="HF model dir (default: a tiny random Llama, built once)")
    p.add_argument("--modes", default="inproc,ray1,ray2")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--group-size", type=int, default=2)
    p.add_argument("--examples", type=int, default=16)
    p.add_argument("--chunk-tokens", type=int, default=64)
    p.add_argument("--memory-tokens", type=int, default=16)
    p.add_argument("--answer-tokens", type=int, default=8)
    p.add_argument("--out", default="benchmarks/results/train_workers.json")
    args = p.parse_args(argv)

    from memagent.config import preset
    from memagent.rl.config import TrainConfig
    from pipelines.train_job import TrainJob, run_training
    from benchmarks.train_curve import niah

    tmp = Path(tempfile.mkdtemp(prefix="train-workers-"))
    model = args.model or str(build_tiny_llama(tmp / "tiny"))
    data = niah(args.examples, sentences=20, seed=0)
    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, group_size=args.group_size, warmup_steps=0,
                         save_every=args.steps, micro_batch_tokens=1024, lr=1e-3)
    agent = preset("tiny").with_overrides(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                                          answer_tokens=args.answer_tokens)
    jobs = {"inproc": TrainJob(), "ray1": TrainJob(ray_address="local"), "ray2": TrainJob(workers=2)}
    results = {}
    for mode in args.modes.split(","):
        load_before = [round(x, 2) for x in os.getloadavg()]
        t = time.perf_counter()
        records = run_training(jobs[mode], config=config, agent_config=agent, data=data, out_dir=tmp / mode,
                               model=model)
        wall = time.perf_counter() - t
        steady = records[1:] or records
        results[mode] = {
            "workers": jobs[mode].workers, "ray": jobs[mode].uses_ray, "wall_s": round(wall, 1),
            "step_s": [r["step_s"] for r in records], "rollout_s": [r["rollout_s"] for r in records],
            "update_s": [r["update_s"] for r in records],
            "median_step_s": median([r["step_s"] for r in steady]),
            "median_rollout_s": median([r["rollout_s"] for r in steady]),
            "median_update_s": median([r["update_s"] for r in steady]),
            "loadavg_before": load_before, "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        }
    print_table(["mode", "workers", "median step s", "rollout s", "update s", "wall s", "load 1m before/after"],
                [[m, r["workers"], r["median_step_s"], r["median_rollout_s"], r["median_update_s"], r["wall_s"],
                  f"{r['loadavg_before'][0]}/{r['loadavg_after'][0]}"] for m, r in results.items()])
    write_json(args.out, {"settings": vars(args) | {"model": model}, "machine": machine(), "modes": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
