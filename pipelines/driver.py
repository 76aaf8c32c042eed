"""The phases of a batch run, in their order: one function for the product and its fault harness.

    check the output ─► take its lease ─► plan ─► [token budgets] ─► take out redo rows
        ─► sweep the logs of done ids ─► (nothing to do: export the records, summary)
        ─► write the rows ─► export the records ─► sweep stray logs ─► summary

:func:`run_batch_qa <pipelines.batch_qa.run_batch_qa>` calls :func:`run_phases` with Ray Data's row
phase (the actors and the writer); the fault harness (memagent_testing/faults.py) with an in-process one, so the
faults it injects land in this order, not in a copy of it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import pyarrow.compute as pc

from memagent.agent import check_config
from memagent.engines.budget import token_budget
from memagent.result_schema import N_RECORDS_PREFIX
from pipelines import checkpoints, commit_rules, lease, records_output, storage, storage_errors
from pipelines.batch_config import BatchQAConfig
from pipelines.input_plan import InputPlan, plan_input, take_out_redo_rows
from pipelines.summary import EVIDENCE_COLUMNS, RECORD_COUNT_COLUMNS, BatchSummary

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActorSnapshots:
    """What the row phase's actors reported: each actor's last gate and meter snapshot."""

    snapshots: dict[str, dict]
    max_in_flight: int


class RowPhase(Protocol):
    """Answers and writes the rows ``plan`` leaves to do, each output file only while ``run_id`` holds
    the lease; ``started`` is the run's start (``time.perf_counter``), for a stopped job's summary."""

    def __call__(self, plan: InputPlan, run_id: str, started: float) -> ActorSnapshots | None: ...


def run_phases(cfg: BatchQAConfig, write_rows: RowPhase, *, check_budget: bool,
               plan_input: Callable[[BatchQAConfig], InputPlan] = plan_input) -> BatchSummary:
    """Run the phases (module doc) under the output's lease, taken before any row is read or any
    model loads; ``check_budget``: refuse budgets the engine's tokenizer cannot meet, first;
    ``plan_input``: the plan phase (a documents input's: pipelines/documents_plan.py)."""
    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    storage.check_output_location(out_fs, out_path, cfg.output, cfg.s3)  # a bad output named before the lease
    with lease.hold(cfg.output, cfg.s3, force=cfg.force_unlock) as held:
        started = time.perf_counter()
        plan = plan_input(cfg)
        if check_budget:  # budgets from the tokenizer, before any model loads
            check_config(token_budget(cfg.engine), cfg.agent)
        take_out_redo_rows(cfg, plan)
        # Logs of ids done before this run (a driver killed between commit and sweep): never resumed again.
        checkpoints.remove_logs(cfg.output, cfg.s3, plan.committed_ids.to_pylist())
        if plan.total_rows is not None and plan.skipped >= plan.total_rows:  # nothing to read: no Ray, no model
            log.info("all %d ids already in %s; nothing to do", plan.total_rows, cfg.output)
            export_records(cfg)  # what a run killed before its export left to do
            return summarise(cfg, plan, time.perf_counter() - started)
        actors = write_rows(plan, held.holder.run_id, started)
        export_records(cfg)
        remove_stray_logs(cfg)
        summary = summarise(cfg, plan, time.perf_counter() - started)
        if actors is not None:
            summary.add_actor_snapshots(actors.snapshots, actors.max_in_flight)
        return summary


def export_records(cfg: BatchQAConfig) -> None:
    """Each record type's records dataset brought up to the committed rows (pipelines/records_output.py)."""
    schema = cfg.agent.extraction
    if schema is not None and schema.record_types:
        records_output.export_records(cfg.output, cfg.s3, [r.name for r in schema.record_types])


def remove_stray_logs(cfg: BatchQAConfig) -> None:
    """The run ended: only the logs of rows a rerun redoes (``infra:`` errors) stay under ``_progress``."""
    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    try:
        with storage_errors.output_errors(cfg.output, cfg.s3):
            _, retry = commit_rules.committed_and_retry_ids(out_fs, storage.complete_parquet_files(out_fs, out_path))
            checkpoints.remove_stray(cfg.output, cfg.s3, retry.to_pylist())
    except OSError as exc:  # every row is written: a sweep that fails is the next run's, not this run's failure
        log.warning("output %s: checkpoint logs not swept (%s); the next run sweeps them", cfg.output, exc)


def summarise(cfg: BatchQAConfig, plan: InputPlan, seconds: float) -> BatchSummary:
    """Read back the small columns of this run's output rows and count them."""
    out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
    has_answers = "answers" in plan.output_schema.names
    counts = [c for c in plan.output_schema.names
              if c.startswith(N_RECORDS_PREFIX) or c in RECORD_COUNT_COLUMNS.values() or c in EVIDENCE_COLUMNS]
    with storage_errors.output_errors(cfg.output, cfg.s3):
        table = storage.read_columns(out_fs, storage.complete_parquet_files(out_fs, out_path),
                                     ["id", "error", "score", "context_tokens", "resumed_at_chunk",
                                      "checkpoint_ignored", *(["answers"] if has_answers else []), *counts])
    if len(plan.committed_ids):
        table = table.filter(pc.invert(pc.is_in(table.column("id"), value_set=plan.committed_ids)))
    rows_in = plan.total_rows if plan.total_rows is not None else plan.skipped + table.num_rows
    return BatchSummary.from_rows(table, rows_in=rows_in, skipped=plan.skipped, seconds=seconds,
                                  output=cfg.output, require_grounding=cfg.agent.require_grounding)
