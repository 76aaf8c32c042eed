"""Aligned drafting: the prompt (with the previous memory in it) as the predicted reply. The pointer
follows the reply, re-syncs after an edit, drafts what remains of the memory at once, and the
output stays the model's (greedy tokens identical to decoding without speculation)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from memagent.engines import EngineConfig, SamplingParams
from memagent.engines.hf import TransformersEngine
from memagent.engines.hf_decode import Speculation
from memagent.engines.speculation import (
    AlignedDrafter,
    CostModel,
    NgramDrafter,
    advance_alignment,
    choose_draft_len,
    matched_prefix,
    pick_proposal,
    resync,
)

NL = 9  # the newline before the memory in the prompt, and before the reply
MEMORY = list(range(20, 40))  # 20 tokens of previous memory
PROMPT = np.array([1, 2, 3, NL, *MEMORY, NL, 4, 5, 6, 7, NL], dtype=np.int64)  # ... memory ... chunk ... "\n"


def reply_after(*tokens: int) -> tuple[AlignedDrafter, np.ndarray]:
    """An aligned drafter over PROMPT that has seen ``tokens`` of the reply, one step each."""
    drafter, history = AlignedDrafter(PROMPT), PROMPT.copy()
    for tok in tokens:
        history = np.append(history, tok)
        drafter.observe(history, 1)
    return drafter, history


# -- the pointer ---------------------------------------------------------------------------------


def test_aligned_drafter_starts_at_the_memory_and_drafts_all_that_remains():
    drafter, history = reply_after(20)  # the reply's first token, after its newline: the memory's start
    assert drafter.propose(history, 1000) == [*MEMORY[1:], NL, 4, 5, 6, 7, NL]  # up to the prompt's end
    assert drafter.propose(history, 5) == MEMORY[1:6]  # the cap holds
    # Accepting a run moves the pointer over it: the next draft is the rest of the memory, whole.
    history = np.append(history, MEMORY[1:12])
    drafter.observe(history, 11)
    assert drafter.propose(history, len(MEMORY) - 12) == MEMORY[12:]
    assert reply_after()[0].propose(PROMPT, 8) == []  # nothing to align on before the first token


def test_aligned_resyncs_right_after_an_edit_where_ngram_lookup_cannot():
    # The reply copies 20..24, replaces 25 by 99 (a new number), then goes on copying with 26.
    drafter, history = reply_after(20, 21, 22, 23, 24, 99)
    assert drafter.propose(history, 4) == []  # 99 is nowhere in the prompt: out of sync
    drafter, history = reply_after(20, 21, 22, 23, 24, 99, 26)
    assert drafter.propose(history, 4) == [27, 28, 29, 30]
    ngram = NgramDrafter(history, 2, 4)
    assert ngram.propose(history, 4) == []  # (99, 26) never occurred
    assert pick_proposal([ngram.propose(history, 4), drafter.propose(history, 4)], [0.9, 0.5]) == 1


@pytest.mark.parametrize("edit, resumes_at", [
    ((20, 21, 77, 78, 79, 22), 23),  # three tokens inserted: the pointer waits for the copy to resume
    ((20, 21, 22, 30), 31),  # 23..29 deleted: a single token found just ahead
    ((20, 21, 22, 23, 50, 51, 26), 27),  # two tokens replaced by two others
])
def test_aligned_resyncs_after_insertions_deletions_and_replacements(edit, resumes_at):
    drafter, history = reply_after(*edit)
    assert drafter.propose(history, 3) == [resumes_at, resumes_at + 1, resumes_at + 2]


def test_resync_prefers_longer_matches_and_the_one_nearest_the_expected_position():
    source = np.array([5, 6, 7, 1, 5, 6, 8, 2, 5, 6, 7, 3, 0])
    # (5, 6, 7) ends at 3 and at 11; expected 10: the nearer one.
    assert resync(source, np.array([0, 5, 6, 7]), expected=10) == 11
    assert resync(source, np.array([0, 5, 6, 7]), expected=2) == 3
    assert resync(source, np.array([0, 5, 6, 7]), expected=None) == 3  # none expected: the earliest
    # A single token is trusted only near the expected position, and never without one.
    assert resync(source, np.array([4, 8]), expected=7, n_max=3) == 7
    assert resync(source, np.array([4, 8]), expected=40, n_max=3) is None
    assert resync(source, np.array([4, 8]), expected=None, n_max=3) is None
    assert advance_alignment(source, None, False, np.array([9, 9]), 1) == (None, False)


def test_each_drafter_is_scored_whichever_drafted_and_compared_at_the_steps_length():
    kept = [20, 21, 22, 5]  # three drafted tokens accepted, then the model's own
    assert matched_prefix([20, 21, 22, 23, 24], kept) == (4, 3)  # a rejection at the 4th token
    assert matched_prefix([20, 21], kept) == (2, 2)  # agreed as far as it went: successes only
    assert matched_prefix([7], kept) == (1, 0) and matched_prefix([], kept) == (0, 0)
    long, short = list(range(200)), list(range(8))
    assert pick_proposal([short, long], [0.98, 0.9]) == 1  # in full: 200 tokens at 0.9 yield more
    assert pick_proposal([short, long], [0.98, 0.9], k=8) == 0  # cut to 8: the surer one
    assert pick_proposal([short, short], [0.9, 0.9]) == 0  # a tie: the first


# -- the draft length at batch 1 ------------------------------------------------------------------


def test_at_batch_one_a_synced_draft_is_taken_whole():
    remaining = len(MEMORY) - 1
    gpu_like = CostModel(c0=0.010, c_row=0.0005, c_tok=0.00002)  # a verify of 64 tokens ~ one decode step
    assert choose_draft_len([remaining], [0.98], rows=1, cost=gpu_like, max_draft=256) == remaining
    assert choose_draft_len([200], [0.99], rows=1, cost=gpu_like, max_draft=256) == 200
    assert choose_draft_len([200], [0.99], rows=1, cost=gpu_like, max_draft=64) == 64  # the config cap
    # On this CPU's prior (compute-bound drafts) a long run still pays at batch 1, and not in a full batch.
    assert choose_draft_len([200], [0.99], rows=1, cost=CostModel(), max_draft=256) >= 30
    assert choose_draft_len([200] * 16, [0.3] * 16, rows=16, cost=CostModel(), max_draft=256) <= 1


# -- the output is the model's --------------------------------------------------------------------

MEMORY_TEXT = ("The special magic number for the blue door is 4187. The grass is green. The sky is blue. "
               "The road bends to the left near the old mill, and the river runs beside it.")


def conversations() -> list[tuple[list[dict[str, str]], int]]:
    """Memory updates whose reply mostly copies the memory (one with an edit), and a plain copy."""
    from memagent.prompts import memory_update_messages

    question = "What is the special magic number for the blue door?"
    return [
        (memory_update_messages(question, MEMORY_TEXT, "The weather was fine. Nothing happened in the town."), 60),
        (memory_update_messages(question, MEMORY_TEXT[:88], "The red door's number is 5521."), 48),
        ([{"role": "user", "content": "Repeat the text below exactly, word for word.\n\n" + MEMORY_TEXT}], 60),
    ]


def run_with(engine: TransformersEngine, spec: Speculation, prompts) -> list:
    saved = engine.speculation
    engine.speculation = spec
    try:
        async def go():
            return await asyncio.gather(*(engine.chat(m, SamplingParams(max_tokens=k, logprobs=True))
                                          for m, k in prompts))

        return asyncio.run(go())
    finally:
        engine.speculation = saved


@pytest.fixture(scope="module")
def tiny_fp32(tiny_llama_dir):
    return TransformersEngine.from_config(EngineConfig(model=str(tiny_llama_dir), dtype="fp32"), name="tiny")


def test_greedy_aligned_drafting_gives_the_same_tokens_on_a_tiny_model(tiny_fp32):
    # The tiny random model does not copy, so most drafts are rejected: every path of the
    # verification (rejections, re-syncs, a batch of rows accepting different lengths) is taken.
    prompts = [*conversations(), ([{"role": "user", "content": "a b c a b c a b c a b c"}], 40)]
    spec = tiny_fp32.speculation
    plain = run_with(tiny_fp32, replace(spec, max_draft=0), prompts)
    for variant in (replace(spec, ngram=False, adaptive=False), replace(spec, adaptive=False), spec):
        fast = run_with(tiny_fp32, variant, prompts)
        assert sum(c.draft_tokens for c in fast) > 0 or variant.adaptive
        for a, b in zip(plain, fast):
            assert a.token_ids == b.token_ids
            assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)


@pytest.fixture(scope="module")
def smollm2_fp32(smollm2_dir):
    """The packaged model in fp32: greedy identity is exact there (docs/engines.md on bf16)."""
    return TransformersEngine.from_config(EngineConfig(model=str(smollm2_dir), dtype="fp32"), name="smollm2-135m")


@pytest.mark.slow
def test_greedy_aligned_drafting_gives_the_same_tokens_and_writes_a_copy_in_few_forwards(smollm2_fp32):
    engine = smollm2_fp32
    prompts = conversations()
    spec = engine.speculation
    assert spec.aligned_draft > 0 and spec.ngram  # the default drafts from both
    plain = run_with(engine, replace(spec, max_draft=0), prompts)
    ngram = run_with(engine, replace(spec, aligned_draft=0, adaptive=False), prompts)
    aligned = run_with(engine, replace(spec, ngram=False, adaptive=False), prompts)
    both = run_with(engine, spec, prompts)
    for a, *others in zip(plain, ngram, aligned, both):
        for b in others:
            assert (b.token_ids, b.finish_reason) == (a.token_ids, a.finish_reason)
            assert b.logprobs == pytest.approx(a.logprobs, abs=2e-3)
    copy_plain, copy_ngram, copy_aligned = plain[2], ngram[2], aligned[2]
    assert MEMORY_TEXT in copy_plain.text and copy_plain.finish_reason == "stop"  # the reply is the memory
    # Drafting the whole remaining memory: the first token, then the rest and the end in one forward.
    assert copy_aligned.decode_steps <= 3 < copy_plain.completion_tokens / 10
    assert copy_ngram.decode_steps >= copy_plain.completion_tokens / (spec.max_draft + 1)  # capped at 8 a step
    # Memory updates that copy the memory: fewer forwards than n-gram lookup alone.
    assert sum(c.decode_steps for c in aligned[:2]) < sum(c.decode_steps for c in ngram[:2])
