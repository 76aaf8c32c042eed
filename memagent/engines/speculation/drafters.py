"""Drafters: what a row proposes to verify next, by n-gram lookup or by following its prompt.

Both keep per-row state that grows with the reply in O(new tokens) a step, so a decode step's
drafting costs the same at 200K tokens of history as at 2K: :class:`NgramIndex` holds the latest
occurrence of every n-gram, :class:`AlignedDrafter` a pointer into the prompt and the prompt's
token positions by id (:func:`token_index`). Neither copies the tokens: both read the row's one
:class:`TokenHistory` (the drafting state of a row of 128K tokens: 5 MB, all of it arrays, vs 46 MB
before; benchmarks/drafting_memory.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class TokenHistory(Sequence[int]):
    """A row's prompt + reply in one int32 buffer, reserved for the reply up front: the one copy of the
    prompt its drafters read (:class:`NgramIndex` keeps positions only; :class:`AlignedDrafter` reads
    :attr:`prompt`, a view). Grows by doubling past the reservation (a view taken earlier keeps the old
    buffer alive, correct as the prompt never changes)."""

    def __init__(self, prompt: Sequence[int], reserve: int = 0):
        self._buf = np.empty(len(prompt) + max(reserve, 0), dtype=np.int32)
        self._buf[: len(prompt)] = prompt
        self._len = self.prompt_len = len(prompt)

    @property
    def prompt(self) -> np.ndarray:
        return self._buf[: self.prompt_len]

    def extend(self, new: Sequence[int]) -> None:
        end = self._len + len(new)
        if end > len(self._buf):
            grown = np.empty(max(end, 2 * len(self._buf)), dtype=np.int32)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        self._buf[self._len : end] = new
        self._len = end

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):  # type: ignore[override]  # an int or a slice, as a numpy view would answer
        return self._buf[: self._len][i]


def _ints(tokens: Sequence[int]) -> list[int]:
    return tokens.tolist() if isinstance(tokens, np.ndarray) else [int(t) for t in tokens]


_MASK = (1 << 64) - 1
_MUL = 0x9E3779B97F4A7C15  # odd: n-grams of small ids spread over all 64 bits
_POW = [pow(_MUL, n, 1 << 64) for n in range(64)]  # _MUL ** n, wrapped: the weight of a suffix's n-th last id


def suffix_keys(gram: Sequence[int]) -> list[int]:
    """The 64-bit keys of ``gram``'s suffixes, shortest first: ``out[n - 1]`` is the key of ``gram[-n:]``,
    the polynomial :func:`gram_keys` computes (so one backward pass keys every size)."""
    out, h = [], 0
    for n, t in enumerate(reversed(gram)):
        h = (h + (int(t) + 1) * _POW[n]) & _MASK
        out.append(h)
    return out


def gram_keys(tokens: np.ndarray, n: int) -> np.ndarray:
    """The key of every n-gram of ``tokens``, by its end: ``[L - n + 1]`` uint64 (entry ``j`` ends at ``j + n - 1``):
    ``sum_j (tokens[j] + 1) * _MUL ** (n - 1 - j)`` over the n-gram, wrapping at 64 bits."""
    h = np.zeros(len(tokens) - n + 1, dtype=np.uint64)
    for j in range(n):
        h = h * np.uint64(_MUL) + tokens[j : len(tokens) - n + 1 + j].astype(np.uint64) + np.uint64(1)
    return h


class NgramIndex:
    """Where each n-gram (``n_min ≤ n ≤ n_max``) of a growing token sequence last occurred, its tail excluded.

    The index holds positions only; the tokens are the caller's (``history``, prompt + reply). An
    n-gram enters the index once a token follows it, so what followed it is always there to draft.
    The prompt's n-grams are built once into sorted arrays (a 64-bit key and the end position of
    its latest occurrence: 12 bytes an n-gram, vs a Python dict of tuples' ~130); the reply's go
    into a small dict per size, which wins (it is later). A key found is checked against the
    tokens: two n-grams sharing a key (a 64-bit collision) cost a missed draft, never a wrong one.
    Appending costs ``n_max - n_min + 1`` dict writes a token, a lookup as many reads.
    """

    def __init__(self, tokens: Sequence[int], n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max
        ids = np.asarray(tokens[: len(tokens)], dtype=np.int64)
        self.static: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for n in range(n_min, n_max + 1):
            keys = gram_keys(ids[:-1], n) if len(ids) - 1 >= n else np.zeros(0, dtype=np.uint64)
            # The latest occurrence of each key: np.unique's first index in the reversed keys.
            uniq, first_rev = np.unique(keys[::-1], return_index=True)
            self.static[n] = uniq, (len(keys) - 1 - first_rev + n - 1).astype(np.int32)
        self.recent: dict[int, dict[int, int]] = {n: {} for n in range(n_min, n_max + 1)}
        self.indexed = len(ids)  # n-grams ending before this length's last token are indexed

    def update(self, history: Sequence[int]) -> None:
        """Index the n-grams that ``history`` (grown at its end) now has a token after."""
        old, last = self.indexed, len(history) - 1
        if last < old:
            return
        lo = max(old - 1 - self.n_max + 1, 0)
        toks = _ints(history[lo:last])  # the tokens of every n-gram ending in [old - 1, last)
        for end in range(old - 1, last):
            keys = suffix_keys(toks[max(end - self.n_max + 1 - lo, 0) : end + 1 - lo])
            for n in range(self.n_min, min(self.n_max, end + 1) + 1):
                self.recent[n][keys[n - 1]] = end
        self.indexed = len(history)

    def draft(self, history: Sequence[int], max_draft: int) -> list[int]:
        """Up to ``max_draft`` tokens that followed the latest earlier occurrence of ``history``'s last
        n-gram, the longest ``n`` with a match winning (``[]`` when none recurs)."""
        size = len(history)
        if max_draft <= 0:
            return []
        tail = _ints(history[max(size - self.n_max, 0) :])
        tail_keys = suffix_keys(tail)
        for n in range(min(self.n_max, size - 1), self.n_min - 1, -1):
            gram, key = tail[len(tail) - n :], tail_keys[n - 1]
            end = self.recent[n].get(key)
            if end is None:
                keys, ends = self.static[n]
                at = int(np.searchsorted(keys, np.uint64(key)))
                end = int(ends[at]) if at < len(keys) and int(keys[at]) == key else None
            if end is not None and _ints(history[end - n + 1 : end + 1]) == gram:
                return _ints(history[end + 1 : end + 1 + max_draft])
        return []


class NgramDrafter:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the reply's last n-gram
    (in the prompt or the reply so far), over an :class:`NgramIndex` of the row's tokens."""

    name = "ngram"

    def __init__(self, prompt: Sequence[int], n_min: int, n_max: int):
        self.index = NgramIndex(prompt, n_min, n_max)

    def propose(self, history: Sequence[int], max_draft: int) -> list[int]:
        return self.index.draft(history, max_draft)

    def observe(self, history: Sequence[int], new: int) -> None:
        """``history`` (``[L]``, prompt + reply) grew by its last ``new`` tokens."""
        self.index.update(history)


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
    order = np.argsort(head, kind="stable").astype(np.int32)  # int32: half the size, positions fit
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
