"""Drafters: what a row proposes to verify next, by n-gram lookup or by following its prompt.

Both keep per-row state that grows with the reply in O(new tokens) a step, so a decode step's
drafting costs the same at 200K tokens of history as at 2K: :class:`NgramIndex` holds the latest
occurrence of every n-gram, :class:`AlignedDrafter` a pointer into the prompt and the prompt's
token positions by id (:func:`token_index`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


class NgramIndex:
    """Where each n-gram (``n_min ≤ n ≤ n_max``) of a growing token sequence last occurred, its tail excluded.

    ``latest[n][gram]`` is the position of the last token of ``gram``'s latest occurrence that is
    not the sequence's own last ``n`` tokens: an n-gram enters the index once a token follows it,
    so what followed it is always there to draft. Appending a token costs ``n_max - n_min + 1``
    dict writes and a lookup as many reads, whatever the length.
    """

    def __init__(self, tokens: Iterable[int], n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self.latest: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(n_min, n_max + 1)}
        self.extend(tokens)

    def extend(self, new: Iterable[int]) -> None:
        """Append ``new``; the n-grams ending before the new last token become earlier occurrences."""
        toks = self.tokens
        old = len(toks)
        toks.extend(int(t) for t in new)
        last = len(toks) - 1  # n-grams ending here are the tail: not indexed yet
        for n, latest in self.latest.items():
            first = max(old - 1, n - 1)  # the first end position not indexed so far
            if first >= last:
                continue
            # grams[e] = tuple(toks[e - n + 1 : e + 1]) for first <= e < last; later ends overwrite earlier ones.
            grams = zip(*(toks[first - n + 1 + i : last - n + 1 + i] for i in range(n)))
            latest.update(zip(grams, range(first, last)))

    def draft(self, max_draft: int) -> list[int]:
        """Up to ``max_draft`` tokens that followed the latest earlier occurrence of the sequence's last
        n-gram, the longest ``n`` with a match winning (``[]`` when none recurs)."""
        toks, size = self.tokens, len(self.tokens)
        if max_draft <= 0:
            return []
        for n in range(min(self.n_max, size - 1), self.n_min - 1, -1):
            end = self.latest[n].get(tuple(toks[size - n:]))
            if end is not None:  # the latest occurrence: the nearest context is the best guess
                return toks[end + 1 : end + 1 + max_draft]
        return []


class NgramDrafter:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the reply's last n-gram
    (in the prompt or the reply so far), over an :class:`NgramIndex` of the row's tokens."""

    name = "ngram"

    def __init__(self, prompt: Sequence[int], n_min: int, n_max: int):
        self.index = NgramIndex(prompt, n_min, n_max)

    def propose(self, history: Sequence[int], max_draft: int) -> list[int]:
        return self.index.draft(max_draft)

    def observe(self, history: Sequence[int], new: int) -> None:
        """``history`` (``[L]``, prompt + reply) grew by its last ``new`` tokens."""
        self.index.extend(history[len(history) - new:])


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


def resync(source: np.ndarray, history: Sequence[int], expected: int | None, n_max: int = 3,
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


def advance_alignment(source: np.ndarray, pointer: int | None, synced: bool, history: Sequence[int],
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

    def propose(self, history: Sequence[int], max_draft: int) -> list[int]:
        return aligned_draft(self.source, self.pointer, max_draft) if self.synced else []

    def observe(self, history: Sequence[int], new: int) -> None:
        """``history`` (``[L]``, prompt + reply) grew by its last ``new`` tokens."""
        self.pointer, self.synced = advance_alignment(self.source, self.pointer, self.synced, history, new,
                                                      self.n_max, self.index)
