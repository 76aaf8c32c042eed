"""The training memory estimate and the guard that refuses a run which cannot fit."""

from __future__ import annotations

import pytest

from memagent.config import AgentConfig, preset
from memagent.rl.config import TrainConfig
from memagent.rl.memory import MB, MemoryBudgetError, ModelShape, check_memory, estimate_peak_memory

# SmolLM2-135M: 30 layers, 576 wide, 1536 MLP, 3 KV heads x 64, tied 49152-token embeddings.
SMOLLM2 = ModelShape(params=134_515_008, layers=30, hidden=576, intermediate=1536, kv_dim=192, vocab=49152)
AGENT_A = preset("small").with_overrides(chunk_tokens=512, memory_tokens=64, answer_tokens=16)
A = dict(batch_size=2, group_size=2)  # the reference configuration (a), with AGENT_A


def test_resident_parts_follow_the_model_and_the_zero_stage():
    est = estimate_peak_memory(TrainConfig(), AGENT_A, SMOLLM2)
    weights = SMOLLM2.params * 4 / MB  # 513 MB in fp32
    r = est.resident
    assert r["policy"] == r["reference"] == pytest.approx(weights)
    assert r["adam_moments"] == pytest.approx(2 * weights)
    # One process: ZeRO-0 (no master copy; gradients only during the update), rollout shares the policy.
    assert "fp32_master" not in r and "rollout_weights" not in r and "gradients" not in r
    # ZeRO-2 asked for on one process: a master copy and a bucket on top.
    z2 = estimate_peak_memory(TrainConfig(zero_stage=2), AGENT_A, SMOLLM2).resident
    assert z2["fp32_master"] == z2["gradients"] == pytest.approx(weights)
    assert z2["reduce_bucket"] == pytest.approx(200_000_000 / MB)
    # Two ranks at the default (ZeRO-2): moments and master copy halved per rank.
    two = estimate_peak_memory(TrainConfig(), AGENT_A, SMOLLM2, world_size=2).resident
    assert two["adam_moments"] == pytest.approx(weights) and two["fp32_master"] == pytest.approx(weights / 2)
    assert "reference" not in estimate_peak_memory(TrainConfig(kl_coef=0.0), AGENT_A, SMOLLM2).resident


def test_transients_follow_the_knobs_the_message_names():
    base = estimate_peak_memory(TrainConfig(**A), AGENT_A, SMOLLM2)
    no_ckpt = estimate_peak_memory(TrainConfig(gradient_checkpointing=False, **A), AGENT_A, SMOLLM2)
    assert no_ckpt.transient["update"] > 2 * base.transient["update"]  # activations of all 30 layers kept
    # On a CPU each conversation is one row of the update: its length, not micro_batch_tokens, counts.
    short = estimate_peak_memory(TrainConfig(gradient_checkpointing=False, **A),
                                 AGENT_A.with_overrides(chunk_tokens=128), SMOLLM2)
    assert short.transient["update"] < 0.75 * no_ckpt.transient["update"]
    assert estimate_peak_memory(TrainConfig(micro_batch_tokens=1024, **A), AGENT_A, SMOLLM2).transient == base.transient
    wide = estimate_peak_memory(TrainConfig(batch_size=8, group_size=8), AGENT_A, SMOLLM2)
    assert wide.transient["rollout"] > 10 * base.transient["rollout"]
    assert base.peak_mb == pytest.approx(sum(base.resident.values()) + max(base.transient.values()))
    # Configuration (a): 3.6-3.9 GB measured (benchmarks/results/train_memory.json).
    assert 3400 < base.peak_mb < 4300


def test_guard_refuses_with_the_estimate_the_memory_and_the_knob():
    est = estimate_peak_memory(TrainConfig(gradient_checkpointing=False), AGENT_A, SMOLLM2)
    assert est.largest_transient == "update"
    with pytest.raises(MemoryBudgetError) as err:
        check_memory(est, available_mb=2048)
    msg = str(err.value)
    assert f"{est.peak_mb / 1024:.1f} GB" in msg and "2.0 GB" in msg
    assert "gradient_checkpointing" in msg and "--chunk-tokens" in msg and "--force" in msg
    check_memory(est, available_mb=2048, force=True)  # forced: no error
    check_memory(est, available_mb=est.peak_mb + 1)
    with pytest.raises(MemoryBudgetError, match="2 process"):
        check_memory(est, available_mb=est.peak_mb + 1, processes=2)  # two ranks on one host
    assert isinstance(MemoryBudgetError("x"), ValueError)  # the CLI reports it as a user error


def test_model_shape_counts_the_real_parameters(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    shape = ModelShape.of(tiny_llama_dir)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir))
    assert shape.params == sum(p.numel() for p in model.parameters())
    assert (shape.layers, shape.hidden, shape.kv_dim) == (2, 64, 32)


# The data is read first (a bad file is named before any model loads); this one is valid.
EXAMPLE = {"id": "q-1", "question": "Who?", "context": "Ann did.", "answers": ["Ann"]}


def test_train_refuses_before_loading_anything(tiny_llama_dir, tmp_path, monkeypatch):
    import psutil

    from memagent.rl.trainer import train

    class Tiny:
        available = 64 * MB

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Tiny)
    with pytest.raises(MemoryBudgetError, match="available"):
        train(config=TrainConfig(steps=1), agent_config=AgentConfig(chunk_tokens=64, memory_tokens=16,
              answer_tokens=8, query_tokens=32), data=[EXAMPLE], out_dir=tmp_path / "run",
              model=str(tiny_llama_dir))
    assert not (tmp_path / "run").exists()
