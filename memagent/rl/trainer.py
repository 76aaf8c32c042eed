"""Multi-Conv DAPO on DeepSpeed: the training loop of MemAgent, one iteration per page.

Each step: sample G trajectories per question with the memory agent (the same
``read_document`` batch jobs use) -> reward the final answers -> one group-relative advantage
per trajectory, copied to all its conversations -> recompute old (and reference) log-probs
-> clipped token-mean updates in mini-batches through DeepSpeed -> push the new weights into
the rollout engine -> log a JSON line -> checkpoint every N steps. :func:`train` calls one
function per phase, in that order.

Single process on CPU (gloo, ``DS_ACCELERATOR=cpu``; the environment is filled in when no
launcher did)::

    from memagent.rl.trainer import train
    train(config=TrainConfig(steps=30), agent_config=preset("tiny"), data="train.parquet",
          out_dir="runs/niah", model="smollm2-135m")

Multi-GPU: ``deepspeed --no_local_rank --num_gpus 8 --module memagent_cli train ...``
(each rank rolls out its share of the questions with its own engine; the token-mean is
taken over all ranks' tokens; ``infra/deepspeed/launch_multi_gpu.sh``). The rollout engine is
transformers in-process (``rollout_engine="hf"``) or vLLM on the rank's GPU (``"vllm"``; weights
synced through safetensors + ``reload_weights``).

Run directory: ``run.json`` (configs), ``model_config/`` (base config + tokenizer, for
export), ``metrics.jsonl`` (one record per step), ``checkpoints/step_NNNNNN/`` (DeepSpeed
states + ``hf/``, an HF export) and ``checkpoints/latest``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from memagent.agent import check_config
from memagent.config import AgentConfig
from memagent.models import DEFAULT_MODEL
from memagent.rl.advantages import expand_to_conversations, group_advantages
from memagent.rl.batching import (Sample, behaviour_gap, collate, micro_batches, response_log_probs, score_samples,
                                  stack_right)
from memagent.rl.checkpoint import latest_tag, push_weights, save_checkpoint, write_jsonl
from memagent.rl.config import TrainConfig
from memagent.rl.data import DataStream, load_examples, seed_everything
from memagent.rl.distributed import (all_gather_ints, all_gather_objects, all_reduce, merge_rank_metrics,
                                     setup_distributed)
from memagent.rl.loss import policy_loss
from memagent.rl.memory import guard_memory, release_memory, trim_heap
from memagent.rl.metrics import Update, step_metrics
from memagent.rl.rollout import (Conversation, InProcessModel, RewardFn, RolloutBatch, Shutdown, SleepMode,
                                 WeightSync, collect_rollouts, default_reward)

log = logging.getLogger(__name__)


def train(
    *,
    config: TrainConfig,
    agent_config: AgentConfig,
    data: str | Path | Sequence[Mapping[str, Any]],
    out_dir: str | Path,
    model: str = DEFAULT_MODEL,
    resume: bool = False,
    reward_fn: RewardFn = default_reward,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    engine_max_batch_size: int = 64,
    force: bool = False,
) -> list[dict[str, Any]]:
    """Train the memory policy; returns this call's per-step metric records.

    Args:
        config: training hyperparameters.
        agent_config: the agent's budgets; sampling and ``\\boxed{}`` answers are set from ``config``.
        data: Parquet/JSONL path or URI, or a list of dicts (id, question, context, answers).
        out_dir: run directory (see the module docstring).
        model: base model name or local path (:func:`memagent.models.resolve_model`).
        resume: continue from ``out_dir``'s latest checkpoint (same data order and step count).
        reward_fn: ``(final response, answers) -> float`` (default: strict boxed EM).
        on_step: called with each step's metrics record (progress bars).
        engine_max_batch_size: most requests in one forward of the transformers rollout engine.
        force: train even when :func:`check_memory` estimates that a step will not fit in memory.
    """
    examples = load_examples(data)  # first: a bad file is named (FILE:LINE) before any model loads
    rank, world = setup_distributed()
    out, resume_tag, model_dir = open_run(Path(out_dir), model, resume)
    guard_memory(config, agent_config, model_dir, world=world, engine_max_batch_size=engine_max_batch_size,
                 force=force)
    run = build_run(config, agent_config, model_dir, rank=rank, world=world, out=out,
                    engine_max_batch_size=engine_max_batch_size)
    stream, start_step = restore(run, examples, resume_tag)
    write_run_files(run, n_examples=len(examples))

    records: list[dict[str, Any]] = []
    for step in range(start_step, config.steps):
        record = train_step(run, stream, step, config, reward_fn)
        records.append(record)
        if rank == 0:
            write_jsonl(out / "metrics.jsonl", record)
        if on_step:
            on_step(record)
        save_if_due(run, stream, step + 1)
    close(run)
    return records


def save_if_due(run: Run, stream: DataStream, done: int) -> None:
    """7. A checkpoint after every ``save_every`` steps and after the last one (the data cursor of every rank)."""
    config = run.config
    if done % config.save_every == 0 or done == config.steps:
        save_checkpoint(run.engine, run.rollout_engine.tokenizer, run.ckpt_dir, done, all_gather_ints(stream.cursor),
                        zero_stage=run.zero_stage, keep=config.keep_checkpoints, rank=run.rank)


def train_step(run: Run, stream: DataStream, step: int, config: TrainConfig, reward_fn: RewardFn) -> dict[str, Any]:
    """One step: rollouts -> group advantages -> old and reference log-probs -> policy update -> weight
    sync. Returns the step's metrics record over all ranks."""
    t_step = time.perf_counter()
    cursor_start = stream.cursor
    batch = rollout(run, stream, step, reward_fn)
    samples = advantages(batch, config)
    t_update = time.perf_counter()
    on_policy = config.ppo_mini_batches * config.ppo_epochs == 1
    score_old_and_reference(run, samples, on_policy=on_policy)
    upd = update_policy(run, samples, on_policy=on_policy)
    if not upd.stats:
        log.warning("step %d: no trainable conversation on any rank (%d groups generated, %d dropped); "
                    "no update", step, batch.groups_generated, batch.groups_dropped)
    sync_weights(run)
    update_s = time.perf_counter() - t_update
    record = step_metrics(step, batch, samples, upd, rollout_s=batch.seconds, update_s=update_s,
                          step_s=time.perf_counter() - t_step, cursor=(cursor_start, stream.cursor))
    return merge_rank_metrics(all_gather_objects(record))  # the whole step, not rank 0's share


# ---------------------------------------------------------------------------------------------
# Set-up phases
# ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    """What the phases of one run share."""

    config: TrainConfig
    rollout_config: AgentConfig  # the agent's budgets, sampling at config.temperature, boxed answers
    rank: int
    world: int
    out: Path
    model_dir: Path
    engine: Any  # deepspeed.DeepSpeedEngine around the policy
    zero_stage: int  # in force (config.zero_stage_for(world))
    reference: torch.nn.Module | None  # the frozen initial policy (kl_coef > 0)
    tokenizer: Any
    rollout_engine: Any  # memagent.engines.Engine + WeightSync or InProcessModel (+ SleepMode: vLLM sleep mode)
    shared_weights: bool  # the rollout engine generates with the trained module itself: nothing to sync
    pad_id: int
    ds_config: dict[str, Any]

    @property
    def ckpt_dir(self) -> Path:
        return self.out / "checkpoints"


def open_run(out: Path, model: str, resume: bool) -> tuple[Path, str | None, Path]:
    """``(out, resume tag or None, local model dir)``; refuses to overwrite an existing run."""
    from memagent.models import resolve_model

    resume_tag = latest_tag(out / "checkpoints")
    if resume_tag and not resume:
        raise FileExistsError(f"{out} already holds checkpoints; pass resume=True (--resume) or use a new directory")
    if resume and (out / "run.json").is_file():
        model = json.loads((out / "run.json").read_text())["model_dir"]  # the base the run started from
    return out, resume_tag, resolve_model(model)


def build_run(config: TrainConfig, agent_config: AgentConfig, model_dir: Path, *, rank: int, world: int, out: Path,
              engine_max_batch_size: int) -> Run:
    """Load the policy into DeepSpeed, the frozen reference, the tokenizer and the rollout engine."""
    import deepspeed
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent.engines import make_engine

    if config.batch_size % world:
        raise ValueError(f"batch_size={config.batch_size} must be divisible by the world size {world}")
    cuda = torch.cuda.is_available()
    config.check_device(cuda)
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    bf16 = config.precision == "bf16" or (config.precision == "auto" and cuda)
    dtype = torch.bfloat16 if bf16 else torch.float32
    zero_stage = config.zero_stage_for(world)

    rollout_engine = make_engine(rollout_engine_config(config, model_dir, device, bf16, engine_max_batch_size))
    # A transformers engine in this process generates with the module DeepSpeed trains (ZeRO <= 2
    # keeps full weights on every rank): one copy of the weights, no state dict per step.
    shared = (zero_stage < 3 and isinstance(rollout_engine, InProcessModel)
              and isinstance(rollout_engine.model, torch.nn.Module))
    if not (shared or isinstance(rollout_engine, WeightSync)):
        raise TypeError(f"{type(rollout_engine).__name__} cannot take new weights (update_weights): no RL rollouts")
    if config.rollout_sleep_mode and not isinstance(rollout_engine, SleepMode):
        raise TypeError(f"rollout_sleep_mode: {type(rollout_engine).__name__} has no sleep/wake_up")
    policy = rollout_engine.model if shared else AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    if config.gradient_checkpointing:
        enable_gradient_checkpointing(policy)
    reference = None
    if config.kl_coef > 0:  # the initial policy, frozen
        reference = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
        reference.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    ds_config = config.deepspeed_config(world_size=world, bf16=bf16, cuda=cuda)
    engine, _, _, _ = deepspeed.initialize(
        model=policy, model_parameters=[p for p in policy.parameters() if p.requires_grad], config=ds_config,
        lr_scheduler=config.lr_scheduler,
    )
    if world == 1:
        # Nothing to reduce; at ZeRO-0 DeepSpeed would still copy every gradient into one flat
        # buffer and back at each step (+0.5 GB at 135M parameters).
        engine.enable_backward_allreduce = False
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rollout_config = agent_config.with_overrides(temperature=config.temperature, top_p=config.top_p,
                                                 answer_style="boxed")
    check_config(rollout_engine, rollout_config)
    return Run(config=config, rollout_config=rollout_config, rank=rank, world=world, out=out, model_dir=model_dir,
               engine=engine, zero_stage=zero_stage, reference=reference, tokenizer=tokenizer,
               rollout_engine=rollout_engine, shared_weights=shared, pad_id=pad_id, ds_config=ds_config)


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer in backward instead of keeping its activations.

    transformers checkpoints a layer only while that layer is in training mode. The policy stays
    in eval mode (no dropout: the update's log-probs must be those of the policy that sampled),
    so only the layers' own flag is set; their dropout submodules keep eval mode. Forwards
    without grad (generation, scoring) are never checkpointed.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()  # the first name since transformers 5.x, the second before
    for m in model.modules():
        if isinstance(m, GradientCheckpointingLayer):
            m.training = True


def rollout_engine_config(config: TrainConfig, model_dir: Path, device: str, bf16: bool, max_batch_size: int) -> Any:
    """The :class:`~memagent.engines.EngineConfig` of the rollout engine: the policy's weights,
    device and precision; for vLLM also its share of the GPU and sleep mode."""
    from memagent.engines import EngineConfig

    common = dict(model=str(model_dir), device=device, dtype="bf16" if bf16 else "fp32", max_batch_size=max_batch_size)
    if config.rollout_engine == "vllm":
        return EngineConfig(engine="vllm", gpu_memory_utilization=config.rollout_gpu_memory_utilization,
                            enable_sleep_mode=config.rollout_sleep_mode, **common)
    return EngineConfig(engine="hf", **common)


def restore(run: Run, examples: list[dict[str, Any]], resume_tag: str | None) -> tuple[DataStream, int]:
    """This rank's data stream and the first step: from the checkpoint ``resume_tag``, or fresh.

    Rank r reads examples r, r + world, ...; the cursor says how many it has drawn.
    """
    start_step, cursor = 0, 0
    if resume_tag:
        _, client = run.engine.load_checkpoint(str(run.ckpt_dir), tag=resume_tag)
        start_step, cursor = int(client["step"]), int(client["cursors"][run.rank])
        sync_weights(run)
        log.info("resumed from %s at step %d", resume_tag, start_step)
    stream = DataStream(examples[run.rank::run.world], seed=run.config.seed, shuffle=run.config.shuffle, cursor=cursor)
    return stream, start_step


def write_run_files(run: Run, *, n_examples: int) -> None:
    """``run.json`` (every config in force) and ``model_config/`` (what export needs); rank 0."""
    if run.rank != 0:
        return
    run.out.mkdir(parents=True, exist_ok=True)
    (run.out / "run.json").write_text(json.dumps({
        "model_dir": str(run.model_dir), "train_config": run.config.model_dump(),
        "agent_config": run.rollout_config.model_dump(), "world_size": run.world, "deepspeed": run.ds_config,
        "examples": n_examples}, indent=2, default=str))
    if not (run.out / "model_config").is_dir():
        run.engine.module.config.save_pretrained(run.out / "model_config")
        run.tokenizer.save_pretrained(run.out / "model_config")


def close(run: Run) -> None:
    """Stop the rollout engine's own process now (vLLM), not at interpreter exit."""
    if isinstance(run.rollout_engine, Shutdown):
        run.rollout_engine.shutdown()


# ---------------------------------------------------------------------------------------------
# The phases of one step
# ---------------------------------------------------------------------------------------------


def rollout(run: Run, stream: DataStream, step: int, reward_fn: RewardFn) -> RolloutBatch:
    """1. G trajectories for each of this rank's ``batch_size / world`` questions, rewarded."""
    config = run.config
    # Seeded per (step, rank): a resumed run samples as the original would have.
    seed_everything(config.seed * 1_000_003 + step * run.world + run.rank)
    batch = asyncio.run(collect_rollouts(
        run.rollout_engine, stream.draw, batch_size=config.batch_size // run.world, group_size=config.group_size,
        config=run.rollout_config, reward_fn=reward_fn, dynamic_sampling=config.dynamic_sampling,
        max_rounds=config.max_rollout_rounds, overlong=config.overlong, overlong_penalty=config.overlong_penalty,
    ))
    if config.rollout_sleep_mode:
        run.rollout_engine.sleep(1)  # free the GPU for the update; weights wait in CPU memory
    release_memory()  # the generation's KV caches and logits, before the update allocates
    return batch


def advantages(batch: RolloutBatch, config: TrainConfig) -> list[Sample]:
    """2. One scalar per trajectory (R_i - group mean), copied to all its conversations.

    Returns the trainable conversations with their advantage.
    """
    traj_adv = group_advantages(batch.rewards, batch.group_ids, std_normalize=config.std_normalize)
    conv_adv = expand_to_conversations(traj_adv, batch.conv_traj_index)
    return [Sample(c, float(a)) for c, a in zip(batch.conversations, conv_adv.tolist()) if c.trainable]


def score_old_and_reference(run: Run, samples: list[Sample], *, on_policy: bool) -> None:
    """3. Old (if needed) and reference log-probs of every sample, before any update.

    On-policy (one update per rollout batch) the policy being updated is the one that sampled,
    so the old log-probs are the update forward's own, detached (a forward saved); otherwise
    they are recomputed here, as verl does.
    """
    score = dict(pad_id=run.pad_id, token_budget=run.config.micro_batch_tokens, temperature=run.config.temperature)
    if not on_policy:
        for s, logp in zip(samples, score_samples(run.engine.module, samples, **score)):
            s.old_logp = logp
    if run.reference is not None:
        for s, logp in zip(samples, score_samples(run.reference, samples, **score)):
            s.ref_logp = logp


def update_policy(run: Run, samples: list[Sample], *, on_policy: bool) -> Update:
    """4. Clipped token-mean updates: ``ppo_epochs`` passes over ``ppo_mini_batches`` mini-batches.

    Each mini-batch is one optimizer step, accumulated over token-budgeted micro-batches.
    """
    config, engine, pad_id, world = run.config, run.engine, run.pad_id, run.world
    upd = Update([], [], 0, engine.optimizer.param_groups[0]["lr"])
    # CPU forwards run rows one at a time anyway (response_log_probs); a backward per row too
    # keeps one row's activations and one tied-embedding gradient alive, not a micro-batch's.
    rows = 1 if next(engine.module.parameters()).device.type == "cpu" else None
    for _epoch in range(config.ppo_epochs):
        for mini in _split(samples, config.ppo_mini_batches):
            # Token-mean over the mini-batch on all ranks; DeepSpeed averages gradients over
            # ranks, so each rank divides by (global tokens / world).
            n_tokens = all_reduce(sum(len(s.conv.response_ids) for s in mini)) / world
            micros = micro_batches(mini, config.micro_batch_tokens, max_rows=rows)
            n_micro = int(all_reduce(len(micros), op="max"))
            if n_micro == 0:
                # Empty on every rank (dynamic sampling kept no group, or all masked): no
                # step, or AdamW would move the weights on momentum and decay alone.
                continue
            micros += [[_dummy_sample(pad_id)]] * (n_micro - len(micros))  # equal collectives per rank
            for mb in micros:
                b = collate(mb, pad_id)
                logp, ent = response_log_probs(engine, b, temperature=config.temperature, entropy=True)
                T, mask = logp.shape[1], b["response_mask"].to(logp.device)
                old = logp.detach() if on_policy else stack_right([s.old_logp for s in mb], T).to(logp.device)
                loss, m = policy_loss(
                    logp=logp, old_logp=old,
                    advantages=b["advantages"].to(logp.device), mask=mask,
                    clip_low=config.clip_low, clip_high=config.clip_high, dual_clip=config.dual_clip,
                    ref_logp=(stack_right([s.ref_logp for s in mb], T).to(logp.device)
                              if run.reference is not None else None),
                    kl_coef=config.kl_coef, entropy=ent, num_tokens=max(n_tokens, 1.0),
                )
                engine.backward(loss, scale_wrt_gas=False)
                trim_heap()  # before the next row allocates (CPU: rows run one at a time)
                m["behaviour_logp_gap"] = behaviour_gap(mb, old, mask)  # rollout engine vs trainer
                upd.stats.append(m)
            gn = _grad_norm(engine.module) if run.zero_stage == 0 else None  # DeepSpeed tracks it at ZeRO >= 1
            engine.step()  # the accumulation boundary: reduce, clip, AdamW, LR schedule
            upd.optimizer_steps += 1
            gn = engine.get_global_grad_norm() if gn is None else gn
            if gn is not None:
                upd.grad_norms.append(float(gn))
    release_memory()
    return upd


def sync_weights(run: Run) -> None:
    """5. The rollout engine generates with the updated policy from the next step on."""
    if run.config.rollout_sleep_mode:
        run.rollout_engine.wake_up()
    if run.shared_weights:  # updated in place: the engine's cached prompt KV was computed by the old weights
        run.rollout_engine.weights_changed()
    else:
        push_weights(run.engine.module, run.rollout_engine, run.zero_stage)


# ---------------------------------------------------------------------------------------------
# Small pieces
# ---------------------------------------------------------------------------------------------


def _split(samples: list[Sample], n: int) -> list[list[Sample]]:
    """``n`` contiguous, near-equal mini-batches in rollout order (verl: no shuffling)."""
    size, extra = divmod(len(samples), n)
    out, i = [], 0
    for k in range(n):
        j = i + size + (k < extra)
        out.append(samples[i:j])
        i = j
    return out


def _dummy_sample(pad_id: int) -> Sample:
    """A masked one-token row: keeps a rank with fewer micro-batches in step with the others."""
    conv = Conversation(traj_index=-1, group_id=-1, conv_index=0, prompt_ids=[pad_id], response_ids=[pad_id],
                        behaviour_logprobs=None, is_final=False, truncated=False, trainable=False)
    return Sample(conv, 0.0, old_logp=torch.zeros(1), ref_logp=torch.zeros(1))


def _grad_norm(model: torch.nn.Module) -> float:
    """Global 2-norm of the gradients (before clipping), as DeepSpeed reports it at ZeRO >= 1."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
