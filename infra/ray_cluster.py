"""A local multi-node Ray cluster on loopback: a head plus worker nodes, each its own raylet.

    python -m infra.ray_cluster --workers 1        # prints the address; runs until Ctrl-C

Worker nodes carry the custom resource ``worker_node`` so a job can pin actors to them
(``BatchQAConfig.resources``), as a GPU worker group would be pinned on a real cluster.
Everything binds to 127.0.0.1 (``ray start`` would pick the host's external address).
"""

from __future__ import annotations

import argparse
import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from infra.local_s3 import wait_until_stopped

if TYPE_CHECKING:
    from ray.cluster_utils import Cluster

LOOPBACK = "127.0.0.1"
# Keep every raylet and client on loopback, without token auth (local development only).
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
# Object store per node. ray.cluster_utils gives each node 150 MiB, a unit-test size: Ray Data
# sizes its backpressure budgets from it, and a 2,000-document lake (130 MB of contexts) then
# reached the actors at a trickle (occupancy 0.175 against 0.48 on one local node, the same job).
OBJECT_STORE_MB = 1024


@contextmanager
def local_cluster(workers: int = 1, head_cpus: int = 1, worker_cpus: int = 1,
                  object_store_mb: int = OBJECT_STORE_MB) -> Iterator[str]:
    """Start a head and ``workers`` worker nodes; yield the cluster address; tear it all down."""
    with loopback_cluster(workers, head_cpus, worker_cpus, object_store_mb) as cluster:
        yield cluster.address


@contextmanager
def loopback_cluster(workers: int = 1, head_cpus: int = 1, worker_cpus: int = 1,
                     object_store_mb: int = OBJECT_STORE_MB, resources: dict[str, float] | None = None,
                     temp_dir: str | None = None) -> Iterator[Cluster]:
    """:func:`local_cluster`, yielding the ``ray.cluster_utils.Cluster`` itself, so that a caller can
    stop one node's processes (``cluster.remove_node(node)``, as a lost machine) and leave the rest.

    ``resources``: custom resources every node carries (beside ``head_node``/``worker_node``);
    ``temp_dir``: the cluster's session files (default Ray's /tmp/ray; keep it short: socket paths).
    """
    os.environ.update(ENV)
    from ray.cluster_utils import Cluster

    store = object_store_mb * 1024 * 1024
    extra = dict(resources or {})
    head_args = {"node_ip_address": LOOPBACK, "num_cpus": head_cpus, "resources": {"head_node": 1, **extra},
                 "include_dashboard": False, "object_store_memory": store}
    if temp_dir is not None:
        head_args["temp_dir"] = temp_dir
    cluster = Cluster(initialize_head=True, head_node_args=head_args)
    try:
        for _ in range(workers):
            cluster.add_node(node_ip_address=LOOPBACK, num_cpus=worker_cpus, resources={"worker_node": 1, **extra},
                             object_store_memory=store)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--head-cpus", type=int, default=1)
    parser.add_argument("--worker-cpus", type=int, default=1)
    parser.add_argument("--object-store-mb", type=int, default=OBJECT_STORE_MB, help="object store per node")
    args = parser.parse_args()
    with local_cluster(args.workers, args.head_cpus, args.worker_cpus, args.object_store_mb) as address:
        print(f"Ray cluster: {address} (1 head + {args.workers} worker node(s))")
        print(f"run jobs with: {' '.join(f'{k}={v}' for k, v in ENV.items())} memagent batch --ray-address {address} ...")
        wait_until_stopped()


if __name__ == "__main__":
    main()
