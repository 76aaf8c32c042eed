"""Peak memory and trained tokens/s of one Multi-Conv DAPO step on CPU; writes one JSON file.

Two configurations, each run in its own process (two steps: a warm-up step, then
the measured one, then the final checkpoint):

  (a) RULER niah_single_1, 8 samples of 2048 tokens; batch 2 x group 2; chunk 512, memory 64,
      answer 16 (``memagent train --steps 2 --batch-size 2 --group-size 2 --chunk-tokens 512
      --memory-tokens 64 --answer-tokens 16``);
  (b) RULER niah_single_1, 8 samples of 8192 tokens; batch 4 x group 4; the ``small`` preset
      (chunk 1024, memory 160, answer 48).

    .venv/bin/python benchmarks/train_memory.py --configs a --out benchmarks/results/train_memory.json

On a 2-core CPU (b)'s first step takes over an hour (its rollout alone ~15 min). There
``--optimizer-state-upfront --timeout-s`` records the rollout and scoring phases of the real run
with AdamW's moments resident, and ``--update-probe ROWS`` measures the update on rows as long as
(b)'s longest conversation (same trainer, same resident set), without the rollout:

    .venv/bin/python benchmarks/train_memory.py --configs b --update-probe 4 --optimizer-state-upfront \
        --out benchmarks/results/train_memory_update_probe.json

The parent samples the resident memory of the child's whole process tree every 50 ms and kills
it above ``--max-rss-gb`` (a shared machine must not swap or OOM). The child records the peak of
its own RSS during each phase of the step (rollout, scoring, update, weight sync, checkpoint),
the memory guard's estimate, and the step's metrics. Measurements only, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

CONFIGS: dict[str, dict[str, Any]] = {
    "a": {"length": 2048, "samples": 8, "preset": "small",
          "agent": {"chunk_tokens": 512, "memory_tokens": 64, "answer_tokens": 16},
          "train": {"steps": 2, "batch_size": 2, "group_size": 2}},
    "b": {"length": 8192, "samples": 8, "preset": "small", "agent": {},
          "train": {"steps": 2, "batch_size": 4, "group_size": 4}},
}
PHASES = ("build_run", "rollout", "score_old_and_reference", "update_policy", "sync_weights", "save_checkpoint")


def tree_rss(proc: Any) -> int:
    """Resident bytes of ``proc`` and all its descendants (psutil.Process)."""
    import psutil

    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


# ---------------------------------------------------------------------------------------------
# Child: one training run with per-phase RSS peaks
# ---------------------------------------------------------------------------------------------


def sample_peaks(me: Any, phase: dict[str, Any], peaks: dict[str, int], stop: threading.Event,
                 dump: Callable[[bool], None]) -> None:
    """Until ``stop``: the current phase's RSS peak every 10 ms, and the results dumped every 20 s."""
    last = time.perf_counter()
    while not stop.is_set():
        key = f"{phase['step']}:{phase['name']}"
        peaks[key] = max(peaks.get(key, 0), me.memory_info().rss)
        if time.perf_counter() - last > 20:  # a run stopped early still reports its phases
            dump(False)
            last = time.perf_counter()
        time.sleep(0.01)


def wrap_phases(trainer: Any, phase: dict[str, Any], peaks: dict[str, int], me: Any) -> None:
    """Wrap each of ``PHASES`` in ``trainer``: it names the current phase and records its RSS at the end."""
    def wrap(name: str) -> None:
        fn = getattr(trainer, name)

        def wrapped(*args: Any, **kw: Any) -> Any:
            prev = phase["name"]
            phase["name"] = name
            try:
                return fn(*args, **kw)
            finally:
                key = f"{phase['step']}:{name}"
                peaks[key] = max(peaks.get(key, 0), me.memory_info().rss)
                phase["name"] = prev

        setattr(trainer, name, wrapped)

    for name in PHASES:
        wrap(name)


def count_rollout_steps(trainer: Any, phase: dict[str, Any]) -> None:
    """Make ``trainer``'s rollout set the current step (the phases after it count to that step)."""
    first = trainer.rollout

    def rollout(run: Any, stream: Any, step: int, reward_fn: Any) -> Any:
        phase["step"] = step
        return first(run, stream, step, reward_fn)

    trainer.rollout = rollout


def allocate_optimizer_upfront(trainer: Any) -> None:
    """Make ``trainer``'s run builder allocate AdamW's moments as soon as the run is built."""
    build = trainer.build_run

    def build_run(*args: Any, **kw: Any) -> Any:
        run = build(*args, **kw)
        allocate_optimizer_state(run.engine.optimizer)
        return run

    trainer.build_run = build_run


def child(spec_path: Path) -> None:
    import psutil

    from benchmarks.common import set_threads
    from memagent.config import preset
    from memagent.rl import trainer
    from memagent.rl.config import TrainConfig

    spec = json.loads(spec_path.read_text())
    set_threads(spec.get("threads"))
    me = psutil.Process()
    phase = {"name": "setup", "step": -1}  # imports, data, restore: outside the wrapped phases
    peaks: dict[str, int] = {}
    stop = threading.Event()
    wrap_phases(trainer, phase, peaks, me)

    config = TrainConfig(**spec["train"])
    agent = preset(spec["preset"]).with_overrides(**spec["agent"])

    records: list[dict[str, Any]] = []
    t0 = time.perf_counter()

    def dump(done: bool) -> None:  # after every step, so a run stopped early still reports
        Path(spec["result"]).write_text(json.dumps({
            "done": done, "seconds": round(time.perf_counter() - t0, 1),
            "phase_peak_rss_mb": {k: round(v / 2**20) for k, v in sorted(peaks.items())},
            "steps": records}, default=str))

    def on_step(rec: dict[str, Any]) -> None:
        phase["step"] = rec["step"] + 1  # the checkpoint after the last step counts to the next one
        records.append(rec)
        dump(False)

    count_rollout_steps(trainer, phase)
    if spec.get("optimizer_state_upfront"):
        allocate_optimizer_upfront(trainer)
    threading.Thread(target=sample_peaks, args=(me, phase, peaks, stop, dump), daemon=True).start()
    if spec.get("probe_rows"):
        probe_update(spec, config, agent, phase, on_step)
    else:
        trainer.train(config=config, agent_config=agent, data=spec["data"], out_dir=spec["run_dir"],
                      model=spec["model"], on_step=on_step, force=True)
    stop.set()
    dump(True)


def probe_update(spec: dict[str, Any], config: Any, agent: Any, phase: dict[str, Any], on_step: Any) -> None:
    """Scoring and update only, twice, on ``probe_rows`` random rows as long as the configuration's
    longest conversation (a memory update: chunk + memory + question + template, and a reply of
    ``memory_tokens``); the phases of a step that a CPU reaches only after a long rollout."""
    import random

    from memagent.models import resolve_model
    from memagent.rl import trainer
    from memagent.rl.batching import Sample
    from memagent.rl.distributed import setup_distributed
    from memagent.rl.memory import PROMPT_OVERHEAD_TOKENS
    from memagent.rl.rollout import Conversation

    setup_distributed()
    run = trainer.build_run(config, agent, resolve_model(spec["model"]), rank=0, world=1, out=Path(spec["run_dir"]),
                            engine_max_batch_size=64)
    rng, vocab = random.Random(0), run.engine.module.config.vocab_size
    prompt = agent.chunk_tokens + agent.memory_tokens + agent.query_tokens + PROMPT_OVERHEAD_TOKENS
    for step in range(2):
        phase["step"] = step
        samples = [Sample(Conversation(traj_index=i, group_id=0, conv_index=0,
                                       prompt_ids=[rng.randrange(100, vocab) for _ in range(prompt)],
                                       response_ids=[rng.randrange(100, vocab) for _ in range(agent.memory_tokens)],
                                       behaviour_logprobs=None, is_final=False, truncated=False, trainable=True),
                          rng.choice((-1.0, 1.0))) for i in range(spec["probe_rows"])]
        t0 = time.perf_counter()
        trainer.score_old_and_reference(run, samples, on_policy=True)
        trainer.update_policy(run, samples, on_policy=True)
        on_step({"step": step, "rows": len(samples), "row_tokens": prompt + agent.memory_tokens,
                 "update_s": round(time.perf_counter() - t0, 2)})


def allocate_optimizer_state(optimizer: Any) -> None:
    """Create AdamW's moments now, as its first step would (zeros, step 0): the first step then
    carries the resident set of every later one, so a one-step run measures the steady state."""
    import torch

    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and not optimizer.state[p]:
                optimizer.state[p] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(p),
                                      "exp_avg_sq": torch.zeros_like(p)}


# ---------------------------------------------------------------------------------------------
# Parent: data, the child under a watchdog, the JSON
# ---------------------------------------------------------------------------------------------


def make_data(path: Path, length: int, samples: int, model: str) -> None:
    from memagent.data.io import write_parquet
    from memagent.models import load_tokenizer
    from memagent.data.ruler import RULER_SCHEMA, RulerGenerator

    rows = list(RulerGenerator(load_tokenizer(model)).generate(["niah_single_1"], [length], samples))
    write_parquet(rows, str(path), RULER_SCHEMA)


def estimate(spec: dict[str, Any]) -> dict[str, Any]:
    """The trainer's own estimate (memagent.rl.memory) for this configuration, without running it."""
    from memagent.config import preset
    from memagent.models import resolve_model
    from memagent.rl.config import TrainConfig
    from memagent.rl.memory import ModelShape, estimate_peak_memory

    agent = preset(spec["preset"]).with_overrides(**spec["agent"])
    shape = ModelShape.of(resolve_model(spec["model"]))
    est = estimate_peak_memory(TrainConfig(**spec["train"]), agent, shape)
    return {"peak_mb": round(est.peak_mb), "resident_mb": {k: round(v) for k, v in est.resident.items()},
            "transient_mb": {k: round(v) for k, v in est.transient.items()}}


def measure(name: str, spec: dict[str, Any], work: Path, max_rss: int, timeout_s: float) -> dict[str, Any]:
    import psutil

    from benchmarks.common import loadavg

    data = work / f"{name}-{spec['length']}.parquet"
    if not data.exists():
        make_data(data, spec["length"], spec["samples"], spec["model"])
    run_dir = work / f"run-{name}-{time.time_ns()}"
    spec = {**spec, "data": str(data), "run_dir": str(run_dir), "result": str(work / f"{name}.result.json")}
    spec_path = work / f"{name}.spec.json"
    spec_path.write_text(json.dumps(spec))
    load_before = loadavg()
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(spec_path)], env=os.environ.copy())
    ps, peak, killed, loads, last = psutil.Process(proc.pid), 0, False, [], 0.0
    while proc.poll() is None:
        peak = max(peak, tree_rss(ps))
        if time.perf_counter() - last > 10:  # the machine is shared: how busy it was during the run
            loads.append(os.getloadavg()[0])
            last = time.perf_counter()
        if peak > max_rss or time.perf_counter() - t0 > timeout_s:
            for p in [*ps.children(recursive=True), ps]:
                p.kill()
            killed = True
            break
        time.sleep(0.05)
    rc = proc.wait()
    out: dict[str, Any] = {"config": {k: spec.get(k) for k in ("length", "samples", "preset", "agent", "train",
                                                             "optimizer_state_upfront", "probe_rows")},
                           "peak_rss_mb": round(peak / 2**20), "wall_s": round(time.perf_counter() - t0, 1),
                           "loadavg_before": load_before, "loadavg_after": loadavg(),
                           "loadavg_1min_mean_during": round(sum(loads) / len(loads), 2) if loads else None,
                           "returncode": rc}
    result_file = Path(spec["result"])
    result = json.loads(result_file.read_text()) if result_file.exists() else {"steps": [], "done": False}
    if killed:
        out["killed"] = f"above {round(max_rss / 2**20)} MB" if peak > max_rss else f"after {timeout_s:.0f} s"
        out["partial"] = result  # per-phase peaks and the steps finished before the kill
        return out
    if spec.get("probe_rows"):
        out.update(probe=result["steps"], phase_peak_rss_mb=result["phase_peak_rss_mb"])
        return out
    measured = result["steps"][-1]  # the step after the warm-up
    out.update(
        trained_tokens_per_s=round(measured["train_tokens_per_s"], 1),
        update_s=measured["update_s"], rollout_s=measured["rollout_s"], step_s=measured["step_s"],
        trained_convs=measured["trained_convs"], response_tokens=measured["response_tokens"],
        phase_peak_rss_mb=result["phase_peak_rss_mb"],
        steps=[{k: s[k] for k in ("step", "trained_convs", "response_tokens", "update_s", "rollout_s",
                                  "train_tokens_per_s", "peak_rss_mb")} for s in result["steps"]],
    )
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--configs", default="a,b", help="comma list of a, b (default: both)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                   help="override a TrainConfig field in every configuration, e.g. gradient_checkpointing=false")
    p.add_argument("--estimate-only", action="store_true", help="record the memory guard's estimates, run nothing")
    p.add_argument("--max-rss-gb", type=float, default=9.0, help="kill a run whose process tree exceeds this")
    p.add_argument("--timeout-s", type=float, default=3600, help="stop a run after this long (partial results kept)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, = cores)")
    p.add_argument("--optimizer-state-upfront", action="store_true",
                   help="allocate AdamW's moments before the first step, so that a run stopped by --timeout-s "
                        "within its first step (config (b) on a small CPU) still measures the steady state")
    p.add_argument("--update-probe", type=int, default=0, metavar="ROWS",
                   help="instead of training: build the trainer, then score and update ROWS random rows of the "
                        "configuration's longest conversation, twice (the update's peak without the rollout's hour)")
    p.add_argument("--work", type=Path, help="directory for data and runs (default: a temporary one)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/train_memory.json"))
    args = p.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    from benchmarks.common import machine, write_json

    overrides = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    tmp = tempfile.TemporaryDirectory() if args.work is None else None
    work = args.work or Path(tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    results = {"machine": machine(), "overrides": overrides, "runs": {}}
    for name in args.configs.split(","):
        spec = json.loads(json.dumps(CONFIGS[name]))
        spec["train"].update(overrides)
        spec.update(model=args.model, threads=args.threads, optimizer_state_upfront=args.optimizer_state_upfront,
                    probe_rows=args.update_probe)
        if args.estimate_only:
            results["runs"][name] = {"config": {k: spec[k] for k in ("length", "samples", "preset", "agent", "train")},
                                     "estimate": estimate(spec)}
            print(f"({name}) estimated peak {results['runs'][name]['estimate']['peak_mb']} MB", flush=True)
            continue
        r = measure(name, spec, work, int(args.max_rss_gb * 2**30), args.timeout_s)
        r["estimate"] = estimate(spec)
        results["runs"][name] = r
        print(f"({name}) peak {r['peak_rss_mb']} MB (estimate {r['estimate']['peak_mb']} MB), "
              f"{r.get('trained_tokens_per_s')} trained tokens/s, load {r['loadavg_before']}", flush=True)
        write_json(args.out, results)  # after each configuration: a later one may be stopped
    write_json(args.out, results)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
