"""The sampling distribution a row would use without speculation: temperature, then the top-p nucleus."""

from __future__ import annotations

import math

import torch


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
