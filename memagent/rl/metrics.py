"""One training step's record: what :func:`memagent.rl.trainer.update_policy` did, and the JSON line a rank
logs for the step (rewards, lengths, loss statistics, speed, memory)."""

from __future__ import annotations

import resource
from dataclasses import dataclass
from typing import Any, Iterable

from memagent.rl.batching import Sample
from memagent.rl.rollout import RolloutBatch


@dataclass
class Update:
    """What :func:`update_policy` did: per-micro-batch loss statistics, grad norms, steps, lr."""

    stats: list[dict[str, float]]
    grad_norms: list[float]
    optimizer_steps: int
    lr: float  # the rate this step's first update used


def step_metrics(step: int, batch: RolloutBatch, samples: list[Sample], upd: Update, *, rollout_s: float,
                 update_s: float, step_s: float, cursor: tuple[int, int]) -> dict[str, Any]:
    """6. One JSON-able record of this rank: rewards, lengths, loss statistics (token-weighted), speed, memory."""
    trajs, convs, stats = batch.trajectories, batch.conversations, upd.stats
    tokens = sum(m["tokens"] for m in stats)

    def tokmean(key: str) -> float:
        return sum(m[key] * m["tokens"] for m in stats) / tokens if tokens else 0.0

    trained_tokens = sum(s.length for s in samples)
    return {
        "step": step,
        "reward_mean": mean(t.reward for t in trajs),  # trained trajectories
        "accuracy": mean(t.score for t in trajs),
        "trajectories_generated": len(batch.generated_rewards),
        "reward_generated_mean": mean(batch.generated_rewards),  # all generated, incl. dropped groups
        "accuracy_generated": mean(batch.generated_scores),
        "rollout_rounds": batch.rounds,
        "groups": len({t.group_id for t in trajs}),
        "groups_dropped": batch.groups_dropped,
        "groups_failed": batch.groups_failed,
        "trajectories": len(trajs),
        "convs_per_traj": mean(t.n_convs for t in trajs),
        "chunks_per_doc": mean(t.n_chunks for t in trajs),
        "memory_len": mean(len(c.response_ids) for c in convs if not c.is_final),
        "answer_len": mean(len(c.response_ids) for c in convs if c.is_final),
        "truncated_frac": mean(float(c.truncated) for c in convs),
        "trained_convs": len(samples),
        "response_tokens": int(tokens),
        "pg_loss": tokmean("pg_loss"),
        "kl": tokmean("kl"),
        "entropy": tokmean("entropy"),
        "clip_frac": tokmean("clip_frac"),
        "clip_high_frac": tokmean("clip_high_frac"),
        "clip_low_frac": tokmean("clip_low_frac"),
        "dual_clip_frac": tokmean("dual_clip_frac"),
        "approx_kl_old": tokmean("approx_kl_old"),
        "behaviour_logp_gap": tokmean("behaviour_logp_gap"),  # |old - engine| per token: ~0 in fp32
        "grad_norm": mean(upd.grad_norms) if upd.grad_norms else None,
        "optimizer_steps": upd.optimizer_steps,  # 0: nothing to train on this step
        "lr": float(upd.lr),
        "rollout_s": round(rollout_s, 3),
        "update_s": round(update_s, 3),
        "step_s": round(step_s, 3),
        "rollout_tokens_per_s": batch.generated_tokens / rollout_s if rollout_s else 0.0,
        "train_tokens_per_s": trained_tokens / update_s if update_s else 0.0,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "data_cursor": list(cursor),
        "example_ids": list(dict.fromkeys(t.example_id for t in trajs)),  # in draw order
    }


def mean(values: Iterable[float]) -> float:
    """The mean of ``values`` (0 when there are none)."""
    vals = list(values)
    return float(sum(vals) / len(vals)) if vals else 0.0
