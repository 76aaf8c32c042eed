"""Distributed helpers: process-group set-up, scalar collectives, and merging per-rank metrics.

Every helper is the identity in a single process, so the trainer calls them unconditionally.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import torch

from memagent.net import free_port


def setup_distributed() -> tuple[int, int]:
    """Prepare the environment DeepSpeed reads; returns ``(rank, world_size)``.

    Under the DeepSpeed launcher or torchrun the variables are already set. A plain
    ``python`` process becomes rank 0 of 1 (DeepSpeed otherwise tries MPI discovery, and it
    asserts on ``LOCAL_RANK`` even single-process). Without CUDA it selects the CPU
    accelerator, whose backend is gloo when oneCCL is absent.
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("LOCAL_RANK", os.environ["RANK"])
    import deepspeed

    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    else:
        skip_shared_memory_all_reduce()
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend=None if torch.cuda.is_available() else "gloo",
                                   auto_mpi_discovery=False)
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def skip_shared_memory_all_reduce() -> None:
    """Keep DeepSpeed's CPU backend from JIT-compiling its shared-memory all-reduce.

    DeepSpeed builds that C++ op (about 45 s of CPU on a cold extension cache, and a compiler on the
    machine) whenever it sets up its communication backend, yet only tensor-parallel inference calls
    it (``inference_all_reduce``); training reduces through gloo either way. Marked incompatible, the
    op is never built and the backend falls back to the process group.
    """
    import deepspeed.ops
    from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

    deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False


def _single() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1


def all_reduce(value: float, op: str = "sum") -> float:
    """A scalar reduced over ranks (``op``: "sum" or "max")."""
    if _single():
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    reduce_op = torch.distributed.ReduceOp
    torch.distributed.all_reduce(t, op=reduce_op.MAX if op == "max" else reduce_op.SUM)
    return float(t.item())


def all_gather_ints(value: int) -> list[int]:
    """One int per rank, in rank order."""
    return [int(v) for v in all_gather_objects(int(value))]


def all_gather_objects(value: Any) -> list[Any]:
    """One picklable value per rank, in rank order."""
    if _single():
        return [value]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, value)
    return out


# How each per-rank step metric combines into the run's: counts and throughputs add up, times
# and memory take the slowest rank, per-trajectory means weight ranks by their trajectories,
# token-level statistics by their response tokens; _GLOBAL ones are the same on every rank.
_SUMMED = {"groups", "groups_dropped", "groups_failed", "trajectories", "trajectories_generated", "trained_convs",
           "response_tokens", "rollout_tokens_per_s", "train_tokens_per_s"}
_SLOWEST = {"rollout_s", "update_s", "step_s", "peak_rss_mb", "rollout_rounds"}
_PER_TRAJECTORY = {"reward_mean", "accuracy", "convs_per_traj", "chunks_per_doc", "memory_len", "answer_len",
                   "truncated_frac"}
_PER_GENERATED = {"reward_generated_mean", "accuracy_generated"}
_GLOBAL = {"step", "lr", "grad_norm", "optimizer_steps"}


def merge_rank_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Combine one step's metric records of all ranks (rank order) into the run's record.

    ``[{"trajectories": 2, "reward_mean": 1.0, ...}, {"trajectories": 2, "reward_mean": 0.0, ...}]``
    -> ``{"trajectories": 4, "reward_mean": 0.5, ...}``. Lists (example ids) are concatenated;
    ``data_cursor`` becomes one pair per rank.
    """
    if len(records) == 1:
        return dict(records[0])
    merged: dict[str, Any] = {}
    for key, first in records[0].items():
        values = [r[key] for r in records]
        if key == "data_cursor":
            merged[key] = [list(v) for v in values]
        elif isinstance(first, list):
            merged[key] = [x for v in values for x in v]
        elif not isinstance(first, (int, float)) or isinstance(first, bool) or key in _GLOBAL:
            merged[key] = first
        elif key in _SUMMED:
            merged[key] = sum(values)
        elif key in _SLOWEST:
            merged[key] = max(values)
        else:
            weight = ("trajectories" if key in _PER_TRAJECTORY else
                      "trajectories_generated" if key in _PER_GENERATED else "response_tokens")
            w = [r.get(weight) or 0 for r in records]
            merged[key] = sum(v * x for v, x in zip(values, w)) / sum(w) if sum(w) else sum(values) / len(values)
    merged["world_size"] = len(records)
    return merged
