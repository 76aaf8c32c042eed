"""The batch job's Ray Data actor: one engine, up to ``max_in_flight`` documents reading at once."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING, Awaitable, Callable

import pyarrow as pa
import ray

from memagent.documents.columns import PAGES_COLUMN, page_spans
from memagent.documents.evidence_pages import EVIDENCE_PAGES_COLUMN, evidence_pages
from memagent.engines import EngineConfig
from memagent.error_kinds import engine_is_dead
from pipelines.breaker import InfraBreaker
from pipelines import fingerprint
from pipelines.admission import AdmissionPlan, Gate, count_document
from pipelines.batch_config import BatchQAConfig
from pipelines.checkpoints import CheckpointLog

if TYPE_CHECKING:
    from memagent.chunking import ChunkedDocument
    from memagent.engines.base import Engine

log = logging.getLogger(__name__)

# Builds the actor's engine from the job's engine config, inside the actor (so it must pickle).
# The default is memagent.engines.make_engine; a custom engine (or a benchmark's model of one)
# plugs in here.
EngineBuilder = Callable[[EngineConfig], "Engine"]


async def read_row(engine: Engine, row: dict, cfg: BatchQAConfig, checkpoint_args: Callable[[dict], Awaitable[dict]],
                   chunked: ChunkedDocument | None = None) -> dict:
    """One row as an actor reads it: ``checkpoint_args(row)``, then ``answer_row``
    (``chunked``: the row's context already chunked by ``cfg.agent``, when the worker counted it).

    Reading the row's checkpoints is part of the row: whatever it raises (a corrupt log; the store's
    OSErrors are retried inside ``checkpoint_args``) is the row's error record, as a failed read is. Raised, it
    would fail the whole Ray call, and every retry and rerun of it the same way: the batch never ends.
    """
    from memagent.batch import answer_row, failure_record

    try:
        args = await checkpoint_args(row)
    except Exception as exc:  # noqa: BLE001 - one row's log must not cost the call's other rows
        record = failure_record(row, exc, cfg.agent, engine.name, cfg.method, doing="reading its checkpoints")
        return {**record, "checkpoint_ignored": None}
    return await answer_row(engine, row, cfg.agent, question=cfg.question, metric=cfg.metric, method=cfg.method,
                            chunked=chunked, **args)


class AgentWorker:
    """Ray Data actor: one engine; up to ``admission.max_in_flight`` documents reading at once.

    Ray Data hands the actor many small calls at once (``max_concurrent_calls_per_actor``); each
    row of each call waits at one actor-wide gate (:class:`pipelines.admission.Gate`) and starts
    the moment a document finishes, whichever call it came in; each call returns its own rows as
    soon as they are done. ``ledger`` names the run's :class:`pipelines.admission.OccupancyLedger`.
    """

    def __init__(self, cfg: BatchQAConfig, admission: AdmissionPlan, output_schema: pa.Schema,
                 ledger: str | None = None, build_engine: EngineBuilder | None = None):
        import torch

        from memagent.agent import check_config
        from memagent.engines import make_engine
        from pipelines.engine_metrics import ActorMeter, MeteredEngine

        job = cfg.job
        torch.set_num_threads(job.torch_threads or max(1, (os.cpu_count() or 1) // job.concurrency))
        inner = (build_engine or make_engine)(cfg.engine)
        memagent = cfg.method == "memagent"
        self.engine = MeteredEngine(inner, memory_tokens=cfg.agent.memory_tokens if memagent else None)
        if memagent:
            check_config(self.engine, cfg.agent)
        self.cfg, self.schema = cfg, output_schema
        ctx = ray.get_runtime_context()
        self.node_id = ctx.get_node_id()
        actor_id = ctx.get_actor_id() or f"local{os.getpid()}"
        self.key = f"{actor_id[:8]}:{os.getpid()}"
        limit = admission.max_in_flight
        reserve = min(job.long_document_in_flight or limit, limit) if job.long_document_tokens else None
        self.gate = Gate(limit, reserve_limit=reserve)
        self.meter = ActorMeter(actor_id[:8], self.engine, self.gate)
        self.ledger_name = ledger
        # Stop when infrastructure errors dominate.
        self.breaker = InfraBreaker(consecutive=job.max_consecutive_infra_errors, window=job.infra_error_window,
                                    rate=job.max_infra_error_rate)
        self._ledger = None
        # Checkpoints beside the output (pipelines/checkpoints.py); none for the one-prompt baseline.
        every = job.checkpoint_every_steps
        self.checkpoints = CheckpointLog(cfg.output, cfg.s3, every, job.checkpoint_every_s) if memagent and every else None
        # A read resumes only on the stack that wrote it (dtype, model and tokenizer files, library versions) and
        # with the settings it was read with, each a part of the key so that a changed one is named.
        self.decode_parts = {**fingerprint.decode_parts(cfg.engine, inner), **fingerprint.settings_parts(cfg)} \
            if self.checkpoints else {}

    async def _report(self) -> None:
        """Send the gate's counts to the run's ledger (awaited: the driver reads it after the last call)."""
        if not self.ledger_name:
            return
        try:
            if self._ledger is None:
                self._ledger = ray.get_actor(self.ledger_name)
            await self._ledger.report.remote(self.key, {**self.gate.snapshot(), **self.meter.lag_snapshot(),
                                                        **self.meter.spec_snapshot()})
        except (ray.exceptions.RayError, ValueError) as exc:
            # Occupancy figures are bookkeeping: a call that fails here (this actor's node going down,
            # the ledger unreachable) must not fail the rows of a call that read them.
            log.warning("actor %s: could not report occupancy (%s)", self.key, type(exc).__name__)
            self._ledger = None

    async def _checkpoint_args(self, row: dict) -> dict:
        """answer_row's checkpoint arguments for ``row``: its checkpointed state, if any, and a writer."""
        row_id, fp = row.get("id"), row.get(fingerprint.COLUMN)
        if self.checkpoints is None or not isinstance(row_id, str) or not isinstance(fp, str):
            return {}
        key = fingerprint.checkpoint_key(fp, self.decode_parts)
        return await asyncio.to_thread(self.checkpoints.resume_args, row_id, key)

    async def __call__(self, batch: pa.Table) -> pa.Table:
        cfg = self.cfg
        self.meter.start()

        async def one(row: dict) -> dict:
            # Counting a long document's tokens is CPU work: off the loop the documents in flight share. The
            # count is the read's own chunking, handed on: a long document is tokenized once.
            long, chunked = await asyncio.to_thread(count_document, self.engine.tokenizer, row.get("context"),
                                                    cfg.job.long_document_tokens, cfg.agent.chunk_tokens,
                                                    cfg.agent.max_chunks)
            async with self.gate.slot(long=long):
                record = self.breaker.check(await read_row(self.engine, row, cfg, self._checkpoint_args, chunked))
            if PAGES_COLUMN in row:  # a converted document: each evidence span's pages
                record[EVIDENCE_PAGES_COLUMN] = evidence_pages(record, page_spans(row[PAGES_COLUMN]))
            return record

        try:
            records = list(await asyncio.gather(*(one(r) for r in batch.to_pylist())))
        except Exception as exc:
            if engine_is_dead(exc):  # Ray restarts the actor and retries its calls; checkpoints resume the reads
                log.error("actor %s: the engine died (%s: %s); exiting so that Ray restarts the actor",
                          self.key, type(exc).__name__, exc)
                os._exit(1)
            raise
        for r in records:
            r["node_id"] = self.node_id  # which node read the row (placement checks, debugging)
        self.meter.publish()
        await self._report()
        return pa.Table.from_pylist(records, schema=self.schema)
