"""``memagent run-batch``: an OpenAI Batch API request file answered without a server (like ``vllm run-batch``)."""

from __future__ import annotations

import argparse
import sys

from memagent_cli.flags import add_model_flags, build
from memagent_cli.options import (
    add_agent_flags, add_engine_flags, add_s3_flags, agent_config, engine_config, s3_options,
)


def batch_run_config(args: argparse.Namespace, engine_model: str | None = None):
    """The BatchRunConfig of the batch, engine, agent and S3 flags."""
    from pipelines.openai_batch import BatchRunConfig

    values = {**args._run_flags.values(args), "engine": engine_config(args, drop=("served_model",)),
              "agent": agent_config(args), "s3": s3_options(args), "engine_model": engine_model}
    return build(BatchRunConfig, values, "run-batch options")


def cmd_run_batch(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from pipelines import storage
    from pipelines.openai_batch import Store, duplicate_ids, jsonl, run_requests

    cfg = batch_run_config(args, engine_model=args.served_model)
    in_fs, in_path = storage.filesystem(args.input, cfg.s3)
    with in_fs.open_input_stream(in_path) as f:
        data = f.read()
    if duplicates := duplicate_ids(data):  # the file fails validation, as OpenAI's Batch API fails it
        for error in duplicates:
            print(f"error: {args.input}: {error['message']}", file=sys.stderr)
        return 2
    # State beside the output: a rerun with the same -o answers only the lines not answered yet.
    work = Store(args.output.rstrip("/") + ".work", cfg.s3)
    bar = tqdm(total=None, unit="line", desc="run-batch", disable=args.quiet or None, file=sys.stderr)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    try:
        out, err = run_requests(data, work, "run", cfg, progress=progress)
    finally:
        bar.close()
    out_fs, out_path = storage.filesystem(args.output, cfg.s3)

    def write(target: str) -> None:
        with out_fs.open_output_stream(target) as f:
            f.write(jsonl(out + err))

    storage.atomic_put(out_fs, out_path, write, "run-batch")
    print(f"{len(out)} line(s) answered, {len(err)} error line(s) -> {args.output} (state: {work.root})",
          file=sys.stderr)
    return 0


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    rb = sub.add_parser("run-batch", parents=[common],
                        help="answer an OpenAI Batch API request file (JSONL) as `memagent serve` answers each "
                        "request, no server")
    rb.add_argument("-i", "--input", required=True, help="request file: JSONL of custom_id, method, url, body "
                    "(local or s3://)")
    rb.add_argument("-o", "--output", required=True, help="results JSONL (local or s3://): output lines then error "
                    "lines; state goes to OUTPUT.work, and a rerun resumes from it")
    rb.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    from pipelines.openai_batch import BatchRunConfig

    rb.set_defaults(_run_flags=add_model_flags(rb, BatchRunConfig, "batch lines", exclude=("engine_model",)))
    add_agent_flags(rb)
    add_engine_flags(rb)
    add_s3_flags(rb)
    rb.set_defaults(func=cmd_run_batch, progress=False)
