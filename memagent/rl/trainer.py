"""Multi-Conv DAPO on DeepSpeed: the training loop of MemAgent, one iteration per page.

Each step: sample G trajectories per question with the memory agent (the same
``read_document`` batch jobs use) -> reward the final answers -> one group-relative advantage
per trajectory, copied to all its conversations -> recompute old (and reference) log-probs
-> clipped token-mean updates in mini-batches through DeepSpeed -> push the new weights into
the rollout engine -> log a JSON line -> checkpoint every N steps.

Single process on CPU (gloo, ``DS_ACCELERATOR=cpu``; the environment is filled in when no
launcher did)::

    from memagent.rl.trainer import train
    train(config=TrainConfig(steps=30), agent_config=preset("tiny"), data="train.parquet",
          out_dir="runs/niah", model="smollm2-135m")

Multi-GPU: ``deepspeed --no_local_rank --num_gpus 8 --module memagent.rl.cli_commands train ...``
(each rank rolls out its share of the questions with its own engine; the token-mean is
taken over all ranks' tokens; ``infra/deepspeed/launch_multi_gpu.sh``). The rollout engine is
transformers in-process (``rollout_engine="hf"``) or vLLM on the rank's GPU (``"vllm"``; weights
synced through safetensors + ``reload_weights``). Only the single-process CPU path is tested here.

Run directory: ``run.json`` (configs), ``model_config/`` (base config + tokenizer, for
export), ``metrics.jsonl`` (one record per step), ``checkpoints/step_NNNNNN/`` (DeepSpeed
states + ``hf/``, an HF export) and ``checkpoints/latest``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from memagent.agent import check_config
from memagent.config import AgentConfig
from memagent.rl import plumbing as P
from memagent.rl.advantages import expand_to_conversations, group_advantages
from memagent.rl.config import TrainConfig
from memagent.rl.loss import policy_loss
from memagent.rl.rollout import Conversation, RewardFn, collect_rollouts, default_reward

log = logging.getLogger(__name__)


def train(
    *,
    config: TrainConfig,
    agent_config: AgentConfig,
    data: str | Path | Sequence[Mapping[str, Any]],
    out_dir: str | Path,
    model: str = "smollm2-135m",
    resume: bool = False,
    reward_fn: RewardFn = default_reward,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    engine_max_batch_size: int = 64,
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
    """
    # ================================ Setup ================================================
    rank, world = P.setup_distributed()
    import deepspeed
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memagent.engines import make_engine
    from memagent.models import resolve_model

    out = Path(out_dir)
    ckpt_dir = out / "checkpoints"
    resume_tag = P.latest_tag(ckpt_dir)
    if resume_tag and not resume:
        raise FileExistsError(f"{out} already holds checkpoints; pass resume=True (--resume) or use a new directory")
    if resume and (out / "run.json").is_file():
        model = json.loads((out / "run.json").read_text())["model_dir"]  # the base the run started from
    model_dir = resolve_model(model)
    if config.batch_size % world:
        raise ValueError(f"batch_size={config.batch_size} must be divisible by the world size {world}")
    cuda = torch.cuda.is_available()
    config.check_device(cuda)
    device = f"cuda:{torch.cuda.current_device()}" if cuda else "cpu"
    bf16 = config.precision == "bf16" or (config.precision == "auto" and cuda)
    dtype = torch.bfloat16 if bf16 else torch.float32

    policy = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    if config.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    reference = None
    if config.kl_coef > 0:  # the initial policy, frozen
        reference = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(device).eval()
        reference.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    template = json.loads(P.TEMPLATE.read_text()) if P.TEMPLATE.is_file() else None
    ds_config = config.deepspeed_config(world_size=world, bf16=bf16, template=template)
    engine, _, _, _ = deepspeed.initialize(
        model=policy, model_parameters=[p for p in policy.parameters() if p.requires_grad], config=ds_config,
        lr_scheduler=config.lr_scheduler,
    )
    rollout_engine = make_engine(rollout_engine_config(config, model_dir, device, bf16, engine_max_batch_size))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rollout_config = agent_config.with_overrides(temperature=config.temperature, top_p=config.top_p,
                                                 answer_style="boxed")
    check_config(rollout_engine, rollout_config)

    examples = P.load_examples(data)
    start_step, cursor = 0, 0
    if resume_tag:
        _, client = engine.load_checkpoint(str(ckpt_dir), tag=resume_tag)
        start_step, cursor = int(client["step"]), int(client["cursors"][rank])
        P.push_weights(engine.module, rollout_engine, config.zero_stage)
        log.info("resumed from %s at step %d", resume_tag, start_step)
    stream = P.DataStream(examples[rank::world], seed=config.seed, shuffle=config.shuffle, cursor=cursor)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "run.json").write_text(json.dumps({
            "model_dir": str(model_dir), "train_config": config.model_dump(),
            "agent_config": rollout_config.model_dump(), "world_size": world, "deepspeed": ds_config,
            "examples": len(examples)}, indent=2, default=str))
        if not (out / "model_config").is_dir():
            policy.config.save_pretrained(out / "model_config")
            tokenizer.save_pretrained(out / "model_config")
    records: list[dict[str, Any]] = []

    for step in range(start_step, config.steps):
        t_step = time.perf_counter()
        # ============================ 1. Rollout ===========================================
        # Seeded per (step, rank): a resumed run samples as the original would have.
        P.seed_everything(config.seed * 1_000_003 + step * world + rank)
        cursor_start = stream.cursor
        batch = asyncio.run(collect_rollouts(
            rollout_engine, stream.draw, batch_size=config.batch_size // world, group_size=config.group_size,
            config=rollout_config, reward_fn=reward_fn, dynamic_sampling=config.dynamic_sampling,
            max_rounds=config.max_rollout_rounds, overlong=config.overlong, overlong_penalty=config.overlong_penalty,
        ))
        if config.rollout_sleep_mode:
            rollout_engine.sleep(1)  # free the GPU for the update; weights wait in CPU memory

        # ============================ 2. Advantages ========================================
        # One scalar per trajectory (R_i - group mean), then copied to all its conversations.
        traj_adv = group_advantages(batch.rewards, batch.group_ids, std_normalize=config.std_normalize)
        conv_adv = expand_to_conversations(traj_adv, batch.conv_traj_index)
        samples = [P.Sample(c, float(a)) for c, a in zip(batch.conversations, conv_adv.tolist()) if c.trainable]

        # ============================ 3. Old and reference log-probs =======================
        t_update = time.perf_counter()
        score = dict(pad_id=pad_id, token_budget=config.micro_batch_tokens, temperature=config.temperature)
        # One update per rollout batch: the policy being updated is the one that sampled, so the
        # old log-probs are the update forward's own, detached (a forward saved). Otherwise they
        # are recomputed before any update, as verl does.
        on_policy = config.ppo_mini_batches * config.ppo_epochs == 1
        if not on_policy:
            P.score_samples(engine.module, samples, attr="old_logp", **score)
        if reference is not None:
            P.score_samples(reference, samples, attr="ref_logp", **score)

        # ============================ 4. Policy update =====================================
        lr = engine.optimizer.param_groups[0]["lr"]  # the rate this step's first update uses
        stats: list[dict[str, float]] = []
        grad_norms: list[float] = []
        optimizer_steps = 0
        for _epoch in range(config.ppo_epochs):
            for mini in _split(samples, config.ppo_mini_batches):
                # Token-mean over the mini-batch on all ranks; DeepSpeed averages gradients over
                # ranks, so each rank divides by (global tokens / world).
                n_tokens = P.all_reduce(sum(len(s.conv.response_ids) for s in mini)) / world
                micros = P.micro_batches(mini, config.micro_batch_tokens)
                n_micro = int(P.all_reduce(len(micros), op="max"))
                if n_micro == 0:
                    # Empty on every rank (dynamic sampling kept no group, or all masked): no
                    # step, or AdamW would move the weights on momentum and decay alone.
                    continue
                micros += [[_dummy_sample(pad_id)]] * (n_micro - len(micros))  # equal collectives per rank
                for mb in micros:
                    b = P.collate(mb, pad_id)
                    logp, ent = P.response_log_probs(engine, b, temperature=config.temperature, entropy=True)
                    T, mask = logp.shape[1], b["response_mask"].to(logp.device)
                    old = logp.detach() if on_policy else P.stack_right([s.old_logp for s in mb], T).to(logp.device)
                    loss, m = policy_loss(
                        logp=logp, old_logp=old,
                        advantages=b["advantages"].to(logp.device), mask=mask,
                        clip_low=config.clip_low, clip_high=config.clip_high, dual_clip=config.dual_clip,
                        ref_logp=(P.stack_right([s.ref_logp for s in mb], T).to(logp.device)
                                  if reference is not None else None),
                        kl_coef=config.kl_coef, entropy=ent, num_tokens=max(n_tokens, 1.0),
                    )
                    engine.backward(loss, scale_wrt_gas=False)
                    m["behaviour_logp_gap"] = P.behaviour_gap(mb, old, mask)  # rollout engine vs trainer
                    stats.append(m)
                engine.step()  # the accumulation boundary: reduce, clip, AdamW, LR schedule
                optimizer_steps += 1
                gn = engine.get_global_grad_norm()
                if gn is not None:  # not tracked at ZeRO stage 0
                    grad_norms.append(float(gn))

        if not stats:
            log.warning("step %d: no trainable conversation on any rank (%d groups generated, %d dropped); "
                        "no update", step, batch.groups_generated, batch.groups_dropped)

        # ============================ 5. Sync weights into the rollout engine ==============
        if config.rollout_sleep_mode:
            rollout_engine.wake_up()
        P.push_weights(engine.module, rollout_engine, config.zero_stage)
        update_s = time.perf_counter() - t_update

        # ============================ 6. Log metrics =======================================
        record = _metrics(step, batch, samples, stats, grad_norms, lr, optimizer_steps=optimizer_steps,
                          rollout_s=batch.seconds, update_s=update_s, step_s=time.perf_counter() - t_step,
                          cursor=(cursor_start, stream.cursor))
        record = P.merge_rank_metrics(P.all_gather_objects(record))  # the whole step, not rank 0's share
        records.append(record)
        if rank == 0:
            P.write_jsonl(out / "metrics.jsonl", record)
        if on_step:
            on_step(record)

        # ============================ 7. Checkpoint ========================================
        done = step + 1
        if done % config.save_every == 0 or done == config.steps:
            save_checkpoint(engine, rollout_engine.tokenizer, ckpt_dir, done, P.all_gather_ints(stream.cursor),
                            config, rank)
    if hasattr(rollout_engine, "shutdown"):
        rollout_engine.shutdown()  # vLLM: stop its engine-core process now, not at interpreter exit
    return records


# ---------------------------------------------------------------------------------------------
# Small pieces of the loop
# ---------------------------------------------------------------------------------------------


def rollout_engine_config(config: TrainConfig, model_dir: Path, device: str, bf16: bool, max_batch_size: int) -> Any:
    """The :class:`~memagent.engines.EngineConfig` of the rollout engine: the policy's weights,
    device and precision; for vLLM also its share of the GPU and sleep mode."""
    from memagent.engines import EngineConfig

    common = dict(model=str(model_dir), device=device, dtype="bf16" if bf16 else "fp32", max_batch_size=max_batch_size)
    if config.rollout_engine == "vllm":
        return EngineConfig(engine="vllm", gpu_memory_utilization=config.rollout_gpu_memory_utilization,
                            enable_sleep_mode=config.rollout_sleep_mode, **common)
    return EngineConfig(engine="hf", **common)


def save_checkpoint(engine: Any, tokenizer: Any, ckpt_dir: Path, step: int, cursors: list[int],
                    config: TrainConfig, rank: int) -> Path:
    """DeepSpeed states (all ranks, shared dir) + an HF export in ``<tag>/hf`` (rank 0)."""
    tag = P.step_tag(step)
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"step": step, "cursors": cursors})
    sd = P.gathered_state_dict(engine.module, config.zero_stage)  # collective at ZeRO-3
    if rank == 0:
        P.export_hf(engine.module, sd, tokenizer, ckpt_dir / tag / "hf")
        P.prune_checkpoints(ckpt_dir, config.keep_checkpoints)
    return ckpt_dir / tag


def _split(samples: list[P.Sample], n: int) -> list[list[P.Sample]]:
    """``n`` contiguous, near-equal mini-batches in rollout order (verl: no shuffling)."""
    size, extra = divmod(len(samples), n)
    out, i = [], 0
    for k in range(n):
        j = i + size + (k < extra)
        out.append(samples[i:j])
        i = j
    return out


def _dummy_sample(pad_id: int) -> P.Sample:
    """A masked one-token row: keeps a rank with fewer micro-batches in step with the others."""
    conv = Conversation(traj_index=-1, group_id=-1, conv_index=0, prompt_ids=[pad_id], response_ids=[pad_id],
                        behaviour_logprobs=None, is_final=False, truncated=False, trainable=False)
    return P.Sample(conv, 0.0, old_logp=torch.zeros(1), ref_logp=torch.zeros(1))


def _metrics(step: int, batch: Any, samples: list[P.Sample], stats: list[dict[str, float]],
             grad_norms: list[float], lr: float, *, optimizer_steps: int, rollout_s: float, update_s: float,
             step_s: float, cursor: tuple[int, int]) -> dict[str, Any]:
    """One JSON-able record: rewards, lengths, loss statistics (token-weighted), speed, memory."""
    trajs, convs = batch.trajectories, batch.conversations
    tokens = sum(m["tokens"] for m in stats)

    def tok_mean(key: str) -> float:
        return sum(m[key] * m["tokens"] for m in stats) / tokens if tokens else 0.0

    trained_tokens = sum(s.length for s in samples)
    return {
        "step": step,
        "reward_mean": P.mean(t.reward for t in trajs),  # trained trajectories
        "accuracy": P.mean(t.score for t in trajs),
        "trajectories_generated": len(batch.generated_rewards),
        "reward_generated_mean": P.mean(batch.generated_rewards),  # all generated, incl. dropped groups
        "accuracy_generated": P.mean(batch.generated_scores),
        "rollout_rounds": batch.rounds,
        "groups": len({t.group_id for t in trajs}),
        "groups_dropped": batch.groups_dropped,
        "groups_failed": batch.groups_failed,
        "trajectories": len(trajs),
        "convs_per_traj": P.mean(t.n_convs for t in trajs),
        "chunks_per_doc": P.mean(t.n_chunks for t in trajs),
        "memory_len": P.mean(len(c.response_ids) for c in convs if not c.is_final),
        "answer_len": P.mean(len(c.response_ids) for c in convs if c.is_final),
        "truncated_frac": P.mean(float(c.truncated) for c in convs),
        "trained_convs": len(samples),
        "response_tokens": int(tokens),
        "pg_loss": tok_mean("pg_loss"),
        "kl": tok_mean("kl"),
        "entropy": tok_mean("entropy"),
        "clip_frac": tok_mean("clip_frac"),
        "clip_high_frac": tok_mean("clip_high_frac"),
        "clip_low_frac": tok_mean("clip_low_frac"),
        "dual_clip_frac": tok_mean("dual_clip_frac"),
        "approx_kl_old": tok_mean("approx_kl_old"),
        "behaviour_logp_gap": tok_mean("behaviour_logp_gap"),  # |old - engine| per token: ~0 in fp32
        "grad_norm": P.mean(grad_norms) if grad_norms else None,
        "optimizer_steps": optimizer_steps,  # 0: nothing to train on this step
        "lr": float(lr),
        "rollout_s": round(rollout_s, 3),
        "update_s": round(update_s, 3),
        "step_s": round(step_s, 3),
        "rollout_tokens_per_s": batch.generated_tokens / rollout_s if rollout_s else 0.0,
        "train_tokens_per_s": trained_tokens / update_s if update_s else 0.0,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "data_cursor": list(cursor),
        "example_ids": list(dict.fromkeys(t.example_id for t in trajs)),  # in draw order
    }
