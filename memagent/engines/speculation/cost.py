"""How many tokens to draft, and from which drafter: the forward cost model, its solver, the choice of ``k``.

One verification forward of ``B`` rows × ``t`` tokens costs about ``c0 + c_row·B + c_tok·B·t``
seconds: ``c0`` reads the weights once, ``c_row`` reads a row's KV cache (once, however many
tokens the row verifies), ``c_tok`` is the per-token compute. A row whose draft has ``d`` tokens
at per-token acceptance ``α`` yields ``E(α, d) = 1 + α + … + α^d`` tokens; each step the loop
picks the ``k`` (each row drafts ``min(k, d_i)``) that maximises expected tokens per second.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Forward cost prior (seconds) c0 + c_row * rows + c_tok * rows * tokens, refitted online per engine:
# fitted to this project's measured CPU decode steps (benchmarks/README.md, "The cost prior").
PRIOR_C0 = 0.055
PRIOR_C_ROW = 0.0114
PRIOR_C_TOK = 0.0063
# Off the CPU (CUDA): a verification of 64 tokens costs about one decode step (weights read once,
# the extra tokens' compute nearly free). Assumed, not measured on this project's GPUs yet.
GPU_PRIOR = (0.010, 0.0005, 0.00002)


def expected_tokens(alpha: float, d: int) -> float:
    """Tokens one step yields for a row drafting ``d`` tokens at per-token acceptance ``alpha``.

    ``1 + α + … + α^d``: the model's own token, plus each drafted token kept if all before it were.
    """
    if d <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(d + 1)
    return (1.0 - alpha ** (d + 1)) / (1.0 - alpha)


def pick_proposal(proposals: Sequence[Sequence[int]], alphas: Sequence[float], k: int | None = None) -> int:
    """Index of the proposal with the highest expected yield ``E(α_j, min(len(p_j), k))`` (the first on a tie).

    ``k``: the step's draft length when known (a 200-token aligned draft cut to 8 tokens yields
    what its first 8 do); None compares the proposals in full.
    """
    gains = [expected_tokens(a, len(p) if k is None else min(len(p), k)) for p, a in zip(proposals, alphas)]
    return max(range(len(gains)), key=lambda j: (gains[j], -j))


class CostModel:
    """Seconds of one forward of ``rows × tokens``: ``c0 + c_row · rows + c_tok · rows · tokens``.

    The engine keeps the device's prior (:meth:`for_device`) fixed, so the draft length, and with
    it each forward's shape and bf16 rounding, does not follow the wall clock; with
    ``draft_learning`` it is refitted online (:meth:`update`).

    ``c0`` reads the weights, ``c_row`` reads each row's KV cache (once per row, however many
    tokens it verifies), ``c_tok`` is the per-token compute. A least-squares fit over recent steps
    (exponential forgetting, weight ``decay`` per step), pulled toward the prior by a small ridge,
    so a loop that only ever sees one batch size keeps a sensible split.
    """

    def __init__(self, c0: float = PRIOR_C0, c_row: float = PRIOR_C_ROW, c_tok: float = PRIOR_C_TOK,
                 decay: float = 0.98, ridge: float = 0.05):
        self.decay, self.ridge = decay, ridge
        self.prior = np.array([c0, c_row, c_tok])
        self.theta = self.prior.copy()
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self._scale = np.array([1.0, 16.0, 64.0])  # typical feature sizes: the ridge is per scaled feature

    @classmethod
    def for_device(cls, device: str) -> CostModel:
        """The prior for ``device``: the CPU one measured here, or :data:`GPU_PRIOR` off the CPU."""
        return cls() if device == "cpu" else cls(*GPU_PRIOR)

    @property
    def c0(self) -> float:
        return float(self.theta[0])

    @property
    def c_row(self) -> float:
        return float(self.theta[1])

    @property
    def c_tok(self) -> float:
        return float(self.theta[2])

    def update(self, rows: int, tokens: int, seconds: float) -> None:
        """Record one forward of ``rows × tokens`` that took ``seconds``; refit, no coefficient below zero."""
        x = np.array([1.0, rows, rows * tokens]) / self._scale
        self._xtx = self.decay * self._xtx + np.outer(x, x)
        self._xty = self.decay * self._xty + x * seconds
        prior = self.prior * self._scale
        self.theta = np.maximum(nonnegative_quadratic_min(self._xtx + self.ridge * np.eye(3),
                                                          self._xty + self.ridge * prior) / self._scale, 1e-7)

    def seconds(self, rows: int, tokens: int) -> float:
        return float(self.theta @ np.array([1.0, rows, rows * tokens]))


def nonnegative_quadratic_min(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``argmin θ'Aθ - 2b'θ`` over ``θ ≥ 0`` (``A`` ``[n, n]`` positive definite, ``n`` small): every set of
    coefficients left free, the best feasible one (the optimum is the free minimum of its own face).

    Why the constraint is solved rather than a negative fit refused: a loop that only ever runs one
    batch size cannot tell ``c0`` from ``c_row · rows``, so its exact fit often puts one below zero,
    and refusing every such refit would keep the prior for good.
    """
    n = len(b)
    full = np.linalg.solve(a, b)
    if (full >= 0).all():  # the usual case, one solve a forward: the free minimum is feasible
        return full
    best, best_value = np.zeros(n), 0.0
    for mask in range(1, (1 << n) - 1):
        free = [i for i in range(n) if mask >> i & 1]
        theta = np.zeros(n)
        theta[free] = np.linalg.solve(a[np.ix_(free, free)], b[free])
        value = float(theta @ a @ theta - 2 * b @ theta)
        if (theta >= 0).all() and value < best_value:
            best, best_value = theta, value
    return best


def choose_draft_len(draft_lens: Sequence[int], alphas: Sequence[float], rows: int, cost: CostModel,
                     max_draft: int) -> int:
    """The ``k`` that maximises expected tokens per second of the next forward,
    ``Σ_i E(α_i, min(k, d_i)) / (c0 + c_row·B + c_tok·B·(k+1))``.

    Args:
        draft_lens: per active row, how many tokens its lookup found (0 = none).
        alphas: per active row, its estimated per-token acceptance.
        rows: rows in the forward (the batch, finished rows included: they still take a slot).
        cost: forward cost model.
        max_draft: the configured cap.

    Returns:
        ``k`` in ``[0, max_draft]``; each row then drafts ``min(k, d_i)``.
    """
    longest = min(max(draft_lens, default=0), max_draft)
    if longest <= 0:
        return 0
    # gain[k] = Σ_i E(α_i, min(k, d_i)): ``[K+1, R]`` at once (aligned drafts make K a few hundred).
    ks = np.arange(longest + 1)
    d = np.minimum(ks[:, None], np.asarray(draft_lens)[None, :])
    a = np.minimum(np.asarray(alphas, dtype=np.float64), 1.0 - 1e-12)[None, :]
    gain = ((1.0 - a ** (d + 1)) / (1.0 - a)).sum(axis=1)
    rates = gain / (cost.theta @ np.stack([np.ones_like(ks), np.full_like(ks, rows), rows * (ks + 1)]))
    best_k, best_rate = 0, -1.0
    for k, rate in enumerate(rates.tolist()):
        if rate > best_rate * (1 + 1e-9):
            best_k, best_rate = k, rate
    return best_k
