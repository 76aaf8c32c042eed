"""Engines behind one async interface, chosen by name through :class:`EngineConfig`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams

__all__ = ["Completion", "Engine", "EngineConfig", "EngineStats", "SamplingParams", "make_engine"]


class EngineConfig(BaseModel):
    """Which backend runs the model, and how."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: Literal["hf"] = Field("hf", description="Backend: 'hf' = transformers (CPU or CUDA).")
    model: str = Field("smollm2-135m", description="Registered model name, HF model directory or .gguf file.")
    device: str = Field("auto", description="'auto', 'cpu', 'cuda' or 'cuda:N'.")
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = Field("auto", description="'auto' = bf16 where the hardware is fast at it.")
    max_batch_size: int = Field(16, gt=0, description="Most requests the engine puts in one forward pass.")


def make_engine(config: EngineConfig) -> Engine:
    """Build the engine ``config`` names (loads the model)."""
    from memagent.models import resolve_model

    if config.engine == "hf":
        from memagent.engines.hf import TransformersEngine

        return TransformersEngine(
            resolve_model(config.model),
            device=config.device,
            dtype=config.dtype,
            max_batch_size=config.max_batch_size,
            name=config.model if "/" not in config.model else None,
        )
    raise ValueError(f"unknown engine {config.engine!r}")  # pragma: no cover - Literal guards it
