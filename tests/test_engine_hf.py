"""The transformers engine batches concurrent requests and reports tokens and finish reasons."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from memagent.engines import EngineConfig, SamplingParams, make_engine
from memagent.engines.hf import TransformersEngine, _Request, chosen_log_probs, resolve_dtype


def msgs(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_concurrent_requests_share_one_forward(tiny_engine: TransformersEngine):
    before = tiny_engine.stats.batch_sizes.copy()

    async def run():
        return await asyncio.gather(*(tiny_engine.chat(msgs(f"question {i}"), SamplingParams(max_tokens=6))
                                      for i in range(5)))

    outs = asyncio.run(run())
    sizes = tiny_engine.stats.batch_sizes - before  # {batch size: forwards} of this test's requests
    assert sizes == {5: 1}, sizes
    for o in outs:
        assert 1 <= o.completion_tokens <= 6
        assert o.finish_reason in {"stop", "length"}
        assert o.prompt_tokens == len(o.prompt_token_ids) and o.completion_tokens == len(o.token_ids)


def test_per_request_max_tokens_and_max_batch_size(tiny_llama_dir):
    engine = TransformersEngine.from_config(EngineConfig(model=str(tiny_llama_dir), max_batch_size=2))

    async def run():
        return await asyncio.gather(*(engine.chat(msgs("hi there"), SamplingParams(max_tokens=n)) for n in (2, 5, 9)))

    outs = asyncio.run(run())
    assert all(o.completion_tokens <= n for o, n in zip(outs, (2, 5, 9)))
    assert all(s <= 2 for s in engine.stats.batch_sizes)
    # A random model rarely emits EOS: a reply cut at its limit reports "length".
    assert any(o.finish_reason == "length" and o.completion_tokens == n for o, n in zip(outs, (2, 5, 9)))


@pytest.mark.parametrize("per_row_prefill", [True, False])
def test_greedy_is_deterministic_and_batch_invariant(tiny_engine, monkeypatch, per_row_prefill):
    p = SamplingParams(max_tokens=8, logprobs=True)
    calls = []
    prefill = tiny_engine._prefill_rows
    monkeypatch.setattr(tiny_engine, "_prefill_per_row", lambda batch: per_row_prefill)
    monkeypatch.setattr(tiny_engine, "_prefill_rows", lambda *a: calls.append(a) or prefill(*a))

    async def alone():
        return await tiny_engine.chat(msgs("same prompt"), p)

    async def crowded():
        return await asyncio.gather(tiny_engine.chat(msgs("same prompt"), p),
                                    tiny_engine.chat(msgs("a much longer prompt with many more words in it"), p))

    a = asyncio.run(alone())
    b = asyncio.run(crowded())[0]
    assert a.token_ids == b.token_ids  # left padding does not change the reply
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    assert len(calls) == (2 if per_row_prefill else 0)  # alone and crowded both took the per-row path


def test_cpu_prefills_padded_batches_row_by_row(tiny_engine, tiny_llama_dir):
    def reqs(*lengths):
        return [_Request(list(range(100, 100 + n)), SamplingParams(max_tokens=2), None) for n in lengths]

    uncached = TransformersEngine.from_config(EngineConfig(model=str(tiny_llama_dir), enable_prefix_caching=False))
    assert uncached._prefill_per_row(reqs(5, 9))  # padding: per-row prefill
    assert not uncached._prefill_per_row(reqs(7, 7))  # no padding: no mask, one batched forward
    assert not uncached._prefill_per_row(reqs(4))
    assert tiny_engine._prefill_per_row(reqs(7, 7))  # the prefix cache: rows compute only what it lacks
    cache = tiny_engine._prefill_rows(reqs(5, 9), 9, 12)
    keys = cache.layers[0].keys  # [B, H_kv, L - 1, D], row 0 left-padded with zeros
    assert keys.shape[0] == 2 and keys.shape[2] == 8
    assert keys[0, :, :4].abs().sum() == 0
    # Row 0 is row 1's prefix: same tokens at the same positions give the same keys.
    assert torch.allclose(keys[0, :, 4:], keys[1, :, :4], atol=1e-5) and keys[1].abs().sum() > 0


def test_sampling_and_logprobs(tiny_engine):
    p = SamplingParams(max_tokens=5, temperature=1.0, logprobs=True)
    out = asyncio.run(tiny_engine.chat(msgs("sample"), p))
    assert len(out.logprobs) == len(out.token_ids)
    assert all(lp <= 0.0 for lp in out.logprobs)


def test_chosen_log_probs_match_the_stacked_computation():
    torch.manual_seed(0)
    steps = [torch.randn(3, 11) for _ in range(4)]  # generate's T raw [B, V] logits
    tokens = torch.randint(0, 11, (3, 4))
    stacked = torch.log_softmax(torch.stack(steps, dim=1) / 0.7, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(chosen_log_probs(steps, tokens, 0.7), stacked, atol=1e-6)


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
    assert engine.name == tiny_llama_dir.name and engine.dtype in (torch.float32, torch.bfloat16)


def test_the_engine_is_built_from_its_config_and_rejects_another_backends(tiny_llama_dir):
    config = EngineConfig(model=str(tiny_llama_dir), dtype="fp32", context_window=512, speculate=False,
                          prompt_lookup_min=1, prompt_lookup_max=3)
    engine = TransformersEngine.from_config(config, name="tiny")
    assert (engine.name, engine.dtype, engine.context_window) == ("tiny", torch.float32, 512)
    assert (engine.speculation.max_draft, engine.speculation.ngram_min, engine.speculation.ngram_max) == (0, 1, 3)
    with pytest.raises(ValueError, match="engine='hf'"):
        TransformersEngine(tiny_llama_dir, EngineConfig(engine="vllm", model=str(tiny_llama_dir)))


def test_loading_prints_no_progress_bar(tiny_llama_dir, capfd):
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    TransformersEngine.from_config(EngineConfig(model=str(tiny_llama_dir)))
    assert "Loading weights" not in capfd.readouterr().err  # one bar per actor, every update, in a batch job
    assert hf_logging.is_progress_bar_enabled()  # switched off for the load only


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


def test_a_request_that_arrives_as_the_idle_batcher_times_out_is_served(tiny_engine, monkeypatch):
    """A request enqueued after the batcher's idle wait timed out but before the batcher ran again (the event loop
    was busy: a grammar compiled, a checkpoint written) is answered, never left in a queue no batcher reads."""
    monkeypatch.setattr(type(tiny_engine), "IDLE_EXIT_S", 0.05)

    async def run():
        loop = asyncio.get_running_loop()
        await tiny_engine.chat(msgs("one"), SamplingParams(max_tokens=2))  # the batcher now waits, idle
        after_its_deadline = loop.create_future()
        loop.call_later(0.08, after_its_deadline.set_result, None)
        time.sleep(0.2)  # the loop is busy past both deadlines: they fire in one turn, the batcher's first
        await after_its_deadline
        return await asyncio.wait_for(tiny_engine.chat(msgs("two"), SamplingParams(max_tokens=2)), timeout=30)

    assert asyncio.run(run()).completion_tokens <= 2


def test_a_stop_string_ends_the_decode(tiny_engine):
    """The reply ends where the stop string first occurs: its text just before it, every decoded token counted."""
    p = SamplingParams(max_tokens=200)
    full = asyncio.run(tiny_engine.chat(msgs("stop somewhere"), p))
    assert full.completion_tokens == 200 and len(full.text) > 40  # the random model runs to the limit
    stop = full.text[30:34]
    cut = asyncio.run(tiny_engine.chat(msgs("stop somewhere"), SamplingParams(max_tokens=200, stop=[stop])))
    assert cut.text == full.text[: full.text.index(stop)] and cut.finish_reason == "stop"
    assert cut.token_ids == full.token_ids[: cut.completion_tokens] and cut.completion_tokens < 40
    assert stop in tiny_engine.tokenizer.decode(cut.token_ids)  # the token that completed it is kept and counted
    assert stop not in tiny_engine.tokenizer.decode(cut.token_ids[:-1])


def test_a_stop_token_ends_the_decode_and_is_kept(tiny_engine):
    full = asyncio.run(tiny_engine.chat(msgs("stop token"), SamplingParams(max_tokens=40)))
    token = full.token_ids[10]
    first = full.token_ids.index(token)
    cut = asyncio.run(tiny_engine.chat(msgs("stop token"), SamplingParams(max_tokens=40, stop_token_ids=[token])))
    assert cut.token_ids == full.token_ids[: first + 1] and cut.finish_reason == "stop"


def test_stop_strings_end_a_sliding_window_models_decode(tiny_engine, monkeypatch):
    """model.generate (sliding-window models) stops each row at its own stop string too."""
    monkeypatch.setattr(tiny_engine, "_sliding_window", True)
    p = SamplingParams(max_tokens=120)

    async def both(stop):
        return await asyncio.gather(tiny_engine.chat(msgs("slide"), SamplingParams(max_tokens=120, stop=[stop])),
                                    tiny_engine.chat(msgs("another prompt"), p))

    full = asyncio.run(tiny_engine.chat(msgs("slide"), p))
    stop = full.text[30:34]
    cut, other = asyncio.run(both(stop))
    assert cut.text == full.text[: full.text.index(stop)] and cut.finish_reason == "stop"
    assert cut.completion_tokens < 40 and other.completion_tokens == 120
