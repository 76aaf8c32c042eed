"""Batch QA over a document lake: Parquet (local or S3) in, answers + memory traces out.

    read_parquet ─► skip ids already written ─► map_batches(AgentWorker, actor pool) ─► write_parquet

Each actor loads one engine and reads all rows of a batch concurrently (one coroutine per
row; the engine batches their calls). Streaming end to end: the driver only ever holds the
``id`` column (for the duplicate check and resume), never contexts or results.

Guarantees:
- every input id is written exactly once across runs: a rerun on the same output skips ids
  already present in complete output files (partial files are quarantined, their rows redone);
- a bad row (null/empty/non-string context, missing question, agent exception) becomes an
  error row, never a lost one; only infrastructure failures (a dead actor) are retried, by Ray.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import ray
from pydantic import BaseModel, ConfigDict, Field, model_validator
from ray.data import ActorPoolStrategy, DataContext

from memagent.batch import RESULT_SCHEMA
from memagent.config import AgentConfig, preset
from memagent.engines import EngineConfig
from pipelines import storage
from pipelines.storage import S3Options

log = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("id", "context")

# Fault injection for tests: the actor handling its N-th batch kills its own process, once
# (the marker file records that it happened).
CRASH_AT_BATCH_ENV = "MEMAGENT_FAULT_CRASH_AT_BATCH"
CRASH_MARKER_ENV = "MEMAGENT_FAULT_MARKER"


class BatchQAConfig(BaseModel):
    """One batch QA job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str = Field(..., description="Parquet file or directory, local or s3://bucket/prefix.")
    output: str = Field(..., description="Output directory, local or s3://; reruns resume into it.")
    s3: S3Options = Field(default_factory=S3Options)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    agent: AgentConfig = Field(default_factory=lambda: preset("small"))
    question: str | None = Field(None, description="Job-level question for inputs without a question column.")
    metric: Literal["sub_em", "em", "f1", "string_match_all", "boxed_em"] = Field(
        "sub_em", description="Score against `answers` when the input has them; a `metric` column overrides it per row."
    )
    method: Literal["memagent", "full-context"] = Field(
        "memagent", description="'memagent' reads chunk by chunk; 'full-context' is the one-prompt baseline."
    )
    concurrency: int = Field(1, gt=0, description="Actors, each holding one engine.")
    batch_size: int = Field(16, gt=0, description="Rows per batch; an actor reads a batch's rows concurrently.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per actor (0 on CPU: a GPU request on a CPU cluster hangs).")
    num_cpus: float = Field(1.0, gt=0, description="CPUs reserved per actor.")
    torch_threads: int | None = Field(None, gt=0, description="Torch threads per actor; default = node cores / concurrency.")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resources per actor, e.g. {'gpu_worker': 1} to pin node groups."
    )
    ray_address: str | None = Field(None, description="Ray cluster address; None = local Ray.")
    no_progress_timeout_s: float = Field(
        3600, description="Fail when no operator makes progress this long (model loads and long documents are slow)."
    )
    progress: bool = Field(True, description="Show Ray Data progress bars.")

    @model_validator(mode="after")
    def _check(self) -> BatchQAConfig:
        storage.check_uri(self.input, "input")
        storage.check_uri(self.output, "output")
        if self.question is not None and not self.question.strip():
            raise ValueError("question must not be empty")
        if self.num_gpus > 0 and self.engine.device == "cpu":
            raise ValueError("num_gpus > 0 with engine device 'cpu': use device 'auto' or 'cuda'")
        if self.engine.engine == "openai" and self.num_gpus > 0:
            # The model runs behind the endpoint; a GPU held by an HTTP client is a GPU wasted.
            raise ValueError("num_gpus > 0 with engine 'openai': the actors only call the endpoint; use num_gpus 0")
        if self.engine.engine == "vllm" and self.num_gpus <= 0 and self.engine.device != "cpu":
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


@dataclass
class BatchSummary:
    rows_in: int
    skipped: int
    rows_out: int
    error_rows: int
    accuracy: float | None
    context_tokens: int
    seconds: float
    output: str

    @property
    def tokens_per_second(self) -> float:
        return self.context_tokens / self.seconds if self.seconds > 0 else 0.0

    def lines(self) -> list[str]:
        acc = "n/a (no answers)" if self.accuracy is None else f"{self.accuracy:.3f}"
        return [
            f"rows in:        {self.rows_in} ({self.skipped} already done, skipped)",
            f"rows out:       {self.rows_out} this run",
            f"error rows:     {self.error_rows}",
            f"accuracy:       {acc}",
            f"tokens read/s:  {self.tokens_per_second:.1f} ({self.context_tokens} tokens in {self.seconds:.1f} s)",
            f"output:         {self.output}",
        ]


def plan_input(cfg: BatchQAConfig) -> InputPlan:
    """Validate the input before any work: columns, id type/nulls/duplicates; find done ids."""
    in_fs, in_path = storage.filesystem(cfg.input, cfg.s3)
    files = storage.parquet_files(in_fs, in_path)
    if not files:
        raise ValueError(f"input {cfg.input}: no Parquet files found")
    import pyarrow.parquet as pq

    with in_fs.open_input_file(files[0]) as f:
        schema = pq.read_schema(f)
    missing = [c for c in REQUIRED_COLUMNS if c not in schema.names]
    if "question" not in schema.names and cfg.question is None:
        missing.append("question (or a job-level --question)")
    if missing:
        raise ValueError(f"input {cfg.input}: missing column(s) {', '.join(missing)}; have {', '.join(schema.names)}")
    if "question" in schema.names and cfg.question is not None:
        raise ValueError("input has a question column and a job-level question was given: drop one of them")
    if not (pa.types.is_string(schema.field("id").type) or pa.types.is_large_string(schema.field("id").type)):
        raise ValueError(f"input column id must be strings, got {schema.field('id').type}; cast the ids to strings")
    clash = [c for c in [*RESULT_SCHEMA.names, "node_id"] if c in schema.names]
    if clash:
        raise ValueError(f"input column(s) {', '.join(clash)} clash with output columns; rename them")
    ids = storage.read_column(in_fs, files, "id")
    if ids.null_count:
        raise ValueError(f"input column id has {ids.null_count} null value(s); every row needs an id")
    dup = storage.duplicates(ids)
    if dup:
        raise ValueError(f"input column id has duplicates, e.g. {', '.join(dup)}; ids must be unique")

    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    done_files = storage.complete_parquet_files(out_fs, out_path)
    done = storage.read_column(out_fs, done_files, "id").combine_chunks() if done_files else pa.array([], pa.string())
    extra = [f for f in RESULT_SCHEMA if f.name not in schema.names] + [pa.field("node_id", pa.string())]
    output_schema = pa.schema(list(schema) + extra)
    skipped = int(pc.sum(pc.is_in(ids, value_set=done)).as_py() or 0) if len(done) else 0
    return InputPlan(schema=schema, total_rows=len(ids), done_ids=done, skipped=skipped, output_schema=output_schema)


def drop_done(batch: pa.Table, done_ids: pa.Array | ray.ObjectRef) -> pa.Table:
    """Rows whose id is not in ``done_ids`` (resume). The id set travels once, via the object store."""
    if isinstance(done_ids, ray.ObjectRef):
        done_ids = ray.get(done_ids)
    if len(done_ids) == 0:
        return batch
    return batch.filter(pc.invert(pc.is_in(batch.column("id"), value_set=done_ids)))


class AgentWorker:
    """Ray Data actor: one engine, all rows of each batch read concurrently."""

    def __init__(self, engine: EngineConfig, agent: AgentConfig, output_schema: pa.Schema,
                 question: str | None, metric: str, torch_threads: int | None, concurrency: int,
                 method: str = "memagent"):
        import torch

        from memagent.agent import check_config
        from memagent.engines import make_engine

        torch.set_num_threads(torch_threads or max(1, (os.cpu_count() or 1) // concurrency))
        self.engine = make_engine(engine)
        if method == "memagent":
            check_config(self.engine, agent)
        self.agent, self.schema, self.question, self.metric = agent, output_schema, question, metric
        self.method = method
        self.batches = 0
        self.node_id = ray.get_runtime_context().get_node_id()

    def _maybe_crash(self) -> None:
        at, marker = os.environ.get(CRASH_AT_BATCH_ENV), os.environ.get(CRASH_MARKER_ENV)
        if at and marker and self.batches == int(at) and not Path(marker).exists():
            Path(marker).write_text(f"crashed at batch {at} on pid {os.getpid()}\n")
            os._exit(1)

    async def __call__(self, batch: pa.Table) -> pa.Table:
        from memagent.batch import answer_rows

        self.batches += 1
        self._maybe_crash()
        records = await answer_rows(self.engine, batch.to_pylist(), self.agent,
                                    question=self.question, metric=self.metric, method=self.method)
        for r in records:
            r["node_id"] = self.node_id  # which node read the row (placement checks, debugging)
        return pa.Table.from_pylist(records, schema=self.schema)


def endpoint_env(engine: EngineConfig) -> dict[str, str]:
    """The endpoint's API key, for actors on other nodes (a remote cluster does not share our env)."""
    if engine.engine == "openai" and engine.api_key_env in os.environ:
        return {engine.api_key_env: os.environ[engine.api_key_env]}
    return {}


def uses_s3(cfg: BatchQAConfig) -> bool:
    return storage.is_s3(cfg.input) or storage.is_s3(cfg.output)


def configure_data_context(cfg: BatchQAConfig) -> None:
    ctx = DataContext.get_current()
    ctx.execution_no_progress_timeout_s = cfg.no_progress_timeout_s
    ctx.enable_progress_bars = cfg.progress
    ctx.max_errored_blocks = 0  # never drop data silently; row errors are rows
    ctx.print_on_execution_start = cfg.progress


def ensure_ray(cfg: BatchQAConfig) -> None:
    if not ray.is_initialized():
        ray.init(address=cfg.ray_address, include_dashboard=False, log_to_driver=True,
                 runtime_env={"env_vars": cfg.s3.env()} if uses_s3(cfg) else None)


def summarise(cfg: BatchQAConfig, plan: InputPlan, seconds: float) -> BatchSummary:
    """Read back the small columns of the output and count this run's rows."""
    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    table = storage.read_columns(out_fs, storage.complete_parquet_files(out_fs, out_path),
                                 ["id", "error", "score", "context_tokens"])
    if len(plan.done_ids):
        table = table.filter(pc.invert(pc.is_in(table.column("id"), value_set=plan.done_ids)))
    scores = table.column("score").drop_null() if len(table) else pa.array([])
    return BatchSummary(
        rows_in=plan.total_rows,
        skipped=plan.skipped,
        rows_out=len(table),
        error_rows=len(table) - table.column("error").null_count if len(table) else 0,
        accuracy=pc.mean(scores).as_py() if len(scores) else None,
        context_tokens=int(pc.sum(table.column("context_tokens")).as_py() or 0) if len(table) else 0,
        seconds=seconds,
        output=cfg.output,
    )


def run_batch_qa(cfg: BatchQAConfig) -> BatchSummary:
    """Run the job to completion and summarise what this run wrote."""
    t0 = time.perf_counter()
    plan = plan_input(cfg)
    ensure_ray(cfg)
    configure_data_context(cfg)
    if plan.skipped >= plan.total_rows:
        log.info("all %d ids already in %s; nothing to do", plan.total_rows, cfg.output)
        return summarise(cfg, plan, time.perf_counter() - t0)

    in_fs, in_path = storage.filesystem(cfg.input, cfg.s3)
    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    fault_env = {k: os.environ[k] for k in (CRASH_AT_BATCH_ENV, CRASH_MARKER_ENV) if k in os.environ}
    actor_env = {**cfg.s3.env(), **fault_env, **endpoint_env(cfg.engine)}
    ds = ray.data.read_parquet(in_path, filesystem=in_fs)
    if len(plan.done_ids):
        ds = ds.map_batches(drop_done, fn_args=[ray.put(plan.done_ids)], batch_format="pyarrow",
                            batch_size=None, num_cpus=0.25)
    # Blocks of one batch each: an actor's output block (and so its Parquet file) is written when
    # its batch is done. Whole-file blocks would hold every answer of a file until the file is
    # read to the end, so a job stopped after hours would have written nothing to resume from.
    ds = ds.repartition(target_num_rows_per_block=cfg.batch_size)
    ds = ds.map_batches(
        AgentWorker,
        fn_constructor_kwargs=dict(engine=cfg.engine, agent=cfg.agent, output_schema=plan.output_schema,
                                   question=cfg.question, metric=cfg.metric, torch_threads=cfg.torch_threads,
                                   concurrency=cfg.concurrency, method=cfg.method),
        compute=ActorPoolStrategy(size=cfg.concurrency),
        batch_size=cfg.batch_size,
        batch_format="pyarrow",
        num_gpus=cfg.num_gpus,
        num_cpus=cfg.num_cpus,
        runtime_env={"env_vars": actor_env} if actor_env else None,
        resources=dict(cfg.resources) or None,
        # Actors are restarted and their tasks retried by Ray on process death (defaults:
        # max_restarts=-1, max_task_retries=-1); row errors never raise, so only those retry.
    )
    ds.write_parquet(out_path, filesystem=out_fs)
    return summarise(cfg, plan, time.perf_counter() - t0)


def config_dict(cfg: BatchQAConfig) -> dict[str, Any]:
    """The job's config as plain JSON-able data (for logs and artifacts)."""
    return cfg.model_dump(mode="json")
