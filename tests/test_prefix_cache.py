"""The hf engine's prefix KV cache: reused prefixes change no greedy token, and the cache stays in its bound."""

from __future__ import annotations

import asyncio

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent.engines import EngineConfig, SamplingParams
from memagent.engines.hf import TransformersEngine
from memagent.engines.prefix_cache import BLOCK, PrefixCache

LAYERS, HEADS, DIM = 2, 1, 2


def fake_kv(ids: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per layer (keys, values) [H, n, D] whose every entry is the token id at that position (an oracle)."""
    col = torch.tensor(ids, dtype=torch.float32)[None, :, None].expand(HEADS, len(ids), DIM)
    return [(col + layer, -col - layer) for layer in range(LAYERS)]


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@given(st.lists(st.lists(st.integers(0, 3), min_size=0, max_size=5 * BLOCK), min_size=1, max_size=6),
       st.lists(st.integers(0, 3), max_size=5 * BLOCK))
def test_lookup_returns_the_longest_cached_run_of_whole_blocks(stored: list[list[int]], query: list[int]):
    """A lookup reuses the longest whole-block prefix any stored prompt shares with it, and its KV is theirs."""
    cache = PrefixCache(max_bytes=2**30)
    for ids in stored:
        cache.insert(ids, fake_kv(ids))
    m, kv = cache.lookup(query)
    assert m == max(lcp(ids, query) // BLOCK * BLOCK for ids in stored)
    if m:
        assert kv is not None and kv.shape == (LAYERS, 2, HEADS, m, DIM)
        assert torch.equal(kv[1, 0, 0, :, 0], torch.tensor(query[:m], dtype=torch.float32) + 1)
        assert torch.equal(kv[0, 1, 0, :, 1], -torch.tensor(query[:m], dtype=torch.float32))
    else:
        assert kv is None


def test_eviction_keeps_the_bound_and_drops_least_recent_leaves_first():
    """Past its byte bound the cache evicts the least recently used blocks, leaves before their parents."""
    block_bytes = LAYERS * 2 * HEADS * BLOCK * DIM * 4
    cache = PrefixCache(max_bytes=5 * block_bytes)
    shared = list(range(2 * BLOCK))
    a, b = shared + [7] * BLOCK, shared + [8] * 2 * BLOCK
    cache.insert(a, fake_kv(a))  # 3 blocks
    cache.insert(b, fake_kv(b))  # 2 more, sharing 2: 5 blocks
    assert len(cache) == 5 and cache.bytes == 5 * block_bytes
    assert cache.lookup(a)[0] == 3 * BLOCK  # a is now more recent than b's own blocks
    c = [9] * BLOCK
    cache.insert(c, fake_kv(c))  # over the bound by one block: b's last block (its least recent leaf) goes
    assert cache.bytes == 5 * block_bytes and cache.evicted_blocks == 1
    assert cache.lookup(b)[0] == 3 * BLOCK and cache.lookup(a)[0] == 3 * BLOCK and cache.lookup(c)[0] == BLOCK
    cache.clear()
    assert cache.bytes == 0 and cache.lookup(a) == (0, None)


@pytest.fixture(scope="module")
def context_llama_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir) -> str:
    """conftest's tiny Llama with weights 15x larger: its replies depend on the whole context (at the default
    init its tied embeddings just echo the last token, whatever KV the cache handed it)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=True, initializer_range=0.3)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("context-llama")
    LlamaForCausalLM(config).save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def engines(context_llama_dir):
    """That model in fp32 twice: with the prefix cache and without (speculation on, its default)."""
    def make(on: bool) -> TransformersEngine:
        return TransformersEngine.from_config(EngineConfig(model=context_llama_dir, dtype="fp32",
                                                           enable_prefix_caching=on), name=f"tiny-{on}")
    return make(True), make(False)


def merge_split_prompts(tokenizer, words: list[str], cuts: list[int]) -> list[list[int]]:
    """Prompts that share text up to a cut inside a word: their ids part where the tokenizer merges differently."""
    text = " ".join(words)
    return [tokenizer.encode(text[:cut] + "zq ends here", add_special_tokens=False) for cut in cuts]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_greedy_output_is_the_same_with_and_without_the_prefix_cache(engines, data):
    """Greedy replies are token for token those of an engine that prefills every prompt in full, whatever the
    prompts share (random-length id prefixes, text cut inside a token merge), batched or one at a time."""
    cached, plain = engines
    cached.prefix_cache.clear()
    rnd = st.integers(300, 20000)
    base = data.draw(st.lists(rnd, min_size=BLOCK, max_size=4 * BLOCK), label="shared")
    cuts = data.draw(st.lists(st.integers(1, len(base)), min_size=1, max_size=4), label="cuts")
    tails = [data.draw(st.lists(rnd, min_size=1, max_size=BLOCK), label="tail") for _ in cuts]
    prompts = [base[:c] + t for c, t in zip(cuts, tails)]
    words = data.draw(st.lists(st.sampled_from(["internationalization", "tokenizer", "memory", "the", "schema"]),
                               min_size=12, max_size=40), label="words")
    text_cuts = data.draw(st.lists(st.integers(len(" ".join(words)) // 2, len(" ".join(words))),
                                   min_size=1, max_size=3), label="text_cuts")
    prompts += merge_split_prompts(cached.tokenizer, words, text_cuts)
    params = SamplingParams(max_tokens=data.draw(st.integers(1, 8), label="max_tokens"))

    async def batch(engine):  # all at once: one padded batch (rows reuse what rows before them cached)
        return await asyncio.gather(*(engine.chat_ids(p, params) for p in prompts))

    async def one_by_one(engine):
        return [await engine.chat_ids(p, params) for p in reversed(prompts)]

    for run in (batch, one_by_one):
        with_cache, without = asyncio.run(run(cached)), asyncio.run(run(plain))
        assert [c.token_ids for c in with_cache] == [c.token_ids for c in without]
        assert all(c.cached_prompt_tokens == 0 for c in without)
    # The second pass found every prompt's own whole blocks cached by the first.
    assert [c.cached_prompt_tokens for c in with_cache] == [
        (len(p) - 1) // BLOCK * BLOCK for p in reversed(prompts)]
    assert cached.stats.cached_prompt_tokens >= sum(c.cached_prompt_tokens for c in with_cache)


def test_the_cache_stays_within_its_bound_and_the_replies_do_not_change(context_llama_dir):
    """With a bound far below what the prompts hold, the engine evicts and still answers as without the cache."""
    small = TransformersEngine.from_config(EngineConfig(model=context_llama_dir, dtype="fp32", prefix_cache_mib=1))
    plain = TransformersEngine.from_config(EngineConfig(model=context_llama_dir, dtype="fp32",
                                                        enable_prefix_caching=False))
    assert plain.prefix_cache is None
    torch.manual_seed(1)
    prompts = [torch.randint(300, 20000, (1500,)).tolist() for _ in range(3)]  # 750 KiB each in fp32
    params = SamplingParams(max_tokens=4)

    async def run(engine):
        return [await engine.chat_ids(p, params) for p in prompts + prompts]

    a, b = asyncio.run(run(small)), asyncio.run(run(plain))
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    assert small.prefix_cache.bytes <= 2**20 and small.prefix_cache.evicted_blocks > 0


def test_new_weights_empty_the_cache(tiny_llama_dir):
    """KV computed by the old weights is never reused after a weight update."""
    engine = TransformersEngine.from_config(EngineConfig(model=str(tiny_llama_dir), dtype="fp32"))
    asyncio.run(engine.chat_ids(list(range(300, 300 + 3 * BLOCK)), SamplingParams(max_tokens=1)))
    assert len(engine.prefix_cache) > 0
    engine.update_weights(engine.model.state_dict())
    assert len(engine.prefix_cache) == 0


@pytest.mark.slow
def test_the_packaged_model_answers_the_same_with_a_shared_question_cached(smollm2_dir):
    """The packaged model in fp32: documents read against one long question give the same greedy replies with the
    question's KV reused, and every document after the first reuses the question."""
    question = ("Extract these fields from the document as JSON: "
                + ", ".join(f"field_{i} (the {i}th figure the document states, or null)" for i in range(20)))
    docs = [f"Report {i}: revenue was {13 * i + 4} million, staff {7 * i} people, founded {1950 + i}." for i in range(2)]
    messages = [[{"role": "user", "content": f"{question}\n\nDocument:\n{d}"}] for d in docs]
    params = SamplingParams(max_tokens=12)

    def run(on: bool):
        engine = TransformersEngine.from_config(EngineConfig(model=str(smollm2_dir), dtype="fp32",
                                                             enable_prefix_caching=on))

        async def go():
            return [await engine.chat(m, params) for m in messages]
        return asyncio.run(go())

    with_cache, without = run(True), run(False)
    assert [c.token_ids for c in with_cache] == [c.token_ids for c in without]
    shared = lcp(with_cache[0].prompt_token_ids, with_cache[1].prompt_token_ids)
    assert with_cache[0].cached_prompt_tokens == 0
    assert all(c.cached_prompt_tokens == shared // BLOCK * BLOCK > 0 for c in with_cache[1:])


def test_prefill_computed_and_reused_are_counted_per_call_kind_and_summed_over_actors():
    """The metered engine books each reply's prompt tokens as computed or reused under its call kind, and the job
    summary sums the actors' counts and prints them."""
    from memagent.engines.base import Completion, Engine, EngineStats
    from pipelines.engine_metrics import MeteredEngine
    from pipelines.summary import BatchSummary

    class Fixed(Engine):
        name, context_window, tokenizer, stats = "fixed", 4096, None, EngineStats()

        async def chat(self, messages, params):
            return Completion("x", 100, 2, "stop", cached_prompt_tokens=64 if params.call == "records" else 0)

    metered = MeteredEngine(Fixed())
    for call in ("memory", "records", "records", ""):
        asyncio.run(metered.chat([], SamplingParams(max_tokens=2, call=call)))
    assert metered.prefill_by_call == {"memory": [100, 0], "records": [72, 128], "other": [100, 0]}
    summary = BatchSummary(rows_in=1, skipped=0, rows_out=1, error_rows=0, accuracy=None, context_tokens=1,
                           seconds=1.0, output="out")
    snapshot = {"peak": 1, "first_start": None, "last_done": None, "integral": 0.0, "at": 0.0}
    summary.add_actor_snapshots({"a": {**snapshot, "prefill_by_call": metered.prefill_by_call},
                                 "b": {**snapshot, "prefill_by_call": {"records": [8, 32]}}}, max_in_flight=1)
    assert summary.prefill_by_call == {"memory": [100, 0], "records": [80, 160], "other": [100, 0]}
    assert "records 80 computed, 160 reused (67%)" in "\n".join(summary.lines())
    assert summary.record()["prefill_by_call"] == summary.prefill_by_call


def test_a_custom_template_that_defeats_reuse_still_loads_and_is_reported(tmp_path, caplog):
    """A prompts file that puts the question after the chunk works as before and its lost reuse is logged; the
    packaged templates put what every call shares first."""
    from memagent.prompts import DEFAULT_PROMPTS, load_prompts, memory_update_messages, reuse_problems

    assert reuse_problems(DEFAULT_PROMPTS) == []
    path = tmp_path / "late.toml"
    path.write_text('memory_update = "Memory: {memory}\\nSection: {chunk}\\nQuestion: {question}"\n'
                    'final_answer = "{question} {memory}"\n', encoding="utf-8")
    with caplog.at_level("WARNING", logger="memagent.prompts"):
        prompts = load_prompts(path)
    assert [r.getMessage() for r in caplog.records] == [
        f"prompts file {path}: {p}" for p in reuse_problems(prompts)]
    assert "'memory_update' puts {question} after {memory}" in caplog.records[0].getMessage()
    assert memory_update_messages("Q?", "M", "C", prompts=prompts)[0]["content"] == "Memory: M\nSection: C\nQuestion: Q?"


def test_a_servers_cached_prompt_tokens_reach_the_reply():
    """An OpenAI-compatible server's usage.prompt_tokens_details.cached_tokens is the reply's cached_prompt_tokens."""
    from types import SimpleNamespace

    from memagent.engines.openai import OpenAIEngine

    def reply(usage):
        body = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}], "usage": usage}
        return OpenAIEngine._completion(SimpleNamespace(endpoint="http://h/v1"), body, [], SamplingParams(max_tokens=2))

    usage = {"prompt_tokens": 900, "completion_tokens": 1}
    assert reply({**usage, "prompt_tokens_details": {"cached_tokens": 768}}).cached_prompt_tokens == 768
    assert reply(usage).cached_prompt_tokens == 0
    assert reply({**usage, "prompt_tokens_details": None}).cached_prompt_tokens == 0


def test_each_step_of_a_read_records_what_it_reused_and_the_report_shows_it(engines):
    """A read of a three-chunk document on the engine with the prefix cache: each step's ``cached_prompt_tokens`` is
    what the engine reported for that call (none for the first, the shared instructions and question for each later
    memory update), and the trace report's view lists ``[prompt tokens, reused]`` per step, as the row holds them."""
    from memagent.batch import answer_row
    from memagent.config import AgentConfig
    from memagent.report.html import row_view

    cached, _ = engines
    cached.prefix_cache.clear()
    seen: list[int] = []
    chat = cached.chat

    async def counting(messages, params, **kw):
        reply = await chat(messages, params, **kw)
        seen.append(reply.cached_prompt_tokens)
        return reply

    cached.chat = counting
    try:
        config = AgentConfig(chunk_tokens=64, memory_tokens=16, answer_tokens=8, query_tokens=64)
        text = " ".join(f"Sentence {i} of a document that the memory agent reads chunk by chunk." for i in range(24))
        row = asyncio.run(answer_row(cached, {"id": "d", "context": text, "question": "What does it read?"}, config))
    finally:
        del cached.chat
    assert row["error"] is None and row["n_chunks"] >= 3
    assert [s["cached_prompt_tokens"] for s in row["steps"]] == seen
    memory = [n for n, s in zip(seen, row["steps"]) if s["kind"] == "memory"]
    assert memory[0] == 0 and all(n >= BLOCK for n in memory[1:]), seen  # the instructions and question again
    assert row_view(row)["pf"] == [[s["prompt_tokens"], s["cached_prompt_tokens"]] for s in row["steps"]]
