"""How much host memory one training step needs, estimated from the configs, and a guard.

The estimate adds what lives through the whole run (weights, gradients, AdamW's moments, the
reference, DeepSpeed's copies) to the largest transient of a step (the rollout's KV caches and
logits, or one row's activations and logits, or the checkpoint's copy of the weights).
Per-token coefficients come from the model's shapes; the measured constants are below.
Measured peak of the reference configuration (SmolLM2-135M, fp32, CPU, one process; batch 2 x
group 2, chunk 512, memory 64, answer 16): benchmarks/results/train_memory.json. What keeps it
there: gradient checkpointing, unpadded rows (on a CPU, backward one row at a time), a rollout
engine that shares the policy's weights, no ZeRO-2 or gradient all-reduce in one process, and
behaviour log-probs taken one step at a time instead of stacking logits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from memagent.config import AgentConfig
from memagent.rl.config import ZERO_OPTIMIZATION, TrainConfig

log = logging.getLogger(__name__)

MB = 2**20
RUNTIME_MB = 600
"""Resident memory of a trainer process besides its tensors: torch, transformers, DeepSpeed, the
tokenizer, the allocator's heap. Measured on configuration (a) (CPU, torch 2.13, SmolLM2-135M):
0.5 GB before the first step, 0.6 GB between steps (2.6 GB = runtime + policy + reference + AdamW)."""
PROMPT_OVERHEAD_TOKENS = 120
"""Chat template and instruction tokens around question, memory and chunk (the agent's prompts)."""
UPDATE_FACTOR = 1.4
"""Measured / counted memory of the update (gradients + one row's activations, logits and
embedding gradients below): autograd's other temporaries and the allocator's slack. Measured on
configuration (a): 1.18 GB above the resident set in the second step's update, 0.88 GB counted."""
ROLLOUT_FACTOR = 1.35
"""Measured / counted memory of the rollout (KV caches + logits below): prefill temporaries, the
sampler's, the allocator's slack. Measured: 2.2 GB above the resident set against 1.62 GB counted
at configuration (b), 0.42 against 0.31 at (a)."""


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know of the policy."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    kv_dim: int  # key/value heads x head dim
    vocab: int

    @classmethod
    def of(cls, model_dir: str | Path) -> ModelShape:
        """Read from an HF model directory (no weights loaded: the model is built on the meta device)."""
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        cfg = AutoConfig.from_pretrained(str(model_dir))
        with torch.device("meta"):
            params = sum(p.numel() for p in AutoModelForCausalLM.from_config(cfg).parameters())
        text = cfg.get_text_config(decoder=True)
        heads = int(text.num_attention_heads)
        head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // heads)
        kv = int(getattr(text, "num_key_value_heads", None) or heads)
        return cls(params=params, layers=int(text.num_hidden_layers), hidden=int(text.hidden_size),
                   intermediate=int(getattr(text, "intermediate_size", 4 * text.hidden_size)),
                   kv_dim=kv * head_dim, vocab=int(text.vocab_size))


@dataclass(frozen=True)
class MemoryEstimate:
    """Megabytes per part; ``peak_mb`` = the resident parts + the largest transient."""

    resident: dict[str, float]
    transient: dict[str, float]

    @property
    def peak_mb(self) -> float:
        return sum(self.resident.values()) + max(self.transient.values(), default=0.0)

    @property
    def largest_transient(self) -> str:
        return max(self.transient, key=self.transient.__getitem__)


def estimate_peak_memory(config: TrainConfig, agent: AgentConfig, shape: ModelShape, *, world_size: int = 1,
                         bf16: bool = False, engine_max_batch_size: int = 64) -> MemoryEstimate:
    """Peak resident memory of one training process (CPU, transformers rollout engine), in MB: what stays
    resident (:func:`resident_bytes`) plus the largest transient (:func:`transient_bytes`) and
    :data:`RUNTIME_MB`."""
    w = 2 if bf16 else 4
    resident = {"runtime": RUNTIME_MB * MB, **resident_bytes(config, shape, w, world_size)}
    transient = transient_bytes(config, agent, shape, w, world_size, engine_max_batch_size)
    return MemoryEstimate({k: v / MB for k, v in resident.items()}, {k: v / MB for k, v in transient.items()})


def resident_bytes(config: TrainConfig, shape: ModelShape, w: int, world_size: int) -> dict[str, float]:
    """Resident, with ``P`` parameters and ``w`` bytes per weight (4 fp32, 2 bf16), ``N`` ranks:

    - policy ``P*w`` (the rollout engine generates with it at ZeRO <= 2; a second copy at ZeRO-3);
    - reference ``P*w`` when ``kl_coef > 0``;
    - at ZeRO >= 1 gradients ``4P`` (ZeRO-2/3: ``4P/N`` + a reduce bucket of ``4 * reduce_bucket_size``);
    - AdamW moments ``8P`` (ZeRO >= 1: ``8P/N``) and at ZeRO >= 1 an fp32 master copy ``4P/N``.
    """
    P = shape.params
    stage = config.zero_stage_for(world_size)
    shard = world_size if stage >= 1 else 1
    resident = {"policy": P * w}
    if stage == 3:
        resident["rollout_weights"] = P * w
    if config.kl_coef > 0:
        resident["reference"] = P * w
    if stage >= 1:
        resident["gradients"] = 4 * P / (world_size if stage >= 2 else 1)
    if stage >= 2:
        resident["reduce_bucket"] = 4 * ZERO_OPTIMIZATION["reduce_bucket_size"]
    resident["adam_moments"] = 8 * P / shard
    if stage >= 1:
        resident["fp32_master"] = 4 * P / shard
    return resident


def transient_bytes(config: TrainConfig, agent: AgentConfig, shape: ModelShape, w: int, world_size: int,
                    engine_max_batch_size: int) -> dict[str, float]:
    """Transient, per phase (the peak takes the largest):

    - rollout: KV caches ``2 * layers * kv_dim * w`` per token of every concurrent conversation
      (``batch/N * group`` of them, at most ``engine_max_batch_size``), and the behaviour
      log-probs' logits, the ``[rows, new tokens, vocab]`` fp32 logits generate keeps;
    - update: at ZeRO-0 the gradients ``4P`` (freed after each optimizer step), and one row
      (on a CPU each conversation runs forward and backward alone: the longest is a memory
      update, chunk + memory + question + template + reply). With gradient checkpointing each
      layer keeps its input (``hidden * 4`` bytes per token per layer) and one layer is
      recomputed at a time (``(9 hidden + 4 intermediate + 4 kv_dim) * 4`` bytes per token);
      without it every layer keeps the latter. Plus the logits of the reply, three
      ``[T + 1, vocab]`` fp32 arrays (logits, log-softmax, gradient), and the two ``[vocab,
      hidden]`` gradients of a tied embedding (as input and as output layer) before they are summed;
    - checkpoint: a CPU copy of the weights ``4P`` and DeepSpeed's serialisation buffers ``4P``.

    The rollout's and update's counts are scaled by the measured :data:`ROLLOUT_FACTOR` and :data:`UPDATE_FACTOR`.
    """
    P = shape.params
    convs = min(config.batch_size // max(world_size, 1) * config.group_size, engine_max_batch_size)
    update_row = agent.chunk_tokens + agent.memory_tokens + agent.query_tokens + PROMPT_OVERHEAD_TOKENS
    kv = 2 * shape.layers * shape.kv_dim * w * (update_row + agent.memory_tokens) * convs
    rollout_logits = convs * max(agent.memory_tokens, agent.answer_tokens) * shape.vocab * 4

    row = update_row + agent.memory_tokens
    per_layer = (9 * shape.hidden + 4 * shape.intermediate + 4 * shape.kv_dim) * 4
    if config.gradient_checkpointing:
        acts = row * shape.layers * shape.hidden * 4 + row * per_layer
    else:
        acts = row * shape.layers * per_layer
    logits = 3 * (max(agent.memory_tokens, agent.answer_tokens) + 1) * shape.vocab * 4
    embedding = 2 * shape.vocab * shape.hidden * 4
    grads = 4 * P if config.zero_stage_for(world_size) == 0 else 0
    return {"rollout": ROLLOUT_FACTOR * (kv + rollout_logits),
            "update": UPDATE_FACTOR * (grads + acts + logits + embedding),
            "checkpoint": 8 * P}


class MemoryBudgetError(ValueError):
    """The estimated peak of a training step exceeds the memory available."""


def check_memory(estimate: MemoryEstimate, available_mb: float, *, processes: int = 1, force: bool = False) -> None:
    """Raise :class:`MemoryBudgetError` (a one-paragraph message) when ``processes`` trainers of
    this ``estimate`` do not fit in ``available_mb``; a no-op with ``force``."""
    need = estimate.peak_mb * processes
    if force or need <= available_mb:
        return
    knob = {
        "update": "turn gradient_checkpointing on, or lower the agent's chunk tokens (--chunk-tokens: one "
                  "conversation is one row of the update)",
        "rollout": "lower batch_size (--batch-size) or group_size (--group-size), or the agent's chunk/memory tokens",
        "checkpoint": "use a machine with more memory (the checkpoint copies the weights twice)",
    }[estimate.largest_transient]
    parts = ", ".join(f"{k} {v:.0f}" for k, v in sorted(estimate.resident.items(), key=lambda kv: -kv[1]))
    raise MemoryBudgetError(
        f"a training step needs about {need / 1024:.1f} GB ({processes} process(es) x {estimate.peak_mb:.0f} MB: "
        f"{parts} MB resident, plus {estimate.transient[estimate.largest_transient]:.0f} MB for the "
        f"{estimate.largest_transient}), but only {available_mb / 1024:.1f} GB of memory is available. To fit, "
        f"{knob}; or lower kl_coef to 0 (no reference copy). Pass force=True (--force) to try anyway."
    )


def guard_memory(config: TrainConfig, agent_config: AgentConfig, model_dir: Path, *, world: int,
                 engine_max_batch_size: int, force: bool) -> None:
    """Refuse to start when a step's estimated peak exceeds the host's available memory (CPU runs;
    on GPUs the limit is the device's, which this estimate does not model)."""
    import os

    import psutil
    import torch

    if force or torch.cuda.is_available():
        return
    estimate = estimate_peak_memory(config, agent_config, ModelShape.of(model_dir), world_size=world,
                                    bf16=config.precision == "bf16", engine_max_batch_size=engine_max_batch_size)
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # ranks sharing this host's memory
    log.info("estimated peak memory per process: %.0f MB", estimate.peak_mb)
    check_memory(estimate, psutil.virtual_memory().available / 2**20, processes=processes)


def release_memory() -> None:
    """Hand freed memory back: Python's cycles, CUDA's cache, and the host heap (:func:`trim_heap`)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    trim_heap()


def trim_heap() -> None:
    """Return the free pages of glibc's heap to the OS (a no-op elsewhere).

    CPU tensors are malloc'ed, and glibc keeps what a phase frees for the next one: without a
    trim after each row's backward, the next row's activations and gradients land beside the
    last one's leftovers (+0.16 GB at configuration (a)). Costs milliseconds. A fixed mmap
    threshold would bound the heap too, but faulted every large tensor in afresh: 30% slower.
    """
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
