"""Fitting a generated text to a token budget: the largest number of units whose text fits, found with few
tokenizer calls (a secant guess from the sizes measured so far, then a bisection)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Fit:
    """The result of :func:`fit_to_budget`: ``n`` units give ``text`` of ``tokens`` tokens."""

    n: int
    text: str
    tokens: int
    measures: int


def fit_to_budget(
    build: Callable[[int], str],
    count: Callable[[str], int],
    budget: int,
    *,
    lo: int,
    hi: int | None = None,
    estimate: Callable[[int], float] | None = None,
    tol: float = 0.005,
    max_measures: int = 16,
) -> Fit:
    """The largest ``n`` in ``[lo, hi]`` whose ``build(n)`` has at most ``budget`` tokens.

    Estimate-then-refine: guess ``n`` from ``estimate`` (cheap, e.g. prefix sums of per-unit
    token counts; default: the rate of the last exact count), count exactly, correct the
    estimate by the error seen, repeat; falls back to bisection inside the bracket. Stops once
    within ``tol`` below the budget, the bracket is closed, or ``hi`` fits. Exact counts are
    the cost (~0.5 s per 128K tokens), typically 2-3 per call.
    """
    if budget <= 0:
        raise ValueError(f"token budget must be positive, got {budget}")

    good: Fit | None = None
    bad: int | None = None
    points: list[tuple[int, int]] = []
    n = _largest(lambda m: estimate(m) <= budget, lo, hi) if estimate is not None else lo
    for measures in range(1, max_measures + 1):
        text = build(n)
        tokens = count(text)
        if tokens <= budget:
            if good is None or n > good.n:
                good = Fit(n, text, tokens, measures)
            if tokens >= budget * (1 - tol) or (hi is not None and n >= hi):
                break
        else:
            if n <= lo:
                raise _smallest_over(lo, tokens, budget)
            bad = n if bad is None else min(bad, n)
        low = good.n + 1 if good is not None else lo  # the sizes still open: [low, high]
        high = bad - 1 if bad is not None else hi
        if high is not None and low > high:
            break
        points.append((n, tokens))
        n = _next_size(points, budget, estimate, (lo, hi), (low, high), measures)
    if good is None:
        good = _smallest_fit(build, count, lo, budget, max_measures + 1)
    return Fit(good.n, good.text, good.tokens, measures)


def _smallest_fit(build: Callable[[int], str], count: Callable[[str], int], lo: int, budget: int,
                  measures: int) -> Fit:
    """``lo`` units, counted once more when no count fitted; ``ValueError`` when even they are over ``budget``."""
    text = build(lo)
    fit = Fit(lo, text, count(text), measures)
    if fit.tokens > budget:
        raise _smallest_over(lo, fit.tokens, budget)
    return fit


def _smallest_over(lo: int, tokens: int, budget: int) -> ValueError:
    return ValueError(f"even the smallest size ({lo} units) has {tokens} tokens, over the budget of {budget}")


def _next_size(points: list[tuple[int, int]], budget: int, estimate: Callable[[int], float] | None,
               limits: tuple[int, int | None], open_sizes: tuple[int, int | None], measures: int) -> int:
    """The next size to count: :func:`_guess` when it falls among the ``open_sizes`` ``(low, high)``, else their
    middle (from the fourth count on always, once bounded above), else double the last size."""
    low, high = open_sizes
    guess = _guess(points, budget, estimate, *limits)
    if guess < low or (high is not None and guess > high) or (measures >= 4 and high is not None):
        guess = (low + high) // 2 if high is not None else max(low, 2 * points[-1][0])
    return guess


def _largest(pred: Callable[[int], bool], lo: int, hi: int | None) -> int:
    """The largest ``n`` in ``[lo, hi]`` with ``pred(n)`` (monotone; ``lo`` when even ``lo`` fails):
    doubling, then bisection."""
    if not pred(lo):
        return lo
    step = 1
    while pred(lo + step) and (hi is None or lo + step < hi):
        step *= 2
    low, high = lo + step // 2, lo + step if hi is None else min(lo + step, hi)
    while low < high:  # invariant: pred(low)
        mid = (low + high + 1) // 2
        low, high = (mid, high) if pred(mid) else (low, mid - 1)
    return low


def _guess(points: list[tuple[int, int]], budget: int, estimate: Callable[[int], float] | None, lo: int,
           hi: int | None) -> int:
    """The next size to count, from the ``(size, tokens)`` counted so far: the estimate corrected by the
    last error, else the secant through the last two counts, else the last count's rate."""
    n, tokens = points[-1]
    if estimate is not None:
        bias = tokens - estimate(n)
        return _largest(lambda m: estimate(m) + bias <= budget, lo, hi)
    if len(points) >= 2 and points[-1][1] != points[-2][1]:
        # Secant through the last two counts: handles a fixed part (headers, common words).
        (n1, t1), (n2, t2) = points[-2], points[-1]
        return math.floor(n2 + (budget - t2) * (n2 - n1) / (t2 - t1))
    return math.floor(n * budget / max(tokens, 1))
