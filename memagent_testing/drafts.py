"""The oracle of n-gram drafting: the full scan the speculation index replaced (tests/test_speculation.py and
benchmarks/drafting.py compare the index against it)."""

from __future__ import annotations

import numpy as np


def find_draft(tokens: np.ndarray, max_draft: int, n_min: int, n_max: int) -> list[int]:
    """The oracle: the scan the index replaced, every window of the whole sequence compared per step.

    Up to ``max_draft`` tokens that followed the latest earlier occurrence of ``tokens``' last
    n-gram, sizes ``n_max`` down to ``n_min``, the first size with a match winning.
    """
    length = len(tokens)
    if max_draft <= 0:
        return []
    for n in range(min(n_max, length - 1), n_min - 1, -1):
        tail = tokens[length - n:]
        windows = np.lib.stride_tricks.sliding_window_view(tokens[: length - 1], n)  # the tail excluded
        hits = np.flatnonzero((windows == tail).all(axis=1))
        if len(hits):
            start = int(hits[-1]) + n
            return tokens[start : start + max_draft].tolist()
    return []
