"""The batch job on a local two-node Ray cluster, actors pinned to the second node."""

from __future__ import annotations

import pytest

from memagent.engines import EngineConfig
from pipelines.batch_qa import BatchQAConfig, run_batch_qa
from pipelines.job import JobConfig
from tests.pipeline_helpers import FAST_AGENT, good_rows, read_output, write_rows

pytestmark = pytest.mark.slow


def test_actors_run_on_the_worker_node(tiny_llama_dir, tmp_path):
    import ray

    from infra.ray_cluster import local_cluster

    rows = good_rows(4)
    write_rows(tmp_path / "in" / "a.parquet", rows)
    if ray.is_initialized():
        ray.shutdown()
    with local_cluster(workers=1, head_cpus=1, worker_cpus=1) as address:
        cfg = BatchQAConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out"),
                            engine=EngineConfig(model=str(tiny_llama_dir)), agent=FAST_AGENT,
                            job=JobConfig(batch_size=2, resources={"worker_node": 1}, ray_address=address,
                                          progress=False))
        try:
            summary = run_batch_qa(cfg)
            worker_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("worker_node")}
            head_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("head_node")}
        finally:
            ray.shutdown()
    out = read_output(tmp_path / "out")
    assert sorted(r["id"] for r in out) == [r["id"] for r in rows] and summary.rows_out == 4
    assert len(worker_nodes) == 1 and len(head_nodes) == 1 and worker_nodes != head_nodes
    assert {r["node_id"] for r in out} == worker_nodes
