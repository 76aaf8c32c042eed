"""Batch QA over a document lake: Parquet (local or S3) in, answers + memory traces out.

    read_parquet ─► skip ids already written ─► fingerprint
        ─► map_batches(AgentWorker, actor pool) ─► write_parquet

The row phase of :func:`pipelines.driver.run_phases`, which plans, sweeps and summarises around it.

Each actor loads one engine and keeps up to ``max_in_flight`` documents reading at once
(continuous admission: one row per call, the next row starts as soon as one finishes; the
engine batches the calls of all documents in flight). Streaming end to end: the driver holds
only ids and fingerprints (for the checks and resume), never contexts or results.

Guarantees:
- every input id is written exactly once across runs: a rerun on the same output skips ids
  already present in complete output files (partial files are quarantined, their rows redone);
  a rerun whose input changed for a written id is refused unless ``redo_changed``;
- a bad row (null/empty/non-string context, missing question, agent exception) becomes an
  error row, never a lost one; infrastructure errors (``infra:``) are written but not done, so
  a rerun redoes them, and a circuit breaker stops the job when they dominate.
"""

from __future__ import annotations

import functools
import gc
import re
import signal
import threading
import time
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import ray
from ray.data import ActorPoolStrategy, DataContext
from ray.data.datasource import FilenameProvider
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from memagent.error_kinds import InfrastructureFailure
from pipelines import checkpoints, fingerprint, lease, resources, storage, storage_errors
from pipelines.admission import AdmissionPlan, OccupancyLedger
from pipelines.batch_config import BatchQAConfig
from pipelines.documents_input import check_documents_job, documents_source
from pipelines.documents_plan import plan_documents
from pipelines.driver import ActorSnapshots, run_phases, summarise
from pipelines.input_plan import InputPlan, plan_input, unreadable_input
from pipelines.job import ray_init_address
from pipelines.summary import BatchSummary
from pipelines.worker import AgentWorker, EngineBuilder

__all__ = ["BatchQAConfig", "InputPlan", "plan_input", "run_batch_qa", "summarise"]


def run_batch_qa(cfg: BatchQAConfig, *, build_engine: EngineBuilder | None = None) -> BatchSummary:
    """Run the job to completion and summarise what this run wrote.

    The phases of :func:`pipelines.driver.run_phases` (plan, sweeps, write, summary, under the output's
    lease, taken before Ray starts or any model loads), the rows written by Ray Data. ``build_engine``
    builds each actor's engine instead of ``make_engine(cfg.engine)``.
    """
    def write_rows(plan: InputPlan, run_id: str, started: float) -> ActorSnapshots:
        return _write_with_ray(cfg, plan, run_id, started, build_engine)

    check_budget = build_engine is None and cfg.method == "memagent"
    source = documents_source(cfg)
    if source is None:
        return run_phases(cfg, write_rows, check_budget=check_budget)
    # Documents: converted as they stream into the same stages (pipelines/documents_plan.py starts Ray, under the lease).
    check_documents_job(cfg, source)
    had_ray = ray.is_initialized()
    try:
        return run_phases(cfg, write_rows, check_budget=check_budget,
                          plan_input=functools.partial(plan_documents, source=source, start_ray=_start_ray))
    finally:
        if not had_ray and ray.is_initialized():
            ray.shutdown()


def _start_ray(cfg: BatchQAConfig) -> None:
    ensure_ray(cfg)
    configure_data_context(cfg)


def _write_with_ray(cfg: BatchQAConfig, plan: InputPlan, run_id: str, started: float,
                    build_engine: EngineBuilder | None) -> ActorSnapshots:
    """start (Ray, the occupancy ledger) -> build the dataset -> write; the actors' last snapshots."""
    run = _start(cfg, AdmissionPlan.for_job(cfg.job, cfg.engine), run_id)
    # An actor no node can hold is refused now, not after the no-progress timeout.
    resources.check_job_fits(cfg.job, shutdown_on_refusal=run.started_ray)
    # The ledger lives on the driver's node: a lost worker node must not take it (and the job) along.
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    ledger = ray.remote(OccupancyLedger).options(name=run.ledger_name, num_cpus=0,
                                                 scheduling_strategy=here).remote()
    try:
        _write(cfg, plan, run, _dataset(cfg, plan, run, build_engine), started)
        return ActorSnapshots(ray.get(ledger.read.remote()), run.admission.max_in_flight)
    finally:
        if ray.is_initialized():  # a stopped job's _write shuts down the Ray it started
            ray.kill(ledger)


@dataclass(frozen=True)
class _Run:
    """What the start phase set up."""

    admission: AdmissionPlan
    started_ray: bool  # this run started Ray (and stops it on a stopped job)
    ledger_name: str  # the run's OccupancyLedger actor, where the actors report their gates
    run_id: str  # the run id of the output's lease this run holds (checked before each output file)


def _start(cfg: BatchQAConfig, admission: AdmissionPlan, run_id: str) -> _Run:
    started_ray = ensure_ray(cfg)
    configure_data_context(cfg)
    return _Run(admission, started_ray, f"memagent-occupancy-{uuid.uuid4().hex[:12]}", run_id)


class LeasedFilenames(FilenameProvider):
    """Ray Data's default output file names, each handed out only while the lease is this run's.

    The writer asks for a file's name in the write task, right before writing it: a run whose
    lease was taken (``--force-unlock`` from another host) stops at its next file, whatever its
    heartbeat has seen (:func:`pipelines.lease.check_held`: one small read per file).
    """

    def __init__(self, output: str, s3: storage.S3Options | None, run_id: str):
        super().__init__(dataset_uuid=uuid.uuid4().hex[:12], file_format="parquet")
        self.output, self.s3, self.run_id = output, s3, run_id

    def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
        lease.check_held(self.output, self.s3, self.run_id)
        return super().get_filename_for_task(write_uuid, task_index)


def _dataset(cfg: BatchQAConfig, plan: InputPlan, run: _Run, build_engine: EngineBuilder | None) -> ray.data.Dataset:
    """read the planned files -> drop done ids -> fingerprint -> [longest first] -> the actors."""
    if plan.documents is not None:  # converted as they stream; the done ids' files were never listed for reading
        ds = plan.documents
    else:
        in_fs, _ = storage.filesystem(cfg.input, cfg.s3)
        # Exactly the files the plan checked (not a directory Ray would list by its own rules), with
        # the unified schema of all of them; columns come from the files, not from directory names.
        ds = ray.data.read_parquet(plan.files, filesystem=in_fs, schema=plan.schema, file_extensions=None,
                                   partitioning=None)
    if plan.carried:  # input columns named like output columns keep their values under CARRIED_PREFIX
        ds = ds.rename_columns(plan.carried)
    if len(plan.committed_ids) and plan.documents is None:
        ds = ds.map_batches(drop_done, fn_args=[ray.put(plan.committed_ids)], batch_format="pyarrow",
                            batch_size=None, num_cpus=0.25)
    # What each row is answered from, kept in the output so that a rerun can check what it skips.
    ds = ds.map_batches(fingerprint.add_fingerprints, fn_kwargs=dict(question=fingerprint.job_question(cfg),
                                                                     key=fingerprint.answer_key(cfg)),
                        batch_format="pyarrow", batch_size=None, num_cpus=0.25)
    if cfg.job.longest_first:  # a global sort: the whole input is read before the first row starts
        ds = ds.map_batches(_with_context_chars, batch_format="pyarrow", batch_size=None, num_cpus=0.25)
        ds = ds.sort(_LENGTH_COLUMN, descending=True).drop_columns([_LENGTH_COLUMN])
    # Continuous admission: small calls (``rows_per_call`` rows), many at once per actor, each row
    # gated by the actor's ``max_in_flight``; the writer gathers finished rows into files of
    # ``batch_size`` rows, so a stopped job loses at most the rows in flight and one file's worth
    # (whole-file blocks would hold every answer of a file until the file is read to the end).
    adm = run.admission
    ds = ds.repartition(target_num_rows_per_block=adm.rows_per_call)
    # No runtime env: Ray logs runtime envs in clear text, so the API key (named by
    # engine.api_key_env) and AWS credentials never travel in one; actors read them from their
    # node's environment (a local Ray's workers inherit this process's).
    return ds.map_batches(
        AgentWorker,
        fn_constructor_kwargs=dict(cfg=cfg, admission=adm, output_schema=plan.output_schema,
                                   ledger=run.ledger_name, build_engine=build_engine),
        compute=ActorPoolStrategy(size=cfg.job.concurrency, max_concurrent_calls_per_actor=adm.calls,
                                  max_tasks_in_flight_per_actor=adm.tasks_in_flight),
        batch_size=adm.rows_per_call,
        batch_format="pyarrow",
        num_gpus=cfg.job.num_gpus,
        num_cpus=cfg.job.num_cpus,
        resources=dict(cfg.job.resources) or None,
        # Actors are restarted and their tasks retried by Ray on process death (defaults:
        # max_restarts=-1, max_task_retries=-1); row errors never raise, so only those retry.
    )


def _write(cfg: BatchQAConfig, plan: InputPlan, run: _Run, ds: ray.data.Dataset, started: float) -> None:
    """Write the answers; a tripped circuit breaker or a failing output ends the job with one line."""
    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    rows_per_file = cfg.job.batch_size if run.admission.rows_per_call < cfg.job.batch_size else None
    stopped = failed = None
    try:
        # Each committed row's checkpoint log goes as its file lands (and all at the end).
        with storage_errors.quiet_write_failures(cfg.output), checkpoints.Sweeper(cfg.output, cfg.s3):
            ds.write_parquet(out_path, filesystem=out_fs, min_rows_per_file=rows_per_file,
                             filename_provider=LeasedFilenames(cfg.output, cfg.s3, run.run_id))
    except Exception as exc:
        failed = lease_lost(exc)  # another run took the output: stop writing now
        stopped = breaker_message(exc) if failed is None else None
        if failed is None and stopped is None:  # a full disk, a permission, quota or S3 error: one line
            failed = storage_errors.write_failure(exc, cfg.output, storage_errors.s3_endpoint(cfg.s3))
        if failed is None and stopped is None:  # a corrupt page in an input file: its file and row group
            failed = unreadable_input(cfg, plan.files, exc)
        if stopped is None and failed is None:
            raise
    if stopped is None and failed is None:
        return
    # Raised outside the except block: the Ray error's traceback would keep the dataset, and so
    # its actors and their CPUs, alive in a process that goes on (tests, flows).
    del ds
    gc.collect()
    if run.started_ray:  # stop the actors now: no worker log lines after the one-line message
        ray.shutdown()
    if failed is not None:
        raise failed
    written = summarise(cfg, plan, time.perf_counter() - started)
    raise InfrastructureFailure(f"{stopped} ({written.rows_out} row(s) written this run, "
                                f"{written.infra_errors} of them infrastructure errors)")


def drop_done(batch: pa.Table, committed_ids: pa.Array | ray.ObjectRef) -> pa.Table:
    """Rows whose id is not in ``committed_ids`` (resume). The id set travels once, via the object store."""
    if isinstance(committed_ids, ray.ObjectRef):
        committed_ids = ray.get(committed_ids)
    if len(committed_ids) == 0:
        return batch
    return batch.filter(pc.invert(pc.is_in(batch.column("id"), value_set=committed_ids)))


_LENGTH_COLUMN = "__memagent_context_chars"


def _with_context_chars(batch: pa.Table) -> pa.Table:
    """``batch`` plus the length of each context in characters (0 for a null or non-string one)."""
    ctx = batch.column("context")
    n = pc.utf8_length(ctx).fill_null(0) if pa.types.is_string(ctx.type) or pa.types.is_large_string(ctx.type) \
        else pa.array([0] * len(batch), pa.int64())
    return batch.append_column(_LENGTH_COLUMN, pc.cast(n, pa.int64()))


def configure_data_context(cfg: BatchQAConfig) -> None:
    ctx = DataContext.get_current()
    ctx.execution_no_progress_timeout_s = cfg.job.no_progress_timeout_s
    ctx.enable_progress_bars = cfg.job.progress
    ctx.max_errored_blocks = 0  # never drop data silently; row errors are rows
    ctx.print_on_execution_start = cfg.job.progress


def ensure_ray(cfg: BatchQAConfig) -> bool:
    """Start (or connect to) Ray unless the caller already did; True when this call did it."""
    if ray.is_initialized():
        return False
    # No runtime env: Ray logs it in clear text (runtime_env_agent.log). A Ray that this call
    # starts has workers that inherit this process's environment, credentials included; a
    # cluster already running (`ray start`, --ray-address) has its nodes' own environment
    # (infra/kuberay: a Kubernetes Secret). Endpoint/region travel inside the pickled filesystem.
    address = ray_init_address(cfg.job.ray_address)
    # ray.init replaces SIGTERM's handler with sys.exit; a handler the process owner installed
    # (the CLI's: SIGTERM acts like Ctrl-C, so a scheduler's stop releases the lease) is kept.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    ray.init(address=address, include_dashboard=False, log_to_driver=True)
    if callable(previous):
        signal.signal(signal.SIGTERM, previous)
    return True


def lease_lost(exc: BaseException) -> lease.LeaseLost | None:
    """The writer's :class:`pipelines.lease.LeaseLost` inside the exception Ray Data raised, if any."""
    for e in storage_errors.error_causes(exc):
        # Ray's task error wraps the writer's line in its own: take the line itself.
        match = re.search(r"output \S+: while this run wrote, its lease was taken over by [^\n]*", str(e))
        if match:
            return lease.LeaseLost(match.group(0))
    return None


def breaker_message(exc: BaseException) -> str | None:
    """The actor's "stopped early: ..." line inside the exception Ray Data raised, if the breaker tripped."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        match = re.search(r"stopped early: [^\n]*", str(exc))
        if match:
            return match.group(0)
        exc = exc.__cause__ or exc.__context__
    return None
