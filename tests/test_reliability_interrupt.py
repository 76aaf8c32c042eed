"""Ctrl-C on `memagent batch` stops within seconds and says how to resume (was a 41-line
``KeyboardInterrupt`` traceback); the rerun finishes the job with every id exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.pipeline_helpers import good_rows, interruptible, read_output, write_rows

pytestmark = pytest.mark.slow


def test_ctrl_c_stops_within_seconds_with_a_resume_hint(tiny_llama_dir, tmp_path):
    rows = good_rows(20, tokens=400)  # ten batches: Ctrl-C lands while most are still to read
    write_rows(tmp_path / "in" / "a.parquet", rows)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "memagent_cli", "batch", "--input", str(tmp_path / "in"), "--output", str(out),
           "--model", str(tiny_llama_dir), "--chunk-tokens", "64", "--memory-tokens", "8", "--answer-tokens", "6",
           "--batch-size", "2", "--max-in-flight", "2", "--torch-threads", "1", "--no-progress"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True,
                            preexec_fn=interruptible)
    deadline = time.monotonic() + 300
    while not list(out.glob("*.parquet")):  # the job is under way: its first file is written
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no output file within 300 s"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    t0 = time.monotonic()
    _, stderr = proc.communicate(timeout=60)
    stopped_in = time.monotonic() - t0
    assert proc.returncode == 130, stderr[-3000:]
    assert stopped_in < 20, stopped_in
    assert "interrupted: memagent batch stopped. Run the same command again to resume" in stderr
    assert "Traceback" not in stderr, stderr[-3000:]
    written = {r["id"] for r in read_output(out)}
    assert 0 < len(written) < len(rows)
    assert not (out / "_memagent.lease").exists()  # Ctrl-C releases the output's lease
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"({len(written)} already done, skipped)" in done.stdout
    assert sorted(r["id"] for r in read_output(out)) == [r["id"] for r in rows]  # every id exactly once
