"""The batch job at scale on simulated GPUs: continuous admission against the batch barrier.

    python -m benchmarks.scale --out benchmarks/results/scale.json [--docs 2000] [--actors 8]
        [--max-in-flight 64] [--modes admission,barrier] [--time-scale 1.0] [--cluster]

Generates a lake (:mod:`benchmarks.scale_lake`) of ``--docs`` documents with lognormal lengths
(median 8K tokens, sigma 1.2, capped at 1M; count, seed and the length histogram go into the JSON),
writes it as Parquet, and runs the real Ray Data job (``pipelines.batch_qa.run_batch_qa``: Parquet
in, Parquet out, resume on) once per mode over the same lake, each into its own output, on
``--actors`` actors holding the latency-model engine of ``benchmarks/latency_engine.py`` (one
H100-class GPU serving an 8B model each; its steps sleep, so eight cost almost no CPU).

Modes: ``admission`` (the job's default: one row per call, ``max_in_flight`` calls per actor,
the actor's gate), ``barrier`` (admission off: one call per actor of ``max_in_flight`` rows,
the job before continuous admission). Suffixes, combinable: ``_lpt`` sorts the rows longest first
(``JobConfig.longest_first``); ``_priority`` makes the engine schedule by priority
(``EngineConfig.priority_scheduling``: the document with most conversations left first) instead
of first come first served; ``_reserve`` lets a document of ``--long-tokens`` or more reserve its
actor (``JobConfig.long_document_tokens``, ``--long-in-flight`` documents there while it reads),
e.g. ``admission_lpt_priority``, ``admission_lpt_reserve``; ``_spec`` speculates (prompt lookup,
``--speculative-tokens`` a step) at ``--speculate-acceptance`` (``measured``: the per-step
distribution of ``--speculation-results``; or a fixed mean acceptance rate), ``_spec0.5`` at 0.5.

Headline keys, per mode under ``modes``: ``occupancy`` (mean documents in flight /
``max_in_flight``, all actors over the job's window, from the actors' gates), ``wall_vs_ideal``
(the job's wall, from the first row admitted to the last written, / the wall an always-full
engine needs for the same prefill and decode tokens: ``LatencyModel.ideal_seconds`` over all
actors' work / actors, with "full" = ``min(max_in_flight, max_seqs)`` sequences per step),
``docs_per_s``. ``critical_path_s``: the longest document alone on an idle engine (no job can
end sooner; speculating, its expected time at the mode's mean acceptance, beside
``critical_path_no_speculation_s``). ``_spec`` modes keep ``ideal_s`` without speculation (the
same reference) and add ``speculation`` (the setting, its expected drafted and accepted tokens per
decode step). Targets: occupancy >= 0.9, wall_vs_ideal <= 1.15 with admission on.

``--chain-others 0,3,15`` runs only the chain isolation (:func:`benchmarks.scale_chain.run_chain`):
the lake's longest document on one simulated engine with 0, 3, 15 other documents reading beside it,
no Ray.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import psutil  # noqa: E402

from benchmarks.common import loadavg, print_table, write_json  # noqa: E402
from benchmarks.latency_engine import Acceptance, LatencyModel, engine_builder, load_acceptance, model_dict  # noqa: E402
from benchmarks.scale_chain import run_chain  # noqa: E402
from benchmarks.scale_lake import make_lake  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


class Scraper:
    """Reads Ray's Prometheus endpoint every few seconds while the job runs; keeps the memagent_* lines."""

    def __init__(self, port: int, out: str, every_s: float = 5.0):
        import threading

        self.url, self.out, self.every_s = f"http://127.0.0.1:{port}/metrics", Path(out), every_s
        self.samples: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import urllib.request

        while not self._stop.wait(self.every_s):
            try:
                text = urllib.request.urlopen(self.url, timeout=5).read().decode()
            except OSError as exc:
                self.samples.append(f"# {time.strftime('%H:%M:%S')} scrape failed: {exc}")
                continue
            lines = [ln for ln in text.splitlines() if "memagent_" in ln and not ln.startswith("#")]
            if lines:
                self.samples.append(f"# scraped {self.url} at {time.strftime('%H:%M:%S')}\n" + "\n".join(lines))
                self.out.write_text(self.samples[-1] + "\n")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self.samples:
            self.out.write_text("\n\n".join(self.samples[-3:]) + "\n")


def admission_for(mode: str) -> str:
    """``JobConfig.admission`` of a mode's base name."""
    return {"admission": "continuous", "barrier": "barrier"}[mode]


def mode_config(base: str, variants: list[str], lake: Path, out: Path, args: argparse.Namespace, agent: Any) -> Any:
    """The batch job's config of one mode (its base admission and its ``_lpt``/``_reserve`` suffixes)."""
    from memagent.engines import EngineConfig
    from pipelines.batch_qa import BatchQAConfig
    from pipelines.job import JobConfig

    reserve = "reserve" in variants
    return BatchQAConfig(input=str(lake), output=str(out), agent=agent, engine=EngineConfig(),
                         job=JobConfig(concurrency=args.actors, batch_size=args.batch_size, num_cpus=args.actor_cpus,
                                       max_in_flight=args.max_in_flight, progress=False,
                                       admission=admission_for(base),
                                       longest_first="lpt" in variants,
                                       long_document_tokens=args.long_tokens if reserve else None,
                                       long_document_in_flight=min(args.long_in_flight, args.max_in_flight),
                                       resources={"worker_node": 0.001} if args.pin_workers else {},
                                       ray_address=args.address))


def job_bounds(model: LatencyModel, table: list[dict], prefill: int, decode: int,
               args: argparse.Namespace) -> tuple[float, float, float, dict]:
    """The ideal wall, the critical path with and without speculation, and the longest document's row."""
    # The reference is the same with speculation or without: an always-full engine, not speculating.
    plain = replace(model, speculative_tokens=0, speculation_acceptance=None, speculation_steps=())
    full = replace(plain, max_seqs=min(model.max_seqs, args.max_in_flight))
    ideal = full.ideal_seconds(prefill, decode) / args.actors * model.time_scale
    longest = max(table, key=lambda r: r["context_tokens"] or 0)
    critical = sum(model.chain_seconds(s["prompt_tokens"], s["completion_tokens"]) for s in longest["steps"]) \
        * model.time_scale
    critical_plain = sum(plain.chain_seconds(s["prompt_tokens"], s["completion_tokens"])
                         for s in longest["steps"]) * model.time_scale
    return ideal, critical, critical_plain, longest


def longest_docs_seconds(table: list[dict]) -> dict[str, float]:
    """Seconds each of the five longest documents spent in its actor (its chain under load)."""
    return {f'{r["id"]} ({r["context_tokens"]:,} tokens, {r["n_chunks"]} chunks)': round(r["seconds"], 1)
            for r in sorted(table, key=lambda r: -(r["context_tokens"] or 0))[:5]}


def machine_figures(load0: list[float], cpu_busy: float, summary: Any) -> dict:
    """The load, CPU and event-loop figures of one mode's run."""
    return {
        "loadavg_start": load0, "loadavg_end": loadavg(),
        # The simulated GPUs sleep; everything else (Ray Data, the agents, tokenising) shares the
        # machine's cores. Near 1.0 the figures above measure this machine, not the schedule.
        "cpu_busy_fraction": round(cpu_busy, 3), "cores": psutil.cpu_count(),
        "loop_lag_mean_ms": round(summary.loop_lag_mean_s * 1e3, 1) if summary.loop_lag_mean_s is not None else None,
        "loop_lag_max_ms": round(summary.loop_lag_max_s * 1e3, 1) if summary.loop_lag_max_s is not None else None,
    }


def run_mode(mode: str, lake: Path, out: Path, args, model: LatencyModel, agent) -> dict:
    import pyarrow.dataset as pads

    from pipelines.admission import AdmissionPlan
    from pipelines.batch_qa import run_batch_qa

    base, *variants = mode.split("_")
    # The engine's queue: first come first served, by priority in the "_priority" variants.
    model = replace(model, priority_scheduling="priority" in variants, **speculation(variants, args))
    reserve = "reserve" in variants
    cfg = mode_config(base, variants, lake, out, args, agent)
    load0 = loadavg()
    cpu0 = psutil.cpu_times()
    t0 = time.perf_counter()
    plan = AdmissionPlan.for_job(cfg.job, cfg.engine)
    summary = run_batch_qa(cfg, build_engine=engine_builder(model_dict(model)))
    wall = time.perf_counter() - t0
    cpu_busy = cpu_busy_fraction(cpu0, psutil.cpu_times())
    table = pads.dataset(str(out), format="parquet").to_table(
        columns=["id", "error", "steps", "context_tokens", "n_chunks", "seconds", "node_id"]).to_pylist()
    assert len({r["id"] for r in table}) == len(table) == args.docs, (len(table), args.docs)
    prefill = sum(s["prompt_tokens"] for r in table for s in (r["steps"] or []))
    decode = sum(s["completion_tokens"] for r in table for s in (r["steps"] or []))
    ideal, critical, critical_plain, longest = job_bounds(model, table, prefill, decode, args)
    # The job's window: from the first document admitted to the last one done (the actors' gates);
    # planning, actor start (tokenizer load) and the last file's write are reported apart.
    job_wall = summary.reading_seconds or summary.seconds
    return {
        "mode": mode, "priority_scheduling": model.priority_scheduling, "longest_first": cfg.job.longest_first,
        "long_document_tokens": cfg.job.long_document_tokens,
        "long_document_in_flight": cfg.job.long_document_in_flight if reserve else None,
        "rows_per_call": plan.rows_per_call,
        "calls_per_actor": plan.calls,
        "max_in_flight": plan.max_in_flight, "occupancy": round(summary.occupancy or 0.0, 4),
        "actor_occupancy": {k: round(v, 4) for k, v in summary.actor_occupancy.items()},
        "actor_windows_s": summary.actor_windows, "tasks_in_flight_per_actor": plan.tasks_in_flight,
        "peak_in_flight": summary.peak_in_flight,
        "wall_s": round(job_wall, 2), "ideal_s": round(ideal, 2), "wall_vs_ideal": round(job_wall / ideal, 4),
        "critical_path_s": round(critical, 2), "longest_doc_tokens": longest["context_tokens"],
        "critical_path_no_speculation_s": round(critical_plain, 2),
        "speculation": speculation_report(model, table),
        "longest_docs_s": longest_docs_seconds(table),
        "bound_s": round(max(ideal, critical), 2), "wall_vs_bound": round(job_wall / max(ideal, critical), 4),
        "docs_per_s": round(args.docs / job_wall, 3), "rows_out": summary.rows_out, "error_rows": summary.error_rows,
        "prefill_tokens": prefill, "decode_tokens": decode, "nodes": len({r["node_id"] for r in table}),
        "files_written": len(list(out.glob("*.parquet"))), "run_batch_qa_s": round(wall, 2),
        "job_seconds": round(summary.seconds, 2), "summary": summary.lines(),
        **machine_figures(load0, cpu_busy, summary),
    }


def speculation(variants: list[str], args) -> dict:
    """LatencyModel speculation fields of a mode's ``spec[VALUE]`` suffix (none: not speculating)."""
    spec = next((v[4:] for v in variants if v.startswith("spec")), None)
    if spec is None:
        return {}
    value = spec or args.speculate_acceptance
    fields = {"speculative_tokens": args.speculative_tokens}
    if value == "measured":
        if args.measured is None:
            raise SystemExit("a measured _spec mode needs --speculation-results")
        return {**fields, "speculation_steps": tuple(map(tuple, args.measured["steps"]))}
    return {**fields, "speculation_acceptance": float(value)}


def speculation_report(model: LatencyModel, table: list[dict]) -> dict | None:
    """The setting, its expected per-step means, and what the traces recorded (when they carry the counts)."""
    if not model.speculating:
        return None
    drafted, accepted = Acceptance(model).means()
    steps = [s for r in table for s in (r["steps"] or [])]
    out = {"speculative_tokens": model.speculative_tokens,
           "acceptance": "measured" if model.speculation_steps else model.speculation_acceptance,
           "expected_drafted_per_step": round(drafted, 3), "expected_accepted_per_step": round(accepted, 3),
           "expected_acceptance_rate": round(accepted / drafted, 4) if drafted else None}
    if steps and "draft_tokens" in steps[0]:
        d, a = sum(s["draft_tokens"] or 0 for s in steps), sum(s["accepted_tokens"] or 0 for s in steps)
        out.update(trace_draft_tokens=d, trace_accepted_tokens=a, trace_acceptance_rate=round(a / d, 4) if d else None)
    return out


def cpu_busy_fraction(before, after) -> float:
    """Share of all cores' time spent not idle between two ``psutil.cpu_times()``."""
    idle = lambda t: t.idle + getattr(t, "iowait", 0.0)  # noqa: E731
    total = sum(after) - sum(before)
    return 1.0 - (idle(after) - idle(before)) / total if total > 0 else 0.0


def run_hf(args) -> dict:
    """The real hf engine (packaged model, CPU): short and long documents, admission on vs off, one run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memagent.config import AgentConfig
    from memagent.data.demo import niah_row
    from memagent.engines import EngineConfig
    from pipelines.batch_qa import BatchQAConfig, run_batch_qa
    from pipelines.job import JobConfig

    short, long_ = args.hf_short_tokens, args.hf_short_tokens * 8
    rows = [niah_row(i, short, 0.5, args.seed) for i in range(28)] + \
        [niah_row(28 + i, long_, 0.5, args.seed) for i in range(4)]
    random.Random(args.seed).shuffle(rows)
    rows = [{"id": f"hf-{i:02d}", "question": r["question"], "context": r["context"], "answers": r["answers"]}
            for i, r in enumerate(rows)]
    work = Path(args.keep or tempfile.mkdtemp(prefix="scale-hf-"))
    (work / "lake").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), work / "lake" / "part-0.parquet")
    agent = AgentConfig(chunk_tokens=args.hf_chunk_tokens, memory_tokens=32, answer_tokens=16, query_tokens=64)
    out = {"docs": {"short": 28, "long": 4, "short_tokens": short, "long_tokens": long_},
           "order": [r["id"] for r in rows], "agent": agent.model_dump(mode="json")}
    for mode in ("admission", "barrier"):
        cfg = BatchQAConfig(input=str(work / "lake"), output=str(work / f"out-{mode}"), agent=agent,
                            engine=EngineConfig(), job=JobConfig(concurrency=1, batch_size=16, torch_threads=1,
                                                                 progress=False, admission=admission_for(mode)))
        load0 = loadavg()
        summary = run_batch_qa(cfg)
        out[mode] = {"wall_s": round(summary.seconds, 2), "reading_s": round(summary.reading_seconds or 0, 2),
                     "occupancy": round(summary.occupancy or 0, 4), "rows_out": summary.rows_out,
                     "error_rows": summary.error_rows, "accuracy": summary.accuracy, "loadavg_start": load0,
                     "loadavg_end": loadavg(), "summary": summary.lines()}
        print(mode, out[mode], flush=True)
    out["speedup_reading"] = round(out["barrier"]["reading_s"] / out["admission"]["reading_s"], 3)
    out["speedup_wall"] = round(out["barrier"]["wall_s"] / out["admission"]["wall_s"], 3)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return out


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    from memagent.engines import EngineConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--actors", type=int, default=8)
    parser.add_argument("--max-in-flight", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16, help="rows per output file")
    parser.add_argument("--modes", default="admission,barrier")
    parser.add_argument("--time-scale", type=float, default=1.0, help="sleep this fraction of each modelled step")
    parser.add_argument("--fact-every", type=int, default=1500, help="one digit sentence in N (memory growth)")
    parser.add_argument("--chunk-tokens", type=int, default=5000)
    parser.add_argument("--memory-tokens", type=int, default=256)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--long-tokens", type=int, default=256_000, help="_reserve modes: --long-document-tokens")
    parser.add_argument("--long-in-flight", type=int, default=4, help="_reserve modes: --long-document-in-flight")
    parser.add_argument("--actor-cpus", type=float, default=0.25)
    parser.add_argument("--node-cpus", type=int, default=4, help="logical CPUs per node (--cluster: each node)")
    parser.add_argument("--cluster", action="store_true", help="2-node loopback cluster (infra/ray_cluster.py)")
    parser.add_argument("--metrics-port", type=int, default=None, help="Ray metrics export port (curl it)")
    parser.add_argument("--scrape-out", default=None, help="save the memagent_* lines of the metrics endpoint here")
    parser.add_argument("--hf", action="store_true", help="only the real-hf comparison (28 short + 4 long docs)")
    parser.add_argument("--chain-others", default=None,
                        help="only the chain isolation: the longest document with K others reading, e.g. 0,3,15")
    parser.add_argument("--hf-short-tokens", type=int, default=1000)
    parser.add_argument("--hf-chunk-tokens", type=int, default=1024)
    parser.add_argument("--keep", default=None, help="work directory to keep (default: a temp dir, removed)")
    parser.add_argument("--speculate-acceptance", default="measured",
                        help="_spec modes: 'measured' (--speculation-results) or a mean acceptance rate, e.g. 0.5")
    parser.add_argument("--speculative-tokens", type=int, default=EngineConfig().speculative_tokens,
                        help="_spec modes: most tokens drafted per sequence and step")
    parser.add_argument("--speculation-results", default=None, help="_spec modes at 'measured': a results file "
                        "with per-step drafted/accepted counts (default: benchmarks/results/speculation.json, "
                        "else speculation_provisional.json)")
    return parser.parse_args()


def add_run_settings(args: argparse.Namespace) -> None:
    """Fill in the defaults found at run time: the speculation results file, its acceptance, no Ray address."""
    results = REPO / "benchmarks" / "results"
    if args.speculation_results is None:  # the single-document speculation benchmark's, when it is there
        args.speculation_results = next((str(results / f) for f in ("speculation.json", "speculation_provisional.json")
                                         if (results / f).exists()), None)
    args.measured = load_acceptance(args.speculation_results) if "_spec" in args.modes and args.speculation_results \
        else None
    args.address, args.pin_workers = None, False


def children_peak_rss_mb() -> float:
    """Peak RSS of the largest child process (Ray's workers), in MB."""
    return round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)


def hf_only(args: argparse.Namespace) -> None:
    """The real-hf comparison alone (--hf), on a local two-CPU Ray; writes --out."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = run_hf(args)
    finally:
        ray.shutdown()
    write_json(args.out, {"benchmark": "scale_hf", **result, "peak_rss_mb_children": children_peak_rss_mb()})


def chain_only(args: argparse.Namespace, work: Path, lake: dict, model: LatencyModel, agent: Any) -> None:
    """The chain isolation alone (--chain-others); writes --out and removes the work directory unless --keep."""
    chains = run_chain(work / "lake", args, model, agent)
    write_json(args.out, {"benchmark": "scale_chain", "lake": lake, "time_scale": args.time_scale,
                          "latency_model": model_dict(model), "chain": chains, "loadavg_end": loadavg()})
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


def start_ray(args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
    """``ray.init`` on the 2-node loopback cluster (--cluster; ``stack`` stops it) or on a local Ray."""
    import ray

    if args.cluster:
        from infra.ray_cluster import local_cluster

        # --node-cpus logical CPUs a node (4: 8 actors of --actor-cpus 0.75 fit 5 to a node, so they spread).
        args.address = stack.enter_context(local_cluster(workers=1, head_cpus=args.node_cpus,
                                                         worker_cpus=args.node_cpus))
        ray.init(address=args.address, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}}, log_to_driver=False)
        return
    kw = {"_metrics_export_port": args.metrics_port} if args.metrics_port else {}
    # The metrics endpoint needs Ray's dashboard agent (ray[default]'s packages).
    for attempt in range(3):  # Ray gives its raylet 30 s to register: not always enough on a loaded machine
        try:
            ray.init(address="local", num_cpus=args.node_cpus, include_dashboard=bool(args.metrics_port),
                     log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}}, **kw)
            break
        except Exception as exc:  # noqa: BLE001 - ray raises a bare Exception here
            print(f"ray.init failed ({exc}); retrying", flush=True)
            ray.shutdown()
            if attempt == 2:
                raise


def run_modes(args: argparse.Namespace, work: Path, model: LatencyModel, agent: Any) -> dict[str, dict]:
    """Every --modes job over the lake, each into a fresh output; then Ray and the work directory are cleaned up."""
    import ray

    stack = contextlib.ExitStack()
    start_ray(args, stack)
    results = {}
    scraper = Scraper(args.metrics_port, args.scrape_out) if args.metrics_port and args.scrape_out else None
    try:
        for mode in args.modes.split(","):
            print(f"mode {mode} ...", flush=True)
            shutil.rmtree(work / f"out-{mode}", ignore_errors=True)  # a fresh output: no resume across runs
            results[mode] = run_mode(mode, work / "lake", work / f"out-{mode}", args, model, agent)
            print({k: v for k, v in results[mode].items() if k != "actor_occupancy"}, flush=True)
    finally:
        if scraper:
            scraper.stop()
        ray.shutdown()
        stack.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return results


def write_results(args: argparse.Namespace, lake: dict, results: dict[str, dict], model: LatencyModel,
                  agent: Any) -> None:
    """Write --out (headline figures from the admission mode, else the first) and print the modes' table."""
    head = results.get("admission") or next(iter(results.values()))
    data = {
        "benchmark": "scale", "occupancy": head["occupancy"], "wall_vs_ideal": head["wall_vs_ideal"],
        "docs_per_s": head["docs_per_s"], "targets": {"occupancy": ">= 0.9", "wall_vs_ideal": "<= 1.15"},
        "cluster": "2-node loopback (infra/ray_cluster.py)" if args.cluster else "local Ray",
        "lake": lake, "modes": results,
        "settings": {"actors": args.actors, "max_in_flight": args.max_in_flight, "batch_size": args.batch_size,
                     "time_scale": args.time_scale, "agent": agent.model_dump(mode="json"),
                     "latency_model": model_dict(model), "actor_cpus": args.actor_cpus,
                     "speculation_measured": {k: v for k, v in (args.measured or {}).items() if k != "steps"} or None},
        "peak_rss_mb_driver": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_rss_mb_children": children_peak_rss_mb(),
    }
    write_json(args.out, data)
    print_table(["mode", "occupancy", "wall_vs_ideal", "wall_vs_bound", "docs/s", "wall s", "ideal s", "critical s"],
                [[m, r["occupancy"], r["wall_vs_ideal"], r["wall_vs_bound"], r["docs_per_s"], r["wall_s"], r["ideal_s"],
                  r["critical_path_s"]] for m, r in results.items()])


def main() -> None:
    args = parse_args()
    add_run_settings(args)

    from memagent.config import AgentConfig
    from memagent.models import load_tokenizer

    if args.hf:
        hf_only(args)
        return
    agent = AgentConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens, answer_tokens=32,
                        query_tokens=128)
    work = Path(args.keep or tempfile.mkdtemp(prefix="scale-"))
    t0 = time.perf_counter()
    lake = make_lake(work / "lake", args.docs, args.seed, args.fact_every, args.files, load_tokenizer("smollm2-135m"))
    lake["generate_s"] = round(time.perf_counter() - t0, 2)
    model = LatencyModel(time_scale=args.time_scale, chars_per_token=lake["chars_per_token"])
    print(f"lake: {args.docs} docs, {lake['tokens_total']} tokens (max {lake['tokens_max']}) in {lake['generate_s']} s",
          flush=True)
    if args.chain_others:
        chain_only(args, work, lake, model, agent)
        return
    results = run_modes(args, work, model, agent)
    write_results(args, lake, results, model, agent)


if __name__ == "__main__":
    main()
