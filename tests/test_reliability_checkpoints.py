"""A long document survives its actor's death and its driver's: the read resumes inside the text
from its chain checkpoints, every step once, and ends as the uninterrupted read (fp32, greedy)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from memagent.agent import ReadState
from memagent.config import AgentConfig
from memagent.data.demo import niah_row
from memagent.engines import EngineConfig
from pipelines.batch_qa import BatchQAConfig, run_batch_qa
from pipelines.checkpoints import PROGRESS_DIR, CheckpointLog
from pipelines.job import JobConfig
from tests.pipeline_helpers import CrashOnce, interruptible, read_output, write_rows
from tests.resume_helpers import RefusedOnce

pytestmark = pytest.mark.slow

# ~99 chunks of 32 tokens (ten checkpoint intervals): a chain a random tiny model reads in seconds, long
# enough that the driver below is killed with most of the document still unread.
AGENT = AgentConfig(chunk_tokens=32, memory_tokens=6, answer_tokens=4, query_tokens=64, temperature=0.0)
EVERY = 10


def long_row() -> dict:
    row = niah_row(0, 3400, depth=0.5, seed=11)
    return {"id": "long/0", "question": row["question"], "context": row["context"], "answers": row["answers"]}


def job(tiny_llama_dir: Path, input: Path, output: Path, **job_fields) -> BatchQAConfig:
    return BatchQAConfig(input=str(input), output=str(output), agent=AGENT,
                         engine=EngineConfig(model=str(tiny_llama_dir), dtype="fp32"),
                         job=JobConfig(batch_size=1, progress=False, checkpoint_every_steps=EVERY, **job_fields))


# Timing and speculation counters are the engine's bookkeeping (a restarted actor's drafter starts
# afresh), not the read: the texts and token counts must match.
BOOKKEEPING = ("seconds", "draft_tokens", "accepted_tokens", "cached_prompt_tokens")


def comparable(row: dict) -> tuple:
    steps = [{k: v for k, v in s.items() if k not in BOOKKEEPING} for s in row["steps"]]
    return row["memory"], row["response"], row["prediction"], steps


@pytest.fixture(scope="module")
def uninterrupted(ray_local, tiny_llama_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    write_rows(tmp / "in" / "long.parquet", [long_row()])
    summary = run_batch_qa(job(tiny_llama_dir, tmp / "in", tmp / "out"))
    (row,) = read_output(tmp / "out")
    assert summary.resumed_rows == 0 and row["error"] is None and row["n_chunks"] >= 90
    assert row["resumed_at_chunk"] is None and row["checkpoint_ignored"] is None
    assert not list((tmp / "out" / PROGRESS_DIR).glob("*/*")), "a committed row's checkpoints are removed"
    return row


def test_actor_killed_at_chunk_80_resumes_at_80(ray_local, tiny_llama_dir, tmp_path, uninterrupted):
    write_rows(tmp_path / "in" / "long.parquet", [long_row()])
    marker = tmp_path / "crashed"
    summary = run_batch_qa(job(tiny_llama_dir, tmp_path / "in", tmp_path / "out"),
                           build_engine=CrashOnce(81, marker))  # dies reading chunk 80
    assert marker.exists(), "the injected crash did not happen"
    (row,) = read_output(tmp_path / "out")  # written exactly once
    assert row["error"] is None and row["resumed_at_chunk"] == 80 - 80 % EVERY
    assert [s["step"] for s in row["steps"]] == list(range(row["n_chunks"] + 1))  # every step once
    assert comparable(row) == comparable(uninterrupted)
    assert summary.resumed_rows == 1 and summary.resumed_chunks == 80
    assert "1 document(s) inside the text, 80 chunk(s) not read again" in "\n".join(summary.lines())
    assert not list((tmp_path / "out" / PROGRESS_DIR).glob("*/*"))


def test_a_stale_checkpoint_is_ignored_and_counted(ray_local, tiny_llama_dir, tmp_path, uninterrupted):
    row = long_row()
    write_rows(tmp_path / "in" / "long.parquet", [row])
    # A log of the same id written from another context (the input changed since): never used.
    cfg = job(tiny_llama_dir, tmp_path / "in", tmp_path / "out")
    fake = ReadState(next_chunk=80, char_offset=0, memory="planted", steps=tuple(
        replace(_step(i), memory="planted") for i in range(80)))
    CheckpointLog(cfg.output, None, EVERY, 60).write(row["id"], "another-fingerprint", fake, 0)
    summary = run_batch_qa(cfg)
    (out,) = read_output(tmp_path / "out")
    assert out["resumed_at_chunk"] is None and "stale" in out["checkpoint_ignored"]
    assert comparable(out) == comparable(uninterrupted)
    assert summary.checkpoints_ignored == 1 and "1 checkpoint(s) ignored" in "\n".join(summary.lines())


def _step(i: int):
    from memagent.agent import Step

    return Step(step=i, kind="memory", chunk_index=i, char_start=0, char_end=0, memory="", prompt_tokens=1,
                completion_tokens=1, finish_reason="stop", seconds=0.0)


def test_driver_killed_then_rerun_resumes_inside_the_document(ray_local, tiny_llama_dir, tmp_path, uninterrupted):
    write_rows(tmp_path / "in" / "long.parquet", [long_row()])
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "memagent_cli", "batch", "--input", str(tmp_path / "in"), "--output", str(out),
           "--model", str(tiny_llama_dir), "--dtype", "fp32", "--chunk-tokens", "32", "--memory-tokens", "6",
           "--answer-tokens", "4", "--query-tokens", "64", "--temperature", "0", "--batch-size", "1",
           "--checkpoint-every-steps", str(EVERY), "--torch-threads", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=interruptible)
    deadline = time.monotonic() + 300
    while len(list((out / PROGRESS_DIR).glob("*/*.json"))) < 3:  # 30 chunks read and checkpointed
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no checkpoints within 300 s"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # no handler runs: the driver, its Ray and the actor are gone
    proc.communicate(timeout=60)
    assert not list(out.glob("*.parquet"))
    summary = run_batch_qa(job(tiny_llama_dir, tmp_path / "in", out))
    (row,) = read_output(out)
    assert row["resumed_at_chunk"] >= 3 * EVERY and summary.resumed_rows == 1
    assert comparable(row) == comparable(uninterrupted)


def test_a_chain_checkpointed_in_fp32_is_not_resumed_in_bf16(ray_local, tiny_llama_dir, tmp_path):
    """A rerun whose dtype differs from the run that checkpointed the chain reads the document from chunk 0 and
    says the dtype differed (the same rerun in fp32 resumes inside the text: the tests above)."""
    write_rows(tmp_path / "in" / "long.parquet", [long_row()])
    cfg = job(tiny_llama_dir, tmp_path / "in", tmp_path / "out")
    run_batch_qa(cfg, build_engine=RefusedOnce(31, tmp_path / "refused"))  # an infra: row; its log is kept
    (row,) = read_output(tmp_path / "out")
    assert row["error"].startswith("infra:") and list((tmp_path / "out" / PROGRESS_DIR).glob("*/*.json"))
    summary = run_batch_qa(cfg.model_copy(update=dict(engine=cfg.engine.model_copy(update=dict(dtype="bf16")))))
    (row,) = read_output(tmp_path / "out")
    assert row["error"] is None and [s["step"] for s in row["steps"]] == list(range(row["n_chunks"] + 1))
    assert row["resumed_at_chunk"] is None and "stale: dtype differed" in row["checkpoint_ignored"]
    assert summary.checkpoints_ignored == 1
