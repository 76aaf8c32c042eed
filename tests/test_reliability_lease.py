"""One writer per output, and an output holding an id twice is refused and repaired.

As reported: two identical ``memagent batch`` runs started together both exited 0 with every id
written twice, and a rerun said there was nothing to do. Now a run takes the output's lease
(``pipelines/lease.py``; a conditional create on local disk and on S3) before any model loads,
a second run refuses naming the holder, and the plan step refuses an output that already holds
duplicate ids, naming the ``memagent repair-output`` command that keeps one row per id.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest

from pipelines import lease
from pipelines.batch_qa import BatchQAConfig, plan_input
from pipelines.job import JobConfig
from tests.pipeline_helpers import FAST_AGENT, good_rows, interruptible, read_output, write_rows


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path, monkeypatch):
    """(output uri, S3Options or None, reader of the lease object's bytes) on local disk or a moto server."""
    if request.param == "local":
        yield str(tmp_path / "out"), None, lambda: (tmp_path / "out" / lease.LEASE_NAME).read_bytes()
        return
    import pyarrow.fs as pafs

    from infra.local_s3 import CREDENTIALS, s3_server
    from pipelines.storage import S3Options

    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    with s3_server(buckets=("lake",)) as endpoint:
        fs = pafs.S3FileSystem(endpoint_override=endpoint.split("://")[1], scheme="http", region="us-east-1")

        def read() -> bytes:
            with fs.open_input_stream(f"lake/out/{lease.LEASE_NAME}") as f:
                return f.read()

        yield "s3://lake/out", S3Options(endpoint_url=endpoint), read


def put_raw(output, s3, holder: lease.Holder) -> None:
    store = lease._store(output, s3)
    now = store.read()
    assert store.put(holder.encode(), expect=now[1] if now else None)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_second_run_refused_naming_the_holder_then_free_after_release(where):
    output, s3, read = where
    first = lease.acquire(output, s3)
    held = json.loads(read())
    assert held["host"] == socket.gethostname() and held["pid"] == os.getpid() and held["run_id"]
    assert held["boot_id"] and held["pid_ns"]  # where this pid means something
    with pytest.raises(lease.OutputBusy) as err:
        lease.acquire(output, s3)
    msg = str(err.value)
    assert msg.startswith(f"output {output} is in use by run {held['run_id']} (host {socket.gethostname()}, "
                          f"pid {os.getpid()}, started ") and "--force-unlock" in msg and "\n" not in msg
    first.release()
    with pytest.raises((FileNotFoundError, OSError)):
        read()
    with lease.hold(output, s3):
        pass


def test_released_on_error(where):
    output, s3, read = where
    with pytest.raises(RuntimeError, match="boom"):
        with lease.hold(output, s3):
            raise RuntimeError("boom")
    lease.acquire(output, s3).release()  # free again


def test_stale_leases_taken_over_live_ones_refused(where, monkeypatch):
    output, s3, read = where
    now = time.time()
    gone = lease.Holder("deadbeef0001", socket.gethostname(), dead_pid(), None, now, now, *lease._namespace())
    put_raw(output, s3, gone)  # this host, process gone: stale at once
    taken = lease.acquire(output, s3)
    assert json.loads(read())["run_id"] == taken.holder.run_id
    taken.release()
    quiet = lease.Holder("feed00000002", "another-host", 1, None, now - 3600, now - lease.STALE_AFTER_S - 5,
                         None, None)
    put_raw(output, s3, quiet)  # another host, no heartbeat for too long
    lease.acquire(output, s3).release()
    alive = lease.Holder("feed00000003", "another-host", 1, None, now - 3600, now - 5, None, None)
    put_raw(output, s3, alive)
    with pytest.raises(lease.OutputBusy, match="in use by run feed00000003 \\(host another-host, pid 1.*if it is "
                       "gone, rerun with --force-unlock feed00000003$"):
        lease.acquire(output, s3)
    with pytest.raises(lease.OutputBusy, match="--force-unlock feed0000000x does not name that run: if it is gone, "
                       "rerun with --force-unlock feed00000003$"):
        lease.acquire(output, s3, force="feed0000000x")
    assert json.loads(read())["run_id"] == "feed00000003"
    forced = lease.acquire(output, s3, force="feed00000003")  # --force-unlock with the holder's run id
    assert json.loads(read())["run_id"] == forced.holder.run_id
    forced.release()


def test_force_unlock_never_takes_the_lease_of_a_run_alive_on_this_host(where):
    """As reported: forcing the lock while its holder ran on the same host let two runs write every id twice."""
    output, s3, read = where
    holder = lease.acquire(output, s3)  # alive: this very process
    for force in (None, holder.holder.run_id, "somethingelse"):
        with pytest.raises(lease.OutputBusy) as err:
            lease.acquire(output, s3, force=force)
        msg = str(err.value)
        assert msg.startswith(f"output {output} is in use by run {holder.holder.run_id}") and "\n" not in msg
        assert msg.endswith(f"which is running on this host; wait for it to finish or stop it (kill {os.getpid()}): "
                            "--force-unlock never takes the lease of a live run")
    assert json.loads(read())["run_id"] == holder.holder.run_id
    holder.release()


def test_two_takers_of_a_stale_lease_one_wins(where):
    output, s3, _ = where
    now = time.time()
    put_raw(output, s3, lease.Holder("deadbeef0004", socket.gethostname(), dead_pid(), None, now, now,
                                     *lease._namespace()))
    results: list = []
    barrier = threading.Barrier(4)

    def take():
        barrier.wait()
        try:
            results.append(lease.acquire(output, s3))
        except lease.OutputBusy as exc:
            results.append(exc)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [r for r in results if isinstance(r, lease.Lease)]
    assert len(won) == 1, results
    won[0].release()


def test_heartbeat_renews_and_a_lost_lease_is_reported(where, monkeypatch):
    output, s3, read = where
    monkeypatch.setattr(lease, "HEARTBEAT_S", 0.2)
    with pytest.raises(lease.OutputBusy, match="lease was taken over by run .*repair-output --output"):
        with lease.hold(output, s3) as held:
            first = json.loads(read())["heartbeat"]
            deadline = time.monotonic() + 60
            while json.loads(read())["heartbeat"] == first:
                assert time.monotonic() < deadline, "no heartbeat"
                time.sleep(0.1)
            now = time.time()
            taker = lease.Holder("feed00000005", "another-host", 1, None, now, now, None, None)
            lease._store(output, s3).put(taker.encode(), expect=None, force=True)  # taken from another host
            other = lease.acquire(output, s3, force="feed00000005")
            held.renew()
            assert held.lost and other.holder.run_id in held.lost
    other.release()


def test_ctrl_c_releases_the_lease(where):
    output, s3, read = where
    code = ("import sys, time; from pipelines import lease; from pipelines.storage import S3Options\n"
            f"s3 = S3Options(endpoint_url={s3.endpoint_url if s3 else None!r}) if {s3 is not None} else None\n"
            f"with lease.hold({output!r}, s3):\n    print('held', flush=True); time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=interruptible)
    assert proc.stdout.readline().strip() == "held", proc.stderr.read()
    assert json.loads(read())["pid"] == proc.pid
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    with pytest.raises(OSError):
        read()


# -- duplicates already in the output ----------------------------------------------------------


def job(tmp_path) -> BatchQAConfig:
    return BatchQAConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out"), agent=FAST_AGENT,
                         job=JobConfig(batch_size=2, progress=False))


def test_output_with_duplicate_ids_refused_then_repaired(tmp_path, capsys):
    from memagent_cli.main import main

    rows = good_rows(4)
    write_rows(tmp_path / "in" / "a.parquet", rows)
    cfg = job(tmp_path)
    schema = plan_input(cfg).output_schema
    out_schema = pa.schema([f for f in schema if f.name in ("id", "question", "context", "prediction", "error")])

    def written(name, entries, mtime):
        path = write_rows(tmp_path / "out" / name, [{**rows[int(i[-1])], "prediction": p, "error": e}
                                                     for i, p, e in entries], schema=out_schema)
        os.utime(path, (mtime, mtime))

    written("old.parquet", [("doc-000", "old-ok", None), ("doc-001", "old-ok", None), ("doc-003", "only", None)],
            1_000_000)
    written("new.parquet", [("doc-000", None, "infra: EndpointError: down"), ("doc-001", "new-ok", None),
                            ("doc-002", "only", None)], 2_000_000)
    with pytest.raises(ValueError) as err:
        plan_input(cfg)
    msg = str(err.value)
    assert msg.startswith(f"output {tmp_path / 'out'} holds duplicate ids, e.g. doc-000, doc-001")
    assert msg.endswith(f"repair it with: memagent repair-output --output {tmp_path / 'out'}")
    assert main(["repair-output", "--output", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "2 duplicated id(s), e.g. doc-000, doc-001: kept one row each, removed 2 row(s) from 2 file(s)" in printed
    out = {r["id"]: r for r in read_output(tmp_path / "out")}
    assert len(read_output(tmp_path / "out")) == 4
    assert out["doc-000"]["prediction"] == "old-ok"  # a complete row over a newer error row
    assert out["doc-001"]["prediction"] == "new-ok"  # then the newest file
    assert out["doc-002"]["prediction"] == out["doc-003"]["prediction"] == "only"
    assert plan_input(cfg).skipped == 4
    assert main(["repair-output", "--output", str(tmp_path / "out")]) == 0
    assert "no duplicate ids; nothing to repair" in capsys.readouterr().out


# -- two real runs racing on one output --------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    """One Ray cluster both runs join (`--ray-address`), as two runs of one scheduler would."""
    import ray

    from infra.local_s3 import CREDENTIALS
    from infra.ray_cluster import ENV, local_cluster

    saved = dict(os.environ)
    os.environ.update({**CREDENTIALS, **ENV})  # the cluster's workers write to the moto server
    if ray.is_initialized():
        ray.shutdown()
    try:
        with local_cluster(workers=0, head_cpus=4) as address:
            yield address
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _race(cmd: list[str], env: dict) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as pool:  # read both as they run: Ray's logs would fill a pipe and stall one
        outs = list(pool.map(lambda p: p.communicate(timeout=900), procs))
    return [subprocess.CompletedProcess(cmd, p.returncode, *out) for p, out in zip(procs, outs)]


def _check_race(results: list[subprocess.CompletedProcess], output: str) -> None:
    # Started together, one takes the lease and runs for a while: the other refuses (without
    # the lease both exited 0 and every id was written twice).
    assert sorted(r.returncode for r in results) == [0, 2], [r.stderr[-2000:] for r in results]
    for r in results:
        busy = r.returncode == 2 and f"error: output {output} is in use by run " in r.stderr
        assert r.returncode == 0 or busy, r.stderr[-3000:]
        if busy:
            assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr  # one line, before any model


@pytest.mark.slow
@pytest.mark.parametrize("store", ["local", "s3"])
def test_two_runs_racing_on_one_output_write_every_id_once(store, cluster, tiny_llama_dir, tmp_path, monkeypatch):
    from infra.local_s3 import CREDENTIALS

    rows = good_rows(8)
    write_rows(tmp_path / "in" / "a.parquet", rows)
    args = ["--model", str(tiny_llama_dir), "--chunk-tokens", "64", "--memory-tokens", "8", "--answer-tokens", "6",
            "--batch-size", "2", "--no-progress", "--torch-threads", "1", "--input", str(tmp_path / "in"),
            "--ray-address", cluster]
    cmd = [sys.executable, "-m", "memagent_cli", "batch", *args]
    env = {**os.environ, **CREDENTIALS, "PYTHONUNBUFFERED": "1"}
    if store == "local":
        results = _race(cmd + ["--output", str(tmp_path / "out")], env)
        _check_race(results, str(tmp_path / "out"))
        written = read_output(tmp_path / "out")
    else:
        import pyarrow.fs as pafs

        from infra.local_s3 import s3_server

        for k, v in CREDENTIALS.items():
            monkeypatch.setenv(k, v)
        with s3_server(buckets=("lake",)) as endpoint:
            results = _race(cmd + ["--output", "s3://lake/out", "--s3-endpoint", endpoint], env)
            _check_race(results, "s3://lake/out")
            fs = pafs.S3FileSystem(endpoint_override=endpoint.split("://")[1], scheme="http", region="us-east-1")
            written = read_output("lake/out", filesystem=fs)
    assert sorted(r["id"] for r in written) == [r["id"] for r in rows]  # every id exactly once


@pytest.mark.parametrize("edit", [
    {"pid": "1234"}, {"heartbeat": "yesterday"}, {"pid": 10**30}, {"started": 1e300}, {"pid_start": 7},
    {"host": None}, {"pid": True},
])
def test_a_hand_edited_lease_is_taken_over_never_a_traceback(tmp_path, edit):
    """A lease file is data anything may have touched: a field of the wrong type or range makes
    it a lease of nobody (taken over with a warning), not a TypeError or OverflowError."""
    now = time.time()
    mine = lease.Holder("feed00000009", socket.gethostname(), os.getpid(), None, now, now, *lease._namespace())
    fields = {**dataclasses.asdict(mine), **edit}
    out = tmp_path / "out"
    out.mkdir()
    (out / lease.LEASE_NAME).write_text(json.dumps(fields))
    assert lease.Holder.decode((out / lease.LEASE_NAME).read_bytes()) is None
    taken = lease.acquire(str(out))
    assert json.loads((out / lease.LEASE_NAME).read_text())["run_id"] == taken.holder.run_id
    taken.release()
