"""Helpers of the resume tests (a node lost, a flow's job retried): a long document, and engines
for the batch job's ``build_engine`` seam that pace a read or fail it once mid-chain."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from memagent.data.demo import niah_row
from tests.pipeline_helpers import CrashOnce

# 32-token chunks: a few thousand tokens make a chain of tens of steps that a tiny model reads in seconds.
LONG_AGENT: dict[str, Any] = {"preset": "tiny", "chunk_tokens": 32, "memory_tokens": 6, "answer_tokens": 4,
                              "query_tokens": 64, "temperature": 0.0}


def long_row(tokens: int = 2400, row_id: str = "long/0", seed: int = 11) -> dict:
    """One needle-in-a-haystack document of about ``tokens`` tokens (~tokens/32 chunks at LONG_AGENT)."""
    row = niah_row(0, tokens, depth=0.5, seed=seed)
    return {"id": row_id, "question": row["question"], "context": row["context"], "answers": row["answers"]}


def segments(output: Path, row_id: str | None = None) -> list[Path]:
    """The chain checkpoint segments under an output (``_progress/<key>/<from>-<to>.json``), of one row or all."""
    from pipelines.checkpoints import PROGRESS_DIR, log_key

    return sorted(Path(output, PROGRESS_DIR).glob(f"{log_key(row_id) if row_id else '*'}/*.json"))


class Paced:
    """``build_engine``: the default engine, each conversation ``pause_s`` slower (so that a test can
    act while a chain is half read); appends the node id of each actor that builds one to ``placements``."""

    def __init__(self, pause_s: float, placements: Path):
        self.pause_s, self.placements = pause_s, str(placements)

    def __call__(self, engine_config: Any) -> Any:
        import ray

        from memagent.engines import make_engine

        with open(self.placements, "a") as f:
            f.write(ray.get_runtime_context().get_node_id() + "\n")
        return _PacedEngine(make_engine(engine_config), self.pause_s)


class _PacedEngine:
    def __init__(self, inner: Any, pause_s: float):
        self.inner, self.pause_s = inner, pause_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def chat(self, messages: Any, params: Any) -> Any:
        await asyncio.sleep(self.pause_s)
        return await self.inner.chat(messages, params)


class RefusedOnce(CrashOnce):
    """``build_engine``: the default engine, whose ``at_call``-th conversation fails as an endpoint that
    went away would (``ConnectionRefusedError``, an infrastructure error), once per ``marker`` file."""

    fault = "refuse"
