"""Transformers engine: CPU (and CUDA) generation that batches concurrent requests.

Every ``chat`` call enqueues its tokenised prompt and awaits a future. One worker coroutine
per event loop takes whatever is pending (up to ``max_batch_size``), prefills it into one
reserved KV cache and runs the engine's own decode loop (:mod:`memagent.engines.hf_decode`)
in a thread, so the event loop keeps accepting requests from other documents while the model
works. On CPU, padded prompts are prefilled row by row (the causal attention kernel, no mask),
and only decoding is batched. With the prefix cache (:mod:`memagent.engines.prefix_cache`, on by
default) every batch is prefilled row by row, and each row computes only the part of its prompt
whose KV is not cached already (the instructions and question every call of a job starts with are
computed once). Each row keeps its own ``max_tokens``, sampling settings,
log-probs and JSON-Schema constraint, so requests of any settings share a batch. Decoding
speculates (:mod:`memagent.engines.speculation`): drafts by prompt lookup and by aligning the
reply with its prompt, which holds the previous memory; the output is the model's.
Models with a sliding attention window fall back to ``model.generate`` without speculation
(:mod:`memagent.engines.hf_sliding`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from memagent.engines.base import Completion, Engine, EngineStats, Messages, SamplingParams
from memagent.engines.config import EngineConfig
from memagent.engines.constraint import TokenConstraint
from memagent.engines.gqa_attention import use_gqa_sdpa
from memagent.engines.hf_decode import DecodeLoop, Row, Speculation
# chosen_log_probs: the sliding-window path's log-probs, public here since before that path had its module.
from memagent.engines.hf_sliding import chosen_log_probs, generate_sliding  # noqa: F401
from memagent.engines.kv_cache import ReservedCache
from memagent.engines.prefix_cache import PrefixCache
from memagent.engines.speculation import AcceptanceTracker, CostModel
from memagent.engines.stop import StopStrings, cut_at_stop
from memagent.models import quiet_weight_loading

log = logging.getLogger(__name__)


def cpu_has_bf16_matmul() -> bool:
    """True when the CPU has bf16 matrix/vector units (AMX or AVX512-BF16)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def default_dtype(device: str) -> torch.dtype:
    """bf16 where the hardware runs it fast, else fp32."""
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_bf16_matmul() else torch.float32


def resolve_dtype(dtype: str | torch.dtype, device: str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return default_dtype(device)
    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
             "float16": torch.float16, "fp32": torch.float32, "float32": torch.float32}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, bf16, fp16 or fp32")
    return names[dtype]


def _left_pad(rows: list[torch.Tensor], length: int) -> torch.Tensor:
    """Rows ``[H, n_i, D]`` → ``[B, H, length, D]``, each right-aligned, zeros before."""
    out = rows[0].new_zeros((len(rows), rows[0].shape[0], length, rows[0].shape[-1]))
    for i, row in enumerate(rows):
        out[i, :, length - row.shape[1]:] = row
    return out


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future
    constraint: TokenConstraint | None = None
    on_tokens: Callable[[list[int]], None] | None = None
    cached_tokens: int = 0  # prompt tokens whose KV the prefix cache held (set by the prefill)


class TransformersEngine(Engine):
    """A Hugging Face causal LM behind the async engine interface; build it with :meth:`from_config`.

    Args:
        model_dir: local HF model directory (config + safetensors + tokenizer): ``config.model``
            resolved (:meth:`from_config` does that).
        config: device, dtype, ``max_batch_size``, ``context_window`` and speculation are read
            from it (its defaults are the engine's).
        batch_wait_s: how long the worker waits after the first pending request for others to join.
        name: model name reported in outputs (default: the directory name).
    """

    IDLE_EXIT_S = 1.0  # the batcher task exits after this long without requests

    def __init__(self, model_dir: str | Path, config: EngineConfig, *, batch_wait_s: float = 0.01,
                 name: str | None = None):
        if config.engine != "hf":
            raise ValueError(f"TransformersEngine needs an EngineConfig with engine='hf', got {config.engine!r}")
        device = config.device
        self.device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.max_batch_size = config.max_batch_size
        self.batch_wait_s = batch_wait_s
        self.name = name or Path(model_dir).name
        t0 = time.perf_counter()
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.tokenizer.padding_side = "left"
        with quiet_weight_loading():
            self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=self.dtype).to(self.device).eval()
        use_gqa_sdpa(self.model)  # verification forwards without copying the KV cache (same bits)
        self.load_seconds = time.perf_counter() - t0
        log.info("loaded %s (%s, %s) in %.1f s", self.name, self.device, self.dtype, self.load_seconds)
        gen_eos = self.model.generation_config.eos_token_id
        eos = gen_eos if gen_eos is not None else self.tokenizer.eos_token_id
        self.eos_ids: set[int] = set(eos if isinstance(eos, list) else [eos])
        pad = self.tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)
        self.context_window = config.context_window or int(getattr(self.model.config, "max_position_embeddings", 2048))
        text_config = self.model.config.get_text_config(decoder=True)
        self._sliding_window = bool(getattr(text_config, "sliding_window", None))
        self.num_layers = int(text_config.num_hidden_layers)
        self.stats = EngineStats()
        # KV of prompt prefixes already prefilled (None: off); a sliding-window model decodes through generate.
        self.prefix_cache = (PrefixCache(config.prefix_cache_mib * 2**20)
                             if config.enable_prefix_caching and not self._sliding_window else None)
        self.speculation = Speculation.from_config(config)
        # Forward cost (adaptive draft length): the device's prior, refitted only with draft_learning.
        self.cost = CostModel.for_device(self.device)
        # With draft_learning, the running acceptance over all rows per drafter: each new row's prior.
        self.acceptance: dict[str, AcceptanceTracker] = {}
        self._queue: asyncio.Queue[_Request] | None = None
        self._worker: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_config(cls, config: EngineConfig, **kwargs: Any) -> TransformersEngine:
        """The engine ``config`` describes; loads the model locally (``kwargs`` go to ``__init__``)."""
        from memagent.models import resolve_model

        kwargs.setdefault("name", config.model if "/" not in config.model else None)
        return cls(resolve_model(config.model), config, **kwargs)

    # -- public API -------------------------------------------------------------------------

    takes_prompt_ids = True
    masks_special_tokens = True  # memagent.engines.grammar keeps them out of constrained replies

    @property
    def streams_tokens(self) -> bool:  # type: ignore[override]  # a sliding-window model decodes in one call
        return not self._sliding_window

    async def chat(self, messages: Messages, params: SamplingParams, *,
                   on_tokens: Callable[[list[int]], None] | None = None) -> Completion:
        """The reply; ``on_tokens`` (optional) is called from the decode thread with each step's new
        tokens as they are kept (streaming; not for sliding-window models, which decode in one call)."""
        return await self.chat_ids(self.encode_chat(messages), params, on_tokens=on_tokens)

    async def chat_ids(self, prompt_ids: list[int], params: SamplingParams, *,
                       on_tokens: Callable[[list[int]], None] | None = None) -> Completion:
        """:meth:`chat` of a prompt already encoded (the server encodes it once, off the event loop)."""
        self.check_window(len(prompt_ids), params.max_tokens)
        constraint = self._constraint(params.json_schema) if params.json_schema is not None else None
        self._ensure_worker()
        assert self._queue is not None
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Request(prompt_ids, params, future, constraint, on_tokens))
        return await future

    def _constraint(self, schema_json: str) -> TokenConstraint:
        if self._sliding_window:
            raise ValueError(f"json_schema: the hf engine cannot constrain {self.name} (a sliding-window model "
                             "decodes through model.generate); use the vllm or openai engine")
        from memagent.engines.grammar import make_constraint  # lazily: the grammar library loads only when used

        return make_constraint(schema_json, self.tokenizer, int(self.model.config.get_text_config().vocab_size))

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            self._worker = None

    # -- batching ---------------------------------------------------------------------------

    def _ensure_worker(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (asyncio.run per call): its own queue
            self._loop, self._queue, self._worker = loop, asyncio.Queue(), None
        if self._worker is None or self._worker.done():  # the queue is kept: nothing put in it is dropped
            self._worker = loop.create_task(self._serve(), name="hf-engine-batcher")

    async def _serve(self) -> None:
        assert self._queue is not None
        queue = self._queue
        while True:
            try:
                pending = [await asyncio.wait_for(queue.get(), timeout=self.IDLE_EXIT_S)]
            except asyncio.TimeoutError:
                # Idle: end quietly, so no batcher is left pending when its event loop closes;
                # the next chat() starts a new one (it checks done()). A request put after the wait
                # timed out but before this task ran again is still queued: serve it, never orphan it.
                if queue.empty():
                    return
                continue
            await asyncio.sleep(self.batch_wait_s)
            while not queue.empty():
                pending.append(queue.get_nowait())
            # The decode loop takes per-row settings: everything shares a forward (at most
            # max_batch_size per forward); model.generate (sliding window) needs one setting per batch.
            groups: dict[tuple, list[_Request]] = {}
            for req in pending:
                p = req.params
                key = (p.greedy, p.temperature, p.top_p, p.logprobs) if self._sliding_window else ()
                groups.setdefault(key, []).append(req)
            for reqs in groups.values():
                # Longest prompts together: less padding per batch.
                reqs.sort(key=lambda r: len(r.prompt_ids))
                for i in range(0, len(reqs), self.max_batch_size):
                    batch = [r for r in reqs[i : i + self.max_batch_size] if not r.future.cancelled()]
                    if not batch:
                        continue
                    try:
                        completions = await asyncio.to_thread(self._generate, batch)
                    except Exception as exc:  # the batch fails, the engine keeps serving
                        for r in batch:
                            if not r.future.done():
                                r.future.set_exception(exc)
                        continue
                    for r, c in zip(batch, completions):
                        if not r.future.done():
                            r.future.set_result(c)

    @torch.inference_mode()
    def _generate(self, batch: list[_Request]) -> list[Completion]:
        """Prefill ``batch`` into one reserved cache, then run the decode loop over it."""
        if self._sliding_window:
            return self._generate_sliding(batch)
        spec = self.speculation
        prompt_len = max(len(r.prompt_ids) for r in batch)
        # Room for the longest reply, one draft, and some holes left by rows accepting less than others.
        longest = max(r.params.max_tokens for r in batch)
        holes = longest // 4 if len(batch) > 1 and spec.max_draft else 0
        capacity = prompt_len + longest + spec.max_draft + 1 + holes
        cache, prefix_mask = self._prefill(batch, prompt_len, capacity)
        rows = [Row(r.prompt_ids, r.params.max_tokens, r.params.temperature, r.params.top_p, r.params.logprobs,
                    r.constraint, generator=self._generator(r.params.seed), abandoned=r.future.cancelled,
                    on_tokens=r.on_tokens, stop_ids=frozenset(r.params.stop_token_ids),
                    stop_strings=self._stop_strings(r.params)) for r in batch]
        loop = DecodeLoop(self.model, self.eos_ids, self.pad_id, spec, self.cost,
                          self.acceptance if spec.learn else None)
        loop.run(rows, cache, prefix_mask)
        self.stats.batch_sizes[len(batch)] += 1
        return [self._completion(r.prompt_ids, row.tokens, row.stopped, row.token_logprobs if row.logprobs else None,
                                 row, r.params.stop, r.cached_tokens) for r, row in zip(batch, rows)]

    def _stop_strings(self, params: SamplingParams) -> StopStrings | None:
        if not params.stop:
            return None
        return StopStrings(params.stop, lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True))

    def _generator(self, seed: int | None) -> torch.Generator | None:
        """A seeded request's own RNG, on the device that samples (None: the loop's shared one)."""
        if seed is None:
            return None
        return torch.Generator(device=self.model.device).manual_seed(seed)

    def _completion(self, prompt_ids: list[int], tokens: list[int], stopped: bool, logprobs: list[float] | None,
                    row: Row | None = None, stops: tuple[str, ...] = (), cached_tokens: int = 0) -> Completion:
        """The reply of ``tokens``; its text ends before the first of ``stops`` (the tokens are all counted)."""
        return self.stats.count(Completion(
            text=cut_at_stop(self.tokenizer.decode(tokens, skip_special_tokens=True), stops),
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(tokens),
            finish_reason="stop" if stopped else "length",
            prompt_token_ids=prompt_ids,
            cached_prompt_tokens=cached_tokens,
            token_ids=tokens,
            logprobs=logprobs,
            draft_tokens=row.draft_tokens if row else 0,
            accepted_tokens=row.accepted_tokens if row else 0,
            decode_steps=row.decode_steps if row else 0,
        ))

    def _prefill(self, batch: list[_Request], prompt_len: int, capacity: int) -> tuple[ReservedCache, torch.Tensor]:
        """The cache of every prompt but its last token, left-padded to ``prompt_len - 1`` slots.

        Returns the cache and its ``[B, prompt_len - 1]`` mask (1 = a real token).
        """
        n = prompt_len - 1
        prefix_mask = torch.zeros((len(batch), n), dtype=torch.long)
        for i, r in enumerate(batch):
            prefix_mask[i, n - (len(r.prompt_ids) - 1):] = 1
        if self._prefill_per_row(batch):
            return self._prefill_rows(batch, prompt_len, capacity), prefix_mask
        cache = ReservedCache(self.num_layers, capacity)
        if n > 0:
            ids = torch.full((len(batch), n), self.pad_id, dtype=torch.long)
            for i, r in enumerate(batch):
                ids[i, n - (len(r.prompt_ids) - 1):] = torch.tensor(r.prompt_ids[:-1], dtype=torch.long)
            padded = bool((prefix_mask == 0).any())
            positions = (prefix_mask.cumsum(-1) - 1).clamp(min=0)
            self.model(input_ids=ids.to(self.device), position_ids=positions.to(self.device),
                       attention_mask=prefix_mask.to(self.device) if padded else None,
                       cache=cache, use_cache=True, logits_to_keep=1)
        return cache, prefix_mask

    def _generate_sliding(self, batch: list[_Request]) -> list[Completion]:
        """``model.generate`` for a sliding-window model (:func:`~memagent.engines.hf_sliding.generate_sliding`)."""
        replies = generate_sliding(self.model, [r.prompt_ids for r in batch], [r.params for r in batch],
                                   [self._stop_strings(r.params) for r in batch], self.pad_id, self.eos_ids, self.device)
        self.stats.batch_sizes[len(batch)] += 1
        return [self._completion(r.prompt_ids, reply.tokens, reply.stopped, reply.logprobs, stops=r.params.stop)
                for r, reply in zip(batch, replies)]

    def _prefill_per_row(self, batch: list[_Request]) -> bool:
        """On CPU, padded prompts are prefilled one by one; with the prefix cache, every batch is.

        A padded batch needs an explicit attention mask, which sends CPU attention down a path
        ~1.5× slower than the causal kernel at 4K tokens (benchmarks/README.md); prefill is compute-bound there anyway,
        so batching it gains nothing, while decode (bandwidth-bound) still runs batched. With the
        prefix cache each row computes only what the cache lacks, which a padded batch could not skip.
        """
        lengths = {len(r.prompt_ids) for r in batch}
        if self.prefix_cache is not None:
            return min(lengths) > 1
        return self.device == "cpu" and len(lengths) > 1 and min(lengths) > 1

    @torch.inference_mode()
    def _prefill_rows(self, batch: list[_Request], prompt_len: int, capacity: int) -> ReservedCache:
        """Per-row KV caches of all but each prompt's last token, left-padded into one batch cache.

        Shapes: row i caches [1, H_kv, n_i - 1, D] → batch cache [B, H_kv, L - 1, D] (zeros
        where padding is, masked by the attention mask); the decode loop then runs the last prompt
        token of every row, so positions and logits are those of an unpadded prefill.
        """
        rows = []
        for r in batch:
            row_cache, r.cached_tokens = self._prefill_row(r.prompt_ids[:-1])
            rows.append(row_cache)
        cache = ReservedCache(len(rows[0].layers), capacity)
        for idx, layer in enumerate(cache.layers):  # layer by layer: the KV is held ~once, not twice
            keys, values = (_left_pad([getattr(row.layers[idx], part)[0] for row in rows], prompt_len - 1)
                            for part in ("keys", "values"))
            layer.update(keys, values)
            for row in rows:
                row.layers[idx].keys = row.layers[idx].values = None
        return cache

    def _prefill_row(self, ids: list[int]) -> tuple[ReservedCache, int]:
        """One row's KV cache of ``ids`` (positions from 0), and how many of its tokens the prefix cache held.

        The cached prefix's KV is copied in, the forward computes only the rest (its positions
        continue the prefix's), and the row's whole blocks go back into the prefix cache.
        """
        cached, kv = self.prefix_cache.lookup(ids) if self.prefix_cache is not None else (0, None)
        prefix = [(kv[i, 0][None], kv[i, 1][None]) for i in range(kv.shape[0])] if kv is not None else None
        cache = ReservedCache(self.num_layers, len(ids), kv=prefix)
        if cached < len(ids):
            rest = torch.tensor([ids[cached:]], device=self.device)
            positions = torch.arange(cached, len(ids), device=self.device)[None]
            self.model(input_ids=rest, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1)
        if self.prefix_cache is not None:
            self.prefix_cache.insert(ids, [(layer.keys[0], layer.values[0]) for layer in cache.layers])
        return cache, cached

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """RL weight sync: copy ``state_dict`` into the model in place (cast to its dtype/device).

        Call it between rollouts (no generation in flight). Every key must match a weight.
        """
        with torch.no_grad():
            missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        missing = [k for k in missing if not (tied and k == "lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"weights do not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
        self.weights_changed()

    def weights_changed(self) -> None:
        """The model's weights changed (loaded here, or trained in place by RL): the prefix cache's KV was
        computed by the old ones."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

