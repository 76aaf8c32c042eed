"""Multi-Conv DAPO training through real DeepSpeed (gloo, CPU). Run: .venv/bin/pytest tests/test_rl_trainer.py

The first run in a fresh environment JIT-compiles DeepSpeed's shared-memory comm op (~1 min,
cached in ~/.cache/torch_extensions afterwards).
"""

from __future__ import annotations

import json

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from memagent.config import AgentConfig
from memagent.rl.batching import Sample, micro_batches
from memagent.rl.config import TrainConfig
from memagent.rl.data import DataStream, load_examples
from memagent.rl.rollout import Conversation
from test_rl_rollout import niah

AGENT = AgentConfig(chunk_tokens=64, memory_tokens=16, answer_tokens=8, query_tokens=32)


# -- config, data and batching (fast) ---------------------------------------------------------------


def test_train_config_defaults_and_rejections():
    c = TrainConfig()
    assert (c.clip_low, c.clip_high, c.dual_clip, c.kl_coef, c.std_normalize) == (0.2, 0.2, 3.0, 0.001, False)
    assert TrainConfig(clip_high=0.28).clip_high == 0.28  # DAPO clip-higher is reachable
    for bad in (dict(dual_clip=1.0), dict(dynamic_sampling=True, group_size=1), dict(clip_low=1.0),
                dict(batch_size=1, group_size=2, ppo_mini_batches=3), dict(overlong_penalty=1.0),
                dict(zero_stage=4), dict(betas=(0.9, 1.0)), dict(unknown=1)):
        with pytest.raises(ValidationError):
            TrainConfig(**bad)
    assert TrainConfig(overlong="penalize", overlong_penalty=1.0).overlong_penalty == 1.0


def test_deepspeed_config_from_train_config():
    ds = TrainConfig(zero_stage=3, lr=1e-5, warmup_steps=5, ppo_mini_batches=4, grad_clip=0.5).deepspeed_config()
    assert ds["zero_optimization"]["stage"] == 3 and ds["gradient_clipping"] == 0.5
    assert ds["managed_gradient_accumulation"] is False
    assert ds["optimizer"]["type"] == "AdamW" and ds["optimizer"]["params"]["lr"] == 1e-5
    assert "scheduler" not in ds
    # Warm-up over 1 training step x 2 mini-batches = 2 optimizer steps: lr/3, 2lr/3, lr, lr.
    cfg = TrainConfig(lr=3.0, warmup_steps=1, ppo_mini_batches=2)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    sched, lrs = cfg.lr_scheduler(opt), []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([1.0, 2.0, 3.0, 3.0])
    ds2 = TrainConfig().deepspeed_config(world_size=2)  # the package's ZeRO settings, no file outside it
    assert ds2["zero_optimization"]["contiguous_gradients"] is True and ds2["zero_optimization"]["stage"] == 2


def test_data_stream_is_deterministic_and_resumable():
    rows = [{"id": str(i)} for i in range(5)]
    a = DataStream(rows, seed=3, shuffle=True)
    first = [r["id"] for r in a.draw(12)]  # crosses two epoch boundaries
    assert sorted(first[:5]) == [str(i) for i in range(5)] and sorted(first[5:10]) == sorted(first[:5])
    b = DataStream(rows, seed=3, shuffle=True, cursor=7)
    assert [r["id"] for r in b.draw(5)] == first[7:12]
    assert [r["id"] for r in DataStream(rows, seed=0, shuffle=False).draw(3)] == ["0", "1", "2"]


def test_micro_batches_respect_the_token_budget():
    def s(n):
        return Sample(Conversation(0, 0, 0, [1] * (n - 1), [2], None, False, False), 0.0)

    mbs = micro_batches([s(10), s(30), s(12), s(28), s(100)], 60)
    assert [[x.length for x in mb] for mb in mbs] == [[10, 12], [28, 30], [100]]
    one_row = micro_batches([s(10), s(30), s(12)], 60, max_rows=1)  # the trainer's CPU setting
    assert [[x.length for x in mb] for mb in one_row] == [[10], [12], [30]]


def test_load_examples_checks_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = niah(2)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    assert load_examples(tmp_path / "d.parquet")[1]["answers"] == rows[1]["answers"]
    with pytest.raises(ValueError, match="answers"):
        load_examples([{"id": "a", "question": "q", "context": "c"}])


# -- a real run through DeepSpeed ---------------------------------------------------------------


@pytest.mark.slow
def test_train_checkpoint_export_and_resume(tiny_llama_dir, tmp_path):
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine
    from memagent.rl.checkpoint import export_checkpoint
    from memagent.rl.trainer import train

    data = niah(6)
    out = tmp_path / "run"
    # A random model never boxes the right number; a length-parity reward gives groups variance.
    kw = dict(agent_config=AGENT, data=data, out_dir=out, model=str(tiny_llama_dir),
              reward_fn=lambda response, answers: float(len(response) % 2))
    cfg = TrainConfig(steps=2, batch_size=2, group_size=2, lr=1e-3, warmup_steps=0, save_every=1,
                      micro_batch_tokens=1024, ppo_mini_batches=2, keep_checkpoints=None)
    records = train(config=cfg, **kw)
    assert [r["step"] for r in records] == [0, 1]
    for r in records:
        assert r["convs_per_traj"] == r["chunks_per_doc"] + 1 > 2
        assert r["lr"] == 1e-3 and r["trajectories"] == 4 and r["response_tokens"] > 0
        assert r["behaviour_logp_gap"] < 1e-3  # rollout engine and trainer agree token by token
    assert records[1]["kl"] > 0  # the policy moved away from the reference

    ckpt = out / "checkpoints"
    assert (ckpt / "latest").read_text().strip() == "step_000002"
    assert (ckpt / "step_000002" / "mp_rank_00_model_states.pt").is_file()
    hf = ckpt / "step_000002" / "hf"
    new, old = load_file(hf / "model.safetensors"), load_file(tiny_llama_dir / "model.safetensors")
    changed = [k for k in old if not torch.equal(old[k], new[k])]
    assert len(changed) == len(old), f"unchanged: {set(old) - set(changed)}"

    engine = TransformersEngine.from_config(EngineConfig(model=str(hf), dtype="fp32"))  # the export loads and generates
    reply = __import__("asyncio").run(engine.chat([{"role": "user", "content": "hi"}],
                                                  __import__("memagent.engines.base", fromlist=["x"]).SamplingParams(4)))
    assert reply.completion_tokens > 0

    # `memagent export`: rebuilt from the DeepSpeed states alone, equal to the in-run export.
    exported = load_file(export_checkpoint(out, tmp_path / "export") / "model.safetensors")
    for k in new:
        torch.testing.assert_close(exported[k], new[k])

    with pytest.raises(FileExistsError):
        train(config=cfg, **kw)

    # Resume: continues at step 2 with the data the uninterrupted run would have drawn. One
    # mini-batch now: the on-policy path (old log-probs from the update's own forward).
    resumed = train(config=cfg.model_copy(update={"steps": 3, "ppo_mini_batches": 1}), resume=True, **kw)
    assert [r["step"] for r in resumed] == [2]
    assert resumed[0]["clip_frac"] == 0.0 and resumed[0]["behaviour_logp_gap"] < 1e-3
    assert resumed[0]["data_cursor"] == [4, 6]
    expected = [r["id"] for r in DataStream(data, seed=cfg.seed, shuffle=cfg.shuffle, cursor=4).draw(2)]
    assert resumed[0]["example_ids"] == expected
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2]
    assert (ckpt / "latest").read_text().strip() == "step_000003"


def test_a_step_with_every_group_dropped_skips_the_update(tiny_llama_dir, tmp_path):
    """Dynamic sampling can keep no group (the policy is right, or wrong, everywhere): no AdamW step."""
    from memagent.rl.trainer import train

    cfg = TrainConfig(steps=2, batch_size=2, group_size=2, lr=1e-3, warmup_steps=0, save_every=2,
                      micro_batch_tokens=1024, dynamic_sampling=True, max_rollout_rounds=1)
    records = train(config=cfg, agent_config=AGENT, data=niah(6), out_dir=tmp_path / "run",
                    model=str(tiny_llama_dir), reward_fn=lambda response, answers: 1.0)
    assert [r["step"] for r in records] == [0, 1]
    for r in records:
        assert r["trajectories"] == 0 and r["groups_dropped"] == 2 and r["optimizer_steps"] == 0
        assert r["reward_generated_mean"] == 1.0 and r["trajectories_generated"] == 4
    hf = tmp_path / "run" / "checkpoints" / "step_000002" / "hf" / "model.safetensors"
    new, old = load_file(hf), load_file(tiny_llama_dir / "model.safetensors")
    assert all(torch.equal(old[k], new[k]) for k in old)  # weights untouched
