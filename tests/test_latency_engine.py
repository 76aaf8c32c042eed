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
