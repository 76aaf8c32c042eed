"""Incremental detokenization: a streamed reply's text, each step decoding only its last few tokens.

Decoding the whole reply at every step costs O(n) a token, O(n^2) a reply (4.6 s of event-loop CPU
for one 4,096-token stream). :class:`IncrementalText` keeps two offsets into the reply's ids, as
vLLM's and TGI's detokenizers do: ``prefix`` (where the last emitted token's context starts) and
``read`` (the ids already turned into text). A step decodes ``ids[prefix:read]`` and ``ids[prefix:]``
and emits what the second adds to the first, so each step decodes a window of a few tokens. A step
that ends inside a character (a byte-level token holding only some of its UTF-8 bytes decodes to
U+FFFD) emits up to the step's last token boundary that ends a character, and waits for the rest;
so a window spans at most the tokens since the last two such boundaries, whatever the step sizes (a
word boundary is one). The text emitted is a prefix of the whole reply's decode;
:meth:`IncrementalText.rest` gives what is left once the reply is complete.

Both offsets sit at points where the decoded text ended on a whole character, so a window never
starts inside one. Tokenizers whose decode joins tokens with context-dependent spacing (SentencePiece's
leading ``▁``) get that context from the prefix window, the reason it is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class IncrementalText:
    """The text of a reply whose token ids arrive a few at a time (``decode``: ids -> text, special
    tokens skipped, as the engine decodes the whole reply)."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.prefix = self.read = 0
        self.text = ""  # everything emitted so far

    def add(self, new: Sequence[int]) -> str:
        """The text ``new`` (the next ids of the reply) completes, up to its last whole character ("" if none)."""
        tried = len(self.ids)  # boundaries up to here failed against this same ``before`` in earlier steps
        self.ids.extend(new)
        if len(self.ids) == self.read:
            return ""
        before = self.decode(self.ids[self.prefix:self.read]) if self.read > self.prefix else ""
        # The step's end, else its last token boundary on a whole character: a step ending inside one
        # must not hold the window open until some later step happens to end on a boundary.
        for end in range(len(self.ids), max(self.read, tried), -1):
            after = self.decode(self.ids[self.prefix:end])
            if len(after) > len(before) and not after.endswith(REPLACEMENT) and after.startswith(before):
                delta = after[len(before):]
                self.prefix, self.read = self.read, end
                self.text += delta
                return delta
            if end == len(self.ids) and not after.endswith(REPLACEMENT):
                return ""  # no character cut: nothing new to show yet (spacing a later token decides)
        return ""

    def rest(self) -> str:
        """What the whole reply's decode holds beyond :attr:`text` (the reply complete: a trailing
        unfinished character as U+FFFD, as the whole decode writes it)."""
        whole = self.decode(self.ids)
        return whole[len(self.text):] if whole.startswith(self.text) else whole
