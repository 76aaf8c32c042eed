"""Engines behind one async interface, chosen by name through :class:`EngineConfig`.

- ``hf``: transformers in this process (CPU or CUDA), batching concurrent requests.
- ``vllm``: vLLM's async engine (GPU), continuous batching and prefix caching.
- ``openai``: any OpenAI-compatible chat endpoint (``vllm serve``, ``memagent serve``, ...).
"""

from __future__ import annotations

from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams
from memagent.engines.config import EngineConfig
from memagent.models import DEFAULT_MODEL

__all__ = ["DEFAULT_MODEL", "Completion", "Engine", "EngineConfig", "EngineStats", "SamplingParams", "make_engine"]


def make_engine(config: EngineConfig) -> Engine:
    """Build the engine ``config`` names (loads the model, or connects to the endpoint)."""
    if config.engine == "hf":
        from memagent.engines.hf import TransformersEngine
        from memagent.models import resolve_model

        return TransformersEngine(
            resolve_model(config.model),
            device=config.device,
            dtype=config.dtype,
            max_batch_size=config.max_batch_size,
            name=config.model if "/" not in config.model else None,
            context_window=config.context_window,
            speculate=config.speculates(),
            speculative_tokens=config.speculative_tokens,
            prompt_lookup_min=config.prompt_lookup_min,
            prompt_lookup_max=config.prompt_lookup_max,
        )
    if config.engine == "vllm":
        from memagent.engines.vllm import VLLMEngine

        return VLLMEngine.from_config(config)
    if config.engine == "openai":
        from memagent.engines.openai import OpenAIEngine

        return OpenAIEngine.from_config(config)
    raise ValueError(f"unknown engine {config.engine!r}")  # pragma: no cover - Literal guards it
