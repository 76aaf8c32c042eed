"""The per-row decoding constraint the hf engine's decode loop applies (e.g. a JSON-Schema grammar).

One instance per request, created by the engine from ``SamplingParams.json_schema``. The loop
asks for the allowed tokens before each sampled position and advances the constraint with the
token it keeps; constrained rows never draft, so no token is ever taken back.
"""

from __future__ import annotations

from typing import Protocol

import torch


class TokenConstraint(Protocol):
    """Which tokens may come next; the state advances one token at a time."""

    def mask_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ``[V]`` (or ``[V']`` padded past the tokenizer) with disallowed tokens at -inf.

        May modify in place; returns the masked tensor.
        """

    def accept(self, token: int) -> bool:
        """Advance past ``token``; False (state unchanged) if the grammar does not allow it."""

    def is_finished(self) -> bool:
        """The tokens accepted so far form a complete value; the row should stop (as at EOS)."""
