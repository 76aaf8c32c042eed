"""The actor's per-row path (``pipelines.worker.read_row``): a row's checkpoint read that fails costs that row only."""

from __future__ import annotations

import asyncio

from memagent.agent import ReadState
from memagent.data.demo import niah_row
from pipelines.batch_config import BatchQAConfig
from pipelines.checkpoints import CheckpointLog
from pipelines.worker import read_row
from tests.checkpoint_helpers import FAST


def test_a_row_whose_checkpoint_read_raises_is_an_error_row_and_the_others_are_read(tmp_path, tiny_engine,
                                                                                   monkeypatch):
    """Rows read together as an actor's call reads them: the row whose log raises on reading is an ``agent:``
    error row naming it; a row whose log holds a key nested past the stack (hand-edited) is stale and read
    from the start; a row without a log is read. The call returns all three."""
    output = str(tmp_path / "out")
    cfg = BatchQAConfig(input=str(tmp_path / "in"), output=output, agent=FAST)
    log = CheckpointLog(output, None, every_steps=1, every_s=3600.0)
    rows = [{**niah_row(i, 300, depth=0.5, seed=1), "id": name} for i, name in enumerate(("bad", "deep", "plain"))]
    state = ReadState(next_chunk=1, char_offset=10, memory="m", steps=())
    deep = "[" * 100_000 + "]" * 100_000  # json.loads of it raises RecursionError, not ValueError
    log.write("deep", deep, state, 0)
    load_resume_path = CheckpointLog.load_resume_path

    def corrupt(self, row_id, key):
        if row_id == "bad":
            raise ValueError("not a log this version can follow")
        return load_resume_path(self, row_id, key)

    monkeypatch.setattr(CheckpointLog, "load_resume_path", corrupt)

    def chain(row: dict):
        return asyncio.to_thread(log.resume_args, row["id"], "fp")

    async def call() -> list[dict]:
        return list(await asyncio.gather(*(read_row(tiny_engine, r, cfg, chain) for r in rows)))

    bad, stale, plain = asyncio.run(call())
    assert bad["id"] == "bad" and bad["prediction"] is None and bad["checkpoint_ignored"] is None
    assert bad["error"] == "agent: reading its checkpoints: ValueError: not a log this version can follow"
    assert stale["error"] is None and stale["n_chunks"] >= 2 and stale["resumed_at_chunk"] is None
    assert "stale" in stale["checkpoint_ignored"]
    assert plain["error"] is None and plain["checkpoint_ignored"] is None and plain["steps"]
