"""The Ray Data jobs: ``memagent batch``, ``memagent demo``, ``memagent eval`` and ``memagent report``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from memagent_cli.flags import add_model_flags, build
from memagent_cli.options import (
    add_agent_flags, add_document_limits_flags, add_engine_flags, add_job_flags, add_s3_flags, agent_config,
    document_limits, engine_config, job_config, s3_options,
)


def batch_config(args: argparse.Namespace, **fields):
    """The BatchQAConfig of the flags (``fields`` fill in what a command decides itself)."""
    from pipelines.batch_qa import BatchQAConfig

    values = {**args._batch_flags.values(args), **fields} if hasattr(args, "_batch_flags") else dict(fields)
    return build(BatchQAConfig, {**values, "s3": s3_options(args), "engine": engine_config(args),
                                 "agent": agent_config(args), "job": job_config(args),
                                 "document_limits": document_limits(args)}, "batch options")


def cmd_batch(args: argparse.Namespace) -> int:
    from pipelines.batch_qa import run_batch_qa

    cfg = batch_config(args)
    schema = cfg.agent.extraction
    if schema is not None and len(schema.field_groups(cfg.agent.answer_tokens)) > 1:  # a wide schema: how it reads
        print(schema.grouping(cfg.agent.answer_tokens), file=sys.stderr)
    summary = run_batch_qa(cfg)
    print("\n".join(summary.lines()))
    if summary.infra_errors:  # not done: the output is incomplete until a rerun redoes them
        print(f"error: {summary.infra_errors} row(s) failed on the infrastructure (endpoint or engine); run the same "
              "command again to redo them", file=sys.stderr)
        return 1
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
    from memagent.data.demo import DemoCorpus, write_demo_corpus
    from pipelines.batch_qa import run_batch_qa
    from pipelines.report import build_report

    corpus = build(DemoCorpus, args._demo_flags.values(args), "demo options")
    run_dir = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    cfg = batch_config(args, input=str(run_dir / "input"), output=str(run_dir / "output"))
    _, n_rows = write_demo_corpus(run_dir / "input", cfg.engine.model, tuple(corpus.lengths), corpus.qa_items,
                                  corpus.seed)
    a = cfg.agent
    print(f"demo: {n_rows} generated documents -> {run_dir}/output")
    print(f"model {cfg.engine.model} ({cfg.engine.engine}), preset {a.preset}: chunk {a.chunk_tokens}, "
          f"memory {a.memory_tokens}, answer {a.answer_tokens} tokens; {cfg.job.concurrency} actor(s), "
          f"batch size {cfg.job.batch_size}")
    summary = run_batch_qa(cfg)
    print_table(cfg.output, title=f"MemAgent demo ({cfg.engine.model}, preset {a.preset})")
    print("\n".join(summary.lines()))
    print(f"traces (steps column, char spans into the input context): {cfg.output}")
    print(f"report: {build_report(cfg.output, None, cfg.s3, job_summary=vars(summary))}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from memagent.data.ruler import RulerItems
    from pipelines.evaluate import EvalConfig, run_evaluation

    items = build(RulerItems, args._items_flags.values(args), "item options")
    cfg = build(EvalConfig, {**args._eval_flags.values(args), "items": items, "engine": engine_config(args),
                             "agent": agent_config(args), "job": job_config(args)}, "eval options")
    summary = run_evaluation(cfg)
    print(Path(summary.results_md).read_text())
    print(json.dumps(asdict(summary), indent=2))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from pipelines.report import build_report

    print(build_report(args.run, args.out, s3_options(args)))
    return 0


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from memagent.data.demo import DemoCorpus
    from memagent.data.ruler import RulerItems
    from pipelines.batch_qa import BatchQAConfig
    from pipelines.evaluate import EvalConfig

    batch = sub.add_parser("batch", parents=[common],
                           help="batch QA / extraction over a Parquet dataset or a folder of documents (Ray Data)")
    batch.set_defaults(func=cmd_batch, _batch_flags=add_model_flags(batch, BatchQAConfig, "input and output",
                                                                    required=("input", "output")))
    add_agent_flags(batch, schema=True)
    add_engine_flags(batch)
    add_job_flags(batch)
    add_s3_flags(batch)
    add_document_limits_flags(batch)

    demo = sub.add_parser("demo", parents=[common],
                          help="generate a small corpus and run batch QA on it with the packaged model")
    demo.add_argument("--out", default="runs/demo", help="where the corpus and results go (default runs/demo)")
    demo.set_defaults(func=cmd_demo, _demo_flags=add_model_flags(demo, DemoCorpus, "demo corpus"))
    add_agent_flags(demo)
    add_engine_flags(demo)
    add_job_flags(demo)
    add_s3_flags(demo)
    if not sys.stderr.isatty():
        demo.set_defaults(progress=False)

    ev = sub.add_parser("eval", parents=[common],
                        help="accuracy over tasks × lengths for the memory agent and the full-context baseline")
    ev.set_defaults(func=cmd_eval, _eval_flags=add_model_flags(ev, EvalConfig, "evaluation"),
                    _items_flags=add_model_flags(ev, RulerItems, "items"))
    add_agent_flags(ev)
    add_engine_flags(ev)
    add_job_flags(ev)

    rep = sub.add_parser("report", parents=[common],
                         help="a self-contained HTML report of a batch or eval output (memory timelines per row)")
    rep.add_argument("--run", required=True, help="batch output dir or eval run dir (local or s3://)")
    rep.add_argument("--out", help="HTML file to write (default: RUN/report.html for local runs)")
    rep.set_defaults(func=cmd_report)
    add_s3_flags(rep)
