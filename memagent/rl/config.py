"""Typed configuration of Multi-Conv DAPO training.

Defaults follow the paper's released scripts where they fit a small run: symmetric clip
0.2/0.2 (DAPO's clip-higher 0.28 is one field away), dual clip 3.0, k3 KL 0.001 to the initial
policy, no std normalisation, token-mean loss, AdamW with linear warm-up then constant,
gradient clipping 1.0. Batch sizes default small (the paper: 128 questions x 16 rollouts).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# The ZeRO settings not derived from TrainConfig fields (the stage is). Bucket sizes are in
# elements: each is a gradient buffer of that many elements (DeepSpeed's default 5e8 is 2 GB in
# fp32); 5e7 (200 MB) keeps NCCL/gloo messages large while fitting beside a small model on CPU.
ZERO_OPTIMIZATION: dict[str, Any] = {
    "contiguous_gradients": True,
    "overlap_comm": False,
    "reduce_scatter": True,
    "allgather_bucket_size": 50_000_000,
    "reduce_bucket_size": 50_000_000,
}

OverlongMode = Literal["none", "mask", "penalize"]
RolloutEngine = Literal["hf", "vllm"]


class TrainConfig(BaseModel):
    """Hyperparameters of one training run. Validated on construction; frozen."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # -- schedule --------------------------------------------------------------------------
    steps: int = Field(100, gt=0, description="Training steps (one rollout batch + its updates each).")
    lr: float = Field(1e-6, gt=0, description="Peak AdamW learning rate (paper: 1e-6).")
    warmup_steps: int = Field(20, ge=0, description="Training steps of linear warm-up from 0, then constant (paper: 20).")
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay (verl default 0.01).")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    grad_clip: float | None = Field(1.0, gt=0, description="Global gradient-norm clip (None: off).")
    seed: int = Field(0, description="Seeds the data order and the sampling of every step.")
    shuffle: bool = Field(True, description="Shuffle the data each epoch (paper: False, sequential).")

    # -- rollout ---------------------------------------------------------------------------
    batch_size: int = Field(4, gt=0, description="Questions per step (on all ranks together; paper: 128).")
    group_size: int = Field(4, gt=0, description="Trajectories per question, G (paper: 16).")
    temperature: float = Field(1.0, gt=0, description="Rollout sampling temperature (paper: 1.0).")
    top_p: float = Field(1.0, gt=0, le=1, description="Rollout nucleus mass (paper: 1.0).")
    dynamic_sampling: bool = Field(
        False, description="Drop groups whose rewards are all equal and refill with new questions (DAPO; paper: off)."
    )
    max_rollout_rounds: int = Field(
        4, gt=0, description="With dynamic sampling: most rollout rounds per step before training on what is there."
    )
    overlong: OverlongMode = Field(
        "none",
        description="Conversations cut by their length limit: 'none' train as is (paper), 'mask' drop their "
        "tokens from the loss, 'penalize' subtract overlong_penalty from the trajectory's reward.",
    )
    overlong_penalty: float = Field(0.5, ge=0, description="Reward subtracted per trajectory with a cut conversation.")
    rollout_engine: RolloutEngine = Field(
        "hf", description="Rollout backend: 'hf' (transformers in the trainer process, CPU or CUDA) or 'vllm' "
        "(vLLM beside the trainer on the same GPU; needs CUDA and the gpu extra).",
        json_schema_extra={"flag": "engine"},
    )
    rollout_gpu_memory_utilization: float = Field(
        0.3, gt=0, lt=1, description="vllm: fraction of the GPU the rollout engine takes (the trainer keeps the rest)."
    )
    rollout_sleep_mode: bool = Field(
        False, description="vllm: sleep the engine during updates (weights to CPU, KV cache freed), wake it to sync."
    )

    # -- loss ------------------------------------------------------------------------------
    clip_low: float = Field(0.2, gt=0, lt=1, description="Ratio clip below: 1 - clip_low (paper: 0.2).")
    clip_high: float = Field(0.2, gt=0, description="Ratio clip above: 1 + clip_high (paper 0.2; DAPO 0.28).")
    dual_clip: float | None = Field(3.0, description="Dual-clip c for negative advantages (verl: 3.0); None: off.")
    kl_coef: float = Field(0.001, ge=0, description="k3 KL coefficient to the initial policy (paper: 0.001); 0: no reference.")
    std_normalize: bool = Field(False, description="Divide advantages by the group std (GRPO); paper: off (Dr.GRPO).")

    # -- update ----------------------------------------------------------------------------
    ppo_mini_batches: int = Field(1, gt=0, description="Optimizer steps per rollout batch (paper: 16).")
    ppo_epochs: int = Field(1, gt=0, description="Passes over the rollout batch (paper: 1).")
    micro_batch_tokens: int = Field(
        8192, gt=0, description=("Padded tokens per forward/backward on a GPU (dynamic batch size; paper: 16384 "
                                 "per GPU). On a CPU each conversation runs forward and backward alone.")
    )
    zero_stage: int | None = Field(
        None, ge=0, le=3, description="DeepSpeed ZeRO stage (0-3); default: 0 on one process (partitioning over "
        "one rank only adds a full fp32 copy of the weights and a gradient bucket), 2 on several."
    )
    precision: Literal["auto", "fp32", "bf16"] = Field("auto", description="'auto': bf16 on CUDA, fp32 on CPU.")
    gradient_checkpointing: bool = Field(
        True, description="Recompute each layer's activations in backward: keeps one hidden state per layer and "
        "token (the activations of a micro-batch otherwise dwarf the model)."
    )

    # -- output ----------------------------------------------------------------------------
    save_every: int = Field(10, gt=0, description="Checkpoint (DeepSpeed + HF export) every N steps and at the end.")
    keep_checkpoints: int | None = Field(2, gt=0, description="Newest DeepSpeed checkpoints kept (None: all).")

    @model_validator(mode="after")
    def _consistent(self) -> TrainConfig:
        if self.dual_clip is not None and self.dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (or None to turn it off), got {self.dual_clip}")
        if self.dynamic_sampling and self.group_size < 2:
            raise ValueError("dynamic_sampling needs group_size >= 2: a group of one always has equal rewards")
        if self.ppo_mini_batches > self.batch_size * self.group_size:
            raise ValueError(
                f"ppo_mini_batches={self.ppo_mini_batches} exceeds the trajectories per step "
                f"({self.batch_size} x {self.group_size}); lower it"
            )
        if self.overlong != "penalize" and "overlong_penalty" in self.model_fields_set:
            raise ValueError("overlong_penalty is only used with overlong='penalize'")
        if self.betas[0] >= 1 or self.betas[1] >= 1 or min(self.betas) < 0:
            raise ValueError(f"AdamW betas must lie in [0, 1), got {self.betas}")
        vllm_only = {"rollout_gpu_memory_utilization", "rollout_sleep_mode"} & self.model_fields_set
        if self.rollout_engine != "vllm" and vllm_only:
            raise ValueError(f"{', '.join(sorted(vllm_only))}: only used with rollout_engine='vllm'")
        return self

    def check_device(self, cuda: bool) -> None:
        """Reject settings the machine cannot run (``cuda``: a CUDA device is available)."""
        if self.rollout_engine == "vllm" and not cuda:
            raise ValueError("rollout_engine='vllm' needs a CUDA GPU (the gpu extra's vLLM is a CUDA build); "
                             "use rollout_engine='hf' (--engine hf) on CPU")

    def zero_stage_for(self, world_size: int) -> int:
        """The ZeRO stage in force: the configured one, else 0 on one process and 2 on several."""
        if self.zero_stage is not None:
            return self.zero_stage
        return 0 if world_size == 1 else 2

    def deepspeed_config(self, *, world_size: int = 1, bf16: bool = False, cuda: bool = False) -> dict:
        """The dict given to ``deepspeed.initialize``: :data:`ZERO_OPTIMIZATION` plus this config's fields.

        Gradient accumulation is driven by the trainer (``managed_gradient_accumulation``
        off): a mini-batch holds as many token-budgeted micro-batches as it needs and
        ``engine.step()`` is the boundary. The learning-rate schedule is :meth:`lr_scheduler`.
        """
        stage = self.zero_stage_for(world_size)
        zero = dict(ZERO_OPTIMIZATION, stage=stage)
        if stage == 3:
            zero["stage3_gather_16bit_weights_on_model_save"] = True
        if stage != 2:
            zero.pop("overlap_comm", None)  # unmanaged accumulation allows overlap_comm only at stage 2
        return {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "train_batch_size": world_size,
            "managed_gradient_accumulation": False,
            "gradient_clipping": self.grad_clip or 0.0,
            "steps_per_print": 10**9,
            "wall_clock_breakdown": False,
            "optimizer": {
                "type": "AdamW",
                "params": {
                    "lr": self.lr,
                    "betas": list(self.betas),
                    "eps": 1e-8,
                    "weight_decay": self.weight_decay,
                    "torch_adam": True,  # no fused CUDA op to JIT-compile on CPU
                    # foreach AdamW holds whole-model temporaries during the step (+490 MB at 135M
                    # params on CPU, measured; the loop: +215 MB, as fast); on GPUs it is faster.
                    "foreach": cuda,
                },
            },
            # No "scheduler": warm-up comes from lr_scheduler() (DeepSpeed's WarmupLR idles 2 steps at 0).
            "zero_optimization": zero,
            "bf16": {"enabled": bool(bf16)},
        }

    def lr_scheduler(self, optimizer: Any) -> Any:
        """Linear warm-up then constant, stepped once per optimizer step (give it to ``deepspeed.initialize``).

        Warm-up is counted in training steps, so it spans ``W = warmup_steps * ppo_mini_batches *
        ppo_epochs`` optimizer steps; update k (from 0) uses ``lr * min(1, (k + 1) / (W + 1))``,
        e.g. W = 3: lr/4, lr/2, 3lr/4, lr, lr, ... (no update is wasted at lr 0).
        """
        import torch

        warm = self.warmup_steps * self.ppo_mini_batches * self.ppo_epochs
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / (warm + 1)))
