"""The transformers engine batches concurrent requests and reports tokens and finish reasons."""

from __future__ import annotations

import asyncio

import pytest

from memagent.engines import EngineConfig, SamplingParams, make_engine
from memagent.engines.hf import TransformersEngine, resolve_dtype


def msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_concurrent_requests_share_one_forward(tiny_engine: TransformersEngine):
    before = len(tiny_engine.stats.batch_sizes)

    async def run():
        return await asyncio.gather(*(tiny_engine.chat(msgs(f"question {i}"), SamplingParams(max_tokens=6))
                                      for i in range(5)))

    outs = asyncio.run(run())
    sizes = tiny_engine.stats.batch_sizes[before:]
    assert max(sizes) == 5 and sum(sizes) == 5, sizes
    for o in outs:
        assert 1 <= o.completion_tokens <= 6
        assert o.finish_reason in {"stop", "length"}
        assert o.prompt_tokens == len(o.prompt_token_ids) and o.completion_tokens == len(o.token_ids)


def test_per_request_max_tokens_and_max_batch_size(tiny_llama_dir):
    engine = TransformersEngine(tiny_llama_dir, max_batch_size=2)

    async def run():
        return await asyncio.gather(*(engine.chat(msgs("hi there"), SamplingParams(max_tokens=n)) for n in (2, 5, 9)))

    outs = asyncio.run(run())
    assert all(o.completion_tokens <= n for o, n in zip(outs, (2, 5, 9)))
    assert all(s <= 2 for s in engine.stats.batch_sizes)
    # A random model rarely emits EOS: a reply cut at its limit reports "length".
    assert any(o.finish_reason == "length" and o.completion_tokens == n for o, n in zip(outs, (2, 5, 9)))


def test_greedy_is_deterministic_and_batch_invariant(tiny_engine):
    p = SamplingParams(max_tokens=8)

    async def alone():
        return await tiny_engine.chat(msgs("same prompt"), p)

    async def crowded():
        return await asyncio.gather(tiny_engine.chat(msgs("same prompt"), p),
                                    tiny_engine.chat(msgs("a much longer prompt with many more words in it"), p))

    a = asyncio.run(alone())
    b = asyncio.run(crowded())[0]
    assert a.token_ids == b.token_ids  # left padding does not change the reply


def test_sampling_and_logprobs(tiny_engine):
    p = SamplingParams(max_tokens=5, temperature=1.0, logprobs=True)
    out = asyncio.run(tiny_engine.chat(msgs("sample"), p))
    assert len(out.logprobs) == len(out.token_ids)
    assert all(lp <= 0.0 for lp in out.logprobs)


def test_prompt_over_window_is_rejected(tiny_engine):
    long = "word " * (tiny_engine.context_window + 10)
    with pytest.raises(ValueError, match="context window"):
        asyncio.run(tiny_engine.chat(msgs(long), SamplingParams(max_tokens=4)))


def test_engine_survives_across_event_loops(tiny_engine):
    for _ in range(2):
        out = asyncio.run(tiny_engine.chat(msgs("again"), SamplingParams(max_tokens=2)))
        assert out.completion_tokens <= 2


def test_sampling_params_validation():
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=1, top_p=0)
    with pytest.raises(ValueError, match="dtype"):
        resolve_dtype("int3", "cpu")


def test_make_engine_by_name(tiny_llama_dir):
    engine = make_engine(EngineConfig(model=str(tiny_llama_dir), max_batch_size=3))
    assert engine.max_batch_size == 3 and engine.context_window == 4096


def test_missing_model_says_how_to_install():
    from memagent.models import ModelNotFoundError, resolve_model

    with pytest.raises(ModelNotFoundError, match="smollm2-135m"):
        resolve_model("/nonexistent/model")


def test_idle_batcher_exits_and_restarts(tiny_engine, monkeypatch):
    monkeypatch.setattr(type(tiny_engine), "IDLE_EXIT_S", 0.05)

    async def run():
        first = await tiny_engine.chat(msgs("one"), SamplingParams(max_tokens=2))
        await asyncio.sleep(0.2)
        assert tiny_engine._worker.done()  # exited while idle: nothing left pending at loop close
        second = await tiny_engine.chat(msgs("two"), SamplingParams(max_tokens=2))
        return first, second

    first, second = asyncio.run(run())
    assert first.completion_tokens <= 2 and second.completion_tokens <= 2
