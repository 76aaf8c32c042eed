"""An outage must not become permanent wrong answers.

The failing case as reported: with the endpoint down, every row became an error row, the job
exited 0, and a rerun skipped them as done (``8 already done, skipped``). Now infrastructure
errors are written as retryable ``infra:`` rows (a rerun takes them out and redoes them), the job
stops early once they dominate (a circuit breaker), and row errors stay done for good.
"""

from __future__ import annotations

import pytest

from memagent.engines.openai import EndpointError
from memagent.error_kinds import InfrastructureFailure, error_kind, error_prefix, is_infra_error
from pipelines.breaker import InfraBreaker
from tests.pipeline_helpers import good_rows, read_output, write_rows
from tests.reliability_helpers import SERVED, free_port, served_app, serving


@pytest.mark.parametrize(("exc", "kind"), [
    (EndpointError("connection failed", None), "infra"),
    (EndpointError("HTTP 503", 503), "infra"),
    (EndpointError("HTTP 429", 429), "infra"),
    (EndpointError("HTTP 401: bad key", 401), "infra"),
    (EndpointError("HTTP 404: unknown model", 404), "infra"),
    (EndpointError("HTTP 400: prompt over the window", 400), "row"),
    (ConnectionRefusedError("refused"), "infra"),
    (type("EngineDeadError", (RuntimeError,), {})("engine died"), "infra"),
    (RuntimeError("VLLMEngine is shut down"), "infra"),
    (ValueError("reply is not valid JSON"), "row"),
    (KeyError("x"), "row"),
])
def test_error_kinds(exc, kind):
    assert error_kind(exc) == kind
    assert error_prefix(exc) == ("infra" if kind == "infra" else "agent")


def test_breaker_consecutive_and_rate():
    b = InfraBreaker(consecutive=3, window=0)
    assert b.record("infra: EndpointError: down") is None and b.record("infra: x") is None
    assert b.record(None) is None  # a success resets the run
    assert [b.record("infra: x") for _ in range(3)][-1] == "3 infrastructure errors in a row"
    b = InfraBreaker(consecutive=0, window=4, rate=0.5)
    assert [b.record(e) for e in (None, "infra: a", "input: bad", None)] == [None] * 4
    assert b.record("infra: b") == "2 of the last 4 rows failed on the infrastructure"
    with pytest.raises(InfrastructureFailure, match="stopped early: 1 infrastructure errors in a row .last: y."):
        InfraBreaker(consecutive=1).check({"error": "infra: y"})
    off = InfraBreaker(consecutive=0, window=0)
    assert all(off.record("infra: z") is None for _ in range(100))
    assert is_infra_error("infra: x") and not is_infra_error("agent: x") and not is_infra_error(None)


@pytest.mark.slow
def test_outage_rows_are_redone_by_a_plain_rerun(ray_local, tiny_llama_dir, tmp_path, capsys):
    from memagent_cli.main import main

    rows = good_rows(4)
    rows[3]["context"] = None  # a row error: done for good
    write_rows(tmp_path / "in" / "part-0.parquet", rows)
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    # Breaker off: every row is written, the outage rows as retryable infrastructure errors.
    cmd = ["batch", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--engine", "openai",
           "--endpoint", url, "--model", str(tiny_llama_dir), "--served-model", SERVED, "--max-retries", "1",
           "--chunk-tokens", "64", "--memory-tokens", "8", "--answer-tokens", "6", "--batch-size", "2",
           "--max-consecutive-infra-errors", "0", "--infra-error-window", "0", "--no-progress"]
    rc = main(cmd)
    std = capsys.readouterr()
    assert rc == 1  # the output is not complete: not a success
    assert "error rows:     4 (1 row errors, done; 3 infrastructure errors, redone by a rerun" in std.out
    assert std.err.strip().endswith("error: 3 row(s) failed on the infrastructure (endpoint or engine); run the "
                                    "same command again to redo them")
    out = {r["id"]: r["error"] for r in read_output(tmp_path / "out")}
    assert sorted(out) == [r["id"] for r in rows]
    assert all(out[f"doc-00{i}"].startswith("infra: EndpointError: POST") and "connection failed" in out[f"doc-00{i}"]
               for i in range(3)), out
    assert out["doc-003"].startswith("input: context must be a string")
    with serving(served_app(tiny_llama_dir), port):
        assert main(cmd) == 0  # the same command, once the endpoint is back
    up = capsys.readouterr().out
    assert "(1 already done, skipped)" in up and "rows out:       3 this run" in up and "error rows:     0" in up
    again = read_output(tmp_path / "out")
    assert sorted(r["id"] for r in again) == [r["id"] for r in rows]  # every id exactly once
    assert {r["id"]: r["error"] for r in again if r["error"]} == {"doc-003": out["doc-003"]}


@pytest.mark.slow
def test_breaker_stops_the_job_and_a_rerun_finishes_it(tiny_llama_dir, tmp_path):
    """`memagent batch` (a real process, its own local Ray) against an endpoint that is down: it stops
    early with one line and exit 2, no traceback; the same command once the endpoint is back finishes."""
    import subprocess
    import sys

    rows = good_rows(8)
    write_rows(tmp_path / "in" / "part-0.parquet", rows)
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    cmd = [sys.executable, "-m", "memagent_cli", "batch", "--input", str(tmp_path / "in"), "--output",
           str(tmp_path / "out"), "--engine", "openai", "--endpoint", url, "--model", str(tiny_llama_dir),
           "--served-model", SERVED, "--max-retries", "1", "--chunk-tokens", "64", "--memory-tokens", "8",
           "--answer-tokens", "6", "--batch-size", "2", "--max-consecutive-infra-errors", "2", "--no-progress"]
    down = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert down.returncode == 2, down.stderr[-3000:]
    err = [line for line in down.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and err[0].startswith("error: stopped early: "), down.stderr[-3000:]
    assert "infrastructure errors in a row (last: EndpointError: POST " in err[0]
    assert "run the same command again" in err[0] and down.stderr.strip().endswith(err[0])
    assert "Traceback" not in down.stderr and "Unhandled error" not in down.stderr, down.stderr[-3000:]
    with serving(served_app(tiny_llama_dir), port):
        up = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr[-3000:]
    assert "error rows:     0" in up.stdout, up.stdout
    final = read_output(tmp_path / "out")
    assert sorted(r["id"] for r in final) == [r["id"] for r in rows]
    assert all(r["error"] is None for r in final)
