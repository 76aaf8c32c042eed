"""Reward curve of Multi-Conv DAPO on generated NIAH-style data; writes one JSON file.

Each example hides "The special magic number for <key> is <n>." in filler text; the agent
must carry the number through its memory and answer \\boxed{n} (strict boxed EM reward).

    .venv/bin/python benchmarks/train_curve.py --model smollm2-135m --steps 30 \\
        --batch-size 4 --group-size 4 --chunk-tokens 128 --memory-tokens 32 --answer-tokens 16 \\
        --out benchmarks/results/train_curve.json

The JSON holds the configs, every step's metrics, seconds per step, peak RSS, and the mean
reward of the first and last quarter of the run; a PNG next to it plots the curve. Numbers are measurements, never asserted.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

FILLER = [
    "The river bends twice before it reaches the old mill.",
    "Farmers in the valley grow barley, beans and apples.",
    "A small bakery on the corner opens at six every morning.",
    "The museum keeps a collection of maps from the last century.",
    "Children play football in the park after school.",
    "The train to the coast leaves every hour on weekdays.",
]


def niah(n: int, *, sentences: int, seed: int) -> list[dict]:
    """``n`` needle-in-a-haystack examples with ``sentences`` filler sentences each."""
    rng = random.Random(seed)
    words = ["apple", "river", "castle", "falcon", "meadow", "silver", "harbor", "violet", "canyon", "ember"]
    rows = []
    for i in range(n):
        key = f"{rng.choice(words)}-{rng.choice(words)}"
        value = str(rng.randint(10, 99))
        hay = [rng.choice(FILLER) for _ in range(sentences)]
        hay.insert(rng.randint(0, sentences), f"The special magic number for {key} is {value}.")
        rows.append({"id": f"niah-{i}", "question": f"What is the special magic number for {key}?",
                     "context": " ".join(hay), "answers": [value]})
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    from benchmarks.common import add_threads_option

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--kl-coef", type=float, default=0.001)
    p.add_argument("--clip-high", type=float, default=0.28)
    p.add_argument("--ppo-mini-batches", type=int, default=1)
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--chunk-tokens", type=int, default=128)
    p.add_argument("--memory-tokens", type=int, default=32)
    p.add_argument("--answer-tokens", type=int, default=16)
    p.add_argument("--query-tokens", type=int, default=64)
    p.add_argument("--sentences", type=int, default=15, help="filler sentences per document")
    p.add_argument("--examples", type=int, default=200)
    p.add_argument("--micro-batch-tokens", type=int, default=4096)
    p.add_argument("--dynamic-sampling", action="store_true")
    p.add_argument("--reward", choices=["boxed_em", "contains"], default="boxed_em",
                   help="boxed_em: strict training reward; contains: the number appears in the final reply "
                   "(a lenient reward for models that never write \\boxed{})")
    p.add_argument("--seed", type=int, default=0)
    add_threads_option(p)
    p.add_argument("--run-dir", type=Path, help="training run directory (default: a temporary one)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/train_curve.json"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
    from benchmarks.common import set_threads

    args = parse_args(argv)
    set_threads(args.threads)
    from memagent.config import AgentConfig
    from memagent.rl.config import TrainConfig
    from memagent.rl.trainer import train
    from memagent.verify import boxed_em, contains_any

    agent = AgentConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                        answer_tokens=args.answer_tokens, query_tokens=args.query_tokens)
    config = TrainConfig(steps=args.steps, batch_size=args.batch_size, group_size=args.group_size, lr=args.lr,
                         warmup_steps=args.warmup_steps, kl_coef=args.kl_coef, clip_high=args.clip_high,
                         ppo_mini_batches=args.ppo_mini_batches, micro_batch_tokens=args.micro_batch_tokens,
                         dynamic_sampling=args.dynamic_sampling, seed=args.seed, save_every=max(args.steps, 1),
                         keep_checkpoints=1)
    data = niah(args.examples, sentences=args.sentences, seed=args.seed)
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="train-curve-"))
    records: list[dict] = []
    reward_fn = boxed_em if args.reward == "boxed_em" else contains_any
    t0 = time.perf_counter()

    def on_step(r: dict) -> None:
        records.append(r)
        write(args, agent, config, records, run_dir, time.perf_counter() - t0)  # partial results survive a kill
        print(f"step {r['step']:3d}  reward {r['reward_generated_mean']:.3f} (trained {r['reward_mean']:.3f})  kl {r['kl']:.2e}  "
              f"clip {r['clip_frac']:.3f}  convs/traj {r['convs_per_traj']:.1f}  {r['step_s']:.1f}s", flush=True)

    train(config=config, agent_config=agent, data=data, out_dir=run_dir, model=args.model, on_step=on_step,
          reward_fn=reward_fn)
    result = write(args, agent, config, records, run_dir, time.perf_counter() - t0)
    if records:
        plot(records, args.out.with_suffix(".png"), title=f"Multi-Conv DAPO on NIAH — {args.model}")
    print(json.dumps({k: v for k, v in result.items() if k not in ("records", "agent_config", "train_config")},
                     indent=2, default=str))
    return 0


def plot(records: list[dict], path: Path, *, title: str) -> Path:
    """Reward per step (points), its 5-step moving mean (line) and the KL to the reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    reward = [r.get("reward_generated_mean", r["reward_mean"]) for r in records]
    window = [sum(reward[max(0, i - 4): i + 1]) / len(reward[max(0, i - 4): i + 1]) for i in range(len(reward))]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, reward, "o", alpha=0.5, label="reward, all rollouts of the step")
    ax.plot(steps, window, "-", label="5-step mean")
    trained = [r for r in records if r["trajectories"]]  # a step that kept no group trained nothing
    ax.plot([r["step"] for r in trained], [r["reward_mean"] for r in trained], "x", alpha=0.4,
            label="reward, trained groups")
    ax.set(xlabel="step", ylabel="reward", ylim=(-0.05, 1.05), title=title)
    kl = ax.twinx()
    kl.plot([r["step"] for r in trained], [r["kl"] for r in trained], ":", color="grey",
            label="KL to reference (right)")
    kl.set_ylabel("KL (k3)")
    handles = ax.get_legend_handles_labels()[0] + kl.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write(args: argparse.Namespace, agent, config, records: list[dict], run_dir: Path, total: float) -> dict:
    """Summarise ``records`` into ``args.out`` (rewritten after every step)."""
    # The success rate of everything generated: with dynamic sampling the trained groups alone
    # exclude all-wrong and all-right groups, which biases their mean towards the middle.
    curve = [r.get("reward_generated_mean", r["reward_mean"]) for r in records]
    q = max(1, len(records) // 4)
    first = sum(curve[:q]) / q
    last = sum(curve[-q:]) / q
    from benchmarks.common import machine

    result = {
        "machine": machine(),
        "model": args.model,
        "reward": args.reward,
        "agent_config": agent.model_dump(),
        "train_config": config.model_dump(),
        "data": {"kind": "niah", "examples": args.examples, "filler_sentences": args.sentences},
        "steps": len(records),
        "seconds_total": round(total, 1),
        "seconds_per_step_mean": round(sum(r["step_s"] for r in records) / max(1, len(records)), 2),
        "rollout_s_mean": round(sum(r["rollout_s"] for r in records) / max(1, len(records)), 2),
        "update_s_mean": round(sum(r["update_s"] for r in records) / max(1, len(records)), 2),
        "chunks_per_doc": records[0]["chunks_per_doc"] if records else None,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "reward_first_quarter": first,
        "reward_last_quarter": last,
        "reward_rose": last > first,
        "reward_curve": curve,
        "reward_trained_curve": [r["reward_mean"] for r in records],
        "records": records,
        "run_dir": str(run_dir),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str))
    return result


if __name__ == "__main__":
    sys.exit(main())
