"""``memagent train`` and ``memagent export``: argparse wiring and handlers.

Wire into the main CLI with ``add_train_commands(subparsers)``; each sub-command sets
``func`` (``args.func(args)`` returns the exit code). Also runnable on its own, e.g. under
the DeepSpeed launcher: ``deepspeed --num_gpus 8 --module memagent.rl.cli_commands train ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def add_train_commands(subparsers: Any) -> None:
    """Add ``train`` and ``export`` to an ``argparse`` sub-parsers object."""
    p = subparsers.add_parser(
        "train",
        help="Multi-Conv DAPO training of the memory policy (DeepSpeed; CPU or GPUs)",
        description="Roll out G trajectories per question with the memory agent, reward the final "
        "\\boxed{} answer, and update the policy with a clipped token-mean loss through DeepSpeed.",
    )
    g = p.add_argument_group("data and model")
    g.add_argument("--data", required=True, help="training Parquet/JSONL (local path or s3:// URI): id, question, context, answers")
    g.add_argument("--out", required=True, help="run directory (metrics.jsonl, checkpoints/, HF exports)")
    g.add_argument("--model", default="smollm2-135m", help="base model name or local path (default: smollm2-135m)")
    g.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    g.add_argument("--engine", dest="rollout_engine", choices=["hf", "vllm"],
                   help="rollout engine: hf (transformers, default) or vllm (CUDA GPU + gpu extra; "
                   "its options rollout_gpu_memory_utilization/rollout_sleep_mode go in --config)")
    g = p.add_argument_group("agent budgets")
    g.add_argument("--preset", default="small", help="agent preset: paper, small, tiny (default: small)")
    g.add_argument("--chunk-tokens", type=int)
    g.add_argument("--memory-tokens", type=int)
    g.add_argument("--answer-tokens", type=int)
    g = p.add_argument_group("training (anything else: --config JSON with TrainConfig fields)")
    g.add_argument("--config", type=Path, help="JSON file of TrainConfig fields; flags below override it")
    g.add_argument("--steps", type=int)
    g.add_argument("--batch-size", type=int, help="questions per step")
    g.add_argument("--group-size", type=int, help="trajectories per question (G)")
    g.add_argument("--lr", type=float)
    g.add_argument("--clip-low", type=float)
    g.add_argument("--clip-high", type=float, help="0.2 = the paper's scripts; 0.28 = DAPO clip-higher")
    g.add_argument("--kl-coef", type=float)
    g.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3])
    g.add_argument("--save-every", type=int)
    g.add_argument("--seed", type=int)
    p.set_defaults(func=run_train)

    e = subparsers.add_parser("export", help="write an HF model directory from a training checkpoint")
    e.add_argument("--checkpoint", required=True, help="run dir, its checkpoints/ dir, or one checkpoints/step_N dir")
    e.add_argument("--out", required=True, help="output HF directory (safetensors + config + tokenizer)")
    e.set_defaults(func=run_export)


_FLAG_FIELDS = ("steps", "batch_size", "group_size", "lr", "clip_low", "clip_high", "kl_coef", "zero_stage",
                "save_every", "seed", "rollout_engine")


def build_configs(args: argparse.Namespace) -> tuple[Any, Any]:
    """(TrainConfig, AgentConfig) from the flags; validation errors name the bad field."""
    from memagent.config import preset
    from memagent.rl.config import TrainConfig

    fields: dict[str, Any] = json.loads(args.config.read_text()) if args.config else {}
    fields.update({k: getattr(args, k) for k in _FLAG_FIELDS if getattr(args, k) is not None})
    agent = preset(args.preset).with_overrides(
        chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens, answer_tokens=args.answer_tokens
    )
    return TrainConfig(**fields), agent


def run_train(args: argparse.Namespace) -> int:
    from pydantic import ValidationError
    from tqdm import tqdm

    try:
        config, agent = build_configs(args)
    except (ValidationError, ValueError) as exc:
        print(f"memagent train: invalid configuration: {exc}", file=sys.stderr)
        return 2
    from memagent.rl.trainer import train

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

    try:
        train(config=config, agent_config=agent, data=args.data, out_dir=args.out, model=args.model,
              resume=args.resume, on_step=on_step)
    except (FileExistsError, FileNotFoundError, ValueError) as exc:
        print(f"memagent train: {exc}", file=sys.stderr)
        return 2
    finally:
        bar.close()
    if rank == 0:
        print(f"done: metrics in {Path(args.out) / 'metrics.jsonl'}, checkpoints in {Path(args.out) / 'checkpoints'}")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from memagent.rl.plumbing import export_checkpoint

    try:
        out = export_checkpoint(args.checkpoint, args.out)
    except (FileNotFoundError, RuntimeError) as exc:
        print(f"memagent export: {exc}", file=sys.stderr)
        return 2
    print(f"exported HF model to {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="memagent")
    add_train_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
