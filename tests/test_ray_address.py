"""Which Ray a job starts or joins: the one rule batch QA, synthesis and training share."""

from __future__ import annotations

import pytest

from pipelines.job import ray_init_address


def test_an_explicit_address_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert ray_init_address("ray://head:10001") == "ray://head:10001"


def test_no_address_is_a_fresh_local_ray_not_a_running_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_init_address(None) == "local"


def test_ray_job_submit_address_is_left_to_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert ray_init_address(None) is None  # ray.init(address=None) reads RAY_ADDRESS itself


def test_every_ray_init_in_the_jobs_takes_the_rule() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    for name in ("batch_qa.py", "synthesize.py", "train_job.py"):
        text = (root / "pipelines" / name).read_text()
        assert "ray.init(address=" in text and "ray.init(address=job.ray_address" not in text, name
        assert "ray_init_address(" in text, name
