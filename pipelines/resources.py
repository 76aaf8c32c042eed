"""Refuse at once an actor that no node can hold, instead of waiting for it until the job's
no-progress timeout (6 hours by default).

Ray queues an actor whose request no node can satisfy (``--resource foo=1`` on a cluster without
``foo``, ``--num-cpus 3`` on 2-core nodes) and waits for an autoscaler to add such a node, forever
if none will. Before the job starts its actors, :func:`check_job_fits` compares one actor's request
with every alive node (an actor must fit on one node, so the cluster's totals are not enough) and
with the node types an autoscaler may still add: those Ray publishes in the GCS cluster config
(autoscaler v2, e.g. KubeRay's), each with its ``max_count``. When an autoscaler runs but its node
types are not published (the v1 autoscaler), a request that fits no current node is only a warning:
the autoscaler may yet start a node that holds it. Likewise ``--concurrency`` actors that never all
fit at once are refused (:func:`too_many_actors`): Ray Data's actor pool would start those that fit
and then write nothing until the timeout.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field

from pipelines.job import JobConfig

log = logging.getLogger(__name__)

EPS = 1e-9  # Ray keeps resource amounts in 1e-4 units


@dataclass(frozen=True)
class Capacity:
    """What the cluster can offer an actor: its alive nodes, and the node types an autoscaler may add."""

    nodes: list[dict[str, float]]
    node_types: dict[str, tuple[dict[str, float], int]] = field(default_factory=dict)  # name -> (resources, max)
    autoscaler: bool = False  # an autoscaler runs (node types known or not)


def actor_request(job: JobConfig) -> dict[str, float]:
    """The resources one actor of the job asks Ray for (as ``map_batches`` passes them)."""
    request = {"CPU": job.num_cpus, "GPU": job.num_gpus, **job.resources}
    return {k: float(v) for k, v in request.items() if v > 0}


def flag_of(resource: str) -> str:
    return {"CPU": "--num-cpus", "GPU": "--num-gpus"}.get(resource, f"--resource {resource}")


def _fits(request: dict[str, float], offer: dict[str, float]) -> bool:
    return all(offer.get(k, 0.0) + EPS >= v for k, v in request.items())


def _holds(request: dict[str, float], offer: dict[str, float]) -> int:
    """How many actors of ``request`` one node of ``offer`` holds."""
    return min((math.floor((offer.get(k, 0.0) + EPS) / v) for k, v in request.items()), default=0)


def _fmt(x: float) -> str:
    return f"{x:g}"


def refusal(request: dict[str, float], capacity: Capacity) -> str | None:
    """Why no node, current or to come, can hold one actor; None when one can."""
    offers = capacity.nodes + [res for res, most in capacity.node_types.values() if most != 0]  # -1: no limit
    if any(_fits(request, o) for o in offers):
        return None
    if capacity.autoscaler and not capacity.node_types:
        return None  # an autoscaler whose node types we cannot see may still add a node that fits
    where = (f"{len(capacity.nodes)} node(s)" + (f" and autoscaler node type(s) {', '.join(capacity.node_types)}"
                                                  if capacity.node_types else ""))
    # Name the resource: one no node has at all, else the one short on the node closest to fitting.
    for name, amount in request.items():
        most = max((o.get(name, 0.0) for o in offers), default=0.0)
        if most <= EPS:
            return (f"{flag_of(name)}: each actor asks {name}={_fmt(amount)}, but no node of this Ray cluster has "
                    f"{name} ({where}); the job would wait for it until --no-progress-timeout")
    best = max(offers, key=lambda o: sum(o.get(k, 0.0) >= v for k, v in request.items()), default={})
    name, amount = next((k, v) for k, v in request.items() if best.get(k, 0.0) + EPS < v)
    most = max(o.get(name, 0.0) for o in offers)
    asks = ", ".join(f"{k}={_fmt(v)}" for k, v in request.items())
    together = f"; one actor asks {asks} on one node" if len(request) > 1 else ""
    return (f"{flag_of(name)}: each actor asks {name}={_fmt(amount)}, but no node of this Ray cluster has that much "
            f"(the most on one node: {name}={_fmt(most)}; {where}){together}; the job would wait for it until "
            "--no-progress-timeout")


def actors_that_fit(request: dict[str, float], capacity: Capacity) -> int | None:
    """Most actors the cluster holds at once (None: unbounded or unknown, an autoscaler without node types)."""
    if capacity.autoscaler and not capacity.node_types:
        return None
    if any(most < 0 and _holds(request, res) for res, most in capacity.node_types.values()):
        return None
    return (sum(_holds(request, n) for n in capacity.nodes)
            + sum(_holds(request, res) * most for res, most in capacity.node_types.values()))


def too_many_actors(request: dict[str, float], capacity: Capacity, concurrency: int) -> str | None:
    """Why ``concurrency`` actors never all run at once (None: they do, or an autoscaler may add room).

    Ray Data's fixed actor pool starts no row until every one of its actors has started: with
    room for fewer, the job loads those and then waits, writing nothing, until the no-progress
    timeout (0 rows in 283 s where one actor wrote them in 19 s).
    """
    fit = actors_that_fit(request, capacity)
    if fit is None or fit >= concurrency:
        return None
    asks = ", ".join(f"{k}={_fmt(v)}" for k, v in request.items())
    flags = " or ".join(dict.fromkeys(flag_of(k) for k in request))
    types = f" and autoscaler node type(s) {', '.join(capacity.node_types)}" if capacity.node_types else ""
    return (f"--concurrency {concurrency}: this Ray cluster holds at most {fit} actor(s) of {asks} at once "
            f"({len(capacity.nodes)} node(s){types}); the job would start {fit} and wait for the others until "
            f"--no-progress-timeout, writing nothing; give --concurrency {max(fit, 1)} or less, or a smaller {flags}")


def cluster_capacity() -> Capacity:
    """The capacity of the Ray cluster this process is connected to."""
    import ray

    nodes = [{k: float(v) for k, v in n["Resources"].items()} for n in ray.nodes() if n.get("Alive")]
    node_types: dict[str, tuple[dict[str, float], int]] = {}
    autoscaler = False
    try:  # autoscaler v2 publishes its node types in the GCS (not a public API: best effort)
        from ray._private.state import state

        config = state.get_cluster_config()
        for group in getattr(config, "node_group_configs", None) or []:
            node_types[group.name or f"type-{len(node_types)}"] = (
                {k: float(v) for k, v in group.resources.items()}, int(group.max_count))
        autoscaler = bool(node_types)
    except Exception as exc:  # noqa: BLE001 - an older/newer Ray: fall back to the nodes alone
        log.debug("no autoscaler node types: %s", exc)
    if not autoscaler:
        try:  # the v1 autoscaler's monitor writes its status here (`ray status` reads it)
            from ray._private.ray_constants import DEBUG_AUTOSCALING_STATUS
            from ray.experimental.internal_kv import _internal_kv_get

            autoscaler = can_add_nodes(_internal_kv_get(DEBUG_AUTOSCALING_STATUS))
        except Exception as exc:  # noqa: BLE001
            log.debug("no autoscaler status: %s", exc)
    return Capacity(nodes, node_types, autoscaler)


def can_add_nodes(status: bytes | str | None) -> bool:
    """Whether the v1 autoscaler status JSON is that of an autoscaler that launches nodes.

    A local Ray (``ray.init()``, ``ray start`` without a cluster config) runs the monitor too, with a
    read-only provider: each node is its own type, named ``node_<node id>``, and nothing launches.
    """
    if not status:
        return False
    report = (json.loads(status).get("autoscaler_report") or {})
    mapping = report.get("node_type_mapping") or {}
    return (any(kind != f"node_{node}" for node, kind in mapping.items())
            or bool(report.get("pending_launches")) or bool(report.get("pending_nodes")))


def check_job_fits(job: JobConfig, *, shutdown_on_refusal: bool = False) -> None:
    """Raise ``ValueError`` naming the resource when no node can ever hold one actor of ``job``, or
    naming ``--concurrency`` when the cluster (with the nodes an autoscaler may add) never holds
    ``job.concurrency`` actors at once.

    ``shutdown_on_refusal``: the caller started Ray for this job; stop it before raising.
    """
    import ray

    request, capacity = actor_request(job), cluster_capacity()
    reason = refusal(request, capacity) or too_many_actors(request, capacity, job.concurrency)
    if reason is None:
        if capacity.autoscaler and not capacity.node_types and not any(_fits(request, n) for n in capacity.nodes):
            log.warning("no node holds an actor (%s) yet; waiting for the autoscaler to add one", request)
        return
    if shutdown_on_refusal:
        ray.shutdown()
    raise ValueError(reason)
