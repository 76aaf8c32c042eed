"""Engines behind one async interface, chosen by name through :class:`EngineConfig`.

- ``hf``: transformers in this process (CPU or CUDA), batching concurrent requests.
- ``vllm``: vLLM's async engine (GPU), continuous batching and prefix caching.
- ``openai``: any OpenAI-compatible chat endpoint (``vllm serve``, ``memagent serve``, ...).
"""

from __future__ import annotations

import importlib

from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams
from memagent.engines.config import EngineConfig
from memagent.models import DEFAULT_MODEL

__all__ = ["DEFAULT_MODEL", "Completion", "Engine", "EngineConfig", "EngineStats", "SamplingParams", "make_engine"]


# Engine name -> its class, imported only when used (vllm and torch are heavy, and optional).
_ENGINES = {
    "hf": "memagent.engines.hf:TransformersEngine",
    "vllm": "memagent.engines.vllm:VLLMEngine",
    "openai": "memagent.engines.openai:OpenAIEngine",
}


def make_engine(config: EngineConfig) -> Engine:
    """Build the engine ``config`` names (loads the model, or connects to the endpoint)."""
    module, cls = _ENGINES[config.engine].split(":")
    return getattr(importlib.import_module(module), cls).from_config(config)
