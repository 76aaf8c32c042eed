"""Multi-Conv DAPO advantages: one scalar per trajectory, shared by all its conversations.

A trajectory (one rollout of the memory agent on one question) is K memory-update
conversations plus one final-answer conversation; only the final answer is rewarded. The
advantage of trajectory i is ``R_i - mean(R over its group)`` (the G rollouts of the same
question), optionally divided by the group's std (off by default, as the paper's runs:
Dr.GRPO style, as the paper's released scripts). It is computed **per trajectory first** and only then copied to
every conversation of that trajectory, so a document that happens to have more chunks does
not weigh more in the group statistics (the official code indexes ``advantage_scalar[sample_index]`` by trajectory).

Worked example (two questions, G = 2 each)::

    rewards      = [1., 0., 1., 1.]        # trajectories 0..3
    group_ids    = [0,  0,  1,  1 ]
    -> advantages  [.5, -.5, 0., 0.]       # group 1 is all-equal: no signal

    conv_traj    = [0, 0, 0, 0, 0, 1, 1, 2, 2, 3, 3]   # traj 0 has 5 convs, traj 1 has 2
    -> per conv    [.5,.5,.5,.5,.5,-.5,-.5, 0, 0, 0, 0]
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["group_advantages", "expand_to_conversations", "all_equal_groups"]


def _as_tensor(x: Sequence[float] | torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype) if isinstance(x, torch.Tensor) else torch.tensor(list(x), dtype=dtype)


def group_advantages(
    rewards: Sequence[float] | torch.Tensor,
    group_ids: Sequence[int] | torch.Tensor,
    *,
    std_normalize: bool = False,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantage of each trajectory.

    Args:
        rewards: ``[N]`` final reward of each trajectory.
        group_ids: ``[N]`` integer id of the question each trajectory answers (any ids, any order).
        std_normalize: divide by the group's (unbiased) std + ``eps``, as GRPO; the paper does not.
        eps: keeps all-equal groups finite when ``std_normalize`` is on.

    Returns:
        ``[N]`` float32 advantages ``R_i - mean_g(R)`` (``/ (std_g + eps)`` if asked).
        A group of size 1 keeps its raw reward (mean taken as 0, std as 1), as verl does.

    Example::

        >>> group_advantages([1., 0., 0., 0., 1., 1.], [0, 0, 0, 0, 1, 1]).tolist()
        [0.75, -0.25, -0.25, -0.25, 0.0, 0.0]
    """
    r = _as_tensor(rewards, torch.float32)  # [N]
    g = _as_tensor(group_ids, torch.long)  # [N]
    if r.ndim != 1 or r.shape != g.shape:
        raise ValueError(f"rewards and group_ids must be 1-D of equal length, got {tuple(r.shape)} and {tuple(g.shape)}")
    _, inverse, counts = torch.unique(g, return_inverse=True, return_counts=True)  # [N], [U]
    n_groups = counts.numel()
    sums = torch.zeros(n_groups).index_add_(0, inverse, r)  # [U]
    mean = sums / counts  # [U]
    mean = torch.where(counts > 1, mean, torch.zeros_like(mean))  # singleton: no baseline
    adv = r - mean[inverse]  # [N]
    if std_normalize:
        sq = torch.zeros(n_groups).index_add_(0, inverse, (r - mean[inverse]) ** 2)  # [U]
        std = torch.sqrt(sq / (counts - 1).clamp(min=1))  # [U] unbiased
        std = torch.where(counts > 1, std, torch.ones_like(std))
        adv = adv / (std[inverse] + eps)
    return adv


def expand_to_conversations(
    traj_advantages: torch.Tensor, conv_traj_index: Sequence[int] | torch.Tensor
) -> torch.Tensor:
    """Copy each trajectory's advantage to every one of its conversations.

    Args:
        traj_advantages: ``[N]`` one advantage per trajectory (from :func:`group_advantages`).
        conv_traj_index: ``[M]`` for each conversation, the index (0..N-1) of its trajectory.

    Returns:
        ``[M]`` advantages, ``out[m] = traj_advantages[conv_traj_index[m]]``. The loss then
        broadcasts each one over the conversation's response tokens.
    """
    idx = _as_tensor(conv_traj_index, torch.long)  # [M]
    if idx.numel() and (idx.min() < 0 or idx.max() >= traj_advantages.numel()):
        raise ValueError(f"conv_traj_index out of range for {traj_advantages.numel()} trajectories")
    return traj_advantages[idx]  # [M]


def all_equal_groups(
    rewards: Sequence[float] | torch.Tensor, group_ids: Sequence[int] | torch.Tensor, *, tol: float = 1e-8
) -> set[int]:
    """Ids of groups whose rewards are all equal (zero advantage: dynamic sampling drops them).

    Example::

        >>> sorted(all_equal_groups([1., 1., 0., 1.], [7, 7, 8, 8]))
        [7]
    """
    r = _as_tensor(rewards, torch.float32)
    g = _as_tensor(group_ids, torch.long)
    out = set()
    for gid in torch.unique(g).tolist():
        vals = r[g == gid]
        if float(vals.max() - vals.min()) <= tol:
            out.add(int(gid))
    return out
