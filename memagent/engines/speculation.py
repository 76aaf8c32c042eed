"""Speculation, the pure parts: drafting (n-gram lookup, aligned), acceptance, how many tokens to draft.

A memory update mostly copies: the new memory repeats the old one, or quotes the chunk. So the
reply's last n-gram usually occurs earlier in its prompt (or reply), and the tokens that followed
it there are a good guess for what comes next. The decode loop (:mod:`memagent.engines.hf_decode`)
feeds each row's pending token plus its draft in one forward pass and keeps, per row, the
drafted tokens the model agrees with plus the model's own next token. The output is the model's:

- greedy: a drafted token is kept iff it is the argmax at its position, so the reply is the
  argmax chain, token for token (up to float rounding of a (k+1)-token forward against k+1
  one-token forwards: a flip needs a near-tie of the top two logits);
- sampling: the rule for a deterministic draft x (a point-mass proposal q = δ_x): keep x with
  probability p(x), else sample from p with x removed and renormalised (p(y) / (1 - p(x)) for
  y ≠ x). The kept token is then distributed exactly as p: P(x) = p(x), and
  P(y) = (1 - p(x)) · p(y) / (1 - p(x)) = p(y). ``p`` is the distribution sampling would use
  without speculation (temperature, then top-p).

Aligned drafting (:class:`AlignedDrafter`). A memory update is mostly a copy of the previous
memory, which sits in the prompt: read the prompt as the predicted reply. A pointer into the
prompt's tokens follows the reply (each token equal to the one under the pointer moves it on),
so while the reply copies, the draft is the rest of the memory, as long as the cost rule below
allows (at batch 1 with cheap verification: all of it, up to ``aligned_draft_tokens``). After a
mismatch (an edit) the pointer moves on as if tokens were substituted one for one, and
:func:`resync` looks for the reply's last three, two or one tokens in the prompt nearest to it,
so drafting resumes on the first copied token after the edit; n-gram lookup with ``n ≥ 2`` needs
``n`` copied tokens first. The first alignment is on the reply's first token with the newline
before it (the earliest occurrence: the memory comes before the chunk). Each step a row takes
the proposal, n-gram or aligned, with the higher expected yield ``E(α, d)`` under its own
acceptance for that drafter (:func:`pick_proposal`), compared at the step's draft length ``k``
(a 200-token aligned draft cut to 8 yields what its first 8 tokens do: a reply looping on its
own text is better drafted by n-gram lookup). Both drafters are scored against the kept tokens
every step, drafted or not (:func:`matched_prefix`), so each one's acceptance stays known.

How many tokens to draft (:func:`choose_draft_len`). One verification forward of ``B`` rows ×
``t`` tokens costs about ``c0 + c_row·B + c_tok·B·t`` seconds: ``c0`` reads the weights once,
``c_row`` reads a row's KV cache (once, however many tokens the row verifies), ``c_tok`` is
the per-token compute (matmuls; on CPU compute-bound). A row whose draft has ``d`` tokens at
per-token acceptance ``α`` yields ``E(α, d) = 1 + α + … + α^d`` tokens. Each step the loop picks
the ``k`` (each row drafts ``min(k, d_i)``) that maximises expected tokens per second,
``Σ_i E(α_i, min(k, d_i)) / (c0 + c_row·B + c_tok·B·(k+1))``. Alone (B = 1) nine tokens cost
little more than one, so long drafts pay; in a full batch each drafted token costs ``c_tok·B``
for ``α·B`` expected tokens, so poor acceptance turns drafting off (``k = 0``). ``α_i`` is the
row's own acceptance so far, with the engine's running rate as its prior
(:class:`AcceptanceTracker`); ``c0, c_row, c_tok`` start from the measurements below and are
refitted online from the loop's own step times (:class:`CostModel`), so the rule follows the
machine and its load. The form assumes a verification reads each row's cache once; transformers'
``sdpa`` copied it on every multi-token forward with a mask (:mod:`memagent.engines.gqa_attention`).

Prior (this machine: 2 cores AVX2, SmolLM2-135M fp32, one torch thread, ``benchmarks/README.md``):
a decode step of 1 row took 72.6 ms and of 16 rows 334 ms at ~1.2K-token contexts, and the
fp32 matmul rate is ~52 GFLOP/s, i.e. ``c_tok ≈ 2 × 165M / 52e9 ≈ 6.3 ms``; hence
``c0 ≈ 55 ms``, ``c_row ≈ 11.4 ms``. The forwards measured in ``benchmarks/results/speculation.json``
(``decode_forwards_on``: k and seconds of every forward of the speculative read) are the on-line data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

# Forward cost prior (seconds) c0 + c_row * rows + c_tok * rows * tokens; refitted online per engine.
# From benchmarks/README.md (roofline/concurrency, 1 thread): a decode step of 1 row 72.6 ms, of
# 16 rows 334 ms (c0 + c_row + c_tok = 0.0726, c0 + 16 (c_row + c_tok) = 0.334), and
# c_tok = 2 x 165M multiply-adds (body + lm_head) at the measured ~52 GFLOP/s.
PRIOR_C0 = 0.055
PRIOR_C_ROW = 0.0114
PRIOR_C_TOK = 0.0063


def find_draft(tokens: np.ndarray, max_draft: int, n_min: int, n_max: int) -> list[int]:
    """Tokens that followed the latest earlier occurrence of ``tokens``' last n-gram.

    Args:
        tokens: ``[L]`` int array, the row's prompt + generated tokens so far.
        max_draft: most tokens to return.
        n_min, n_max: n-gram sizes tried, longest first; the first size with a match wins.

    Returns:
        Up to ``max_draft`` token ids (``[]`` when no n-gram of the sizes recurs).
    """
    length = len(tokens)
    if max_draft <= 0:
        return []
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        tail = tokens[length - n:]
        # windows[j] = tokens[j : j + n] for j < length - n (the tail itself is excluded).
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n  # the latest occurrence: the nearest context is the best guess
            return tokens[start : start + max_draft].tolist()
    return []


# Aligned drafting: a single-token re-synchronisation is trusted only this near the expected
# position (a common token such as " the" recurs everywhere; two or three tokens are specific).
RESYNC_NEAR = 16


def aligned_draft(source: np.ndarray, pointer: int | None, max_draft: int) -> list[int]:
    """The next ``max_draft`` tokens of ``source`` from ``pointer``: the predicted output continued.

    Shapes: ``source`` ``[S]`` int (the prompt), ``pointer`` in ``[0, S]`` or None (not aligned).
    Returns up to ``max_draft`` token ids (``[]`` when not aligned or at the end of ``source``).
    """
    if pointer is None or max_draft <= 0:
        return []
    return source[pointer : pointer + max_draft].tolist()


TokenIndex = tuple[np.ndarray, np.ndarray]


def token_index(source: np.ndarray) -> TokenIndex:
    """Where each token id occurs in ``source`` (all but its last token), for :func:`resync`: the
    positions sorted by token id (ascending positions within one id), and those ids.

    Shapes: ``source`` ``[S]``; returns two ``[S - 1]`` arrays. Built once per prompt.
    """
    head = source[: max(len(source) - 1, 0)]
    order = np.argsort(head, kind="stable")
    return order, head[order]


def resync(source: np.ndarray, history: np.ndarray, expected: int | None, n_max: int = 3,
           near: int = RESYNC_NEAR, index: TokenIndex | None = None) -> int | None:
    """Where in ``source`` the reply goes on, found by matching ``history``'s last tokens.

    The last ``n`` tokens of ``history`` (``n = n_max … 1``, longest first) are looked up in
    ``source``; among the occurrences with something after them, the one ending nearest to
    ``expected`` wins (the earliest when ``expected`` is None: in a memory-update prompt the
    previous memory comes before the chunk). A single token is trusted only within ``near`` of
    ``expected`` and never without one. ``index``: :func:`token_index` of ``source`` (built here
    when not given; a drafter keeps it, as the lookup runs at every step of an unaligned row).

    Shapes: ``source`` ``[S]``, ``history`` ``[L]`` (prompt + reply so far). Returns the position
    in ``source`` of the token predicted next, or None when nothing matches.
    """
    limit = len(source) - 1  # an occurrence must leave at least one token to draft
    if limit < 1 or len(history) == 0:
        return None
    order, ids = index if index is not None else token_index(source)
    last = history[len(history) - 1]
    lasts = order[np.searchsorted(ids, last, "left"):np.searchsorted(ids, last, "right")]  # ascending
    for n in range(min(n_max, len(history), limit), 0, -1):
        if n == 1 and expected is None:
            break
        at = lasts[lasts >= n - 1]  # where an n-token match would end (its last token)
        for j in range(1, n):
            at = at[source[at - j] == history[len(history) - 1 - j]]
        ends = at + 1
        if n == 1:
            ends = ends[np.abs(ends - expected) <= near]
        if len(ends):
            return int(ends[0] if expected is None else ends[np.argmin(np.abs(ends - expected))])
    return None


def advance_alignment(source: np.ndarray, pointer: int | None, synced: bool, history: np.ndarray,
                      new: int, n_max: int = 3, index: TokenIndex | None = None) -> tuple[int | None, bool]:
    """The pointer after the reply grew by ``history``'s last ``new`` tokens.

    While in sync each token equal to ``source[pointer]`` moves the pointer one on. A token that
    differs puts the alignment out of sync; the pointer still moves one per token (the expected
    position, as if tokens were substituted one for one), and at the end :func:`resync` looks for
    the reply's last tokens nearest to it: after an insertion, a deletion or a replaced span the
    reply picks up again as soon as it quotes ``source`` again.

    Shapes: ``source`` ``[S]``, ``history`` ``[L]``. Returns ``(pointer, synced)``.
    """
    for tok in history[len(history) - new:]:
        if pointer is None:
            break
        synced = synced and pointer < len(source) and source[pointer] == tok
        pointer += 1
    if not synced:
        found = resync(source, history, pointer, n_max, index=index)
        if found is not None:
            return found, True
    return pointer, synced


class NgramDrafter:
    """Prompt lookup (:func:`find_draft`) behind the drafter interface; keeps no state."""

    name = "ngram"

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max

    def propose(self, history: np.ndarray, max_draft: int) -> list[int]:
        return find_draft(history, max_draft, self.n_min, self.n_max)

    def observe(self, history: np.ndarray, new: int) -> None:
        pass


class AlignedDrafter:
    """Copy-aware drafting: the prompt (which holds the previous memory) read as the predicted output.

    A pointer into the prompt advances as the reply repeats it (:func:`advance_alignment`), so an
    unchanged memory is drafted in long runs, up to all of what remains; after an edit it
    re-synchronises on the reply's last one to three tokens (:func:`resync`), which n-gram lookup
    with ``n ≥ 2`` cannot do right after a changed token. No alignment until the reply's first
    token (with the newline before it) is found in the prompt.
    """

    name = "aligned"

    def __init__(self, source: np.ndarray, n_max: int = 3):
        self.source, self.n_max = source, n_max
        self.index = token_index(source)
        self.pointer: int | None = None
        self.synced = False

    def propose(self, history: np.ndarray, max_draft: int) -> list[int]:
        return aligned_draft(self.source, self.pointer, max_draft) if self.synced else []

    def observe(self, history: np.ndarray, new: int) -> None:
        """``history`` (``[L]``, prompt + reply) grew by its last ``new`` tokens."""
        self.pointer, self.synced = advance_alignment(self.source, self.pointer, self.synced, history, new,
                                                      self.n_max, self.index)


def pick_proposal(proposals: Sequence[Sequence[int]], alphas: Sequence[float], k: int | None = None) -> int:
    """Index of the proposal with the highest expected yield ``E(α_j, min(len(p_j), k))`` (the first on a tie).

    ``k``: the step's draft length when known (a 200-token aligned draft cut to 8 tokens yields
    what its first 8 do); None compares the proposals in full.
    """
    gains = [expected_tokens(a, len(p) if k is None else min(len(p), k)) for p, a in zip(proposals, alphas)]
    return max(range(len(gains)), key=lambda j: (gains[j], -j))


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


def expected_tokens(alpha: float, d: int) -> float:
    """Tokens one step yields for a row drafting ``d`` tokens at per-token acceptance ``alpha``.

    ``1 + α + … + α^d``: the model's own token, plus each drafted token kept if all before it were.
    """
    if d <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(d + 1)
    return (1.0 - alpha ** (d + 1)) / (1.0 - alpha)


class CostModel:
    """Seconds of one forward of ``rows × tokens``: ``c0 + c_row · rows + c_tok · rows · tokens``, refitted online.

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

    Why not keep the last fit with all coefficients positive: a loop that only ever runs one batch size
    cannot tell ``c0`` from ``c_row · rows``; its exact fit then often puts one below zero, and a refit
    refused every step kept the prior (16-row forwards of 0.22 s still priced at 0.34 s after 80 of them;
    tests/test_speculation.py).
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
    """The ``k`` that maximises expected tokens per second of the next forward.

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


class AcceptanceTracker:
    """Per-token acceptance estimate: accepted / (accepted + rejections), with a prior.

    A block of ``d`` drafted tokens with ``m`` kept is ``m`` successes and, when ``m < d``, one
    failure (the geometric model behind :func:`expected_tokens`).
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


def sampling_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """``softmax(logits / T)`` restricted to the top-p nucleus and renormalised.

    Shapes: ``[..., V]`` → ``[..., V]`` (fp32). The nucleus as transformers' ``TopPLogitsWarper``
    draws it: drop the tokens whose cumulative probability in ascending order is ≤ ``1 - top_p``,
    always keeping the most likely one.
    """
    logits = logits.float() / temperature
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= (1 - top_p)
        drop_sorted[..., -1:] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, -math.inf)
    return logits.softmax(dim=-1)


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
    """Sampled verification of a deterministic draft (see the module docstring).

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
