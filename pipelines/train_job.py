"""Multi-Conv DAPO on a Ray cluster: :func:`memagent.rl.trainer.train` on every worker of a Ray Train run.

``TorchTrainer`` starts ``workers`` processes (one per GPU, or CPU processes), sets ``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` and opens the process group
(gloo without GPUs; with them NCCL for CUDA tensors and gloo for CPU ones) before the loop runs;
``setup_distributed`` then finds the group and DeepSpeed wraps it. Every worker runs the same ``train()``: it
rolls out its share (``batch_size / workers`` questions, rank r reading examples r, r + workers, ...), gradients
are averaged over ranks, and rank 0 writes ``metrics.jsonl`` (each step's records of all ranks
merged), ``run.json`` and the HF exports. DeepSpeed's checkpoints are written by all ranks into
the one ``out_dir``: on one node any local path; on several nodes ``out_dir`` (and ``data``)
must be on storage every node mounts at the same path (NFS, a shared volume), as must
``TrainJob.storage_path`` (or an ``s3://`` URI there).

Failures: a worker that dies (OOM killer, node lost, an error) fails the worker group; Ray
Train's ``FailureConfig`` restarts it (``max_failures`` times) and each worker resumes from the
latest DeepSpeed checkpoint in ``out_dir`` (metric records past it are dropped first, so no step
is counted twice). Survivors blocked in a collective are torn down by Ray Train, not left hanging.

Resume across a change of worker count is refused (:func:`check_resume_world`): see its doc.
Rank 0 appends one line per start of the worker group to ``<out_dir>/launches.jsonl`` (start
step, resumed or not, workers, nodes).

With one worker and no ``ray_address`` :func:`run_training` calls ``train()`` in the calling
process: Ray's start-up (half a minute on a busy 2-core machine) buys nothing there.

    from pipelines.train_job import TrainJob, run_training
    run_training(TrainJob(workers=2), config=TrainConfig(steps=30), agent_config=preset("tiny"),
                 data="train.parquet", out_dir="runs/niah")
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memagent.config import AgentConfig
from memagent.engines import DEFAULT_MODEL
from memagent.rl.config import TrainConfig
from pipelines.job import ray_init_address

if TYPE_CHECKING:
    from memagent.rl.rollout import RewardFn

log = logging.getLogger(__name__)

# In the run directory, written by rank 0 of each worker-group start (first launch and restarts).
LAUNCHES = "launches.jsonl"


class TrainJob(BaseModel):
    """Where and how wide training runs: in this process, or ``workers`` Ray Train workers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workers: int = Field(1, gt=0, description="Training processes, each one DeepSpeed rank with its own rollout "
                         "engine (Ray Train workers when > 1); batch_size must be divisible by it.")
    gpus_per_worker: float = Field(0.0, ge=0, description="GPUs per worker (0: CPU processes over gloo; 1: one GPU "
                                   "per rank over NCCL).")
    cpus_per_worker: float = Field(1.0, gt=0, description="CPUs reserved per worker (its torch threads).")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resource per worker, e.g. worker_node=1 to pin the group "
        "to a node group (repeatable).", json_schema_extra={"flag": "resource"})
    ray_address: str | None = Field(None, description="Ray cluster address; given (or workers > 1), training runs "
                                    "through Ray Train (default: a local Ray on 127.0.0.1).")
    max_failures: int = Field(2, ge=-1, description="Worker-group restarts from the latest checkpoint after a "
                              "worker dies (-1: no limit, 0: fail at once).")
    storage_path: str | None = Field(
        None, description="Ray Train's run state (default: <out_dir>/ray_train); shared by all nodes on a cluster.")

    @model_validator(mode="after")
    def _whole_gpus(self) -> TrainJob:
        if self.gpus_per_worker and self.workers > 1 and self.gpus_per_worker != int(self.gpus_per_worker):
            raise ValueError(f"gpus_per_worker={self.gpus_per_worker} with {self.workers} workers: NCCL needs one "
                             "whole GPU per rank (fractions only with workers=1)")
        return self

    @property
    def uses_ray(self) -> bool:
        """Whether training goes through Ray Train (else ``train()`` runs in the calling process)."""
        return self.workers > 1 or self.ray_address is not None


# ---------------------------------------------------------------------------------------------
# Checkpoint state seen from outside the trainer
# ---------------------------------------------------------------------------------------------


def checkpoint_step(out_dir: str | Path) -> int | None:
    """The step of ``out_dir``'s latest DeepSpeed checkpoint, or None without one."""
    from memagent.rl.checkpoint import latest_tag

    tag = latest_tag(Path(out_dir) / "checkpoints")
    return int(tag.rsplit("_", 1)[-1]) if tag else None


def checkpoint_world(out_dir: str | Path) -> int | None:
    """How many ranks wrote ``out_dir``'s latest checkpoint (its data cursors, one per rank)."""
    import torch

    from memagent.rl.checkpoint import latest_tag

    ckpt = Path(out_dir) / "checkpoints"
    tag = latest_tag(ckpt)
    if tag is None:
        return None
    # mmap: only the small client state is read, not the module's weights.
    state = torch.load(ckpt / tag / "mp_rank_00_model_states.pt", map_location="cpu", mmap=True, weights_only=False)
    if "cursors" in state:
        return len(state["cursors"])
    return int(state.get("dp_world_size", 1))


def check_resume_world(out_dir: str | Path, workers: int, zero_stage: int) -> None:
    """Refuse to resume ``out_dir`` with a worker count other than the one that wrote its checkpoint.

    Correct, and allowed: the same number of workers -- in this process or through Ray Train, on
    other nodes, after a failure. Refused at every ZeRO stage when the count changes: at stages
    1-3 DeepSpeed partitions the AdamW moments (and at 3 the weights) over the ranks that saved
    them and cannot re-partition them without a universal-checkpoint conversion; at every stage
    each rank's data cursor walks its own shard of the examples (rank r reads r, r + W, ...), so
    the data position does not map onto another world size either. What carries over is the
    weights: start a new run from the checkpoint's HF export (``model=<checkpoint>/hf``).
    """
    world = checkpoint_world(out_dir)
    if world is None or world == workers:
        return
    from memagent.rl.checkpoint import latest_tag

    ckpt = Path(out_dir) / "checkpoints"
    tag = latest_tag(ckpt)
    why = (f"ZeRO-{zero_stage} partitions the optimizer state over the {world} ranks that saved it, and"
           if zero_stage else "the optimizer state is whole at ZeRO-0, but")
    raise ValueError(
        f"{out_dir}: checkpoint {tag} was written by {world} worker(s); this run asks for {workers}. Resuming "
        f"across a change of worker count is refused: {why} each rank's data cursor walks its own shard of the "
        f"examples (rank r reads r, r+{world}, ...), which does not map onto {workers} rank(s). Resume with "
        f"workers={world}, or start a new run from this checkpoint's weights: model={ckpt / tag / 'hf'} with a "
        "new out_dir (fresh optimizer and data order).")


def trim_metrics(out_dir: str | Path, before_step: int) -> int:
    """Drop the records of steps >= ``before_step`` from ``metrics.jsonl`` (steps an interrupted
    attempt logged after its last checkpoint, which the resumed run does again); returns the kept count."""
    path = Path(out_dir) / "metrics.jsonl"
    if not path.is_file():
        return 0
    lines = [x for x in path.read_text().splitlines() if x.strip()]
    kept = [x for x in lines if json.loads(x).get("step", 0) < before_step]
    if len(kept) != len(lines):
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(x + "\n" for x in kept))
        tmp.replace(path)
    return len(kept)


def read_metrics(out_dir: str | Path) -> list[dict[str, Any]]:
    """``metrics.jsonl``, one record per step (the last one written for a step wins)."""
    path = Path(out_dir) / "metrics.jsonl"
    by_step: dict[int, dict[str, Any]] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        if line.strip():
            rec = json.loads(line)
            by_step[int(rec["step"])] = rec
    return [by_step[k] for k in sorted(by_step)]


# ---------------------------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------------------------


def run_training(job: TrainJob, *, config: TrainConfig, agent_config: AgentConfig,
                 data: str | Path | Sequence[Mapping[str, Any]], out_dir: str | Path, model: str = DEFAULT_MODEL,
                 resume: bool = False, force: bool = False, reward_fn: RewardFn | None = None,
                 on_step: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Train with ``job.workers`` ranks; returns the run's per-step metric records (``metrics.jsonl``).

    ``job.uses_ray`` false: ``train()`` in this process. Otherwise a Ray Train ``TorchTrainer``
    on ``job.ray_address`` (a Ray started here is shut down at the end; one already up is used
    as is). ``resume``: continue from ``out_dir``'s latest checkpoint (refused when it was
    written by another worker count, :func:`check_resume_world`); without it an ``out_dir``
    holding checkpoints is refused. After a worker failure the restarted group always resumes.
    ``reward_fn``: ``(final response, answers) -> float`` (default: strict boxed EM); with Ray it
    is pickled into every worker, so it must be a picklable callable.
    ``on_step`` sees each step's metrics in this process (progress bars; in-process runs only).
    """
    out = Path(out_dir).resolve()
    if config.batch_size % job.workers:
        raise ValueError(f"batch_size={config.batch_size} must be divisible by workers={job.workers}")
    step = checkpoint_step(out)
    if step is not None and not resume:
        raise FileExistsError(f"{out} already holds checkpoints; pass resume=True or use a new directory")
    if step is not None:
        check_resume_world(out, job.workers, config.zero_stage)
    if not job.uses_ray:
        from memagent.rl.rollout import default_reward
        from memagent.rl.trainer import train

        trim_metrics(out, step or 0)
        train(config=config, agent_config=agent_config, data=str(data) if isinstance(data, Path) else data,
              out_dir=out, model=model, resume=step is not None, force=force, on_step=on_step,
              reward_fn=reward_fn or default_reward)
        return read_metrics(out)
    from memagent.rl.data import check_source

    check_source(data)  # here, once: a bad file fails before Ray Train starts (and retries) its workers
    if isinstance(data, (str, Path)):  # workers need not share this process's working directory
        data = str(data) if "://" in str(data) else str(Path(data).resolve())
    else:
        data = [dict(r) for r in data]
    if Path(model).exists():
        model = str(Path(model).resolve())
    _fit(job, {"config": config, "agent_config": agent_config, "data": data, "out_dir": str(out), "model": model,
               "force": force, "reward_fn": reward_fn}, out)
    return read_metrics(out)


def _fit(job: TrainJob, loop_config: dict[str, Any], out: Path) -> None:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    owns_ray = not ray.is_initialized()
    if owns_ray:
        ray.init(address=ray_init_address(job.ray_address), include_dashboard=False, log_to_driver=True)
    try:
        gpu = job.gpus_per_worker > 0
        resources = {"CPU": job.cpus_per_worker, **job.resources}
        if gpu:
            resources["GPU"] = job.gpus_per_worker
        trainer = TorchTrainer(
            _train_worker,
            train_loop_config=loop_config,
            # With GPUs, NCCL for the tensors DeepSpeed reduces on the device and gloo for the
            # trainer's scalar and object collectives, which use CPU tensors.
            torch_config=TorchConfig(backend="cpu:gloo,cuda:nccl" if gpu else "gloo"),
            scaling_config=ScalingConfig(num_workers=job.workers, use_gpu=gpu, resources_per_worker=resources),
            run_config=RunConfig(
                name=f"train-{out.name}-{int(time.time())}",
                storage_path=job.storage_path or str(out / "ray_train"),
                failure_config=FailureConfig(max_failures=job.max_failures),
            ),
        )
        trainer.fit()  # raises (WorkerGroupError, a TrainingFailedError) once max_failures restarts are spent
    finally:
        if owns_ray and ray.is_initialized():
            ray.shutdown()


def _train_worker(cfg: dict[str, Any]) -> None:
    """One Ray Train worker: the process group is up; resume from the latest checkpoint if any."""
    import torch

    if torch.cuda.is_available():
        # DeepSpeed puts the rank on cuda:LOCAL_RANK; Ray shares the node's workers' GPUs among them
        # (CUDA_VISIBLE_DEVICES), so name the one Ray assigned to this worker.
        from ray.train.torch import get_device

        os.environ["LOCAL_RANK"] = str(get_device().index or 0)
    else:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from memagent.rl.rollout import default_reward
    from memagent.rl.trainer import train

    out = Path(cfg["out_dir"])
    rank = int(os.environ["RANK"])
    start = checkpoint_step(out)
    if rank == 0:  # before train(): no rank writes metrics until the first step's collectives
        trim_metrics(out, start or 0)

    import ray
    import torch.distributed as dist

    nodes = [ray.get_runtime_context().get_node_id()] * int(os.environ["WORLD_SIZE"])
    if dist.is_initialized():  # Ray Train opened the group; ranks group by IP, so ask Ray for the node
        dist.all_gather_object(nodes, nodes[0])
    if rank == 0:  # one line per start of the worker group: where it began, how wide, on which nodes
        out.mkdir(parents=True, exist_ok=True)
        with (out / LAUNCHES).open("a") as f:
            f.write(json.dumps({"start_step": start or 0, "resumed": start is not None,
                                "workers": int(os.environ["WORLD_SIZE"]),
                                "nodes": len(set(nodes)), "node_ids": nodes,
                                "time": time.time()}) + "\n")
    if start is not None:
        log.info("rank %d: resuming %s from step %d", rank, out, start)
    train(config=cfg["config"], agent_config=cfg["agent_config"], data=cfg["data"],
          out_dir=out, model=cfg["model"], resume=start is not None, reward_fn=cfg["reward_fn"] or default_reward,
          force=cfg["force"])
