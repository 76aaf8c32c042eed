"""Acceptance: which drafted tokens a step keeps, and each drafter's running acceptance rate.

- greedy: a drafted token is kept iff it is the argmax at its position, so the reply is the
  argmax continuation, token for token (up to float rounding of a (k+1)-token forward against k+1
  one-token forwards: a flip needs a near-tie of the top two logits);
- sampling: the rule for a deterministic draft x (a point-mass proposal q = δ_x): keep x with
  probability p(x), else sample from p with x removed and renormalised (p(y) / (1 - p(x)) for
  y ≠ x). The kept token is then distributed exactly as p: P(x) = p(x), and
  P(y) = (1 - p(x)) · p(y) / (1 - p(x)) = p(y). ``p`` is the distribution sampling would use
  without speculation (temperature, then top-p: :func:`~memagent.engines.speculation.top_p.sampling_probs`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def accept_greedy(draft: Sequence[int], targets: Sequence[int]) -> list[int]:
    """Greedy verification: ``targets[j]`` is the argmax after the pending token and ``draft[:j]``.

    Shapes: ``draft`` ``[d]``, ``targets`` ``[d + 1]``. Returns the kept tokens: the agreeing
    prefix of ``draft`` plus the model's own next token (length ``m + 1``, ``m`` ≤ ``d``).
    """
    m = 0
    while m < len(draft) and draft[m] == targets[m]:
        m += 1
    return [*draft[:m], int(targets[m])]


def accept_sampled(draft: Sequence[int], probs: torch.Tensor, generator: torch.Generator | None = None) -> list[int]:
    """Sampled verification of a deterministic draft (the rule in the module docstring).

    Shapes: ``draft`` ``[d]``; ``probs`` ``[d + 1, V]``, ``probs[j]`` the sampling distribution
    after the pending token and ``draft[:j]``. Returns the kept tokens (length ``m + 1``).
    """
    kept: list[int] = []
    for j, x in enumerate(draft):
        p = probs[j]
        u = torch.rand((), generator=generator, device=p.device)
        if u < p[x]:
            kept.append(int(x))
            continue
        residual = p.clone()
        residual[x] = 0.0
        if float(residual.sum()) <= 0.0:  # p was a point mass on x: u < 1 always kept it
            kept.append(int(x))
            continue
        kept.append(int(torch.multinomial(residual, 1, generator=generator)))
        return kept
    kept.append(int(torch.multinomial(probs[len(draft)], 1, generator=generator)))
    return kept


def matched_prefix(proposal: Sequence[int], kept: Sequence[int]) -> tuple[int, int]:
    """How a proposal fared against the tokens the step kept: ``(observed, agreed)``.

    ``observed = min(len(proposal), len(kept))`` of its tokens can be checked, ``agreed`` of them
    lead it in agreement. A proposal that was not drafted is scored too, so each drafter's
    acceptance is known whichever one drafted (``agreed < observed`` is a rejection; a proposal
    that agreed as far as could be checked counts its successes only).
    """
    observed = min(len(proposal), len(kept))
    agreed = 0
    while agreed < observed and proposal[agreed] == kept[agreed]:
        agreed += 1
    return observed, agreed


class AcceptanceTracker:
    """Per-token acceptance estimate: accepted / (accepted + rejections), with a prior.

    A block of ``d`` drafted tokens with ``m`` kept is ``m`` successes and, when ``m < d``, one
    failure (the geometric model behind :func:`~memagent.engines.speculation.cost.expected_tokens`).
    """

    def __init__(self, prior: float = 0.5, strength: float = 2.0):
        self.accepted, self.rejected = 0, 0
        self.prior, self.strength = prior, strength

    def record(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.accepted += accepted
            self.rejected += int(accepted < drafted)

    def alpha(self, prior: float | None = None) -> float:
        p = self.prior if prior is None else prior
        return (self.accepted + self.strength * p) / (self.accepted + self.rejected + self.strength)
