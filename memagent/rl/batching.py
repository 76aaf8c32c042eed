"""Conversations -> padded tensors -> response log-probs: what the loss is computed on.

Each trained conversation is one row ``prompt_ids + response_ids``; only the response tokens
carry loss. Rows are left-padded, so every response ends at the right edge of its row and the
policy needs logits only for the last ``T + 1`` positions (``T``: the longest response).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from memagent.rl.loss import entropy_from_logits, masked_mean, token_log_probs
from memagent.rl.rollout import Conversation


@dataclass
class Sample:
    """A conversation ready for the loss: its advantage and (after scoring) its log-probs."""

    conv: Conversation
    advantage: float
    old_logp: torch.Tensor | None = None  # [T_i] recomputed by the policy before the update
    ref_logp: torch.Tensor | None = None  # [T_i] under the reference (initial) policy

    @property
    def length(self) -> int:
        return len(self.conv.prompt_ids) + len(self.conv.response_ids)


def micro_batches(samples: Sequence[Sample], token_budget: int, *, max_rows: int | None = None) -> list[list[Sample]]:
    """Split into micro-batches whose padded size (rows x longest row) stays within the budget.

    Samples are sorted by length first (less padding); a sample longer than the budget gets a
    micro-batch of its own; ``max_rows`` caps the rows of one. Example: lengths [10, 30, 12, 28],
    budget 60 -> [[10, 12], [28, 30]]; with ``max_rows=1`` -> [[10], [12], [28], [30]].
    """
    out: list[list[Sample]] = []
    cur: list[Sample] = []
    for s in sorted(samples, key=lambda s: s.length):
        if cur and ((len(cur) + 1) * s.length > token_budget or (max_rows is not None and len(cur) >= max_rows)):
            out.append(cur)
            cur = []
        cur.append(s)
    if cur:
        out.append(cur)
    return out


def collate(samples: Sequence[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-padded ``prompt + response`` rows; response tokens right-aligned in ``[B, T]``.

    Returns ``input_ids, attention_mask, position_ids [B, L]``, ``targets, response_mask
    [B, T]`` (T = longest response), ``response_lengths`` and ``advantages [B]``. Left padding
    puts every response at the end of its row, so the policy needs logits only for the last
    ``T + 1`` positions. Position ids count real tokens only, as during generation.
    """
    L = max(s.length for s in samples)
    T = max(len(s.conv.response_ids) for s in samples)
    B = len(samples)
    input_ids = torch.full((B, L), pad_id, dtype=torch.long)
    attention = torch.zeros((B, L), dtype=torch.long)
    targets = torch.full((B, T), pad_id, dtype=torch.long)
    response_mask = torch.zeros((B, T), dtype=torch.float32)
    for i, s in enumerate(samples):
        ids = s.conv.prompt_ids + s.conv.response_ids
        r = len(s.conv.response_ids)
        input_ids[i, L - len(ids):] = torch.tensor(ids)
        attention[i, L - len(ids):] = 1
        if r:
            targets[i, T - r:] = torch.tensor(s.conv.response_ids)
            response_mask[i, T - r:] = 1.0 if s.conv.trainable else 0.0
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    lengths = torch.tensor([len(s.conv.response_ids) for s in samples], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids,
            "targets": targets, "response_mask": response_mask, "response_lengths": lengths,
            "advantages": advantages}


ENTROPY_CHUNK_ELEMENTS = 2**24
"""Logits elements (64 MiB in fp32) per slice of the entropy statistic: it takes four [rows, T, V]
temporaries, the largest transient of a micro-batch if computed for all rows at once."""


def response_log_probs(
    model: torch.nn.Module, batch: Mapping[str, torch.Tensor], *, temperature: float = 1.0, entropy: bool = False,
    per_row: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``[B, T]`` of the response tokens (and their entropies ``[B, T]`` if asked).

    Logits at position p predict token p+1: the last ``T + 1`` positions' logits, minus the
    final one, line up with the right-aligned ``targets``. Only those positions get logits
    (``logits_to_keep``): ``[B, T + 1, V]``, never ``[B, L, V]``.

    ``per_row`` (default: on CPU) runs each row alone without its padding: a padding mask sends
    CPU attention down a path that materialises ``[B, heads, L, L]`` scores per layer (the largest
    activation of a micro-batch, and ~2x slower), while an unpadded causal row takes the fused
    kernel; each row also gets logits for its own response only (``[r_i + 1, V]``, not
    ``[T + 1, V]``). The response positions' values are the same; the others are 0.
    """
    device = next(model.parameters()).device
    if per_row if per_row is not None else device.type == "cpu":
        return _per_row_log_probs(model, batch, device, temperature=temperature, entropy=entropy)
    T = batch["targets"].shape[1]
    out = model(
        input_ids=batch["input_ids"].to(device),
        attention_mask=batch["attention_mask"].to(device),
        position_ids=batch["position_ids"].to(device),
        logits_to_keep=T + 1,
        use_cache=False,
    )
    logits = out.logits[:, -(T + 1):-1, :]  # [B, T, V]
    logp = token_log_probs(logits, batch["targets"].to(device), temperature)  # [B, T]
    return logp, (_entropy(logits, temperature) if entropy else None)


def _per_row_log_probs(model: torch.nn.Module, batch: Mapping[str, torch.Tensor], device: torch.device, *,
                       temperature: float, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`response_log_probs` one unpadded row at a time; rows are left-padded to ``[B, T]`` again."""
    L, T = batch["input_ids"].shape[1], batch["targets"].shape[1]
    logps, ents = [], []
    lengths = batch["attention_mask"].sum(-1).tolist()
    for i, (n, r) in enumerate(zip(lengths, batch["response_lengths"].tolist())):
        keep = r + 1  # the prediction of each response token, from the position before it
        out = model(input_ids=batch["input_ids"][i:i + 1, L - n:].to(device), logits_to_keep=keep, use_cache=False)
        logits = out.logits[:, :-1, :]  # [1, keep - 1, V]
        targets = batch["targets"][i:i + 1, T - (keep - 1):].to(device)
        logps.append(torch.nn.functional.pad(token_log_probs(logits, targets, temperature), (T - (keep - 1), 0)))
        if entropy:
            ents.append(torch.nn.functional.pad(_entropy(logits, temperature), (T - (keep - 1), 0)))
    return torch.cat(logps), (torch.cat(ents) if entropy else None)


def _entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-position entropy ``[B, T]`` of ``logits [B, T, V]``; logged only, so no graph, a few rows at a time."""
    rows = max(1, ENTROPY_CHUNK_ELEMENTS // max(1, logits.shape[1] * logits.shape[2]))
    with torch.no_grad():
        return torch.cat([entropy_from_logits(part / temperature) for part in logits.detach().split(rows)])


@torch.no_grad()
def score_samples(
    model: torch.nn.Module, samples: Sequence[Sample], *, pad_id: int, token_budget: int, temperature: float
) -> list[torch.Tensor]:
    """``model``'s log-probs of each sample's response tokens, in ``samples`` order: ``[T_i]`` each (CPU, fp32).

    Used for the old-policy and the reference log-probs (no graph is kept).
    """
    out: dict[int, torch.Tensor] = {}
    for mb in micro_batches(samples, token_budget):
        logp, _ = response_log_probs(model, collate(mb, pad_id), temperature=temperature)
        for i, s in enumerate(mb):
            r = len(s.conv.response_ids)
            out[id(s)] = logp[i, logp.shape[1] - r:].float().cpu() if r else torch.zeros(0)
    return [out[id(s)] for s in samples]


def stack_right(values: Sequence[torch.Tensor], T: int) -> torch.Tensor:
    """Right-align 1-D tensors into ``[B, T]`` (zeros on the left), matching :func:`collate`."""
    out = torch.zeros((len(values), T))
    for i, v in enumerate(values):
        if v.numel():
            out[i, T - v.numel():] = v
    return out


def behaviour_gap(samples: Sequence[Sample], old_logp: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean |old - behaviour| log-prob over masked tokens ``[B, T]``: how far the rollout engine's
    numbers are from the trainer's (dtype, kernels, padding). 0.0 when the engine gave none."""
    if any(s.conv.behaviour_logprobs is None for s in samples):
        return 0.0
    beh = stack_right([torch.tensor(s.conv.behaviour_logprobs) for s in samples], old_logp.shape[1])
    return masked_mean((old_logp.float().cpu() - beh).abs(), mask.cpu()).item()
