"""Stop strings: where a reply ends, which of its tokens it keeps, and what a stream may send yet.

A reply with stop strings ends at the first place one occurs in its decoded text, as OpenAI and
vLLM end it: the text stops just before the stop string (which is not returned), the tokens up to
the one that completed it are kept (and counted), ``finish_reason`` is ``"stop"``. Decoding ends
there: an engine checks after every step (:class:`StopStrings`), not after ``max_tokens``.

A stream sends text as it is decoded, except a tail that could still be the start of a stop
string (:func:`final_text`): what it sent is then always a prefix of the reply's text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# Tokens decoded before a step's new ones when scanning for a stop string: a stop string of ``n``
# characters spans at most ``4 n`` byte-level tokens, plus a few for a character split across tokens.
WINDOW_SLACK = 8


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Where the earliest stop string in ``text`` begins (among those beginning at ``start`` or later);
    None when none occurs."""
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` up to the first stop string (excluded); all of it when none occurs."""
    at = find_stop(text, stops)
    return text if at is None else text[:at]


def held_back(text: str, stops: Sequence[str]) -> int:
    """Characters at the end of ``text`` that could begin a stop string: the longest suffix of ``text``
    that is a proper prefix of one (0 when none)."""
    longest = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:n]):
                longest = n
                break
    return longest


def final_text(text: str, stops: Sequence[str]) -> str:
    """The part of a growing reply's ``text`` that is final: up to the first stop string when one
    occurs, else all but what :func:`held_back` keeps back. Always a prefix of the reply's text."""
    at = find_stop(text, stops)
    return text[:at] if at is not None else text[: len(text) - held_back(text, stops)]


class StopStrings:
    """One row's stop strings over its growing reply (token ids, decoded by ``decode``).

    Each step decodes only a window of the reply's last tokens (the step's new ones and enough
    before them to hold a stop string), so a step costs the same however long the reply: an
    occurrence ending before the step was found at its own step.
    """

    def __init__(self, stops: Sequence[str], decode: Callable[[list[int]], str]):
        if not stops or not all(stops):
            raise ValueError(f"stop strings must be non-empty, got {list(stops)!r}")
        self.stops, self.decode = tuple(stops), decode
        self.window = 4 * max(len(s) for s in stops) + WINDOW_SLACK

    def scan(self, tokens: list[int], new: int) -> int | None:
        """``tokens`` (the reply) grew by its last ``new``: how many tokens it keeps when a stop string now
        occurs (up to the token that completed it), or None when none does."""
        start = max(0, len(tokens) - new - self.window)
        if find_stop(self.decode(tokens[start:]), self.stops) is None:
            return None
        for keep in range(len(tokens) - new + 1, len(tokens)):
            if find_stop(self.decode(tokens[start:keep]), self.stops) is not None:
                return keep
        return len(tokens)
