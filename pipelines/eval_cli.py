"""``memagent eval``: the evaluation matrix (tasks × lengths × methods) from the command line."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from memagent.cli import add_agent_options, add_engine_options, agent_config_from_args, engine_config_from_args


def _csv(kind: type = str):
    def parse(text: str) -> list:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("expected a comma-separated list")
        try:
            return [kind(_tokens(t)) if kind is int else kind(t) for t in items]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _tokens(text: str) -> int:
    """'4K' -> 4096, '64k' -> 65536, '3000' -> 3000."""
    t = text.strip().upper()
    return int(t[:-1]) * 1024 if t.endswith("K") else int(t)


def cmd_eval(args: argparse.Namespace) -> int:
    from pipelines.cli import local_ray_on_loopback

    local_ray_on_loopback(args)
    from pipelines.evaluate import EvalConfig, run_evaluation

    cfg = EvalConfig(
        out=args.out, tasks=args.tasks or [], lengths=args.lengths or [], samples=args.samples, items=args.items,
        methods=args.methods, haystack=args.haystack, squad=args.squad, hotpotqa=args.hotpotqa, seed=args.seed,
        engine=engine_config_from_args(args), agent=agent_config_from_args(args), concurrency=args.concurrency,
        batch_size=args.batch_size, num_gpus=args.num_gpus, ray_address=args.ray_address,
        progress=not args.no_progress, no_progress_timeout_s=args.no_progress_timeout,
        torch_threads=args.torch_threads,
    )
    summary = run_evaluation(cfg)
    with open(summary.results_md) as f:
        print(f.read())
    print(json.dumps(asdict(summary), indent=2))
    return 0


def add_eval_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="accuracy over tasks × lengths for the memory agent and the full-context baseline")
    p.add_argument("--tasks", type=_csv(), help="RULER tasks, e.g. niah_single_1,niah_single_2,hotpotqa,vt")
    p.add_argument("--lengths", type=_csv(int), help="item lengths in tokens, e.g. 4K,8K,16K,32K,64K")
    p.add_argument("--samples", type=int, default=4, help="items per (task, length) (default 4)")
    p.add_argument("--items", help="evaluate this Parquet item set (RULER schema) instead of generating one")
    p.add_argument("--methods", type=_csv(), default=["memagent", "full-context"],
                   help="memagent,full-context (default both)")
    p.add_argument("--out", default="runs/eval", help="run directory (items, predictions/, results, plots)")
    p.add_argument("--haystack", help="essay text for the essay NIAH tasks (e.g. ../shared/data/pg_essays.txt)")
    p.add_argument("--squad", help="SQuAD JSON for qa_1")
    p.add_argument("--hotpotqa", help="HotpotQA JSON for qa_2 (e.g. ../shared/data/hotpotqa_sample.json)")
    p.add_argument("--seed", type=int, default=42)
    add_agent_options(p)
    add_engine_options(p)
    g = p.add_argument_group("job")
    g.add_argument("--concurrency", type=int, default=1, help="actors, each with one engine")
    g.add_argument("--batch-size", type=int, default=16, help="items one actor reads concurrently")
    g.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per actor")
    g.add_argument("--torch-threads", type=int, help="torch threads per actor (default: node cores / concurrency)")
    g.add_argument("--ray-address", help="Ray cluster address (default: local Ray)")
    g.add_argument("--no-progress", action="store_true", help="no progress bars")
    g.add_argument("--no-progress-timeout", type=float, default=6 * 3600, metavar="SECONDS",
                   help="fail a job after this long without a finished batch (default 6 h; -1: never)")
    p.set_defaults(func=cmd_eval)
