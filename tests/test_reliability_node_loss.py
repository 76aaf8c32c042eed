"""A node lost mid-job: on a 2-node loopback Ray cluster, the worker node holding the actor that
reads a long document is stopped (its raylet and store killed, as a machine lost); the job finishes
on the head with every id once, and the long document resumes inside itself from its checkpoints."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from memagent.config import AgentConfig
from memagent.engines import EngineConfig
from pipelines.batch_qa import BatchQAConfig, run_batch_qa
from pipelines.job import JobConfig
from tests.pipeline_helpers import good_rows, read_output, write_rows
from tests.resume_helpers import LONG_AGENT, Paced, long_row, segments

pytestmark = pytest.mark.slow

EVERY = 5
READER = "memagent_reader"  # a custom resource both nodes carry: where the job's actor may run


def test_a_lost_node_s_long_document_resumes_on_the_other_node(tiny_llama_dir, tmp_path):
    import ray

    rows = [long_row(2400), *good_rows(2)]
    write_rows(tmp_path / "in" / "a.parquet", rows)
    out, placements = tmp_path / "out", tmp_path / "placements"
    if ray.is_initialized():
        ray.shutdown()
    ray_tmp = tempfile.mkdtemp(prefix="ray-nl-", dir="/tmp")  # this cluster's sessions only; short socket paths
    try:
        summary, lost, head_id, worker_id = _run_and_lose_the_worker(tiny_llama_dir, tmp_path, out, placements, ray_tmp)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)

    assert lost.get("at") and lost["segments"] >= 2, f"the worker node was not stopped mid-document: {lost}"
    built_on = placements.read_text().split()
    assert built_on[0] == worker_id and head_id in built_on[1:], built_on  # read on the worker, then on the head
    final = read_output(out)
    assert sorted(r["id"] for r in final) == sorted(r["id"] for r in rows)  # every id once
    assert all(r["error"] is None for r in final), [r["error"] for r in final]
    long = next(r for r in final if r["id"] == "long/0")
    assert long["n_chunks"] >= 40 and long["node_id"] == head_id
    assert long["resumed_at_chunk"] >= EVERY, long["resumed_at_chunk"]  # resumed inside the document
    assert [s["step"] for s in long["steps"]] == list(range(long["n_chunks"] + 1))  # every step once
    # The short documents were in flight on the lost node too: those past a checkpoint resume as well.
    assert summary.resumed_rows == sum(r["resumed_at_chunk"] is not None for r in final)
    assert summary.rows_out == len(rows)
    assert not segments(out), "a committed row's checkpoints are removed"


def _run_and_lose_the_worker(tiny_llama_dir: Path, tmp_path: Path, out: Path, placements: Path, ray_tmp: str):
    """Run the job on a head + worker cluster; stop the worker node once the long document has 2 checkpoints."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from infra.ray_cluster import loopback_cluster

    with loopback_cluster(workers=1, head_cpus=2, worker_cpus=1, object_store_mb=100,
                          resources={READER: 1}, temp_dir=ray_tmp) as cluster:
        (worker,) = cluster.worker_nodes
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
        try:
            nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
            head_id = next(i for i, n in nodes.items() if n["Resources"].get("head_node"))
            worker_id = next(i for i, n in nodes.items() if n["Resources"].get("worker_node"))
            lost: dict[str, object] = {"driver": ray.get_runtime_context().get_node_id()[:8], "head": head_id[:8]}

            # While the head's reader slot is held, the job's actor can only start on the worker node.
            @ray.remote(num_cpus=0, resources={READER: 1})
            class Slot:
                def node(self) -> str:
                    return ray.get_runtime_context().get_node_id()

            slot = Slot.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head_id, soft=False)).remote()
            assert ray.get(slot.node.remote(), timeout=60) == head_id

            def lose_the_worker_node() -> None:
                deadline = time.monotonic() + 300
                while len(segments(out, "long/0")) < 2 and time.monotonic() < deadline:  # 10 chunks checkpointed
                    time.sleep(0.05)
                lost["segments"] = len(segments(out, "long/0"))
                try:  # where each actor was, for the failure message (a private API: best effort)
                    lost["where"] = {a["ActorClassName"]: a["Address"]["NodeID"][:8]
                                     for a in ray._private.state.actors().values() if a["State"] == "ALIVE"}
                except Exception as exc:  # noqa: BLE001
                    lost["where"] = repr(exc)
                cluster.remove_node(worker, allow_graceful=False)  # its raylet, store and workers: gone
                ray.kill(slot)  # the head now has room for the restarted actor
                lost["at"] = time.monotonic()

            killer = threading.Thread(target=lose_the_worker_node, daemon=True)
            killer.start()
            cfg = BatchQAConfig(input=str(tmp_path / "in"), output=str(out), agent=AgentConfig(**LONG_AGENT),
                                engine=EngineConfig(model=str(tiny_llama_dir), dtype="fp32"),
                                job=JobConfig(batch_size=1, resources={READER: 1}, torch_threads=1, progress=False,
                                              checkpoint_every_steps=EVERY, no_progress_timeout_s=600))
            try:
                summary = run_batch_qa(cfg, build_engine=Paced(0.05, placements))
            except Exception as exc:
                raise AssertionError(f"the job failed: {lost}") from exc
            killer.join(timeout=60)
        finally:
            ray.shutdown()

    return summary, lost, head_id, worker_id
