"""The hf engine's path for models with a sliding attention window: ``model.generate`` with its own
sliding-window cache, one sampling setting per batch, no speculation and no constraints; each row keeps its
own ``max_tokens``, stop tokens and stop strings (stopping criteria), and replies end with (and include) EOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from memagent.engines.base import SamplingParams
from memagent.engines.stop import StopStrings


class _PerRowTokenLimit(StoppingCriteria):
    """Stops row i once it has generated ``limits[i]`` tokens."""

    def __init__(self, prompt_len: int, limits: torch.Tensor):
        self.prompt_len = prompt_len
        self.limits = limits

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        generated = input_ids.shape[1] - self.prompt_len
        return (generated >= self.limits).to(input_ids.device)


class _PerRowStop(StoppingCriteria):
    """Stops row i at one of its stop tokens or once one of its stop strings occurs; ``keep[i]``: the
    tokens row i keeps (None until it stops)."""

    def __init__(self, prompt_len: int, stop_ids: list[frozenset[int]], matchers: list[StopStrings | None]):
        self.prompt_len, self.stop_ids, self.matchers = prompt_len, stop_ids, matchers
        self.keep: list[int | None] = [None] * len(matchers)

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        for i, (ids, matcher) in enumerate(zip(self.stop_ids, self.matchers)):
            if self.keep[i] is None and (ids or matcher is not None):
                tokens = input_ids[i, self.prompt_len:].tolist()
                if tokens and tokens[-1] in ids:
                    self.keep[i] = len(tokens)
                elif matcher is not None:
                    self.keep[i] = matcher.scan(tokens, 1)
        return torch.tensor([k is not None for k in self.keep], device=input_ids.device)


def chosen_log_probs(step_logits: Sequence[torch.Tensor], tokens: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-prob ``[B, T]`` (CPU) of each generated token under ``softmax(logits / temperature)``.

    ``step_logits`` are generate's ``T`` raw ``[B, V]`` logits. One step at a time: stacking them
    first would hold four ``[B, T, V]`` fp32 copies (2 GB for 16 rows of 160 tokens at a 49K vocab).
    """
    cols = []
    for t, logits in enumerate(step_logits):
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        cols.append(logp.gather(-1, tokens[:, t : t + 1].to(logp.device)).cpu())
    return torch.cat(cols, dim=1)


@dataclass
class SlidingReply:
    """One row's reply: its tokens, whether it stopped (EOS, a stop token or string) rather than hit its
    limit, and the tokens' log-probs (None unless asked for)."""

    tokens: list[int]
    stopped: bool
    logprobs: list[float] | None


@torch.inference_mode()
def generate_sliding(model: Any, prompts: list[list[int]], params: list[SamplingParams],
                     stop_strings: list[StopStrings | None], pad_id: int, eos_ids: set[int],
                     device: str) -> list[SlidingReply]:
    """The replies to ``prompts`` (left-padded into one batch) under ``params[0]``'s sampling settings and
    each row's own limit and stops. Shapes: input [B, L], output [B, L + T]."""
    prompt_len = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), prompt_len), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), prompt_len), dtype=torch.long)
    for i, ids in enumerate(prompts):
        input_ids[i, prompt_len - len(ids) :] = torch.tensor(ids)
        attention[i, prompt_len - len(ids) :] = 1
    limits = torch.tensor([p.max_tokens for p in params])
    stops = _PerRowStop(prompt_len, [frozenset(p.stop_token_ids) for p in params], stop_strings)
    first = params[0]
    sampling: dict[str, Any] = (
        {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        if first.greedy
        else {"do_sample": True, "temperature": first.temperature, "top_p": first.top_p, "top_k": 0}
    )
    out = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        max_new_tokens=int(limits.max()),
        stopping_criteria=StoppingCriteriaList([_PerRowTokenLimit(prompt_len, limits), stops]),
        pad_token_id=pad_id,
        eos_token_id=sorted(eos_ids),
        return_dict_in_generate=True,
        output_logits=first.logprobs,
        **sampling,
    )
    new_tokens = out.sequences[:, prompt_len:].cpu()
    step_logprobs = None
    if first.logprobs:
        step_logprobs = chosen_log_probs(out.logits, new_tokens, 1.0 if first.greedy else first.temperature)
    replies = []
    for i, p in enumerate(params):
        tokens = new_tokens[i, : stops.keep[i] or p.max_tokens].tolist()
        stop_at = next((j for j, t in enumerate(tokens) if t in eos_ids), None)
        if stop_at is not None:
            tokens = tokens[: stop_at + 1]  # the response ends with (and includes) EOS
        logprobs = step_logprobs[i, : len(tokens)].tolist() if step_logprobs is not None else None
        replies.append(SlidingReply(tokens, stop_at is not None or stops.keep[i] is not None, logprobs))
    return replies
