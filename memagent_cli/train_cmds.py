"""``memagent train`` (Multi-Conv DAPO on DeepSpeed) and ``memagent export`` (an HF directory).

Also the module the DeepSpeed launcher runs on every rank:
``deepspeed --no_local_rank --num_gpus 8 --module memagent_cli train ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from memagent.engines import DEFAULT_MODEL
from memagent_cli.flags import add_model_flags, build
from memagent_cli.options import add_agent_flags, agent_config


def train_configs(args: argparse.Namespace) -> tuple[Any, Any]:
    """(TrainConfig, AgentConfig): ``--config`` JSON first, the flags over it."""
    from memagent.rl.config import TrainConfig

    fields: dict[str, Any] = json.loads(Path(args.config).read_text()) if args.config else {}
    fields.update(args._train_flags.values(args))
    return build(TrainConfig, fields, "training options"), agent_config(args)


def cmd_train(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from pipelines.train_job import TrainJob, run_training

    config, agent = train_configs(args)
    print(f"agent budgets: chunk {agent.chunk_tokens}, memory {agent.memory_tokens}, answer {agent.answer_tokens}",
          file=sys.stderr)
    rank = int(os.environ.get("RANK", "0"))  # under torchrun/deepspeed only rank 0 reports
    bar = tqdm(total=config.steps, desc="train", unit="step", dynamic_ncols=True, disable=rank != 0)

    def on_step(rec: dict[str, Any]) -> None:
        if bar.n == 0 and rec["step"]:
            bar.n = rec["step"]  # resumed run
        bar.update(1)
        # reward/acc of everything generated; "trained" differs only under dynamic sampling
        bar.set_postfix(reward=f"{rec['reward_generated_mean']:.3f}", acc=f"{rec['accuracy_generated']:.3f}",
                        trained=f"{rec['reward_mean']:.3f}", kl=f"{rec['kl']:.2e}", s=f"{rec['step_s']:.1f}")

    job = build(TrainJob, args._train_job_flags.values(args), "scaling options")
    try:
        run_training(job, config=config, agent_config=agent, data=args.data, out_dir=args.out, model=args.model,
                     resume=args.resume, force=args.force, on_step=on_step)
    finally:
        bar.close()
    if rank == 0:
        print(f"done: metrics in {Path(args.out) / 'metrics.jsonl'}, checkpoints in {Path(args.out) / 'checkpoints'}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from memagent.rl.checkpoint import export_checkpoint

    print(f"exported HF model to {export_checkpoint(args.checkpoint, args.out)}")
    return 0


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from memagent.rl.config import TrainConfig
    from pipelines.train_job import TrainJob

    p = sub.add_parser(
        "train", parents=[common],
        help="Multi-Conv DAPO training of the memory policy (DeepSpeed; CPU or GPUs)",
        description="Roll out G trajectories per question with the memory agent, reward the final "
        "\\boxed{} answer, and update the policy with a clipped token-mean loss through DeepSpeed.",
    )
    g = p.add_argument_group("data and model")
    g.add_argument("--data", required=True, help="training Parquet/JSONL (local path or s3:// URI): id, question, "
                   "context, answers")
    g.add_argument("--out", required=True, help="run directory (metrics.jsonl, checkpoints/, HF exports)")
    g.add_argument("--model", default=DEFAULT_MODEL, help=f"base model name or local path (default {DEFAULT_MODEL})")
    g.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    g.add_argument("--config", type=Path, help="JSON file of training fields; the flags override it")
    g.add_argument("--force", action="store_true", help="start even when the step's estimated peak memory "
                   "exceeds what the machine has free")
    p.set_defaults(func=cmd_train, _train_flags=add_model_flags(p, TrainConfig, "training"),
                   _train_job_flags=add_model_flags(p, TrainJob, "scaling (more than one worker: Ray Train)"),
                   starts_ray=True)
    # Rollouts sample with the training temperature/top_p; the agent contributes its budgets.
    add_agent_flags(p, exclude=("temperature", "top_p"))

    e = sub.add_parser("export", parents=[common], help="write an HF model directory from a training checkpoint")
    e.add_argument("--checkpoint", required=True, help="run dir, its checkpoints/ dir, or one checkpoints/step_N dir")
    e.add_argument("--out", required=True, help="output HF directory (safetensors + config + tokenizer)")
    e.set_defaults(func=cmd_export)
