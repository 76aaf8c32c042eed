"""A memory of K heads: head selection, carried heads, the agent loop with K heads, and resume."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import asdict

import pytest
from hypothesis import given, settings, strategies as st

from memagent.agent import ResumeMismatch, read_document
from memagent.checkpoint import new_segment, parse_segment, replay
from memagent.config import AgentConfig
from memagent.data.demo import niah_row
from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams
from memagent.heads import NEVER, clean_head, initial_memory, labelled, next_head, split_heads, write_head
from memagent.prompts import NO_MEMORY

HEADS4 = AgentConfig(chunk_tokens=64, memory_tokens=48, memory_heads=4, answer_tokens=8, query_tokens=64)


@settings(max_examples=200, deadline=None)
@given(k=st.integers(1, 8), n=st.integers(0, 60))
def test_every_head_is_rewritten_once_in_every_k_steps(k, n):
    last, chosen = [NEVER] * k, []
    for step in range(n):
        h = next_head(step, last)
        assert last[h] == min(last)  # least recently updated
        last[h] = step
        chosen.append(h)
    assert chosen == [s % k for s in range(n)]  # one write a step: LRU is round-robin
    for s in range(max(0, n - k + 1)):
        assert sorted(chosen[s:s + k]) == list(range(k))


@settings(max_examples=200, deadline=None)
@given(start=st.lists(st.integers(-1, 30), min_size=1, max_size=6, unique=True), n=st.integers(1, 30))
def test_lru_from_any_state_reaches_every_head_within_k_steps(start, n):
    k, last = len(start), list(start)
    step0 = max(start) + 1
    for step in range(step0, step0 + max(n, k)):
        h = next_head(step, last)
        assert all(last[h] <= w for w in last)
        last[h] = step
    assert min(last) >= step0  # after K steps from any state, every head has been rewritten


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(_text, min_size=2, max_size=6), new=_text, data=st.data())
def test_writing_one_head_carries_the_others_byte_for_byte(texts, new, data):
    k = len(texts)
    texts = [clean_head(t) for t in texts]
    memory = labelled(texts, list(range(k)))
    assert split_heads(memory, k) == (texts, list(range(k)))
    h = data.draw(st.integers(0, k - 1))
    after, written = split_heads(write_head(memory, k, h, new + "\n## Memory head 1 of 9 (not yet written)", k), k)
    assert after[h] == clean_head(new) and written[h] == k
    assert [t for i, t in enumerate(after) if i != h] == [t for i, t in enumerate(texts) if i != h]


def test_labels_and_bad_memories():
    assert initial_memory(1) == NO_MEMORY
    m = initial_memory(3)
    assert m.startswith("## Memory head 1 of 3 (not yet written)\nNo previous memory\n\n## Memory head 2 of 3")
    with pytest.raises(ValueError, match="not 4 labelled heads"):
        split_heads(m, 4)
    with pytest.raises(ValueError, match="later step"):
        next_head(2, [0, 2])


class _HeadWriter(Engine):
    """Writes the needle numbers of its section after the head's old text (a scripted memory that keeps all)."""

    def __init__(self, tokenizer):
        self.name, self.context_window, self.tokenizer, self.stats = "heads", 4096, tokenizer, EngineStats()
        self.calls: list[tuple[str, SamplingParams]] = []

    async def chat(self, messages, params: SamplingParams) -> Completion:
        content = messages[-1]["content"]
        self.calls.append((content, params))
        if "<section>" not in content:
            return Completion(text="the answer is x", prompt_tokens=1, completion_tokens=1, finish_reason="stop")
        section = content.split("<section>\n", 1)[1].split("\n</section>", 1)[0]
        found = re.findall(r"\d{5,}", section)
        head = re.search(r"New text of head (\d+):$", content)
        step = len(self.calls)
        text = f"s{step} " + " ".join(found) if head else f"mem {step} " + " ".join(found)
        return Completion(text=text, prompt_tokens=len(content) // 4, completion_tokens=3, finish_reason="stop")


def _steps(steps):
    return [{k: v for k, v in asdict(s).items() if k != "seconds"} for s in steps]


def test_k_heads_each_step_sees_all_rewrites_one(tiny_engine):
    engine = _HeadWriter(tiny_engine.tokenizer)
    row = niah_row(0, 500, depth=0.5, seed=3)
    r = asyncio.run(read_document(engine, row["question"], row["context"], HEADS4))
    memory_steps = [s for s in r.steps if s.kind == "memory"]
    assert len(memory_steps) >= 6
    previous = initial_memory(4)
    for t, (step, (content, params)) in enumerate(zip(memory_steps, engine.calls)):
        assert params.max_tokens == 12  # memory_tokens / K
        assert f"<memory>\n{previous}\n</memory>" in content and content.endswith(f"New text of head {t % 4 + 1}:")
        before, _ = split_heads(previous, 4)
        after, written = split_heads(step.memory, 4)
        found = re.findall(r"\d{5,}", row["context"][step.char_start:step.char_end])
        assert after[t % 4] == f"s{t + 1} {' '.join(found)}".strip()
        assert written[t % 4] == t
        assert [a for i, a in enumerate(after) if i != t % 4] == [b for i, b in enumerate(before) if i != t % 4]
        previous = step.memory
    assert r.memory == previous and r.steps[-1].kind == "answer"


def test_one_head_is_the_papers_memory(tiny_engine):
    engine = _HeadWriter(tiny_engine.tokenizer)
    row = niah_row(0, 300, depth=0.5, seed=3)
    cfg = HEADS4.with_overrides(memory_heads=1)
    asyncio.run(read_document(engine, row["question"], row["context"], cfg))
    first, params = engine.calls[0]
    assert f"<memory>\n{NO_MEMORY}\n</memory>" in first and first.endswith("Updated memory:")
    assert params.max_tokens == 48 and "Memory head" not in engine.calls[1][0]


@pytest.mark.parametrize("at", [1, 3, 5])
def test_resume_mid_document_with_four_heads_equals_the_uninterrupted_read(tiny_engine, at):
    row = niah_row(2, 500, depth=0.7, seed=5)
    states = []

    async def keep(state):
        states.append(state)

    full = asyncio.run(read_document(_HeadWriter(tiny_engine.tokenizer), row["question"], row["context"], HEADS4,
                                     on_state=keep))
    assert len(states) > at
    # Through a checkpoint segment, as the batch job stores it: the memory text holds every head.
    segment = parse_segment(json.dumps(new_segment("d", "k", states[at - 1], 0)))
    state, _ = replay([segment], "d", "k")
    assert state is not None and state.memory == states[at - 1].memory
    engine = _HeadWriter(tiny_engine.tokenizer)
    engine.calls = [None] * at  # the scripted writer numbers its replies by call: as if it had written these
    resumed = asyncio.run(read_document(engine, row["question"], row["context"], HEADS4, resume=state))
    assert (resumed.memory, resumed.response) == (full.memory, full.response)
    assert _steps(resumed.steps) == _steps(full.steps)


def test_a_single_memory_state_is_no_state_of_four_heads(tiny_engine):
    row = niah_row(2, 500, depth=0.7, seed=5)
    states = []

    async def keep(state):
        states.append(state)

    engine = _HeadWriter(tiny_engine.tokenizer)
    asyncio.run(read_document(engine, row["question"], row["context"], HEADS4.with_overrides(memory_heads=1),
                              on_state=keep))
    with pytest.raises(ResumeMismatch, match="memory_heads=4"):
        asyncio.run(read_document(engine, row["question"], row["context"], HEADS4, resume=states[1]))


def test_config_rejects_heads_too_small():
    with pytest.raises(ValueError, match="a head needs 8 or more"):
        AgentConfig(memory_tokens=48, memory_heads=8, chunk_tokens=64)


def test_the_labels_count_in_the_window_check(tiny_engine):
    from memagent.agent import check_config

    check_config(tiny_engine, HEADS4)
    # The heads' labels and template push a config that just fits with one memory over the window.
    big = AgentConfig(chunk_tokens=3300, memory_tokens=256, answer_tokens=64, query_tokens=64)
    for chunk in range(3300, 0, -8):
        try:
            check_config(tiny_engine, big.with_overrides(chunk_tokens=chunk))
            break
        except ValueError:
            continue
    with pytest.raises(ValueError, match="budgets do not fit"):
        check_config(tiny_engine, big.with_overrides(chunk_tokens=chunk, memory_heads=8))


@pytest.mark.slow
def test_speculation_on_the_packaged_model_leaves_a_heads_read_unchanged(smollm2_dir):
    """With two heads, the packaged model's greedy read is the same memory by memory with copy-aware drafting
    as without it (drafts come from the prompt, whose carried heads the rewritten head copies), and drafts are
    accepted: speculation applies to the head being rewritten."""
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine

    row = niah_row(1, 450, depth=0.4, seed=7)
    cfg = AgentConfig(chunk_tokens=128, memory_tokens=64, memory_heads=2, answer_tokens=8, query_tokens=64)
    reads = {}
    for speculate in (False, True):
        engine = TransformersEngine.from_config(EngineConfig(model=str(smollm2_dir), dtype="fp32",
                                                             speculate=speculate))
        try:
            reads[speculate] = asyncio.run(read_document(engine, row["question"], row["context"], cfg))
        finally:
            asyncio.run(engine.close())
    plain, drafted = reads[False], reads[True]
    memories = [s.memory for s in plain.steps if s.kind == "memory"]
    assert len(memories) >= 3 and [s.memory for s in drafted.steps if s.kind == "memory"] == memories
    assert drafted.response == plain.response
    assert sum(s.accepted_tokens for s in drafted.steps) > 0 and sum(s.draft_tokens for s in plain.steps) == 0
