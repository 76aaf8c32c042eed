"""The fault harness (memagent_testing/faults.py) runs the product's driver, :func:`pipelines.driver.run_phases`, so its
faults land in the product's order, not in a copy's (issue 52: the copy had no output check before its lease)."""

from __future__ import annotations

import pytest

from pipelines import driver
from memagent_testing.faults import documents, run_job, write_input


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def test_a_failed_output_check_ends_the_run_before_its_lease(tmp_path, tokenizer):
    """A failure of the run's first store call (the driver's output check) ends run 1 before any lease call,
    and the rerun writes every id once without error."""
    docs = documents()
    input_dir = write_input(tmp_path / "in", docs)
    outcome = run_job(docs, input_dir, str(tmp_path / "out"), None, tokenizer, {(1, "output", "get_file_info", 0): "fail"})
    assert outcome.injected == [(1, "output", "get_file_info", 0, "fail")]
    assert not [key for key in outcome.calls if key[:2] == (1, "lease")], outcome.calls
    assert outcome.runs == 2 and sorted(outcome.rows) == sorted(d.id for d in docs)
    assert all(len(rows) == 1 and rows[0]["error"] is None for rows in outcome.rows.values())


def test_the_harness_runs_the_products_phases(tmp_path, tokenizer, monkeypatch):
    """A phase of the product's driver made to fail (its stray-log sweep) fails the harness's run: the job that
    ends in one run takes a rerun."""
    docs = documents()[:1]
    input_dir = write_input(tmp_path / "in", docs)
    assert run_job(docs, input_dir, str(tmp_path / "clean"), None, tokenizer, {}).runs == 1

    def broken_sweep(cfg):
        raise OSError("the product's stray-log sweep ran")

    monkeypatch.setattr(driver, "remove_stray_logs", broken_sweep)
    outcome = run_job(docs, input_dir, str(tmp_path / "out"), None, tokenizer, {})
    assert outcome.runs == 2  # run 1 failed in the sweep; run 2 found every id done (no sweep to run)
    assert [len(rows) for rows in outcome.rows.values()] == [1]
