"""Group rollouts through the memory agent on a tiny random Llama. Run: .venv/bin/pytest tests/test_rl_rollout.py"""

from __future__ import annotations

import asyncio
import itertools
import random

import torch

from memagent.config import AgentConfig
from memagent.rl.batching import Sample, collate, response_log_probs
from memagent.rl.data import DataStream
from memagent.rl.rollout import Conversation, collect_rollouts

CONFIG = AgentConfig(chunk_tokens=64, memory_tokens=16, answer_tokens=8, query_tokens=32,
                     temperature=1.0, answer_style="boxed")


def niah(n: int, seed: int = 0, sentences: int = 20) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        value = str(rng.randint(1000, 9999))
        filler = [f"Line {j}: the grass is green and the sky is blue." for j in range(sentences)]
        filler.insert(rng.randint(0, sentences), f"The special magic number for key{i} is {value}.")
        rows.append({"id": f"q{i}", "question": f"What is the special magic number for key{i}?",
                     "context": " ".join(filler), "answers": [value]})
    return rows


def run(engine, data, **kw):
    stream = DataStream(data, seed=0, shuffle=False)
    kw.setdefault("config", CONFIG)
    batch = asyncio.run(collect_rollouts(engine, stream.draw, **kw))
    return batch, stream


def test_records_line_up_and_only_the_final_answer_is_rewarded(tiny_engine):
    seen: list[str] = []

    def reward(response: str, answers) -> float:
        seen.append(response)
        return float(len(seen) % 2)

    batch, _ = run(tiny_engine, niah(2), batch_size=2, group_size=3, reward_fn=reward)
    assert len(batch.trajectories) == 6 and len(seen) == 6
    assert batch.rewards.tolist() == [1.0, 0.0] * 3
    # The G trajectories of a question share its group id.
    assert batch.group_ids.tolist() == [0, 0, 0, 1, 1, 1]
    for i, t in enumerate(batch.trajectories):
        convs = [c for c in batch.conversations if c.traj_index == i]
        assert t.n_chunks > 1 and len(convs) == t.n_chunks + 1 == t.n_convs
        assert [c.conv_index for c in convs] == list(range(t.n_convs))
        assert [c.is_final for c in convs] == [False] * t.n_chunks + [True]
        assert all(c.group_id == t.group_id for c in convs)
        final_text = tiny_engine.tokenizer.decode(convs[-1].response_ids, skip_special_tokens=True)
        assert final_text == t.response == seen[i]  # the reward saw the final response only
        for c in convs:
            assert c.behaviour_logprobs is not None and len(c.behaviour_logprobs) == len(c.response_ids)
            assert c.truncated == (len(c.response_ids) == (8 if c.is_final else 16) and
                                   c.response_ids[-1] not in tiny_engine.eos_ids)
    # Conversations come grouped by trajectory, in order.
    assert batch.conv_traj_index.tolist() == sorted(batch.conv_traj_index.tolist())


def test_masks_line_up_with_token_ids_and_logprobs_recompute(tiny_llama_dir):
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine

    # fp32 whatever the CPU (dtype "auto" is bf16 on CPUs with bf16 units): log-probs compared at 1e-3.
    tiny_engine = TransformersEngine.from_config(EngineConfig(model=str(tiny_llama_dir), dtype="fp32"), name="tiny-llama")
    batch, _ = run(tiny_engine, niah(1), batch_size=1, group_size=2)
    samples = [Sample(c, 1.0) for c in batch.conversations]
    b = collate(samples, tiny_engine.pad_id)
    for i, s in enumerate(samples):
        ids, r = s.conv.prompt_ids + s.conv.response_ids, len(s.conv.response_ids)
        L, T = b["input_ids"].shape[1], b["targets"].shape[1]
        assert b["input_ids"][i, L - len(ids):].tolist() == ids
        assert b["attention_mask"][i].sum().item() == len(ids)
        assert b["response_mask"][i].sum().item() == r
        assert b["targets"][i, T - r:].tolist() == s.conv.response_ids
        assert b["response_mask"][i, : T - r].sum().item() == 0
    with torch.no_grad():
        logp, _ = response_log_probs(tiny_engine.model, b)
    for i, s in enumerate(samples):
        r = len(s.conv.response_ids)
        got = logp[i, logp.shape[1] - r:]
        torch.testing.assert_close(got, torch.tensor(s.conv.behaviour_logprobs), atol=1e-3, rtol=1e-3)


def test_dynamic_sampling_drops_all_equal_groups_and_refills(tiny_engine):
    batch, stream = run(tiny_engine, niah(6), batch_size=2, group_size=2, reward_fn=lambda r, a: 0.0,
                        dynamic_sampling=True, max_rounds=2)
    assert batch.trajectories == [] and batch.conversations == []
    assert batch.groups_dropped == 4 and batch.rounds == 2 and batch.examples_drawn == 4 == stream.cursor

    counter = itertools.count()
    # Reward pattern per trajectory: group 0 -> (1, 1) dropped, group 1 -> (0, 1) kept, ...
    pattern = [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    batch, stream = run(tiny_engine, niah(6), batch_size=2, group_size=2,
                        reward_fn=lambda r, a: pattern[next(counter)], dynamic_sampling=True, max_rounds=3)
    assert batch.rounds == 2 and batch.groups_dropped == 1 and stream.cursor == 3
    assert len({t.group_id for t in batch.trajectories}) == 2
    # Every generated trajectory's reward is kept for the unbiased success rate, dropped groups too.
    assert batch.generated_rewards == pattern[:6] and sum(t.reward for t in batch.trajectories) == 2.0
    assert all(len({t.reward for t in batch.trajectories if t.group_id == g}) == 2 for g in batch.group_ids.tolist())


def test_overlong_mask_and_penalty(tiny_engine):
    # A random model rarely emits EOS in 16 tokens: most conversations are cut by the limit.
    batch, _ = run(tiny_engine, niah(1), batch_size=1, group_size=2, overlong="mask", reward_fn=lambda r, a: 1.0)
    assert any(c.truncated for c in batch.conversations)
    assert all(c.trainable == (not c.truncated) for c in batch.conversations)
    batch, _ = run(tiny_engine, niah(1), batch_size=1, group_size=2, overlong="penalize", overlong_penalty=0.25,
                   reward_fn=lambda r, a: 1.0)
    for t in batch.trajectories:
        assert t.score == 1.0 and t.reward == (0.75 if t.truncated_convs else 1.0)
    assert all(c.trainable for c in batch.conversations)


def test_invalid_examples_are_skipped_and_counted(tiny_engine):
    data = niah(2)
    data[0]["question"] = "why " * 100  # over query_tokens=32
    batch, _ = run(tiny_engine, data, batch_size=2, group_size=2)
    assert batch.groups_failed == 1 and {t.example_id for t in batch.trajectories} == {"q1"}


def test_per_row_log_probs_equal_the_padded_batch(tiny_llama_dir):
    """CPU scoring runs each row unpadded (no attention mask); the numbers must not change."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32).eval()
    rows = [([5, 6, 7, 8, 9, 10], [11, 12]), ([5, 6], [13, 14, 15, 16]), ([7] * 9, [17])]
    samples = [Sample(Conversation(0, 0, 0, p, r, None, False, False), 1.0) for p, r in rows]
    b = collate(samples, pad_id=0)
    padded, ent_padded = response_log_probs(model, b, entropy=True, per_row=False)
    unpadded, ent_unpadded = response_log_probs(model, b, entropy=True, per_row=True)
    mask = b["response_mask"].bool()
    torch.testing.assert_close(unpadded[mask], padded[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_unpadded[mask], ent_padded[mask], atol=1e-5, rtol=1e-5)
    assert unpadded.shape == padded.shape == (3, 4)
