"""Training through Ray Train (``pipelines/train_job.py``): 2 workers on a 2-node cluster vs 1 process, fail-over
(the flow on two workers: tests/test_flows.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memagent.config import preset
from memagent.rl.config import TrainConfig
from pipelines.train_job import TrainJob, check_resume_world, read_metrics, run_training, trim_metrics
from tests.pipeline_helpers import KillInRollout, launches
from test_rl_rollout import niah

AGENT = preset("tiny").with_overrides(chunk_tokens=64, memory_tokens=16, answer_tokens=8)


def config(**kw) -> TrainConfig:
    return TrainConfig(**{"steps": 2, "batch_size": 4, "group_size": 2, "warmup_steps": 0, "save_every": 1,
                          "micro_batch_tokens": 1024, "lr": 1e-3, **kw})


def fake_checkpoint(out: Path, step: int, cursors: list[int]) -> None:
    import torch

    tag = out / "checkpoints" / f"step_{step:06d}"
    tag.mkdir(parents=True)
    torch.save({"module": {}, "step": step, "cursors": cursors}, tag / "mp_rank_00_model_states.pt")
    (out / "checkpoints" / "latest").write_text(tag.name)


# -- fast: configuration, resume checks, metric bookkeeping ------------------------------------


def test_train_job_parameters():
    assert not TrainJob().uses_ray
    assert TrainJob(workers=2).uses_ray and TrainJob(ray_address="ray://head:10001").uses_ray
    TrainJob(workers=1, gpus_per_worker=0.5)  # a shared GPU for one rank is fine
    with pytest.raises(ValueError, match="one whole GPU per rank"):
        TrainJob(workers=2, gpus_per_worker=0.5)
    with pytest.raises(ValueError):
        TrainJob(workers=0)


def test_resume_is_refused_across_a_change_of_worker_count(tmp_path: Path):
    out = tmp_path / "run"
    fake_checkpoint(out, 2, [4, 4])
    check_resume_world(out, 2, zero_stage=2)  # same world: fine
    with pytest.raises(ValueError, match=r"written by 2 worker\(s\); this run asks for 1.*ZeRO-2 partitions"):
        check_resume_world(out, 1, zero_stage=2)
    with pytest.raises(ValueError, match=r"whole at ZeRO-0.*data cursor.*step_000002/hf"):
        check_resume_world(out, 4, zero_stage=0)
    # The launcher checks before any worker starts; without resume it refuses to overwrite.
    with pytest.raises(ValueError, match="change of worker count"):
        run_training(TrainJob(workers=1), config=config(batch_size=4), agent_config=AGENT, data=niah(4),
                     out_dir=out, resume=True)
    with pytest.raises(FileExistsError, match="already holds checkpoints"):
        run_training(TrainJob(workers=2), config=config(), agent_config=AGENT, data=niah(4), out_dir=out)
    with pytest.raises(ValueError, match="divisible by workers=3"):
        run_training(TrainJob(workers=3), config=config(), agent_config=AGENT, data=niah(4), out_dir=tmp_path / "x")


def test_metrics_past_the_checkpoint_are_dropped_before_a_resume(tmp_path: Path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "v": s}) + "\n" for s in (0, 1, 2, 1)))
    assert [r["step"] for r in read_metrics(tmp_path)] == [0, 1, 2]  # last record of a step wins
    assert trim_metrics(tmp_path, 1) == 1
    assert [r["step"] for r in read_metrics(tmp_path)] == [0]


def test_train_flow_takes_the_train_job():
    from flows.train import train_memagent

    params = train_memagent.validate_parameters({"train_job": {"workers": 2, "ray_address": "127.0.0.1:6379"}})
    assert params["train_job"] == TrainJob(workers=2, ray_address="127.0.0.1:6379")
    with pytest.raises(Exception, match="greater than 0"):
        train_memagent.validate_parameters({"train_job": {"workers": 0}})


# -- slow: real runs on a local Ray (2 CPUs), then on a 2-node loopback cluster ----------------


@pytest.fixture(scope="module")
def local_ray():
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=True)
    yield
    ray.shutdown()


def assert_same_run(one: list[dict], two: list[dict], batch: int, group: int) -> None:
    assert [r["step"] for r in one] == [r["step"] for r in two]
    for a, b in zip(one, two):
        assert b["world_size"] == 2 and a.get("world_size", 1) == 1
        assert a["trajectories"] == b["trajectories"] == batch * group  # both ranks' rollouts counted
        assert len(set(b["example_ids"])) == batch  # ranks read disjoint questions
        assert set(a) | {"world_size"} == set(b)  # the same record, merged over ranks


def assert_loadable(hf: Path, like: Path | None = None) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf))
    if like is not None:
        ref = AutoModelForCausalLM.from_pretrained(str(like))
        assert model.state_dict().keys() == ref.state_dict().keys()


@pytest.mark.slow
def test_a_killed_worker_fails_over_to_the_last_checkpoint(tiny_llama_dir: Path, tmp_path: Path, local_ray):
    marker = tmp_path / "killed"
    out = tmp_path / "run"
    kill = KillInRollout(out, "step_000001", marker, rank=1)  # rank 1 kills itself during step 1's rollout
    records = run_training(TrainJob(workers=2, max_failures=1), config=config(), agent_config=AGENT,
                           data=niah(8), out_dir=out, model=str(tiny_llama_dir), reward_fn=kill)
    assert "killed rank 1" in marker.read_text()
    # The restarted group began at the checkpoint of step 1 and finished the run.
    assert [(x["start_step"], x["resumed"]) for x in launches(out)] == [(0, False), (1, True)]
    assert [r["step"] for r in records] == [0, 1]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2  # no step counted twice
    assert_loadable(out / "checkpoints" / "step_000002" / "hf")


@pytest.mark.slow
def test_two_workers_on_a_two_node_cluster_give_the_run_of_one(tiny_llama_dir: Path, tmp_path: Path):
    """Two ranks, one on each node of a local 2-node cluster, take the steps one process takes: every
    trajectory counted, disjoint questions per rank, the metrics written once (by rank 0), a checkpoint with
    the one process's weights' names."""
    import ray

    from infra.ray_cluster import local_cluster

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in niah(8)))
    kw = dict(config=config(), agent_config=AGENT, data=str(data), model=str(tiny_llama_dir))
    if ray.is_initialized():
        ray.shutdown()
    one = run_training(TrainJob(), out_dir=tmp_path / "one", **kw)  # in this process
    with local_cluster(workers=1, head_cpus=1, worker_cpus=1) as address:
        try:  # one CPU per node: one worker on the head, one on the worker node
            two = run_training(TrainJob(workers=2, ray_address=address), out_dir=tmp_path / "two", **kw)
        finally:
            ray.shutdown()
    assert_same_run(one, two, batch=4, group=2)
    assert [r["step"] for r in read_metrics(tmp_path / "two")] == [0, 1]
    assert launches(tmp_path / "two") == [dict(launches(tmp_path / "two")[0], start_step=0, resumed=False,
                                               workers=2, nodes=2)]
    assert_loadable(tmp_path / "two" / "checkpoints" / "step_000002" / "hf",
                    like=tmp_path / "one" / "checkpoints" / "step_000002" / "hf")
