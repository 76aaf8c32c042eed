"""The benchmarks' latency-model engine schedules by priority like vLLM's priority policy (or FCFS)."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.latency_engine import LatencyEngine, LatencyModel
from memagent.engines.base import SamplingParams


@pytest.mark.parametrize("priority_scheduling, first", [(True, "urgent"), (False, "early")])
def test_lower_priority_value_goes_first_only_under_priority_scheduling(tiny_engine, priority_scheduling, first):
    model = LatencyModel(max_seqs=1, time_scale=0.001, priority_scheduling=priority_scheduling)
    engine = LatencyEngine(model, tokenizer=tiny_engine.tokenizer)
    done: list[str] = []

    async def ask(name: str, priority: int) -> None:
        await engine.chat([{"role": "user", "content": f"{name} 12345."}], SamplingParams(8, priority=priority))
        done.append(name)

    async def both() -> None:  # both wait before the scheduler's first step; one sequence runs at a time
        await asyncio.gather(ask("early", 0), ask("urgent", -5))
        await engine.close()

    asyncio.run(both())
    assert done[0] == first and len(done) == 2


# -- speculation --

import json  # noqa: E402

from benchmarks.latency_engine import Acceptance, load_acceptance, per_token_acceptance  # noqa: E402

# A memory update whose section holds 40 digit sentences: the reply keeps them all, so it runs to max_tokens.
_LONG_REPLY = "<section>\n" + " ".join(f"Ledger {1000 + i} names a keeper." for i in range(40)) + "\n</section>"


def _read(model: LatencyModel, tokenizer, requests: list[tuple[str, int]]):
    """Run ``requests`` (message, max_tokens) on one engine at once; the completions and the engine."""
    engine = LatencyEngine(model, tokenizer=tokenizer)

    async def go():
        out = await asyncio.gather(*(engine.chat([{"role": "user", "content": text}], SamplingParams(n))
                                     for text, n in requests))
        await engine.close()
        return out

    return asyncio.run(go()), engine


@pytest.mark.parametrize("rate", [0.3, 0.5, 0.7])
def test_a_fixed_rate_is_the_mean_accepted_share_of_drafted_tokens(rate):
    model = LatencyModel(speculative_tokens=8, speculation_acceptance=rate)
    drafted, accepted = Acceptance(model).means()
    assert drafted == 8 and accepted / drafted == pytest.approx(rate, abs=1e-6)
    p = per_token_acceptance(rate, 8)  # each token accepted with p until the first rejection
    assert sum(p ** i for i in range(1, 9)) == pytest.approx(8 * rate, abs=1e-6)
    acc = Acceptance(model, seed=1)
    draws = [acc.draw() for _ in range(20_000)]
    assert sum(a for _, a in draws) / sum(d for d, _ in draws) == pytest.approx(rate, abs=0.02)


def test_always_accepted_drafts_cut_the_decode_steps_and_the_counts_add_up(tiny_engine):
    plain = LatencyModel(time_scale=0.0)
    spec = LatencyModel(time_scale=0.0, speculative_tokens=8, speculation_acceptance=1.0)
    (c0,), e0 = _read(plain, tiny_engine.tokenizer, [(_LONG_REPLY, 40)])
    (c1,), e1 = _read(spec, tiny_engine.tokenizer, [(_LONG_REPLY, 40)])
    assert c0.text == c1.text and c0.completion_tokens == c1.completion_tokens == 40  # same reply, fewer steps
    assert (c0.decode_steps, c0.draft_tokens, c0.accepted_tokens) == (40, 0, 0)
    # prefill samples token 1; then 4 steps of 8 accepted + 1, and one of 2 + 1 (a draft stops at the last token)
    assert (c1.decode_steps, c1.draft_tokens, c1.accepted_tokens) == (6, 34, 34)
    assert e1.sim.steps == e0.sim.steps - 34
    assert (e1.sim.draft_tokens, e1.sim.accepted_tokens) == (34, 34) and e1.sim.decode_tokens == e0.sim.decode_tokens


def test_verification_tokens_take_the_step_budget_from_prefill(tiny_engine):
    """Rejected drafts gain nothing and still cost their tokens: a long prefill beside them needs more steps."""
    base = dict(time_scale=0.0, max_tokens_per_step=64)  # B's prefill outlasts A's decode: every step is full
    requests = [(_LONG_REPLY, 40), ("no digits here, only words " * 500, 4)]
    (a0, b0), e0 = _read(LatencyModel(**base), tiny_engine.tokenizer, requests)
    (a1, b1), e1 = _read(LatencyModel(**base, speculative_tokens=8, speculation_acceptance=0.0),
                         tiny_engine.tokenizer, requests)
    assert a1.accepted_tokens == 0 and a1.decode_steps == a1.completion_tokens == a0.decode_steps
    assert a1.draft_tokens > 0 and e1.sim.prefill_tokens == e0.sim.prefill_tokens
    assert e1.sim.steps > e0.sim.steps
    assert e1.sim.busy_s > e0.sim.busy_s


def test_measured_steps_are_drawn_with_their_weights_and_cut_to_k(tmp_path):
    path = tmp_path / "acc.json"
    path.write_text(json.dumps({"per_decode_step": [[8, 8, 1], [8, 0, 3], [0, 0, 4]]}))
    measured = load_acceptance(path)
    assert measured["acceptance_rate"] == 0.25 and measured["accepted_per_step"] == 1.0
    model = LatencyModel(speculative_tokens=4, speculation_steps=measured["steps"])
    assert Acceptance(model).means() == (2.0, 0.5)  # drafts of 8 cut to k = 4
    acc = Acceptance(model, seed=3)
    draws = [acc.draw() for _ in range(8000)]
    assert set(draws) == {(4, 4), (4, 0), (0, 0)}
    assert draws.count((0, 0)) / len(draws) == pytest.approx(0.5, abs=0.03)


def test_per_conversation_records_spread_their_totals_over_their_decode_steps(tmp_path):
    path = tmp_path / "trace.json"  # decode_steps counts the prefill's token: 3 and 1 steps after it
    path.write_text(json.dumps({"steps": [{"draft_tokens": 10, "accepted_tokens": 5, "decode_steps": 4},
                                          {"draft_tokens": 0, "accepted_tokens": 0, "decode_steps": 2}]}))
    measured = load_acceptance(path)
    assert measured["decode_steps"] == 4 and measured["acceptance_rate"] == 0.5
    assert sum(d * c for d, _, c in measured["steps"]) == 10 and sum(a * c for _, a, c in measured["steps"]) == 5
    # benchmarks/speculation.py's per_step (partial files lack decode_steps): steps = tokens - accepted - 1
    path.write_text(json.dumps({"drafted": 99, "accepted": 99, "per_step": [
        {"drafted": 12, "accepted": 6, "completion_tokens": 11},
        {"drafted": 0, "accepted": 0, "completion_tokens": 1}]}))
    measured = load_acceptance(path)
    assert measured["decode_steps"] == 4
    assert measured["accepted_per_step"] == 1.5 and measured["drafted_per_step"] == 3.0


@pytest.mark.parametrize("kwargs", [
    dict(speculative_tokens=4),  # no acceptance given
    dict(speculative_tokens=4, speculation_acceptance=0.5, speculation_steps=[[4, 2, 1]]),  # both
    dict(speculative_tokens=4, speculation_acceptance=1.5),  # not a rate
    dict(speculative_tokens=4, speculation_steps=[[2, 3, 1]]),  # more accepted than drafted
])
def test_impossible_speculation_settings_are_rejected(kwargs):
    with pytest.raises(ValueError, match="speculat"):
        LatencyModel(**kwargs)


def test_chain_seconds_speculating_divides_the_decode_steps():
    plain = LatencyModel()
    spec = LatencyModel(speculative_tokens=4, speculation_acceptance=1.0)
    assert plain.chain_seconds(100, 41) == pytest.approx(plain.step_seconds(100, 1) + 40 * plain.step_seconds(0, 1))
    assert spec.chain_seconds(100, 41) == pytest.approx(plain.step_seconds(100, 1) + 8 * plain.step_seconds(4, 1))
