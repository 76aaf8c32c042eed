"""Chain checkpoints under faults: a refused log is refused whole, and one chain has one writer."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from memagent.agent import ReadState
from memagent.batch import answer_row
from memagent.checkpoint import new_segment, parse_segment, replay
from pipelines.checkpoints import CheckpointLog
from tests.checkpoint_helpers import FAST, chain, without_times  # noqa: F401 (fixture)


@pytest.mark.parametrize("every_steps, every_s", [(1, 3600.0), (50, 0.0)])
def test_a_refused_checkpoint_is_refused_whole(tmp_path, tiny_engine, chain, every_steps, every_s):
    """A log that does not fit the document leaves a done row and a log holding only the fresh chain's steps."""
    row, full, states = chain
    log = CheckpointLog(str(tmp_path / "out"), None, every_steps=every_steps, every_s=every_s)
    old_steps = tuple(replace(s, memory=f"old cut {s.step}") for s in states[2].steps)
    shifted = replace(states[2], char_offset=states[2].char_offset + 1, steps=old_steps)  # 3 steps that do not fit
    log.write(row["id"], "fp", shifted, 0)
    resumed, _ = log.load(row["id"], "fp")
    assert resumed == shifted
    record = asyncio.run(answer_row(tiny_engine, row, FAST, resume=resumed,
                                    on_state=log.writer(row["id"], "fp", resumed)))
    assert record["error"] is None and "not a state of this document" in record["checkpoint_ignored"]
    state, why = log.load(row["id"], "fp")
    assert why is None and state is not None
    n = len(state.steps)
    assert without_times(state.steps) == without_times(full.steps[:n])  # the fresh chain, none of the old cut
    assert (state.memory, state.char_offset) == (states[n - 1].memory, states[n - 1].char_offset)


def test_a_chain_of_one_attempt_is_replayed_the_others_dropped_and_counted(chain):
    """Two attempts' segments from the same steps replay as the chain of one attempt, the other counted as dropped."""
    from memagent.checkpoint import resume_path

    _, _, states = chain
    other = [replace(s, memory=f"zombie {i}", steps=tuple(replace(t, memory=f"zombie {t.step}") for t in s.steps))
             for i, s in enumerate(states)]

    def seg(st: list[ReadState], first: int, end: int, attempt: str, parent: str | None = None):
        data = new_segment("d", "k", st[end - 1], first, attempt=attempt, parent=parent)
        return parse_segment(json.dumps(data))

    # Listing order interleaves two attempts from step 0 (a, b) and a resumed one (c, after b).
    log = [seg(states, 0, 2, "a"), seg(other, 0, 2, "b"), seg(other, 2, 4, "b"), seg(states, 2, 3, "a"),
           seg(other, 4, 5, "c", parent="b"), seg(states, 3, 4, "a")]
    chain_, rest = resume_path(sorted(log, key=lambda s: s.first_step))  # the old replay order: by first step
    state, why = replay(chain_, "d", "k")
    assert why is None and state == other[4]  # b then c: one chain, end to end, the longest
    assert len(rest) == 3 and {s.attempt for s in rest} == {"a"}  # the other attempt's segments, counted


def test_two_live_attempts_on_one_log_resume_as_one_of_them(tmp_path, chain):
    """Two writers of one row interleaving on one log (a zombie task) leave a log that replays to one writer's state."""
    _, _, states = chain
    other = [replace(s, memory=f"zombie {i}", steps=tuple(replace(t, memory=f"zombie {t.step}") for t in s.steps))
             for i, s in enumerate(states)]
    log = CheckpointLog(str(tmp_path / "out"), None, every_steps=2, every_s=3600)
    a, b = log.writer("r", "fp", None), log.writer("r", "fp", None)

    async def feed() -> None:  # a writes 0-2, b writes 0-2 over it, a writes 2-4: b's steps then a's, if mixed
        for writer, run in ((a, states[:2]), (b, other[:2]), (a, states[2:4])):
            for s in run:
                await writer(s)

    asyncio.run(feed())
    state, _ = log.load("r", "fp")
    assert state is not None
    assert state in (states[len(state.steps) - 1], other[len(state.steps) - 1])  # one writer's state, whole
