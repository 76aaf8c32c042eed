"""The counting half of an engine: its tokenizer and context window, without loading weights.

Budget checks (:func:`memagent.agent.check_config`) need only these, so a job runs them before
it starts any actor: a field list over ``query_tokens`` or budgets over the window are one line
at once, not an error from inside a worker after the model has loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memagent.engines.base import Engine
from memagent.engines.config import EngineConfig


@dataclass(frozen=True)
class TokenBudget:
    """What an engine of a config will count with: ``tokenizer`` and ``context_window``."""

    tokenizer: Any
    context_window: int

    encode_chat = Engine.encode_chat
    count_chat_tokens = Engine.count_chat_tokens


def token_budget(config: EngineConfig) -> TokenBudget:
    """The tokenizer and window the engine ``config`` describes will have (as its ``from_config`` sets them).

    hf and openai: ``context_window`` or the model config's ``max_position_embeddings``; vllm: the
    smaller of ``max_model_len`` and ``context_window`` (``VLLMEngine`` caps one by the other), else
    the model's own.
    """
    from memagent.models import load_tokenizer, model_context_window

    name = config.tokenizer or config.model if config.engine != "hf" else config.model
    windows = [config.context_window] + ([config.max_model_len] if config.engine == "vllm" else [])
    window = min((w for w in windows if w), default=None)
    return TokenBudget(load_tokenizer(name), window or model_context_window(name))
