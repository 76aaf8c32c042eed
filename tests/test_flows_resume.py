"""A ``batch-qa`` flow run whose job stops mid-document (its endpoint went away; the job's circuit
breaker ends it) is retried by the job task's retry policy, and the retry resumes the long document
inside itself: the chain checkpoints live with the output, where any retry finds them.

Run: .venv/bin/pytest tests/test_flows_resume.py   (Prefect's test harness in-process, a real local Ray)
"""

from __future__ import annotations

import pytest

from flows.batch_qa import batch_qa
from tests.flows_helpers import task_runs_of, tiny_engine
from tests.pipeline_helpers import good_rows, read_output, write_rows
from tests.resume_helpers import LONG_AGENT, RefusedOnce, long_row, segments

pytestmark = pytest.mark.slow

EVERY = 5


@pytest.fixture(scope="module", autouse=True)
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def test_a_retried_job_resumes_the_long_document_inside_itself(tiny_llama_dir, tmp_path, monkeypatch):
    import pipelines.batch_qa

    rows = [long_row(2400), *good_rows(2)]
    write_rows(tmp_path / "in" / "a.parquet", rows)
    out, marker = tmp_path / "out", tmp_path / "refused"
    # The job's build_engine seam: the engine's 40th conversation fails as a vanished endpoint would
    # (the short documents take ~12, so the long one is ~25 chunks in); once, across both attempts.
    real = pipelines.batch_qa.run_batch_qa
    left_by_attempt: list[int] = []

    def run_batch_qa(cfg, **kwargs):
        left_by_attempt.append(len(segments(out, "long/0")))
        return real(cfg, build_engine=RefusedOnce(40, marker), **kwargs)

    monkeypatch.setattr(pipelines.batch_qa, "run_batch_qa", run_batch_qa)
    state = batch_qa(
        input=str(tmp_path / "in"), output=str(out), engine=tiny_engine(tiny_llama_dir), agent=LONG_AGENT,
        job={"batch_size": 1, "torch_threads": 1, "checkpoint_every_steps": EVERY,
             "max_consecutive_infra_errors": 1},  # one infrastructure error stops the job (the breaker)
        examples=1, return_state=True,
    )
    assert state.is_completed(), state.message
    assert marker.exists(), "the injected failure did not happen"
    runs = task_runs_of(state.state_details.flow_run_id)
    assert runs["run-batch-qa"].run_count == 2 and runs["run-batch-qa"].state.is_completed()
    # The first attempt left the long document's checkpoints; the retry found them beside the output.
    assert left_by_attempt[0] == 0 and left_by_attempt[1] >= 2, left_by_attempt

    final = read_output(out)
    assert sorted(r["id"] for r in final) == sorted(r["id"] for r in rows)  # every id once
    assert all(r["error"] is None for r in final), [r["error"] for r in final]
    long = next(r for r in final if r["id"] == "long/0")
    assert long["n_chunks"] >= 40 and long["resumed_at_chunk"] >= 2 * EVERY, long["resumed_at_chunk"]
    assert [s["step"] for s in long["steps"]] == list(range(long["n_chunks"] + 1))  # every step once
    summary = state.result()
    assert summary["resumed_rows"] >= 1 and summary["resumed_chunks"] >= long["resumed_at_chunk"]
    assert not segments(out), "a committed row's checkpoints are removed"
