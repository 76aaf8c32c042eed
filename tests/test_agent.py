"""The memory loop end to end: trace shape, overwriting memory, char spans, bad input."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from memagent.agent import InputError, check_config, read_document
from memagent.config import AgentConfig, PRESETS
from memagent.data.demo import niah_row
from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams
from memagent.prompts import NO_MEMORY

FAST = AgentConfig(chunk_tokens=96, memory_tokens=12, answer_tokens=8, query_tokens=64)


def run(coro):
    return asyncio.run(coro)


def test_trace_shape_and_overwrite_with_tiny_model(tiny_engine):
    row = niah_row(0, 400, depth=0.8, seed=1)
    r = run(read_document(tiny_engine, row["question"], row["context"], FAST, keep_completions=True))
    assert r.n_chunks == len(r.steps) - 1 >= 3
    memory_steps = r.steps[:-1]
    assert [s.kind for s in r.steps] == ["memory"] * r.n_chunks + ["answer"]
    assert [s.chunk_index for s in memory_steps] == list(range(r.n_chunks))
    # Spans tile the document.
    assert memory_steps[0].char_start == 0 and memory_steps[-1].char_end == len(row["context"])
    for a, b in zip(memory_steps, memory_steps[1:]):
        assert a.char_end == b.char_start
    tok = tiny_engine.tokenizer
    for i, (s, c) in enumerate(zip(memory_steps, r.completions)):
        # The memory after a step is that step's reply (overwritten, not appended) ...
        assert s.memory == c.text.strip()
        assert s.completion_tokens <= FAST.memory_tokens
        # ... and each prompt holds the previous memory and exactly this chunk.
        prompt = tok.decode(c.prompt_token_ids)
        previous = NO_MEMORY if i == 0 else memory_steps[i - 1].memory
        assert f"<memory>\n{previous}\n</memory>" in prompt
        assert row["context"][s.char_start : s.char_end] in prompt
    final_prompt = tok.decode(r.completions[-1].prompt_token_ids)
    assert "<section>" not in final_prompt and memory_steps[-1].memory in final_prompt
    assert r.memory == memory_steps[-1].memory and r.context_tokens > 3 * FAST.chunk_tokens - 96


def test_centre_truncation_reported(tiny_engine):
    row = niah_row(1, 600, depth=0.5, seed=1)
    cfg = FAST.with_overrides(max_chunks=2)
    r = run(read_document(tiny_engine, row["question"], row["context"], cfg))
    assert r.truncated and r.n_chunks == 2
    assert r.steps[1].chunk_index > 1  # the tail chunk keeps its index in the full document


@pytest.mark.parametrize(
    ("question", "context", "match"),
    [
        ("Q?", "", "context is empty"),
        ("Q?", "  \n\t ", "context is empty"),
        ("Q?", None, "context must be a string, got null"),
        ("Q?", 42, "type int"),
        (None, "text", "question must be a non-empty string"),
        ("   ", "text", "question must be a non-empty string"),
        ("word " * 200, "text", "over query_tokens"),
    ],
)
def test_bad_input_is_a_clear_error(tiny_engine, question, context, match):
    with pytest.raises(InputError, match=match):
        run(read_document(tiny_engine, question, context, FAST))


def test_config_that_cannot_fit_is_rejected(tiny_engine):
    with pytest.raises(ValueError, match="lower chunk_tokens"):
        check_config(tiny_engine, PRESETS["paper"])  # 4K window


@pytest.mark.slow
def test_real_read_with_packaged_model(smollm2_engine):
    """SmolLM2 reads a document whose needle sits in a later chunk (accuracy is not asserted)."""
    row = niah_row(2, 700, depth=0.9, seed=3)
    cfg = PRESETS["tiny"]
    check_config(smollm2_engine, cfg)
    seen = []
    r = run(read_document(smollm2_engine, row["question"], row["context"], cfg, on_step=lambda s, n: seen.append(n)))
    assert r.n_chunks >= 3 and len(r.steps) == r.n_chunks + 1 and seen == [r.n_chunks + 1] * len(r.steps)
    needle_at = row["context"].index("special magic number for")
    holder = next(s for s in r.steps if s.char_start is not None and s.char_start <= needle_at < s.char_end)
    assert holder.chunk_index >= 2  # a later chunk
    memories = [s.memory for s in r.steps[:-1]]
    assert all(m and m != NO_MEMORY for m in memories)
    assert all(s.prompt_tokens > 0 and s.completion_tokens > 0 and s.seconds > 0 for s in r.steps)
    assert r.response.strip() and r.prediction


class _RecordingEngine(Engine):
    """Replies with a fixed text and records each request's sampling parameters."""

    def __init__(self, tokenizer):
        self.name, self.context_window, self.tokenizer, self.stats = "recording", 4096, tokenizer, EngineStats()
        self.params: list[SamplingParams] = []
        self.replies: list[weakref.ref] = []
        self.alive: list[int] = []  # earlier replies still referenced when each request arrives

    async def chat(self, messages, params: SamplingParams) -> Completion:
        self.params.append(params)
        gc.collect()
        self.alive.append(sum(ref() is not None for ref in self.replies))
        reply = Completion(text="noted", prompt_tokens=10, completion_tokens=1, finish_reason="stop",
                           prompt_token_ids=list(range(10)))
        self.replies.append(weakref.ref(reply))
        return reply


def test_each_request_carries_the_conversations_left_as_priority(tiny_engine):
    engine = _RecordingEngine(tiny_engine.tokenizer)
    row = niah_row(0, 400, depth=0.5, seed=2)
    r = run(read_document(engine, row["question"], row["context"], FAST))
    n = r.n_chunks
    # Lower goes first: the first update of an n-chunk document has n + 1 conversations ahead.
    assert [p.priority for p in engine.params] == [-(n + 1 - k) for k in range(n)] + [-1]


def test_replies_are_not_held_unless_asked_for(tiny_engine):
    # A reply may carry its prompt's token ids; a 3.5M-token document has 860 of them.
    row = niah_row(0, 400, depth=0.5, seed=2)
    engine = _RecordingEngine(tiny_engine.tokenizer)
    r = run(read_document(engine, row["question"], row["context"], FAST))
    assert r.completions is None and r.n_chunks > 2
    assert max(engine.alive) <= 1  # at most the reply just read, never the whole chain's
    engine = _RecordingEngine(tiny_engine.tokenizer)
    r = run(read_document(engine, row["question"], row["context"], FAST, keep_completions=True))
    assert [c.prompt_token_ids for c in r.completions] == [list(range(10))] * (r.n_chunks + 1)
    assert engine.alive == list(range(r.n_chunks + 1))
