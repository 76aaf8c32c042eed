"""Chain checkpoints: a read resumed from any state ends as the uninterrupted read; the log on disk."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from memagent.agent import ResumeMismatch, read_document
from memagent.batch import answer_row
from memagent.checkpoint import BadSegment, new_segment, parse_segment, replay
from pipelines.checkpoints import PROGRESS_DIR, CheckpointLog, log_key, remove_logs
from tests.checkpoint_helpers import FAST, chain, without_times  # noqa: F401 (fixture)


@pytest.mark.parametrize("at", [1, 3, -1])
def test_resume_from_a_state_ends_as_the_uninterrupted_read(tiny_engine, chain, at):
    row, full, states = chain
    state = states[at]
    resumed = asyncio.run(read_document(tiny_engine, row["question"], row["context"], FAST, resume=state))
    assert resumed.resumed_at_chunk == state.next_chunk and full.resumed_at_chunk is None
    assert (resumed.memory, resumed.response, resumed.prediction) == (full.memory, full.response, full.prediction)
    assert without_times(resumed.steps) == without_times(full.steps)  # every step once, in order
    assert resumed.steps[: len(state.steps)] == list(state.steps)  # the steps before the resume are kept as they were


def test_states_say_where_the_next_chunk_starts(chain):
    row, full, states = chain
    for state, step in zip(states, full.steps):
        assert state.steps[-1] == step and state.memory == step.memory
        assert state.char_offset == step.char_end  # the next chunk starts where this one ended
    assert states[-1].char_offset == len(row["context"])


def test_a_state_of_another_cut_is_refused_and_answer_row_reads_from_the_start(tiny_engine, chain):
    row, full, states = chain
    shifted = replace(states[2], char_offset=states[2].char_offset + 1)
    with pytest.raises(ResumeMismatch, match="not a state of this document"):
        asyncio.run(read_document(tiny_engine, row["question"], row["context"], FAST, resume=shifted))
    record = asyncio.run(answer_row(tiny_engine, row, FAST, resume=shifted))
    assert record["error"] is None and record["resumed_at_chunk"] is None
    assert "not a state of this document" in record["checkpoint_ignored"]
    assert record["memory"] == full.memory


def test_segments_replay_to_the_state_and_stop_at_a_gap(chain):
    _, _, states = chain
    segs = [parse_segment(json.dumps(new_segment("d", "k", states[e - 1], s))) for s, e in [(0, 2), (2, 5)]]
    state, why = replay(segs, "d", "k")
    assert state == states[4] and why is None
    gap = parse_segment(json.dumps(new_segment("d", "k", states[-1], 6)))
    state, why = replay([*segs, gap], "d", "k")
    assert state == states[4] and "gap" in why
    assert replay(segs, "d", "other-key") == (None, "written for another input or config (stale)")


@pytest.mark.parametrize("edit, problem", [
    (lambda s: s.replace('"format": 2', '"format": 9'), "format 9"),
    (lambda s: s.replace('"next_chunk": 3', '"next_chunk": "three"'), "next_chunk"),
    (lambda s: s[: len(s) // 2], "Invalid JSON"),
    (lambda s: s.replace('"kind": "memory"', '"kind": "answer"', 1), "expected memory step 0"),
])
def test_a_bad_segment_is_named_never_misread(chain, edit, problem):
    _, _, states = chain
    text = json.dumps(new_segment("d", "k", states[2], 0))
    with pytest.raises(BadSegment, match=problem):
        parse_segment(edit(text))


def test_log_on_disk_writes_every_n_steps_and_resumes(tmp_path, chain):
    _, _, states = chain
    log = CheckpointLog(str(tmp_path / "out"), None, every_steps=2, every_s=3600)
    on_state = log.writer("doc/1", "fp", None)

    async def feed(upto: int) -> None:
        for s in states[:upto]:
            await on_state(s)

    asyncio.run(feed(5))
    directory = tmp_path / "out" / PROGRESS_DIR / log_key("doc/1")
    assert sorted(p.name for p in directory.iterdir()) == ["00000000-00000002.json", "00000002-00000004.json"]
    assert log.load("doc/1", "fp") == (states[3], None)
    # A resumed read appends after what it resumed from.
    on_state = log.writer("doc/1", "fp", states[3])
    asyncio.run(on_state(states[4]))
    asyncio.run(on_state(states[5]))
    assert log.load("doc/1", "fp") == (states[5], None)
    # Torn last segment: named, the segments before it used, the torn one removed.
    last = sorted(directory.iterdir())[-1]
    last.write_text(last.read_text()[:40])
    state, why = log.load("doc/1", "fp")
    assert state == states[3] and last.name in why
    assert not last.exists()
    # Stale (another input fingerprint): not used, and removed.
    state, why = log.load("doc/1", "changed")
    assert state is None and "stale" in why and not directory.exists()


def test_logs_of_done_ids_are_removed(tmp_path, chain):
    _, _, states = chain
    log = CheckpointLog(str(tmp_path / "out"), None, every_steps=1, every_s=3600)
    for row_id in ("a", "b", "c"):
        log.write(row_id, "fp", states[0], 0)
    assert remove_logs(str(tmp_path / "out"), None, ["a", "c", "never-written"]) == 2
    left = [p.name for p in (tmp_path / "out" / PROGRESS_DIR).iterdir()]
    assert left == [log_key("b")]


@pytest.mark.slow
def test_log_on_the_loopback_s3_server(monkeypatch, chain):
    from infra.local_s3 import CREDENTIALS, s3_server
    from pipelines.storage import S3Options

    _, _, states = chain
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    with s3_server(buckets=("lake",)) as endpoint:
        s3 = S3Options(endpoint_url=endpoint)
        log = CheckpointLog("s3://lake/out", s3, every_steps=2, every_s=3600)
        on_state = log.writer("doc-1", "fp", None)

        async def feed() -> None:
            for s in states[:4]:
                await on_state(s)

        asyncio.run(feed())
        assert log.segments_written == 2 and log.load("doc-1", "fp") == (states[3], None)
        assert remove_logs("s3://lake/out", s3, ["doc-1"]) == 1
        assert log.load("doc-1", "fp") == (None, None)
