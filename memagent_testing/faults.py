"""The batch job in miniature, every store call under memagent_testing/fault_fs.py's injector: checkpoints, the records
dataset, output files and the lease, on local disk or S3 (a moto server on loopback).

:func:`run_job` runs, in one process and without Ray:

- the product's driver, unchanged: :func:`pipelines.driver.run_phases` (the output check, the lease,
  ``plan_input``, ``take_out_redo_rows``, the sweep of done logs, the records export, the sweep of stray
  logs, the summary), in the order ``run_batch_qa`` runs it;
- in place of Ray Data's row phase, a stand-in that calls the product functions Ray's tasks call:
  per row ``CheckpointLog.resume_args`` and ``answer_row`` (what ``AgentWorker`` does per row: the
  row's records are its ``records_payments`` column), then ``lease.check_held`` and the row's Parquet file named as Ray Data names it (a
  retried write task writes the same name), then ``checkpoints.remove_logs`` for the row.

What it does not cover: Ray itself (``AgentWorker``, its admission gate, ``read_parquet``, the
repartition, ``write_parquet`` with ``LeasedFilenames``, the ``Sweeper`` thread, actor restarts); the
stand-in writes one row per file and retries as Ray would. tests/test_faults_kills.py kills the real
processes of a Ray job for those.

A kill (``kill_before``/``kill_after``) in the actor is the actor's death: Ray restarts it and retries
the row; in a write task, Ray retries the write; in the driver, the run ends with the lease left
behind (its pid is one no process has, so the next run sees a dead holder). ``preempt`` ends the run
wherever it lands (the machine died). An ``OSError`` that reaches the driver fails the job (the lease
released, as ``lease.hold`` does). Plain reruns follow until every id is done.

The engine is a perfect ledger reader (memagent_testing/oracle) whose memory also carries a hash of its prompt,
so a trace mixed from two chains cannot pass for one; it counts memory updates (chunks read).
"""

from __future__ import annotations

import asyncio
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator
from unittest import mock

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from memagent.batch import answer_row
from memagent.config import AgentConfig
from memagent.engines import EngineConfig
from memagent.extraction import schema_from
from pipelines import checkpoints, fingerprint, lease, records_output, storage
from pipelines.batch_config import BatchQAConfig
from pipelines.batch_qa import drop_done
from pipelines.driver import run_phases
from pipelines.input_plan import InputPlan
from pipelines.job import JobConfig
from pipelines.storage import S3Options
from memagent_testing.fault_fs import FaultyStore, Injector, Killed, MemoryCounts, Preempted, faulty
from memagent_testing.oracle.ledger import SCHEMA, Ledger, LedgerSpec, ledger
from memagent_testing.oracle.records_oracle import ChainTaggingOracle, LedgerOracle
from memagent_testing.oracle.servers import OracleEngine


AGENT = AgentConfig(chunk_tokens=64, memory_tokens=256, answer_tokens=16, query_tokens=400,
                    extraction=schema_from(SCHEMA))
RETRIES = 3  # Ray's retries of an actor's call or a write task after its process died
_DEAD_PID = 2**30  # above any pid_max: no process has it


def documents(scale: int = 1) -> list[Ledger]:
    """Three ledgers (7, 14 and 8 chunks at ``scale`` 1, about ``scale`` times that): prose with an alias and a
    conflict, a table, bullets and long lines cut by chunk boundaries."""
    k = scale
    return [ledger("doc/a", LedgerSpec(prose=9 * k, aliases=1, by_role=2 * k, conflicts=k, near_misses=k, filler=4 * k), 3),
            ledger("doc/b", LedgerSpec(prose=0, table_rows=30 * k, near_misses=0, filler=2 * k), 4),
            ledger("doc/c", LedgerSpec(prose=4 * k, bullets=10 * k, long_lines=True, filler=3 * k), 5)]


def write_input(directory: Path, docs: list[Ledger]) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [d.id for d in docs], "context": [d.text for d in docs]}),
                   directory / "part-0.parquet")
    return str(directory)


@dataclass
class Outcome:
    rows: dict[str, list[dict]]  # id -> every output row written for it (exactly one expected)
    records: list[dict]  # the committed records, as read_records reads them
    exported: list[dict]  # the records dataset's files read whole, as pandas reads the folder
    leftovers: list[str]  # what the last run left: logs under _progress, the lease, an export behind the rows
    updates: int  # memory updates asked of the engine over all runs
    runs: int
    injected: list[tuple]  # (run, site, call, n, fault)
    calls: dict[tuple[int, str, str], int] = field(default_factory=dict)  # (run, site, call) -> how many


Plan = dict[tuple[int, str, str, int], str]  # (run, site, call, n-th such call in that run) -> fault


@dataclass
class _Job:
    cfg: BatchQAConfig
    engine: OracleEngine
    pid: int = _DEAD_PID

    @contextmanager
    def faults(self, injector: Injector) -> Iterator[None]:
        """Every store the job opens goes through ``injector``; its lease names a pid no process has."""
        real_fs, real_store, real_me = storage.filesystem, lease._store, lease.Holder.me
        self.pid += 1

        def fs(uri: str, s3: S3Options | None = None) -> tuple[Any, str]:
            inner, path = real_fs(uri, s3)
            return faulty(inner, injector), path

        def me() -> lease.Holder:
            return replace(real_me(), pid=self.pid, pid_start=None)

        with ExitStack() as stack:
            stack.enter_context(mock.patch.object(storage, "filesystem", fs))
            stack.enter_context(mock.patch.object(lease, "_store", lambda o, s3: FaultyStore(real_store(o, s3), injector)))
            stack.enter_context(mock.patch.object(lease.Holder, "me", staticmethod(me)))
            stack.enter_context(mock.patch.object(lease, "hold", _hold_until_killed))
            yield

    def run(self) -> None:
        """One run of the job (raises Killed where the driver died, OSError where the job failed): the
        product's phases (:func:`pipelines.driver.run_phases`) with this harness's row phase."""
        run_phases(self.cfg, self._rows, check_budget=False)

    def _rows(self, plan: InputPlan, run_id: str, started: float) -> None:
        """The row phase in one process: read, drop done ids, fingerprint; per row the actor, then the
        write task, then the checkpoint sweep once the row's file landed (the Sweeper's job)."""
        cfg = self.cfg
        in_fs, _ = storage.filesystem(cfg.input, cfg.s3)
        table = storage.read_columns(in_fs, plan.files, ["id", "context"])
        table = drop_done(table, plan.committed_ids)
        table = fingerprint.add_fingerprints(table, question=fingerprint.job_question(cfg),
                                             key=fingerprint.answer_key(cfg))
        write_uuid = uuid.uuid4().hex[:12]
        for index, row in enumerate(table.to_pylist()):
            record = self._actor(row)
            self._write_task(pa.Table.from_pylist([record], schema=plan.output_schema), write_uuid, index, run_id)
            if record["error"] is None:
                checkpoints.remove_logs(cfg.output, cfg.s3, [row["id"]])

    def _actor(self, row: dict) -> dict:
        cfg = self.cfg
        for attempt in range(RETRIES + 1):
            try:  # a restarted actor: a new CheckpointLog
                chains = checkpoints.CheckpointLog(cfg.output, cfg.s3, cfg.job.checkpoint_every_steps, 3600)
                args = chains.resume_args(row["id"], fingerprint.checkpoint_key(row[fingerprint.COLUMN], {}))
                record = asyncio.run(answer_row(self.engine, row, cfg.agent, **args))
                return {**record, "node_id": "local"}
            except Preempted:
                raise
            except Killed:
                if attempt == RETRIES:
                    raise
        raise AssertionError("unreachable")

    def _write_task(self, table: pa.Table, write_uuid: str, index: int, run_id: str) -> None:
        cfg = self.cfg
        out_fs, out_path = storage.filesystem(cfg.output, cfg.s3)
        name = f"{out_path.rstrip('/')}/{write_uuid}_{index:06d}_000000.parquet"  # Ray Data's: a retry, the same
        for attempt in range(RETRIES + 1):
            try:
                lease.check_held(cfg.output, cfg.s3, run_id)
                pq.write_table(table, name, filesystem=out_fs)
                return
            except Preempted:
                raise
            except Killed:
                if attempt == RETRIES:
                    raise


@contextmanager
def _hold_until_killed(output: str, s3: S3Options | None = None, *, force: str | None = None) -> Iterator[lease.Lease]:
    """``lease.hold``, but a killed process runs no ``finally``: its heartbeat stops, its lease stays behind
    (the next run takes it over as stale); on any other exit it is released as ``lease.hold`` releases it."""
    held = lease.acquire(output, s3, force=force)
    try:
        yield held
    except Killed:
        held._stop.set()
        raise
    finally:
        if not held._stop.is_set():
            held.release()
    if held.lost:
        raise lease.LeaseLost(lease.lost_message(output, held.lost))


def config(input_dir: str, output: str, s3: S3Options | None, every_steps: int) -> BatchQAConfig:
    return BatchQAConfig(input=input_dir, output=output, s3=s3 or S3Options(), agent=AGENT,
                         engine=EngineConfig(engine="openai", model="oracle", endpoint="http://127.0.0.1:9/v1"),  # never called
                         job=JobConfig(batch_size=1, progress=False, checkpoint_every_steps=every_steps))


def run_job(docs: list[Ledger], input_dir: str, output: str, s3: S3Options | None, tokenizer: Any, plan: Plan,
            every_steps: int = 2, max_runs: int = 6) -> Outcome:
    """Run the job, then plain reruns until a run ends cleanly with every id done and nothing left behind (or
    ``max_runs``), each run under its part of ``plan``."""
    oracle = ChainTaggingOracle(LedgerOracle(docs))
    job = _Job(config(input_dir, output, s3, every_steps), OracleEngine(oracle.reply, tokenizer))
    injected: list[tuple] = []
    calls: dict[tuple[int, str, str], int] = {}
    runs = 0
    for runs in range(1, max_runs + 1):
        counts = MemoryCounts()
        injector = Injector({(site, call, n): f for (run, site, call, n), f in plan.items() if run == runs}, counts)
        ended = False
        with job.faults(injector):
            try:
                job.run()
                ended = True
            except (Killed, OSError):
                pass  # the run died or failed: what it committed stays, the rest is the rerun's
        injected += [(runs, *i) for i in counts.injected]
        calls.update({(runs, *key.split("/")): n for key, n in counts.counts.items()})
        rows, left = _rows(job.cfg), None
        if ended and len(rows) == len(docs) and all(r["error"] is None for r in rows):
            left = _left_behind(job.cfg)
            if not left[2]:
                break  # a sweep or export a fault cut short (a lease a failed release left) is the next run's
    records, exported, leftovers = left or _left_behind(job.cfg)  # the last run's output, read once
    return Outcome(_by_id(rows), records, exported, leftovers, oracle.updates, runs, injected, calls)


def _left_behind(cfg: BatchQAConfig) -> tuple[list[dict], list[dict], list[str]]:
    """The committed records, the records dataset's files read whole, and the leftovers."""
    records, exported = _records(cfg), _exported(cfg)
    return records, exported, _leftovers(cfg, records, exported)


def _rows(cfg: BatchQAConfig) -> list[dict]:
    fs, path = storage.filesystem(cfg.output, cfg.s3)
    files = [f for f in storage.parquet_files(fs, path) if storage.has_footer(fs, f)]
    return [r for f in files for r in pq.read_table(f, filesystem=fs).to_pylist()]


def _by_id(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["id"], []).append(r)
    return out


RECORD_KEYS = ("id", "record_index", "payer", "date", "amount")


def _records(cfg: BatchQAConfig) -> list[dict]:
    table = records_output.read_records(cfg.output, "payments", cfg.s3)
    return [{k: r[k] for k in RECORD_KEYS} for r in table.to_pylist()] if len(table) else []


def _exported(cfg: BatchQAConfig) -> list[dict]:
    """Every Parquet file in the records dataset's folder, read whole (as ``pd.read_parquet`` reads it)."""
    fs, path = storage.filesystem(cfg.output, cfg.s3)
    folder = records_output.type_dir(f"{path.rstrip('/')}/{records_output.RECORDS_DIR}", "payments")
    rows = [r for file in storage.output_files(fs, folder) for r in pq.read_table(file, filesystem=fs).to_pylist()]
    return sorted(({k: r[k] for k in RECORD_KEYS} for r in rows), key=lambda r: (r["id"], r["record_index"]))


def _leftovers(cfg: BatchQAConfig, records: list[dict], exported: list[dict]) -> list[str]:
    """What a finished output should not hold: checkpoint logs, files in the records folder that are not
    the committed records once (``exported`` is not ``records``, both as the output holds them now), the lease."""
    fs, path = storage.filesystem(cfg.output, cfg.s3)
    root = path.rstrip("/")
    left = [f.path for f in fs.get_file_info(pafs.FileSelector(f"{root}/{checkpoints.PROGRESS_DIR}", recursive=True,
                                                               allow_not_found=True)) if f.type == pafs.FileType.File]
    folder = fs.get_file_info(pafs.FileSelector(f"{root}/{records_output.RECORDS_DIR}", recursive=True,
                                                allow_not_found=True))
    left += [f.path for f in folder if f.type == pafs.FileType.File and f.base_name.startswith(".")]
    if exported != records:
        left.append(f"{root}/{records_output.RECORDS_DIR}: the records dataset is not the committed records once")
    left += [f"{root}/{lease.LEASE_NAME}"] if fs.get_file_info(f"{root}/{lease.LEASE_NAME}").type == pafs.FileType.File \
        else []
    return left


def steps_without_times(record: dict) -> list[dict]:
    keep = ("step", "kind", "chunk_index", "char_start", "char_end", "memory")
    return [{k: (s[k] if isinstance(s, dict) else asdict(s)[k]) for k in keep} for s in record["steps"]]
