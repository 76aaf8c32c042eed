"""Real kills of a real batch job (issue 43, item 1): SIGKILL at the job's write sites, then plain reruns.

Every process of ``memagent batch`` (the CLI driver, the local Ray it starts, its actors and write-task
workers) runs with tests/fault_hook on its ``PYTHONPATH``: with ``FAULT_PLAN_FILE`` set, the job's stores
go through memagent_testing/fault_fs.py's injector, whose kill is a SIGKILL (the driver, started in a new session,
takes its process group, so its local Ray, with it; an actor or a write-task worker dies alone and Ray
restarts it and retries). The engine is the real OpenAI engine over HTTP to a perfect ledger reader in
this process (memagent_testing/oracle), whose memory updates also carry ``chain <sha256(prompt)[:8]>``: a trace mixed
from two chains differs from the fault-free one; the server counts memory updates (chunks read).

Invariant, after the faulty run and at most 3 reruns without faults: every input id is in the output
exactly once with no error, each row's trace (steps, memory) equals the fault-free run's, the records
dataset holds exactly the fault-free records once, and the chunks read again because of a fault are at
most one checkpoint interval per injected fault.

The kill points are picked from the fault-free run's own trace (tests/fault_hook records every store
call: its site, count, path and process), so they land mid-job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memagent_testing.oracle.ledger import SCHEMA, LedgerSpec, ledger
from memagent_testing.oracle.records_oracle import ChainTaggingOracle, LedgerOracle
from memagent_testing.oracle.servers import oracle_app
from tests.pipeline_helpers import read_output, write_rows
from tests.reliability_helpers import free_port, serving

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
HOOK = REPO / "tests" / "fault_hook"
EVERY = 2  # --checkpoint-every-steps: the most chunks one kill may cost
RUN_TIMEOUT_S = 180
BOOKKEEPING = ("seconds", "draft_tokens", "accepted_tokens", "cached_prompt_tokens")  # the engine's, not the read


@dataclass
class Job:
    """One output directory and the commands that fill it."""

    tmp: Path
    url: str
    model: Path
    s3: dict | None = None  # {"endpoint", "env", "output": "s3://...", "options": S3Options}
    served: tuple | None = None
    pids: list[int] = field(default_factory=list)

    @property
    def output(self) -> str:
        return self.s3["output"] if self.s3 else str(self.tmp / "out")

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "memagent_cli", "batch", "--input", str(self.tmp / "in"), "--output", self.output,
               "--engine", "openai", "--endpoint", self.url, "--model", str(self.model), "--served-model", "oracle",
               "--schema", str(self.tmp / "schema.json"), "--chunk-tokens", "150", "--memory-tokens", "400",
               "--answer-tokens", "16", "--query-tokens", "400", "--no-progress", "--batch-size", "1",
               "--concurrency", "1", "--max-in-flight", "1", "--checkpoint-every-steps", str(EVERY),
               "--torch-threads", "1"]
        return cmd + (["--s3-endpoint", self.s3["endpoint"]] if self.s3 else [])

    def run(self, plan: list[list] | None) -> subprocess.CompletedProcess:
        """The CLI in a new session; with ``plan``, every process of it under the injector."""
        env = {**os.environ, "PYTHONPATH": f"{HOOK}{os.pathsep}{REPO}", **(self.s3["env"] if self.s3 else {})}
        env.pop("FAULT_PLAN_FILE", None)
        if plan is not None:
            (self.tmp / "fault").mkdir(exist_ok=True)
            (self.tmp / "fault" / "plan.json").write_text(json.dumps({"plan": plan}))
            (self.tmp / "fault" / "counts.json").unlink(missing_ok=True)
            env["FAULT_PLAN_FILE"] = str(self.tmp / "fault" / "plan.json")
        proc = subprocess.Popen(self.command(), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        self.pids.append(proc.pid)
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def counts(self) -> dict:
        from memagent_testing.fault_fs import FileCounts

        return FileCounts(str(self.tmp / "fault" / "counts.json")).read()

    def rows(self) -> list[dict]:
        if self.s3:
            from pipelines import storage

            fs, path = storage.filesystem(self.output, self.s3["options"])
            return read_output(path, filesystem=fs)
        return read_output(self.output)

    def records(self) -> list[tuple]:
        from pipelines.records_output import read_records

        table = read_records(self.output, "payments", self.s3["options"] if self.s3 else None)
        return sorted(tuple(sorted((k, str(v)) for k, v in r.items())) for r in table.to_pylist())


def comparable(row: dict) -> tuple:
    steps = [{k: v for k, v in s.items() if k not in BOOKKEEPING} for s in row["steps"]]
    return row["memory"], row["response"], row["prediction"], steps


DOCS = [ledger(f"doc{i}", LedgerSpec(prose=20, aliases=2, by_role=2, near_misses=2, filler=12), 20 + i)
        for i in range(3)]
IDS = sorted(d.id for d in DOCS)


@pytest.fixture(scope="module")
def served(smollm2_dir):
    from transformers import AutoTokenizer

    reader = ChainTaggingOracle(LedgerOracle(DOCS))
    with serving(oracle_app(reader.reply, AutoTokenizer.from_pretrained(str(smollm2_dir))), free_port()) as url:
        yield reader, url


def new_job(tmp: Path, served, smollm2_dir: Path, s3: dict | None = None) -> Job:
    write_rows(tmp / "in" / "part-0.parquet", [{"id": d.id, "context": d.text} for d in DOCS])
    (tmp / "schema.json").write_text(json.dumps(SCHEMA))
    return Job(tmp, served[1], smollm2_dir, s3, served=served)


@dataclass
class Oracle:
    rows: dict
    records: list
    updates: int
    trace: list  # [site/call, n, path, pid] of every store call of the fault-free run
    driver: int

    def calls(self, key: str, path_has: str = "", driver: bool | None = None) -> list[int]:
        """The counts n of the fault-free run's ``key`` calls (on paths holding ``path_has``; by the driver or not)."""
        return [n for k, n, path, pid in self.trace if k == key and path_has in (path or "")
                and (driver is None or (pid == self.driver) == driver)]


def fault_free(job: Job, served) -> Oracle:
    before = served[0].updates
    done = job.run([])  # the hook on, no fault: the trace of every store call
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["id"]: r for r in job.rows()}
    assert sorted(rows) == IDS and all(r["error"] is None for r in rows.values())
    assert all(r["n_chunks"] >= 5 for r in rows.values())
    records = job.records()
    assert records
    return Oracle(rows, records, served[0].updates - before, job.counts()["trace"], job.pids[-1])


@pytest.fixture(scope="module")
def oracle(served, smollm2_dir, tmp_path_factory) -> Oracle:
    return fault_free(new_job(tmp_path_factory.mktemp("fault-free"), served, smollm2_dir), served)


def served_of(job: Job) -> tuple:
    return job.served


def middle(ns: list[int]) -> int:
    assert ns, "the fault-free run made no such call"
    return ns[len(ns) // 2]


def kill_then_rerun(job: Job, served, oracle: Oracle, plan: list[list], driver_dies: bool | list[bool]) -> dict:
    """Run under ``plan`` (``driver_dies``: whether each fault fires in the driver), rerun without faults until
    every id is done (at most 3 reruns; at least one after a driver died),
    then check the module's invariant; returns what happened (for the report)."""
    before = served[0].updates
    first = job.run(plan)
    injected = job.counts()["injected"]
    assert injected, f"the planned fault did not fire: {plan}\n{first.stderr[-3000:]}"
    assert sorted(i[:4] for i in injected) == sorted(list(p) for p in plan)  # each fired, once
    died = [pid == job.pids[-1] for *_, pid in injected]
    if isinstance(driver_dies, bool):
        driver_dies = [driver_dies] * len(died)
    assert died == driver_dies, (injected, job.pids[-1])
    if any(died):
        assert first.returncode == -9, (first.returncode, first.stderr[-3000:])
    else:  # Ray restarted the actor or retried the write task: the run ended as the fault-free one
        assert first.returncode == 0, first.stderr[-3000:]
    reruns = 0
    # A dead driver leaves its lease: at least one rerun, which must take it over.
    while (any(died) and reruns < 1) or {r["id"] for r in job.rows() if r["error"] is None} != set(IDS):
        assert reruns < 3, f"not every id done after 3 reruns: {[(r['id'], r['error']) for r in job.rows()]}"
        again = job.run(None)
        reruns += 1
        assert again.returncode == 0, again.stderr[-3000:]
        if any(died) and reruns == 1:  # the dead driver's lease names a dead run: taken over, not refused
            assert "taking over a stale lease" in again.stderr, again.stderr[-3000:]
    rows = job.rows()
    assert sorted(r["id"] for r in rows) == IDS, "every input id exactly once"
    for row in rows:
        assert row["error"] is None, row["error"]
        assert comparable(row) == comparable(oracle.rows[row["id"]]), f"{row['id']}: trace differs"
    assert job.records() == oracle.records, "the records dataset is not the fault-free records once"
    if job.s3 is None:  # the last run released its lease
        assert not (Path(job.output) / "_memagent.lease").exists()
    if job.s3 is None:  # and the dataset's files, read whole, hold them once: one export file, nothing else
        files = sorted((Path(job.output) / "_records" / "payments").iterdir())
        assert len(files) == 1 and files[0].name.startswith("records-"), files
        whole = pq.read_table(files[0])
        assert sorted(tuple(sorted((k, str(v)) for k, v in r.items())) for r in whole.to_pylist()) == oracle.records
    reread = served[0].updates - before - oracle.updates
    assert reread <= EVERY * len(injected), f"{reread} chunk(s) read again for {len(injected)} fault(s)"
    what = {"plan": plan, "first_rc": first.returncode, "reruns": reruns, "reread": reread, "driver_died": died}
    print(f"\nkill: {what}")
    return what


@pytest.fixture
def job(tmp_path, served, smollm2_dir) -> Job:
    return new_job(tmp_path, served, smollm2_dir)


# -- the workers' writes: actors' checkpoints, Ray Data's write tasks' output files ------------


def test_actor_killed_before_a_checkpoint_write(job, served, oracle):
    """An actor SIGKILLed as it starts a chain checkpoint's write (the log never landed) is restarted by Ray and
    its rows end once each, as the fault-free run, at most one checkpoint interval read again."""
    n = middle(oracle.calls("checkpoint/open_output_stream", driver=False))
    kill_then_rerun(job, served, oracle, [["checkpoint", "open_output_stream", n, "kill_before"]], driver_dies=False)


def test_an_actor_and_a_write_task_killed_after_their_files_landed(job, served, oracle):
    """In one run, an actor SIGKILLed right after a chain checkpoint landed and a write-task worker SIGKILLed
    right after its output file landed: Ray restarts the one and retries the other, and every id ends once,
    as the fault-free run, at most one checkpoint interval read again per kill."""
    n = middle(oracle.calls("checkpoint/open_output_stream", driver=False))
    m = middle(oracle.calls("output/open_output_stream", path_has=".parquet", driver=False))
    kill_then_rerun(job, served, oracle, [["checkpoint", "open_output_stream", n, "kill_after"],
                                          ["output", "open_output_stream", m, "kill_after"]], driver_dies=False)


# -- the driver --------------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["kill_after", "kill_before"])
def test_driver_killed_in_its_records_export(job, served, oracle, fault):
    """A driver SIGKILLed around the write of the records dataset's file (every row committed) leaves the
    dataset unwritten or written: the rerun (nothing to read) exports it, the fault-free records once."""
    kill_then_rerun(job, served, oracle, [["records", "open_output_stream", 0, fault]], driver_dies=True)


def test_driver_killed_after_creating_the_lease(job, served, oracle):
    """A driver SIGKILLed right after its lease landed leaves a lease naming a dead run: the rerun takes it
    over and reads every document once."""
    kill_then_rerun(job, served, oracle, [["lease", "put", 0, "kill_after"]], driver_dies=True)


def test_driver_killed_before_releasing_the_lease(job, served, oracle):
    """A driver SIGKILLed at its lease release, every row written, leaves a lease the rerun takes over
    without reading anything again."""
    n = middle(oracle.calls("lease/delete", driver=True))
    kill_then_rerun(job, served, oracle, [["lease", "delete", n, "kill_before"]], driver_dies=True)


def test_driver_killed_in_its_checkpoint_sweep(job, served, oracle):
    """A driver SIGKILLed while it sweeps the committed rows' chain checkpoints (the fault-free run's sweep
    deletes directory contents, not files) leaves nothing a rerun reads again or duplicates."""
    n = middle(oracle.calls("checkpoint/delete_dir_contents", driver=True))
    kill_then_rerun(job, served, oracle, [["checkpoint", "delete_dir_contents", n, "kill_before"]], driver_dies=True)


# -- the same kills on S3 (a moto server on loopback) ------------------------------------------


@pytest.fixture(scope="module")
def s3(served, smollm2_dir, tmp_path_factory):
    """A new S3 job per call. Its oracle is the local fault-free run (no fault-free run on S3 of its own: one
    more Ray job): an S3 job's rows and records must be the local run's, and the workers' calls the kill
    points are picked from (chain checkpoint and output file writes) are the same, counted alike, on S3."""
    from infra.local_s3 import CREDENTIALS, s3_server
    from pipelines.storage import S3Options

    old = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)  # this process reads the output back
    try:
        with s3_server(buckets=("lake",)) as endpoint:
            def make() -> Job:
                tmp = tmp_path_factory.mktemp("s3job")
                return new_job(tmp, served, smollm2_dir, {"endpoint": endpoint, "env": dict(CREDENTIALS),
                                                          "output": f"s3://lake/{tmp.name}",
                                                          "options": S3Options(endpoint_url=endpoint)})
            yield make
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def test_s3_an_actor_and_a_write_task_killed_after_their_files_landed(s3, oracle):
    """On S3, in one run, an actor SIGKILLed right after a chain checkpoint landed and a write-task worker
    SIGKILLed right after its output object landed: every id ends once, as the fault-free run, at most one
    checkpoint interval read again per kill."""
    n = middle(oracle.calls("checkpoint/open_output_stream", driver=False))
    m = middle(oracle.calls("output/open_output_stream", path_has=".parquet", driver=False))
    job = s3()
    kill_then_rerun(job, served_of(job), oracle, [["checkpoint", "open_output_stream", n, "kill_after"],
                                                  ["output", "open_output_stream", m, "kill_after"]],
                    driver_dies=False)
