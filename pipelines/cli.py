"""``memagent batch`` and ``memagent demo``: the Ray Data jobs from the command line.

Registered on the ``memagent`` command through the ``memagent.commands`` entry point.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from memagent.cli import add_agent_options, add_engine_options, agent_config_from_args, engine_config_from_args


def _batch_config(args: argparse.Namespace, **extra):
    from pipelines.batch_qa import BatchQAConfig
    from pipelines.storage import S3Options

    agent = agent_config_from_args(args)
    if getattr(args, "instruction", None) or getattr(args, "answer_format", None):
        agent = agent.with_overrides(instruction=args.instruction,
                                     answer_style="json" if args.answer_format == "json" else None)
    return BatchQAConfig(
        input=args.input if "input" not in extra else extra.pop("input"),
        output=args.output if "output" not in extra else extra.pop("output"),
        s3=S3Options(endpoint_url=args.s3_endpoint, region=args.s3_region),
        engine=engine_config_from_args(args),
        agent=agent,
        concurrency=args.concurrency,
        batch_size=args.batch_size,
        num_gpus=args.num_gpus,
        num_cpus=args.num_cpus,
        torch_threads=args.torch_threads,
        ray_address=args.ray_address,
        resources=parse_resources(args.resource),
        progress=not args.no_progress,
        no_progress_timeout_s=args.no_progress_timeout,
        **extra,
    )


def parse_resources(items: list[str]) -> dict[str, float]:
    """``["gpu_worker=1"]`` -> ``{"gpu_worker": 1.0}``; malformed items are an error."""
    out = {}
    for item in items:
        name, sep, amount = item.partition("=")
        try:
            value = float(amount) if sep and name.strip() else None
        except ValueError:
            value = None
        if value is None:
            raise ValueError(f"--resource {item!r}: expected NAME=AMOUNT, e.g. gpu_worker=1")
        out[name.strip()] = value
    return out


def _add_job_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("job")
    g.add_argument("--s3-endpoint", help="S3 endpoint URL (default: AWS or $AWS_ENDPOINT_URL)")
    g.add_argument("--s3-region", help="S3 region (default: $AWS_REGION or us-east-1)")
    g.add_argument("--concurrency", type=int, default=1, help="actors, each with one engine")
    g.add_argument("--batch-size", type=int, default=16, help="rows per batch (read concurrently by one actor)")
    g.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per actor (0 on CPU)")
    g.add_argument("--num-cpus", type=float, default=1.0, help="CPUs reserved per actor")
    g.add_argument("--torch-threads", type=int, help="torch threads per actor (default: node cores / concurrency; "
                   "1 when other jobs share the cores)")
    g.add_argument("--resource", action="append", default=[], metavar="NAME=AMOUNT",
                   help="custom Ray resource per actor, e.g. gpu_worker=1 (repeatable)")
    g.add_argument("--ray-address", help="Ray cluster address (default: local Ray)")
    g.add_argument("--no-progress", action="store_true", help="no progress bars (CI logs)")
    g.add_argument("--no-progress-timeout", type=float, default=3600, metavar="SECONDS",
                   help="fail after this long without a finished batch (default 1 h; long documents on CPU "
                        "may need more; -1: never)")


def local_ray_on_loopback(args: argparse.Namespace) -> None:
    """A local Ray instance binds to 127.0.0.1 (must be set before ray is imported)."""
    if not args.ray_address:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def cmd_batch(args: argparse.Namespace) -> int:
    local_ray_on_loopback(args)
    from pipelines.batch_qa import run_batch_qa

    cfg = _batch_config(args, question=args.question, metric=args.metric, method=args.method)
    summary = run_batch_qa(cfg)
    print("\n".join(summary.lines()))
    return 0


def print_table(output: str, title: str) -> None:
    """The per-row table of a demo output directory."""
    import pyarrow.dataset as pads
    from rich.console import Console
    from rich.table import Table

    rows = pads.dataset(output, format="parquet", exclude_invalid_files=True).to_table(
        columns=["id", "context_tokens", "n_chunks", "answers", "prediction", "score", "seconds", "error"]
    ).sort_by("id").to_pylist()
    table = Table(title=title)
    for col in ("id", "tokens", "chunks", "expected", "predicted", "correct", "seconds"):
        table.add_column(col, overflow="fold")
    for r in rows:
        predicted = r["prediction"] if r["error"] is None else f"ERROR: {r['error']}"
        table.add_row(r["id"], str(r["context_tokens"]), str(r["n_chunks"]), ", ".join(r["answers"] or []),
                      (predicted or "")[:60], "yes" if r["score"] else "no", f"{r['seconds'] or 0:.1f}")
    Console(width=140).print(table)
    correct = sum(1 for r in rows if r["score"])
    print(f"{correct}/{len(rows)} correct (sub_em)")


def cmd_demo(args: argparse.Namespace) -> int:
    local_ray_on_loopback(args)
    from memagent.data.demo import write_demo_corpus
    from pipelines.batch_qa import run_batch_qa

    run_dir = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    lengths = tuple(int(x) for x in args.lengths.split(","))
    _, n_rows = write_demo_corpus(run_dir / "input", args.model, lengths, args.qa_items)
    cfg = _batch_config(args, input=str(run_dir / "input"), output=str(run_dir / "output"))
    a = cfg.agent
    print(f"demo: {n_rows} generated documents -> {run_dir}/output")
    print(f"model {cfg.engine.model} ({cfg.engine.engine}), preset {args.preset}: chunk {a.chunk_tokens}, "
          f"memory {a.memory_tokens}, answer {a.answer_tokens} tokens; {cfg.concurrency} actor(s), "
          f"batch size {cfg.batch_size}")
    summary = run_batch_qa(cfg)
    print_table(str(run_dir / "output"), title=f"MemAgent demo ({cfg.engine.model}, preset {args.preset})")
    print("\n".join(summary.lines()))
    print(f"traces (steps column, char spans into the input context): {run_dir / 'output'}")
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    batch = sub.add_parser("batch", help="batch QA / extraction over a Parquet dataset (Ray Data)")
    batch.add_argument("--input", required=True, help="Parquet file/dir, local or s3://")
    batch.add_argument("--output", required=True, help="output dir, local or s3:// (reruns resume)")
    batch.add_argument("--question", help="job-level question for inputs without a question column")
    batch.add_argument("--instruction", help="task instruction added to every prompt (extraction jobs)")
    batch.add_argument("--answer-format", choices=["text", "json"], default=None,
                       help="json: ask for JSON and store the parsed value")
    batch.add_argument("--metric", default="sub_em", choices=["sub_em", "em", "f1", "string_match_all", "boxed_em"])
    batch.add_argument("--method", default="memagent", choices=["memagent", "full-context"],
                       help="memagent (chunk by chunk) or full-context (baseline: one prompt, middle dropped to fit)")
    add_agent_options(batch)
    add_engine_options(batch)
    _add_job_options(batch)
    batch.set_defaults(func=cmd_batch)

    demo = sub.add_parser("demo", help="generate a small corpus and run batch QA on it with the packaged model")
    demo.add_argument("--out", default="runs/demo", help="where the corpus and results go")
    demo.add_argument("--lengths", default="1000,2500,5000", help="needle-in-a-haystack lengths in tokens")
    demo.add_argument("--qa-items", type=int, default=3, help="multi-document QA items")
    add_agent_options(demo)
    add_engine_options(demo)
    _add_job_options(demo)
    demo.set_defaults(func=cmd_demo, no_progress=not sys.stderr.isatty())
    logging.getLogger("ray").setLevel(logging.WARNING)

    from pipelines.eval_cli import add_eval_command

    add_eval_command(sub)
