"""Shared by the chain-checkpoint tests: fast budgets, steps without timing, and a read with every state."""

from __future__ import annotations

import asyncio
from dataclasses import asdict

import pytest

from memagent.agent import ReadState, read_document
from memagent.config import AgentConfig
from memagent.data.demo import niah_row

FAST = AgentConfig(chunk_tokens=48, memory_tokens=10, answer_tokens=6, query_tokens=64, temperature=0.0)


def without_times(steps) -> list[dict]:
    """Steps less the engine's bookkeeping (timing; the drafter's counters depend on what it saw before)."""
    return [{k: v for k, v in asdict(s).items() if k not in ("seconds", "draft_tokens", "accepted_tokens")}
            for s in steps]


@pytest.fixture(scope="module")
def chain(tiny_engine):
    """A document of several chunks read once, with every state it passed through."""
    row = niah_row(3, 500, depth=0.6, seed=2)
    states: list[ReadState] = []

    async def keep(state: ReadState) -> None:
        states.append(state)

    result = asyncio.run(read_document(tiny_engine, row["question"], row["context"], FAST, on_state=keep))
    assert result.n_chunks >= 6 and len(states) == result.n_chunks
    return row, result, states
