"""Prompt-lookup speculation: drafting, the acceptance rules, the adaptive draft length, and the
decode loop's output being the model's (greedy tokens, sampled distribution, log-probs)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.generation.logits_process import TopPLogitsWarper

from memagent.engines import EngineConfig, SamplingParams
from memagent.engines.hf import TransformersEngine
from memagent.engines import hf_decode
from memagent.engines.hf_decode import DecodeLoop, Row, Speculation
from memagent.engines.kv_cache import ReservedCache
from memagent.engines.speculation import drafters
from memagent_testing.drafts import find_draft
from memagent.engines.speculation import (
    CostModel,
    NgramIndex,
    TokenHistory,
    accept_greedy,
    accept_sampled,
    choose_draft_len,
    expected_tokens,
    nonnegative_quadratic_min,
    sampling_probs,
)

# -- pure pieces ------------------------------------------------------------------------------


def draft(tokens, max_draft: int, n_min: int, n_max: int) -> list[int]:
    return NgramIndex(tokens, n_min, n_max).draft(tokens, max_draft)


def test_ngram_index_takes_the_longest_ngram_and_its_latest_occurrence():
    """The draft follows the longest recurring n-gram's latest earlier occurrence, or is empty."""
    toks = [5, 1, 2, 9, 9, 7, 1, 2, 3, 4, 8, 2, 3, 4]
    # The 3-gram (2, 3, 4) recurs at 7..9: draft what followed it there.
    assert draft(toks, 3, 2, 3) == [8, 2, 3]
    # Only 2-grams allowed: (3, 4) latest at 8..9 as well.
    assert draft(toks, 2, 2, 2) == [8, 2]
    # (1, 2) occurs twice before the tail (1, 2): the latest wins.
    assert draft([1, 2, 7, 1, 2, 6, 1, 2], 4, 2, 2) == [6, 1, 2]
    assert draft([1, 2, 3, 4], 4, 2, 3) == []  # nothing recurs
    assert draft([1, 2, 1, 2], 0, 2, 3) == []
    assert draft([3], 4, 1, 2) == []


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), min_size=0, max_size=60),
       cuts=st.lists(st.integers(1, 9), max_size=12),
       sizes=st.tuples(st.integers(1, 5), st.integers(0, 3)), max_draft=st.integers(0, 10))
def test_ngram_index_grown_step_by_step_drafts_what_the_full_scan_drafts(tokens, cuts, sizes, max_draft):
    """After every append, the incremental index's draft equals the full scan's over the tokens so far."""
    n_min, n_max = sizes[0], sizes[0] + sizes[1]
    bounds = np.cumsum([min(len(tokens), 1 + len(tokens) // 3), *cuts]).clip(max=len(tokens))
    history = TokenHistory(tokens[: bounds[0]])
    index = NgramIndex(history, n_min, n_max)
    assert index.draft(history, max_draft) == find_draft(np.array(tokens[: bounds[0]], dtype=np.int64), max_draft,
                                                         n_min, n_max)
    for start, end in zip(bounds[:-1], bounds[1:]):
        history.extend(tokens[start:end])
        index.update(history)
        oracle = find_draft(np.array(tokens[:end], dtype=np.int64), max_draft, n_min, n_max)
        assert index.draft(history, max_draft) == oracle


@settings(max_examples=200, deadline=None)
@given(tokens=st.lists(st.integers(0, 6), min_size=2, max_size=60), split=st.integers(1, 60),
       max_draft=st.integers(1, 8))
def test_ngram_key_collisions_cost_a_miss_never_a_wrong_draft(tokens, split, max_draft):
    """With every n-gram of one last token sharing a key, a draft is still what followed an earlier
    occurrence of the history's last ``n`` tokens for some allowed ``n`` (or empty): keys are checked."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(drafters, "_MUL", 0)  # key = last id + 1: collisions everywhere
        mp.setattr(drafters, "_POW", [1] + [0] * 63)
        history = TokenHistory(tokens[: min(split, len(tokens) - 1)])
        index = NgramIndex(history, 2, 4)
        history.extend(tokens[len(history):])
        index.update(history)
        got = index.draft(history, max_draft)
    if got:
        arr, size = np.array(tokens), len(tokens)
        follows = [arr[e + 1 : e + 1 + max_draft].tolist() for n in range(2, 5) for e in range(n - 1, size - 1)
                   if (arr[e - n + 1 : e + 1] == arr[size - n :]).all()]
        assert got in follows


def test_row_drafting_holds_one_copy_of_the_prompt():
    """The decode loop's drafting state for a row reads one int32 copy of the prompt (the aligned drafter a
    view of it, the n-gram index positions only): well under 60 bytes per prompt token (46 MB at 128K before)."""
    import tracemalloc

    prompt = (np.random.default_rng(0).zipf(1.2, 20_000) % 49_152).tolist()
    loop = DecodeLoop(model=None, eos_ids={0}, pad_id=0, spec=Speculation(max_draft=8, ngram_min=2, ngram_max=4,
                                                                         aligned_draft=256))
    tracemalloc.start()
    history, (ngram, aligned) = loop.row_drafting(Row(prompt_ids=prompt, max_tokens=64))
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert np.shares_memory(aligned.source, history[:])
    assert not any(isinstance(v, (list, np.ndarray)) and len(v) >= len(prompt) for v in vars(ngram.index).values())
    assert held / len(prompt) < 60, held / len(prompt)
    history.extend([prompt[10], prompt[11]])
    ngram.observe(history, 2)
    assert ngram.propose(history, 4) == find_draft(np.array(history[:]), 4, 2, 4) != []


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens(1.0, 4) == 5.0


def test_adaptive_k_drafts_alone_and_stops_drafting_a_compute_bound_batch():
    cost = CostModel()  # the measured prior
    assert choose_draft_len([8], [0.6], rows=1, cost=cost, max_draft=8) >= 2  # weights dominate: draft
    assert choose_draft_len([8], [0.9], rows=1, cost=cost, max_draft=8) >= 6
    # 16 rows, poor acceptance: 16 x 2 tokens cost more than the tokens they add.
    assert choose_draft_len([8] * 16, [0.2] * 16, rows=16, cost=cost, max_draft=8) == 0
    assert choose_draft_len([0, 0], [0.9, 0.9], rows=2, cost=cost, max_draft=8) == 0  # nothing found
    assert choose_draft_len([8], [0.99], rows=1, cost=cost, max_draft=3) == 3  # the cap holds


def test_cost_model_refits_from_observed_steps():
    cost = CostModel(c0=0.25, c_row=0.05, c_tok=0.03)  # a prior ~5x off
    for _ in range(30):
        for rows, t in itertools.product((1, 4, 16), (1, 3, 9)):
            cost.update(rows, t, 0.05 + 0.01 * rows + 0.004 * rows * t)
    assert cost.c0 == pytest.approx(0.05, rel=0.1)
    assert cost.c_row == pytest.approx(0.01, rel=0.1) and cost.c_tok == pytest.approx(0.004, rel=0.1)
    assert cost.seconds(8, 5) == pytest.approx(0.05 + 0.08 + 0.16, rel=0.02)


def test_accept_greedy_keeps_the_agreeing_prefix_plus_the_models_token():
    assert accept_greedy([4, 5, 6], [4, 5, 9, 1]) == [4, 5, 9]
    assert accept_greedy([4, 5], [4, 5, 7]) == [4, 5, 7]
    assert accept_greedy([], [3]) == [3]


@pytest.mark.parametrize("top_p", [1.0, 0.9, 0.5])
def test_sampling_probs_match_transformers_nucleus(top_p):
    torch.manual_seed(0)
    logits = torch.randn(3, 50) * 3
    ours = sampling_probs(logits, 0.7, top_p)
    theirs = (TopPLogitsWarper(top_p)(None, logits / 0.7) if top_p < 1 else logits / 0.7).softmax(-1)
    assert torch.allclose(ours, theirs, atol=1e-6)


# -- the sampled distribution is unchanged -------------------------------------------------------

VOCAB, PROMPT, STEPS = 8, [1, 2, 3, 1, 2], 3


@pytest.fixture(scope="module")
def toy_model() -> LlamaForCausalLM:
    """One layer, 8 tokens, peaked enough that drafts are accepted and rejected alike."""
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         initializer_range=0.6, tie_word_embeddings=False)
    torch.manual_seed(30)  # a seed where P(3 | prompt) = 0.42 and P(1 | prompt, 3) = 0.24
    return LlamaForCausalLM(config).eval()


def exact_distribution(model, temperature: float) -> dict[tuple[int, ...], float]:
    """P(reply) of every reply of STEPS tokens, from full forwards of each prefix (no cache)."""
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(STEPS):
        prefixes = list(probs)
        ids = torch.tensor([PROMPT + list(p) for p in prefixes])
        with torch.no_grad():
            p_next = torch.softmax(model(input_ids=ids).logits[:, -1].double() / temperature, -1)
        probs = {(*p, v): probs[p] * float(p_next[i, v]) for i, p in enumerate(prefixes) for v in range(VOCAB)}
    return probs


NGRAM = Speculation(max_draft=4, ngram_min=2, ngram_max=4, adaptive=False)
ALIGNED = replace(NGRAM, ngram=False, aligned_draft=4)  # drafts the prompt from where the reply aligns with it


def sample_replies(model, n: int, rule, seed: int, temperature: float, spec: Speculation = NGRAM) -> Counter:
    gen = torch.Generator().manual_seed(seed)
    loop = DecodeLoop(model, eos_ids=set(), pad_id=0, spec=spec, generator=gen)
    counts: Counter = Counter()
    batch = 500
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hf_decode, "accept_sampled", rule)  # the loop's sampled verification
        for _ in range(n // batch):
            _sample_batch(model, loop, batch, temperature, counts)
    return counts


def _sample_batch(model, loop: DecodeLoop, batch: int, temperature: float, counts: Counter) -> None:
    cache = ReservedCache(1, len(PROMPT) + 10)
    with torch.no_grad():
        model(input_ids=torch.tensor([PROMPT[:-1]] * batch), cache=cache, use_cache=True)
    rows = [Row(list(PROMPT), STEPS, temperature=temperature) for _ in range(batch)]
    loop.run(rows, cache, torch.ones(batch, len(PROMPT) - 1, dtype=torch.long))
    counts.update(tuple(r.tokens) for r in rows)
    drafted = sum(r.draft_tokens for r in rows)
    accepted = sum(r.accepted_tokens for r in rows)
    assert drafted > 0 and 0 < accepted < drafted  # drafts were made, some kept, some not


def chi_square_pvalue(counts: Counter, expected: dict, n: int) -> float:
    """Pearson's test; outcomes expected < 5 times are pooled into one bin."""
    small = [k for k, p in expected.items() if p * n < 5]
    bins = [(counts.get(k, 0), p * n) for k, p in expected.items() if p * n >= 5]
    bins.append((sum(counts.get(k, 0) for k in small), sum(expected[k] for k in small) * n))
    stat = sum((o - e) ** 2 / e for o, e in bins if e > 0)
    df = len(bins) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def accept_without_removing(draft, probs, generator=None):
    """A wrong rule: on rejection it samples from p itself (x not removed), so x is over-drawn."""
    kept = []
    for j, x in enumerate(draft):
        if torch.rand((), generator=generator) < probs[j][x]:
            kept.append(int(x))
            continue
        kept.append(int(torch.multinomial(probs[j], 1, generator=generator)))
        return kept
    kept.append(int(torch.multinomial(probs[len(draft)], 1, generator=generator)))
    return kept


@pytest.mark.parametrize("spec", [NGRAM, ALIGNED], ids=["ngram", "aligned"])
def test_speculative_sampling_keeps_the_models_distribution(toy_model, spec):
    n, temperature = 6000, 1.0
    expected = exact_distribution(toy_model, temperature)
    first = {v: sum(p for k, p in expected.items() if k[0] == v) for v in range(VOCAB)}
    assert 0.2 < first[3] < 0.8  # the drafted token (3 follows (1, 2)) is neither certain nor hopeless
    good = chi_square_pvalue(sample_replies(toy_model, n, accept_sampled, 1, temperature, spec), expected, n)
    wrong = chi_square_pvalue(sample_replies(toy_model, n, accept_without_removing, 1, temperature, spec), expected, n)
    assert good > 1e-3, good  # fixed seeds: deterministic, and far from the threshold
    assert wrong < 1e-6, wrong  # the test has the power to catch a wrong rule


# -- greedy identity, per-row limits, EOS and log-probs on the packaged model ---------------------


def _prompts(engine: TransformersEngine) -> list[tuple[list[dict[str, str]], int]]:
    """Memory-update and final-answer conversations of different lengths, with per-row limits."""
    import functools

    from memagent.chunking import chunk_document
    from memagent.data.demo import niah_row
    from memagent.data.hotpotqa import count_tokens
    from memagent.prompts import NO_MEMORY, final_answer_messages, memory_update_messages

    count = functools.partial(count_tokens, engine.tokenizer)
    row = niah_row(3, 900, depth=0.3, seed=5, count=count)
    chunks = chunk_document(engine.tokenizer, row["context"], 300).chunks
    memory = ("The special magic number is not yet known. The text so far repeats short sentences: "
              "The grass is green. The sky is blue. Here we go.")
    return [
        (memory_update_messages(row["question"], NO_MEMORY, chunks[0].text), 40),
        (memory_update_messages(row["question"], memory, chunks[1].text), 56),
        (memory_update_messages(row["question"], memory, chunks[-1].text[:400]), 24),
        (final_answer_messages(row["question"], memory + " " + row["answers"][0], "phrase"), 16),
        (final_answer_messages(row["question"], memory, "boxed"), 32),
    ]


@pytest.fixture(scope="module")
def smollm2_fp32(smollm2_dir):
    """The packaged model in fp32 whatever the CPU: dtype "auto" is bf16 on CPUs with bf16 units,
    where a (k+1)-token verification rounds differently from k+1 single steps (docs/engines.md)."""
    return TransformersEngine.from_config(EngineConfig(model=str(smollm2_dir), dtype="fp32"), name="smollm2-135m")


@pytest.mark.slow
def test_greedy_speculation_gives_the_same_tokens_and_logprobs(smollm2_fp32):
    engine = smollm2_fp32
    prompts = _prompts(engine)

    def run(spec: Speculation):
        engine.speculation = spec

        async def go():
            return await asyncio.gather(*(engine.chat(m, SamplingParams(max_tokens=k, logprobs=True))
                                          for m, k in prompts))

        return asyncio.run(go())

    saved = engine.speculation
    try:
        plain = run(replace(saved, max_draft=0))
        fast = run(replace(saved, max_draft=8, adaptive=False))
    finally:
        engine.speculation = saved
    assert sum(c.draft_tokens for c in fast) > 0 and sum(c.accepted_tokens for c in fast) > 0
    assert all(c.draft_tokens == 0 and c.decode_steps == c.completion_tokens for c in plain)
    for (messages, limit), a, b in zip(prompts, plain, fast):
        assert b.completion_tokens <= limit and b.decode_steps <= b.completion_tokens
        if a.token_ids != b.token_ids:  # allowed only at a near-tie of the top two logits
            j = next(j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y)
            ids = torch.tensor([a.prompt_token_ids + a.token_ids[:j]])
            with torch.no_grad():
                top2 = engine.model(input_ids=ids).logits[0, -1].float().topk(2).values
            assert float(top2[0] - top2[1]) < 1e-3 * float(top2[0].abs()), (j, top2)
            continue
        assert (a.finish_reason, a.text) == (b.finish_reason, b.text)
        assert b.logprobs == pytest.approx(a.logprobs, abs=2e-3)
        if a.finish_reason == "stop":
            assert a.token_ids[-1] in engine.eos_ids and len(a.token_ids) <= limit
        else:
            assert len(a.token_ids) == limit


# -- the constraint hook --------------------------------------------------------------------------


class DigitsThenEos:
    """Allows 1-3 digit tokens, then only EOS; finished after EOS. Records its calls."""

    def __init__(self, digit_ids: list[int], eos: int, vocab: int):
        self.digits, self.eos, self.vocab = set(digit_ids), eos, vocab
        self.accepted: list[int] = []

    def mask_logits(self, logits: torch.Tensor) -> torch.Tensor:
        allowed = set(self.digits) if len(self.accepted) < 3 else set()
        if self.accepted:
            allowed.add(self.eos)
        mask = torch.full_like(logits, float("-inf"))
        mask[sorted(allowed)] = 0
        return logits + mask

    def accept(self, token: int) -> bool:
        self.accepted.append(token)
        return True

    def is_finished(self) -> bool:
        return bool(self.accepted) and self.accepted[-1] == self.eos


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_constrained_rows_follow_their_constraint_beside_free_rows(tiny_engine, monkeypatch, temperature):
    tok = tiny_engine.tokenizer
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    eos = min(tiny_engine.eos_ids)
    made: list[DigitsThenEos] = []
    monkeypatch.setattr(tiny_engine, "_constraint",
                        lambda schema: made.append(DigitsThenEos(digits, eos, len(tok))) or made[-1])

    async def go():
        return await asyncio.gather(
            tiny_engine.chat([{"role": "user", "content": "a number please"}],
                             SamplingParams(max_tokens=20, temperature=temperature, json_schema='{"type": "integer"}')),
            tiny_engine.chat([{"role": "user", "content": "anything at all, said twice: anything at all"}],
                             SamplingParams(max_tokens=12, temperature=temperature)))

    constrained, free = asyncio.run(go())
    assert constrained.finish_reason == "stop" and constrained.token_ids[-1] == eos
    assert 1 <= len(constrained.token_ids) - 1 <= 3 and set(constrained.token_ids[:-1]) <= set(digits)
    assert made[0].accepted == constrained.token_ids
    assert constrained.draft_tokens == 0  # constrained rows never draft
    assert free.completion_tokens <= 12


def test_speculation_flags_come_from_the_engine_config(tiny_llama_dir):
    import argparse

    from memagent.engines import make_engine
    from memagent_cli.flags import add_model_flags, build

    parser = argparse.ArgumentParser()
    flags = add_model_flags(parser, EngineConfig, "engine")
    args = parser.parse_args(["--model", str(tiny_llama_dir), "--no-speculate", "--speculative-tokens", "5",
                              "--prompt-lookup-min", "1", "--prompt-lookup-max", "3"])
    config = build(EngineConfig, flags.values(args))
    assert (config.speculate, config.speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max) == (
        False, 5, 1, 3)
    assert make_engine(config).speculation == Speculation(max_draft=0, ngram_min=1, ngram_max=3)
    on = make_engine(config.model_copy(update={"speculate": True}))
    assert on.speculation == Speculation(max_draft=5, ngram_min=1, ngram_max=3, aligned_draft=256)
    args = parser.parse_args(["--model", str(tiny_llama_dir), "--draft-from", "aligned", "--aligned-draft-tokens", "32",
                              "--no-adaptive-draft"])
    aligned = make_engine(build(EngineConfig, flags.values(args)))
    assert (aligned.speculation.ngram, aligned.speculation.aligned_draft, aligned.speculation.adaptive) == (
        False, 32, False)
    with pytest.raises(ValueError, match="draft_from"):
        EngineConfig(engine="vllm", draft_from="aligned")


def test_metered_engine_counts_speculation_and_the_summary_prints_it():
    from memagent.engines.base import Completion, Engine, EngineStats
    from pipelines.engine_metrics import MeteredEngine
    from pipelines.summary import BatchSummary

    class Fixed(Engine):
        name, context_window, tokenizer, stats = "fixed", 4096, None, EngineStats()

        async def chat(self, messages, params):
            return Completion("x", 3, 12, "stop", draft_tokens=10, accepted_tokens=8, decode_steps=4)

    metered = MeteredEngine(Fixed())
    for _ in range(2):
        asyncio.run(metered.chat([], SamplingParams(max_tokens=12)))
    assert (metered.draft_tokens, metered.accepted_tokens, metered.decode_steps, metered.stepped_tokens) == (
        20, 16, 8, 24)
    summary = BatchSummary(rows_in=1, skipped=0, rows_out=1, error_rows=0, accuracy=None, context_tokens=1,
                           seconds=1.0, output="out", draft_tokens=20, accepted_tokens=16, decode_steps=8,
                           stepped_tokens=24)
    assert any("acceptance 0.800" in line and "3.00 tokens per decode step" in line for line in summary.lines())
    assert not BatchSummary(rows_in=1, skipped=0, rows_out=1, error_rows=0, accuracy=None, context_tokens=1,
                            seconds=1.0, output="out").speculation_lines()


def test_cost_model_learns_a_single_batch_size_without_a_negative_coefficient():
    # One batch size only: c0 and c_row · 16 cannot be told apart, and the exact fit wants c0 + 16 c_row
    # below the prior's; the refit keeps every coefficient >= 0 and still prices the forwards it saw.
    cost = CostModel()  # prior c0 + 16 c_row = 0.237 s
    for _ in range(20):
        for t in (1, 6, 9, 16):
            cost.update(16, t, 0.10 + 16 * t * 0.0075)
    assert min(cost.c0, cost.c_row, cost.c_tok) >= 0
    assert cost.seconds(16, 1) == pytest.approx(0.22, rel=0.05) and cost.seconds(16, 9) == pytest.approx(1.18, rel=0.05)
    # Priced right, a full batch at acceptance 0.8 drafts a token or two (the stale fit chose 3 here).
    assert choose_draft_len([100] * 16, [0.8] * 16, rows=16, cost=cost, max_draft=256) <= 2


def test_nonnegative_quadratic_min_is_the_constrained_optimum():
    rng = np.random.default_rng(3)
    for _ in range(200):
        m = rng.standard_normal((3, 3))
        a, b = m @ m.T + 0.1 * np.eye(3), rng.standard_normal(3)
        theta = nonnegative_quadratic_min(a, b)
        grid = np.stack(np.meshgrid(*[np.linspace(0, 3, 31)] * 3), -1).reshape(-1, 3)
        values = np.einsum("ni,ij,nj->n", grid, a, grid) - 2 * grid @ b
        assert (theta >= 0).all() and theta @ a @ theta - 2 * b @ theta <= values.min() + 1e-9
