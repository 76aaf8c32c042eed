"""Engines behind one async interface, chosen by name through :class:`EngineConfig`.

- ``hf``: transformers in this process (CPU or CUDA), batching concurrent requests.
- ``vllm``: vLLM's async engine (GPU), continuous batching and prefix caching.
- ``openai``: any OpenAI-compatible chat endpoint (``vllm serve``, ``memagent serve``, ...).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams

__all__ = ["Completion", "Engine", "EngineConfig", "EngineStats", "SamplingParams", "make_engine"]

EngineName = Literal["hf", "vllm", "openai"]

# Options that only one backend reads, with their defaults: setting one for another backend is a
# mistake we reject rather than ignore.
_OPENAI_ONLY = {"endpoint": None, "api_key_env": "OPENAI_API_KEY", "served_model": None,
                "max_concurrency": 16, "request_timeout_s": 120.0, "max_retries": 5}
_VLLM_ONLY = {"tensor_parallel_size": 1, "gpu_memory_utilization": 0.85, "max_model_len": None,
              "quantization": None, "enable_prefix_caching": True, "enable_sleep_mode": False}
_LOCAL_ONLY = {"max_batch_size": 16, "device": "auto", "dtype": "auto"}  # hf and vllm


class EngineConfig(BaseModel):
    """Which backend runs the model, and how."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: EngineName = Field("hf", description="Backend: 'hf' (transformers), 'vllm' or 'openai' (remote endpoint).")
    model: str = Field("smollm2-135m", description=(
        "Registered model name, HF model directory or .gguf file. For 'openai' it names the local "
        "tokenizer used for chunking and budgets (see `tokenizer`) and, by default, the served model."))
    device: str = Field("auto", description="'auto', 'cpu', 'cuda' or 'cuda:N' (hf, vllm).")
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = Field("auto", description="'auto' = bf16 where the hardware is fast at it.")
    max_batch_size: int = Field(16, gt=0, description="Most requests in one forward pass (hf; vllm: max_num_seqs).")
    tokenizer: str | None = Field(None, description="Tokenizer (registered name or HF directory) when it differs from `model`.")
    context_window: int | None = Field(None, gt=0, description=(
        "Override the model's context window (prompt + reply tokens). Needed for 'openai' when the "
        "tokenizer's model config does not state the served window."))
    # -- openai --
    endpoint: str | None = Field(None, description="openai: base URL of the API, e.g. http://host:8000/v1.")
    api_key_env: str = Field("OPENAI_API_KEY", description="openai: environment variable holding the API key (may be unset).")
    served_model: str | None = Field(None, description="openai: model name sent to the endpoint (default: `model`).")
    max_concurrency: int = Field(16, gt=0, description="openai: most requests in flight at once.")
    request_timeout_s: float = Field(120.0, gt=0, description="openai: timeout of one HTTP request.")
    max_retries: int = Field(5, ge=0, description="openai: retries on 429/5xx/connection errors, with exponential backoff.")
    # -- vllm --
    tensor_parallel_size: int = Field(1, gt=0, description="vllm: GPUs one engine shards the model over.")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="vllm: fraction of GPU memory the engine may take.")
    max_model_len: int | None = Field(None, gt=0, description="vllm: context length to allocate (default: the model's).")
    quantization: str | None = Field(None, description="vllm: quantization method, e.g. 'fp8', 'awq', 'gguf'.")
    enable_prefix_caching: bool = Field(True, description="vllm: reuse KV of shared prompt prefixes.")
    enable_sleep_mode: bool = Field(False, description="vllm: allow sleep()/wake_up() to share a GPU with a trainer.")

    @model_validator(mode="after")
    def _check_backend_options(self) -> EngineConfig:
        owned = [(("openai",), _OPENAI_ONLY), (("vllm",), _VLLM_ONLY), (("hf", "vllm"), _LOCAL_ONLY)]
        for backends, options in owned:
            if self.engine in backends:
                continue
            wrong = [k for k, default in options.items() if getattr(self, k) != default]
            if wrong:
                raise ValueError(f"{', '.join(wrong)}: apply only to engine {' or '.join(backends)}, not {self.engine!r}")
        if self.engine == "openai":
            if not self.endpoint:
                raise ValueError("engine 'openai' needs endpoint (base URL, e.g. http://127.0.0.1:8000/v1)")
            if not self.endpoint.startswith(("http://", "https://")):
                raise ValueError(f"endpoint must be an http(s) URL, got {self.endpoint!r}")
        if self.engine == "vllm" and self.device == "cpu" and self.tensor_parallel_size > 1:
            raise ValueError("tensor_parallel_size > 1 needs GPUs (device is 'cpu')")
        return self


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
        )
    if config.engine == "vllm":
        from memagent.engines.vllm import VLLMEngine

        return VLLMEngine.from_config(config)
    if config.engine == "openai":
        from memagent.engines.openai import OpenAIEngine

        return OpenAIEngine.from_config(config)
    raise ValueError(f"unknown engine {config.engine!r}")  # pragma: no cover - Literal guards it
