"""Batch QA over a document lake: Parquet (local or S3) in, answers + memory traces out.

    read_parquet ─► skip ids already written ─► fingerprint ─► map_batches(AgentWorker, actor pool) ─► write_parquet

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

import asyncio
import gc
import logging
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import ray
from pydantic import BaseModel, ConfigDict, Field, model_validator
from ray.data import ActorPoolStrategy, DataContext

from memagent.batch import Method, result_schema
from memagent.config import AgentConfig, preset
from memagent.engines import EngineConfig
from memagent.error_kinds import INFRA_PREFIX, InfraBreaker, InfrastructureFailure
from memagent.verify import Metric
from pipelines import fingerprint, lease, resources, storage
from pipelines.admission import AdmissionPlan, OccupancyLedger, is_long_document, occupancy, resolve_max_in_flight
from pipelines.job import JobConfig
from pipelines.storage import S3Options
from pipelines.summary import BatchSummary

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("id", "context")

# Fault injection for tests: the actor handling its N-th batch kills its own process, once
# (the marker file records that it happened).
CRASH_AT_BATCH_ENV = "MEMAGENT_FAULT_CRASH_AT_BATCH"
CRASH_MARKER_ENV = "MEMAGENT_FAULT_MARKER"

# Rows per Ray Data call under continuous admission (chosen by measurement, benchmarks/README.md
# "Continuous admission"): one row per call, so a row leaves the actor the moment it is done.
ROWS_PER_CALL = 1


class BatchQAConfig(BaseModel):
    """One batch QA job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str = Field(..., description="Parquet file or directory, local or s3://bucket/prefix. In a directory: "
                       "files named *.parquet (any case) at any depth, except under names starting with _ or . "
                       "(docs/deployment.md).")
    output: str = Field(..., description="Output directory, local or s3://; reruns resume into it.")
    s3: S3Options = Field(default_factory=S3Options)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    agent: AgentConfig = Field(default_factory=lambda: preset("small"))
    question: str | None = Field(None, description="Job-level question for inputs without a question column.")
    metric: Metric = Field(
        "sub_em", description="Score against `answers` when the input has them; a `metric` column overrides it per row."
    )
    method: Method = Field(
        "memagent", description="'memagent' reads chunk by chunk; 'full-context' is the one-prompt baseline."
    )
    job: JobConfig = Field(default_factory=JobConfig, description="Actors, batching, resources and timeouts.")
    redo_changed: bool = Field(
        False, description="On a rerun into the same output, redo (and replace) the rows whose input (question, "
        "context) or answer-changing settings differ from what they were answered from, instead of refusing.")
    force_unlock: bool = Field(False, description=lease.FORCE_UNLOCK_HELP)

    @model_validator(mode="after")
    def _check(self) -> BatchQAConfig:
        storage.check_uri(self.input, "input")
        storage.check_uri(self.output, "output")
        if self.question is not None and not self.question.strip():
            raise ValueError("question must not be empty")
        if self.agent.extraction is not None and (self.question is not None or self.method != "memagent"):
            raise ValueError("an extraction schema's field list is the question: give no question with it, "
                             "and keep method 'memagent'")
        if self.job.num_gpus > 0 and self.engine.device == "cpu":
            raise ValueError("num_gpus > 0 with engine device 'cpu': use device 'auto' or 'cuda'")
        if self.engine.engine == "openai" and self.job.num_gpus > 0:
            # The model runs behind the endpoint; a GPU held by an HTTP client is a GPU wasted.
            raise ValueError("num_gpus > 0 with engine 'openai': the actors only call the endpoint; use num_gpus 0")
        if self.engine.engine == "vllm" and self.job.num_gpus <= 0 and self.engine.device != "cpu":
            # vLLM places its engine on the GPUs Ray grants the actor; with none it cannot start.
            raise ValueError(f"engine 'vllm' needs num_gpus > 0 per actor (e.g. num_gpus="
                             f"{self.engine.tensor_parallel_size}) unless device is 'cpu'")
        return self


@dataclass
class InputPlan:
    """What the up-front validation found."""

    schema: pa.Schema
    total_rows: int
    done_ids: pa.Array
    skipped: int  # input ids already in the output
    output_schema: pa.Schema
    redo_ids: pa.Array = field(default_factory=lambda: pa.array([], pa.string()))  # in the output, to redo
    files: list[str] = field(default_factory=list)  # the input files checked: exactly what the job reads


def plan_input(cfg: BatchQAConfig) -> InputPlan:
    """Validate input and output before any work; find done ids.

    Input: every file readable (a corrupt one is named), the required columns in *every* file
    (a file lacking one is named), the files' schemas unified (columns of every file kept, nulls
    where a file lacks an optional one; compatible types widened; incompatible types name the
    column and both files), ids strings, non-null, unique. Output: a directory or prefix (never
    a file), writable (a probe object is written and deleted), holding only batch outputs.
    """
    endpoint = storage.s3_endpoint(cfg.s3)
    in_fs, in_path = storage.filesystem(cfg.input, cfg.s3)
    storage.check_not_nested(cfg.input, in_path, cfg.output, storage.filesystem(cfg.output, cfg.s3)[1])
    with storage.io_errors("input", cfg.input, endpoint):
        files = storage.parquet_files(in_fs, in_path)
        if not files:
            raise ValueError(f"input {cfg.input}: no Parquet files found")
        schemas = storage.read_schemas(in_fs, files, cfg.input)
    # With an extraction schema the field list is the question: a question column is not needed.
    required = [*REQUIRED_COLUMNS, *(["question"] if cfg.question is None and cfg.agent.extraction is None else [])]
    for file, file_schema in schemas:
        missing = [c for c in required if c not in file_schema.names]
        if missing:
            named = [c if c != "question" else "question (or a job-level --question)" for c in missing]
            where = f"input {cfg.input}" if len(files) == 1 else f"input file {file}"
            raise ValueError(f"{where}: missing column(s) {', '.join(named)}; have {', '.join(file_schema.names)}")
    schema = storage.unify_schemas(schemas, cfg.input)
    if "question" in schema.names and cfg.question is not None:
        raise ValueError("input has a question column and a job-level question was given: drop one of them")
    if not (pa.types.is_string(schema.field("id").type) or pa.types.is_large_string(schema.field("id").type)):
        raise ValueError(f"input column id must be strings, got {schema.field('id').type}; cast the ids to strings")
    results = result_schema(cfg.agent)  # with a schema: its field columns, extraction, field_evidence
    clash = [c for c in [*results.names, "node_id", fingerprint.COLUMN] if c in schema.names]
    if clash:
        raise ValueError(f"input column(s) {', '.join(clash)} clash with output columns; rename them")
    with storage.io_errors("input", cfg.input, endpoint):
        ids = storage.read_column(in_fs, files, "id")
    if ids.null_count:
        raise ValueError(f"input column id has {ids.null_count} null value(s); every row needs an id")
    dup = storage.duplicates(ids)
    if dup:
        raise ValueError(f"input column id has duplicates, e.g. {', '.join(dup)}; ids must be unique")

    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    storage.check_output_location(out_fs, out_path, cfg.output, cfg.s3)
    with storage.io_errors("output", cfg.output, endpoint):
        done_files = storage.complete_parquet_files(out_fs, out_path)
        # Rows written as infrastructure errors (`infra:`) are not done: a rerun takes them out and redoes them.
        done, retry = storage.output_ids(out_fs, done_files)
        dup = storage.duplicates(pa.chunked_array([done, retry.cast(pa.string())], pa.string()))
        if dup:  # not trusting the lease alone: two writers, or a store ignoring conditional writes
            raise ValueError(f"output {cfg.output} holds duplicate ids, e.g. {', '.join(sorted(dup))}; repair it with: "
                             f"memagent repair-output --output {cfg.output}")
        if len(done):  # resume checks what it skips: same question, context and answer-changing settings?
            changed = fingerprint.changed_ids(in_fs, files, out_fs, done_files, done, fingerprint.job_question(cfg),
                                              fingerprint.answer_key(cfg))
            if len(changed) and not cfg.redo_changed:
                raise ValueError(f"{len(changed)} id(s) already in {cfg.output} were answered from a different input "
                                 "(question, context, schema or answer-changing settings), "
                                 f"e.g. {changed[0].as_py()!r}; "
                                 "use a new output, or --redo-changed to answer them again")
            if len(changed):
                log.warning("%d id(s) in %s changed since they were answered: redoing them", len(changed), cfg.output)
                done = done.filter(pc.invert(pc.is_in(done, value_set=changed)))
                retry = pa.concat_arrays([retry.cast(pa.string()), changed])
    retry = retry.filter(pc.is_in(retry, value_set=ids.combine_chunks())) if len(retry) else retry
    extra = [f for f in results if f.name not in schema.names] + [pa.field("node_id", pa.string()),
                                                                        pa.field(fingerprint.COLUMN, pa.string())]
    output_schema = pa.schema(list(schema) + extra)
    skipped = int(pc.sum(pc.is_in(ids, value_set=done)).as_py() or 0) if len(done) else 0
    return InputPlan(schema=schema, total_rows=len(ids), done_ids=done, skipped=skipped, output_schema=output_schema,
                     redo_ids=retry, files=files)


def drop_done(batch: pa.Table, done_ids: pa.Array | ray.ObjectRef) -> pa.Table:
    """Rows whose id is not in ``done_ids`` (resume). The id set travels once, via the object store."""
    if isinstance(done_ids, ray.ObjectRef):
        done_ids = ray.get(done_ids)
    if len(done_ids) == 0:
        return batch
    return batch.filter(pc.invert(pc.is_in(batch.column("id"), value_set=done_ids)))


class AgentWorker:
    """Ray Data actor: one engine; up to ``max_in_flight`` documents reading at once (continuous admission).

    Ray Data hands the actor many small calls at once (``max_concurrent_calls_per_actor``); each
    row of each call waits at one actor-wide gate (:class:`pipelines.admission.Gate`) and starts
    the moment a document finishes, whichever call it came in; each call returns its own rows as
    soon as they are done. ``engine_factory`` ("module:function", called with
    ``engine_factory_config``) replaces ``make_engine`` for benchmarks and tests only.
    """

    def __init__(self, engine: EngineConfig, agent: AgentConfig, output_schema: pa.Schema,
                 question: str | None, metric: str, torch_threads: int | None, concurrency: int,
                 method: str = "memagent", max_in_flight: int | None = None, ledger: str | None = None,
                 engine_factory: str | None = None, engine_factory_config: dict | None = None,
                 breaker: dict | None = None, long_document_tokens: int | None = None,
                 long_document_in_flight: int | None = None):
        from memagent.agent import check_config
        from pipelines.admission import Gate, resolve_max_in_flight
        from pipelines.engine_metrics import ActorMeter, MeteredEngine

        if engine_factory:
            import importlib

            module, _, fn = engine_factory.partition(":")
            inner = getattr(importlib.import_module(module), fn)(engine_factory_config)
        else:
            import torch

            from memagent.engines import make_engine

            torch.set_num_threads(torch_threads or max(1, (os.cpu_count() or 1) // concurrency))
            inner = make_engine(engine)
        self.engine = MeteredEngine(inner, memory_tokens=agent.memory_tokens if method == "memagent" else None)
        if method == "memagent":
            check_config(self.engine, agent)
        self.agent, self.schema, self.question, self.metric = agent, output_schema, question, metric
        self.method = method
        self.batches = 0
        ctx = ray.get_runtime_context()
        self.node_id = ctx.get_node_id()
        actor_id = ctx.get_actor_id() or f"local{os.getpid()}"
        self.key = f"{actor_id[:8]}:{os.getpid()}"
        limit = resolve_max_in_flight(max_in_flight, engine)
        self.long_document_tokens = long_document_tokens
        self.gate = Gate(limit, reserve_limit=min(long_document_in_flight or limit, limit)
                         if long_document_tokens else None)
        self.meter = ActorMeter(actor_id[:8], self.engine, self.gate)
        self.ledger_name = ledger
        self.breaker = InfraBreaker(**(breaker or {}))  # stop when infrastructure errors dominate
        self._ledger = None

    def _maybe_crash(self) -> None:
        at, marker = os.environ.get(CRASH_AT_BATCH_ENV), os.environ.get(CRASH_MARKER_ENV)
        if at and marker and self.batches == int(at) and not Path(marker).exists():
            Path(marker).write_text(f"crashed at batch {at} on pid {os.getpid()}\n")
            os._exit(1)

    async def _report(self) -> None:
        """Send the gate's counts to the run's ledger (awaited: the driver reads it after the last call)."""
        if not self.ledger_name:
            return
        if self._ledger is None:
            self._ledger = ray.get_actor(self.ledger_name)
        await self._ledger.report.remote(self.key, {**self.gate.snapshot(), **self.meter.lag_snapshot(),
                                                    **self.meter.spec_snapshot()})

    async def __call__(self, batch: pa.Table) -> pa.Table:
        from memagent.batch import answer_row

        self.batches += 1
        self._maybe_crash()
        self.meter.start()

        async def one(row: dict) -> dict:
            long = is_long_document(self.engine.tokenizer, row.get("context"), self.long_document_tokens)
            async with self.gate.slot(long=long):
                return self.breaker.check(await answer_row(self.engine, row, self.agent, question=self.question,
                                                           metric=self.metric, method=self.method))

        records = list(await asyncio.gather(*(one(r) for r in batch.to_pylist())))
        for r in records:
            r["node_id"] = self.node_id  # which node read the row (placement checks, debugging)
        self.meter.publish()
        await self._report()
        return pa.Table.from_pylist(records, schema=self.schema)


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
    # No address: a fresh local Ray (as JobConfig.ray_address documents), not whatever cluster
    # `ray start` left in /tmp/ray/ray_current_cluster; RAY_ADDRESS (`ray job submit`) still wins.
    address = cfg.job.ray_address or (None if os.environ.get("RAY_ADDRESS") else "local")
    ray.init(address=address, include_dashboard=False, log_to_driver=True)
    return True


def summarise(cfg: BatchQAConfig, plan: InputPlan, seconds: float) -> BatchSummary:
    """Read back the small columns of the output and count this run's rows."""
    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    has_answers = "answers" in plan.output_schema.names
    table = storage.read_columns(out_fs, storage.complete_parquet_files(out_fs, out_path),
                                 ["id", "error", "score", "context_tokens", *(["answers"] if has_answers else [])])
    if len(plan.done_ids):
        table = table.filter(pc.invert(pc.is_in(table.column("id"), value_set=plan.done_ids)))
    scores = table.column("score").drop_null() if len(table) else pa.array([])
    errors = table.column("error").drop_null().cast(pa.string()) if len(table) else pa.array([], pa.string())
    # Rows that should have been scored: those with answers (error rows among them count as wrong).
    scored = len(scores)
    if has_answers and len(table):
        errored_with_answers = pc.and_(pc.is_valid(table.column("answers")), pc.is_valid(table.column("error")))
        scored += int(pc.sum(errored_with_answers).as_py() or 0)
    return BatchSummary(
        rows_in=plan.total_rows,
        skipped=plan.skipped,
        rows_out=len(table),
        error_rows=len(errors),
        infra_errors=int(pc.sum(pc.starts_with(errors, INFRA_PREFIX)).as_py() or 0) if len(errors) else 0,
        accuracy=(pc.sum(scores).as_py() or 0.0) / scored if scored else None,
        accuracy_answered=pc.mean(scores).as_py() if len(scores) else None,
        scored_rows=scored,
        context_tokens=int(pc.sum(table.column("context_tokens")).as_py() or 0) if len(table) else 0,
        seconds=seconds,
        output=cfg.output,
    )


def run_batch_qa(cfg: BatchQAConfig, *, admission: AdmissionPlan | None = None,
                 engine_factory: tuple[str, dict] | None = None) -> BatchSummary:
    """Run the job holding the output's lease (:mod:`pipelines.lease`), taken before any model loads."""
    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    storage.check_output_location(out_fs, out_path, cfg.output, cfg.s3)  # a bad output named before the lease
    with lease.hold(cfg.output, cfg.s3, force=cfg.force_unlock):
        return _run_batch_qa(cfg, admission=admission, engine_factory=engine_factory)


def _run_batch_qa(cfg: BatchQAConfig, *, admission: AdmissionPlan | None = None,
                  engine_factory: tuple[str, dict] | None = None) -> BatchSummary:
    """Run the job to completion and summarise what this run wrote.

    ``admission`` overrides how rows reach the actors (benchmarks compare
    ``AdmissionPlan.barrier(batch_size)``, the old batch barrier); ``engine_factory``
    ("module:function", config) builds the engine instead of ``make_engine`` (benchmarks, tests).
    """
    t0 = time.perf_counter()
    plan = plan_input(cfg)
    take_out_redo_rows(cfg, plan)
    started_ray = ensure_ray(cfg)
    configure_data_context(cfg)
    if plan.skipped >= plan.total_rows:
        log.info("all %d ids already in %s; nothing to do", plan.total_rows, cfg.output)
        return summarise(cfg, plan, time.perf_counter() - t0)
    # An actor no node can hold is refused now, not after the no-progress timeout.
    resources.check_job_fits(cfg.job, shutdown_on_refusal=started_ray)

    in_fs, _ = storage.filesystem(cfg.input, cfg.s3)  # the plan holds the files to read
    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    fault_env = {k: os.environ[k] for k in (CRASH_AT_BATCH_ENV, CRASH_MARKER_ENV) if k in os.environ}
    # Only the fault-injection hooks travel as a runtime env: Ray logs runtime envs in clear text,
    # so the API key (named by engine.api_key_env) and AWS credentials never do; actors read
    # them from their node's environment (a local Ray's workers inherit this process's).
    actor_env = fault_env
    # Exactly the files the plan checked (not a directory Ray would list by its own rules), with
    # the unified schema of all of them; columns come from the files, not from directory names.
    ds = ray.data.read_parquet(plan.files, filesystem=in_fs, schema=plan.schema, file_extensions=None,
                               partitioning=None)
    if len(plan.done_ids):
        ds = ds.map_batches(drop_done, fn_args=[ray.put(plan.done_ids)], batch_format="pyarrow",
                            batch_size=None, num_cpus=0.25)
    # What each row is answered from, kept in the output so that a rerun can check what it skips.
    ds = ds.map_batches(fingerprint.add_fingerprints, fn_kwargs=dict(question=fingerprint.job_question(cfg),
                                                                     key=fingerprint.answer_key(cfg)),
                        batch_format="pyarrow", batch_size=None, num_cpus=0.25)
    # Continuous admission: small calls (``rows_per_call`` rows), many at once per actor, each row
    # gated by the actor's ``max_in_flight``; the writer gathers finished rows into files of
    # ``batch_size`` rows, so a stopped job loses at most the rows in flight and one file's worth
    # (whole-file blocks would hold every answer of a file until the file is read to the end).
    adm = admission or AdmissionPlan(resolve_max_in_flight(cfg.job.max_in_flight, cfg.engine),
                                     rows_per_call=ROWS_PER_CALL)
    ledger_name = f"memagent-occupancy-{uuid.uuid4().hex[:12]}"
    ledger = ray.remote(OccupancyLedger).options(name=ledger_name, num_cpus=0).remote()
    if cfg.job.longest_first:  # a global sort: the whole input is read before the first row starts
        ds = ds.map_batches(_with_context_chars, batch_format="pyarrow", batch_size=None, num_cpus=0.25)
        ds = ds.sort(_LENGTH_COLUMN, descending=True).drop_columns([_LENGTH_COLUMN])
    ds = ds.repartition(target_num_rows_per_block=adm.rows_per_call)
    ds = ds.map_batches(
        AgentWorker,
        fn_constructor_kwargs=dict(engine=cfg.engine, agent=cfg.agent, output_schema=plan.output_schema,
                                   question=cfg.question, metric=cfg.metric, torch_threads=cfg.job.torch_threads,
                                   concurrency=cfg.job.concurrency, method=cfg.method,
                                   max_in_flight=adm.max_in_flight, ledger=ledger_name,
                                   engine_factory=engine_factory[0] if engine_factory else None,
                                   engine_factory_config=engine_factory[1] if engine_factory else None,
                                   breaker=breaker_options(cfg.job),
                                   long_document_tokens=cfg.job.long_document_tokens,
                                   long_document_in_flight=cfg.job.long_document_in_flight),
        compute=ActorPoolStrategy(size=cfg.job.concurrency, max_concurrent_calls_per_actor=adm.calls,
                                  max_tasks_in_flight_per_actor=adm.tasks_in_flight),
        batch_size=adm.rows_per_call,
        batch_format="pyarrow",
        num_gpus=cfg.job.num_gpus,
        num_cpus=cfg.job.num_cpus,
        runtime_env={"env_vars": actor_env} if actor_env else None,
        resources=dict(cfg.job.resources) or None,
        # Actors are restarted and their tasks retried by Ray on process death (defaults:
        # max_restarts=-1, max_task_retries=-1); row errors never raise, so only those retry.
    )
    stopped = failed = None
    try:
        with storage.quiet_write_failures(cfg.output):
            ds.write_parquet(out_path, filesystem=out_fs,
                             min_rows_per_file=cfg.job.batch_size if adm.rows_per_call < cfg.job.batch_size else None)
    except Exception as exc:
        stopped = breaker_message(exc)
        # A full disk, a permission, quota or S3 error: one line naming the output.
        failed = storage.write_failure(exc, cfg.output, storage.s3_endpoint(cfg.s3)) if stopped is None else None
        if stopped is None and failed is None:
            raise
    if stopped is not None or failed is not None:
        # Raised outside the except block: the Ray error's traceback would keep the dataset, and
        # so its actors and their CPUs, alive in a process that goes on (tests, flows).
        del ds
        gc.collect()
        ray.kill(ledger)
        if started_ray:  # stop the actors now: no worker log lines after the one-line message
            ray.shutdown()
        if failed is not None:
            raise failed
        written = summarise(cfg, plan, time.perf_counter() - t0)
        raise InfrastructureFailure(f"{stopped} ({written.rows_out} row(s) written this run, "
                                    f"{written.infra_errors} of them infrastructure errors)")
    summary = summarise(cfg, plan, time.perf_counter() - t0)
    try:
        snapshots = ray.get(ledger.read.remote())
    finally:
        ray.kill(ledger)
    summary.occupancy, summary.actor_occupancy = occupancy(snapshots)
    summary.max_in_flight = adm.max_in_flight
    summary.peak_in_flight = max((s["peak"] for s in snapshots.values()), default=None)
    starts = [s["first_start"] for s in snapshots.values() if s["first_start"] is not None]
    ends = [s["last_done"] for s in snapshots.values() if s["last_done"] is not None]
    summary.reading_seconds = max(ends) - min(starts) if starts and ends else None
    summary.actor_windows = {k: (round(s["first_start"] - min(starts), 3), round(s["last_done"] - min(starts), 3))
                             for k, s in snapshots.items() if s["first_start"] is not None and s["last_done"]}
    lags = [s for s in snapshots.values() if s.get("loop_lag_mean_s") is not None]
    if lags:
        summary.loop_lag_mean_s = sum(s["loop_lag_mean_s"] for s in lags) / len(lags)
        summary.loop_lag_max_s = max(s["loop_lag_max_s"] for s in lags)
    for key in ("draft_tokens", "accepted_tokens", "stepped_tokens"):  # speculation, over actors
        setattr(summary, key, sum(s.get(key, 0) for s in snapshots.values()))
    summary.decode_steps = sum(s.get("decode_steps", 0) for s in snapshots.values()) or None
    return summary


def breaker_options(job: JobConfig) -> dict[str, Any]:
    """The circuit breaker's thresholds (:class:`memagent.error_kinds.InfraBreaker`) from the job config."""
    return dict(consecutive=job.max_consecutive_infra_errors, window=job.infra_error_window,
                rate=job.max_infra_error_rate)


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


def take_out_redo_rows(cfg: BatchQAConfig, plan: InputPlan) -> None:
    """Remove from the output the rows this run redoes (infrastructure errors of an earlier run)."""
    if not len(plan.redo_ids):
        return
    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    n = storage.remove_rows(out_fs, out_path, storage.complete_parquet_files(out_fs, out_path), plan.redo_ids)
    log.warning("%d row(s) in %s failed on the infrastructure in an earlier run: redoing them", n, cfg.output)


def config_dict(cfg: BatchQAConfig) -> dict[str, Any]:
    """The job's config as plain JSON-able data (for logs and artifacts), secrets redacted."""
    from memagent.redact import redact

    return redact(cfg.model_dump(mode="json"))
