"""An actor that no node can hold is refused at once, naming the resource, instead of
waiting for an autoscaler until the no-progress timeout (6 hours by default)."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from pipelines.job import JobConfig
from pipelines.resources import Capacity, actor_request, actors_that_fit, refusal, too_many_actors

TWO_CORES = {"CPU": 2.0, "memory": 8e9, "node:127.0.0.1": 1.0}


def test_actor_request_from_the_job():
    assert actor_request(JobConfig()) == {"CPU": 1.0}
    assert actor_request(JobConfig(num_cpus=2, num_gpus=0.5, resources={"gpu_worker": 1})) == {
        "CPU": 2.0, "GPU": 0.5, "gpu_worker": 1.0}


@pytest.mark.parametrize("job, flag, words", [
    (JobConfig(resources={"foo": 1}), "--resource foo", "foo=1, but no node of this Ray cluster has foo"),
    (JobConfig(num_cpus=3), "--num-cpus", "CPU=3, but no node of this Ray cluster has that much (the most on one "
                                          "node: CPU=2"),
    (JobConfig(num_gpus=1), "--num-gpus", "GPU=1, but no node of this Ray cluster has GPU"),
])
def test_refusal_names_the_resource(job, flag, words):
    message = refusal(actor_request(job), Capacity([TWO_CORES]))
    assert message.startswith(f"{flag}: each actor asks") and words in message and "--no-progress-timeout" in message


def test_an_actor_must_fit_on_one_node_not_on_the_sum():
    two_nodes = Capacity([{"CPU": 2.0, "GPU": 1.0}, {"CPU": 8.0}])
    assert refusal({"CPU": 4.0}, two_nodes) is None
    message = refusal({"CPU": 4.0, "GPU": 1.0}, two_nodes)  # CPU=10, GPU=1 in all, but not on one node
    assert message.startswith("--num-cpus: ") and "CPU=4, GPU=1 on one node" in message


def test_autoscaler_node_types_count():
    gpu_type = {"gpu-group": ({"CPU": 8.0, "GPU": 1.0, "gpu_worker": 1.0}, 4)}
    assert refusal({"GPU": 1.0, "gpu_worker": 1.0}, Capacity([TWO_CORES], gpu_type, True)) is None
    assert actors_that_fit({"GPU": 1.0}, Capacity([TWO_CORES], gpu_type, True)) == 4
    no_more = {"gpu-group": ({"CPU": 8.0, "GPU": 1.0}, 0)}  # max_count 0: never added
    assert "GPU" in refusal({"GPU": 1.0}, Capacity([TWO_CORES], no_more, True))
    # An autoscaler whose node types are not published: it may still add a node that fits.
    assert refusal({"GPU": 1.0}, Capacity([TWO_CORES], {}, True)) is None
    assert actors_that_fit({"GPU": 1.0}, Capacity([TWO_CORES], {}, True)) is None
    assert actors_that_fit({"CPU": 1.0}, Capacity([TWO_CORES, {"CPU": 3.0}])) == 5
    unbounded = {"gpu-group": ({"CPU": 8.0, "GPU": 1.0}, -1)}  # no max_count
    assert refusal({"GPU": 1.0}, Capacity([TWO_CORES], unbounded, True)) is None
    assert actors_that_fit({"GPU": 1.0}, Capacity([TWO_CORES], unbounded, True)) is None


def test_more_actors_than_ever_fit_at_once_are_refused_naming_concurrency():
    """As reported: --concurrency 3 on 2 cores loaded two actors, then wrote nothing for hours."""
    message = too_many_actors({"CPU": 1.0}, Capacity([TWO_CORES]), 3)
    assert message == ("--concurrency 3: this Ray cluster holds at most 2 actor(s) of CPU=1 at once (1 node(s)); the "
                       "job would start 2 and wait for the others until --no-progress-timeout, writing nothing; give "
                       "--concurrency 2 or less, or a smaller --num-cpus")
    assert too_many_actors({"CPU": 1.0}, Capacity([TWO_CORES]), 2) is None
    assert too_many_actors({"CPU": 0.5}, Capacity([TWO_CORES]), 4) is None
    assert "give --concurrency 1 or less, or a smaller --num-cpus or --resource w" in too_many_actors(
        {"CPU": 1.0, "w": 1.0}, Capacity([{**TWO_CORES, "w": 1.0}]), 2)
    # Nodes an autoscaler may add count; one whose node types are unknown may add any number.
    gpu_type = {"gpu-group": ({"CPU": 8.0, "GPU": 1.0}, 2)}
    assert too_many_actors({"GPU": 1.0}, Capacity([TWO_CORES], gpu_type, True), 2) is None
    assert "at most 2 actor(s) of GPU=1" in too_many_actors({"GPU": 1.0}, Capacity([TWO_CORES], gpu_type, True), 3)
    assert too_many_actors({"CPU": 1.0}, Capacity([TWO_CORES], {}, True), 64) is None


# -- against a real local Ray with 2 CPUs ------------------------------------------------------


@pytest.fixture(scope="module")
def ray_two_cpus():
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # not a `ray start` cluster
    yield
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("job, message", [
    (dict(resources={"foo": 1}), "--resource foo: each actor asks foo=1, but no node of this Ray cluster has foo"),
    (dict(num_cpus=3), "--num-cpus: each actor asks CPU=3, but no node of this Ray cluster has that much"),
    (dict(concurrency=3), "--concurrency 3: this Ray cluster holds at most 2 actor\\(s\\) of CPU=1 at once"),
])
def test_batch_job_refuses_at_once(ray_two_cpus, smollm2_dir, tmp_path, job, message):
    from memagent.engines import EngineConfig
    from pipelines.batch_qa import BatchQAConfig, run_batch_qa
    from tests.pipeline_helpers import FAST_AGENT, good_rows, write_rows

    write_rows(tmp_path / "in" / "part-0.parquet", good_rows(2))
    # A model without weights (config and tokenizer only: the budget check reads those): the
    # refusal comes before any actor, and so any model, loads.
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    for f in smollm2_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, no_weights / f.name)
    cfg = BatchQAConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out"),
                        engine=EngineConfig(model=str(no_weights)), agent=FAST_AGENT,
                        job=JobConfig(progress=False, no_progress_timeout_s=60, **job))
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=message):
        run_batch_qa(cfg)
    assert time.perf_counter() - t0 < 30


def test_a_local_ray_is_no_autoscaler():
    from pipelines.resources import can_add_nodes

    local = {"autoscaler_report": {"node_type_mapping": {"8dcf": "node_8dcf"}, "pending_launches": {},
                                   "pending_nodes": [], "legacy": True}}
    assert not can_add_nodes(json.dumps(local)) and not can_add_nodes(None)
    kuberay = {"autoscaler_report": {"node_type_mapping": {"8dcf": "headgroup"}, "pending_launches": {}}}
    assert can_add_nodes(json.dumps(kuberay))
    launching = {"autoscaler_report": {"node_type_mapping": {"8dcf": "node_8dcf"}, "pending_launches": {"gpu": 1}}}
    assert can_add_nodes(json.dumps(launching).encode())
