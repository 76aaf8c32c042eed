"""RL rollouts with a memory of K heads (issue 54): one training conversation per memory step, whose
completion is the one head that step rewrote; the trainer's Multi-Conv advantage reaches every one."""

from __future__ import annotations

import asyncio

from memagent.config import AgentConfig
from memagent.heads import clean_head, split_heads
from memagent.prompts import strip_thinking
from memagent.rl.config import TrainConfig
from memagent.rl.rollout import RolloutBatch, record_group, rollout_group
from memagent.rl.trainer import advantages
from tests.test_rl_rollout import niah

HEADS = 2
CONFIG = AgentConfig(chunk_tokens=64, memory_tokens=32, memory_heads=HEADS, answer_tokens=8, query_tokens=32,
                     temperature=1.0, answer_style="boxed")


def test_each_memory_conversation_completes_exactly_the_head_it_rewrote(tiny_engine):
    """Conversation t's completion is head t % K's new text; the other heads reach step t + 1's prompt byte
    for byte; every conversation gets its trajectory's reward minus the group mean."""
    rows = niah(2, seed=3)
    batch, results = RolloutBatch(), []
    rewards = iter([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # group 0 mixed, group 1 all equal
    for g, row in enumerate(rows):
        res = asyncio.run(rollout_group(tiny_engine, row, CONFIG, group_size=3))
        results += res
        record_group(batch, row, res, g, reward_fn=lambda response, answers: next(rewards))
    tok = tiny_engine.tokenizer
    for i, (t, res) in enumerate(zip(batch.trajectories, results)):
        convs = [c for c in batch.conversations if c.traj_index == i]
        memory = [s for s in res.steps if s.kind == "memory"]
        assert t.n_chunks == len(memory) > HEADS and len(convs) == len(memory) + 1
        previous = None
        for step, (conv, s) in enumerate(zip(convs, memory)):
            texts, written = split_heads(s.memory, HEADS)
            head = step % HEADS  # least recently updated, from a fresh memory: round-robin
            assert written[head] == step
            completion = tok.decode(conv.response_ids, skip_special_tokens=True)
            assert texts[head] == clean_head(strip_thinking(completion).strip())
            assert len(conv.response_ids) <= CONFIG.memory_tokens // HEADS  # a head's budget, not the memory's
            if previous is not None:
                carried = [x for h, x in enumerate(texts) if h != head]
                assert carried == [x for h, x in enumerate(previous[0]) if h != head]
                prompt = tok.decode(conv.prompt_ids, skip_special_tokens=True)
                assert previous[1] in prompt  # the whole memory, every head and label, is this step's input
            previous = (texts, s.memory)
        final_prompt = tok.decode(convs[-1].prompt_ids, skip_special_tokens=True)
        assert memory[-1].memory in final_prompt and convs[-1].is_final
    samples = advantages(batch, TrainConfig())
    expected = [1 - 1 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0]  # R_i - group mean
    trainable = [c for c in batch.conversations if c.trainable]
    assert [s.conv for s in samples] == trainable
    for s in samples:
        assert abs(s.advantage - expected[s.conv.traj_index]) < 1e-6
