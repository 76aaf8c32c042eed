"""The lease under faults its first tests did not script: a lost response, shared hostnames, skewed clocks."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import time

import pytest

from pipelines import lease


class LostResponse:
    """A lease store whose conditional writes land, but the caller hears a 412 (its response was lost
    and the client's retry found the version already changed: what botocore does on a timeout)."""

    def __init__(self, inner):
        self.inner, self.lose = inner, 0

    def read(self):
        return self.inner.read()

    def put(self, data, expect, force=False):
        version = self.inner.put(data, expect, force)
        if self.lose and version is not None:
            self.lose -= 1
            return None
        return version

    def delete(self, expect):
        return self.inner.delete(expect)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def put_raw(output: str, fields: dict) -> None:
    store = lease._store(output, None)
    now = store.read()
    assert store.put(json.dumps(fields).encode(), expect=now[1] if now else None, force=True)


def holder_fields(**over) -> dict:
    now = time.time()
    return {"run_id": "feed0000000a", "host": "another-host", "pid": 1, "pid_start": None, "started": now - 60,
            "heartbeat": now, "boot_id": None, "pid_ns": None, **over}


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def output(request, tmp_path, monkeypatch):
    """(output uri, S3Options or None) on local disk or a moto server on loopback."""
    if request.param == "local":
        yield str(tmp_path / "out"), None
        return
    from infra.local_s3 import CREDENTIALS, s3_server
    from pipelines.storage import S3Options

    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    with s3_server(buckets=("lake",)) as endpoint:
        yield "s3://lake/out", S3Options(endpoint_url=endpoint)


def test_a_renewal_whose_response_was_lost_keeps_the_lease(output):
    """A renewal that landed but was answered 412 leaves the lease held (not lost) and renewing."""
    output, s3 = output
    held = lease.acquire(output, s3)
    try:
        flaky = LostResponse(held.store)
        held.store, flaky.lose = flaky, 1
        held.renew()
        assert held.lost is None
        beat = held.holder.heartbeat
        held.renew()  # and the next beat lands on the version read back
        assert held.lost is None and held.holder.heartbeat >= beat
        assert json.loads(flaky.read()[0])["run_id"] == held.holder.run_id
    finally:
        held.release()
    assert lease._store(output, s3).read() is None  # released: the version it holds is the stored one


def test_a_create_whose_response_was_lost_takes_the_lease(tmp_path, monkeypatch):
    """A first PUT that landed but was answered 412 gives the lease to its run, not 'in use by' itself."""
    output = str(tmp_path / "out")
    real = lease._store

    def flaky_store(out, s3):
        store = LostResponse(real(out, s3))
        store.lose = 1
        return store

    monkeypatch.setattr(lease, "_store", flaky_store)
    held = lease.acquire(output)
    assert json.loads(held.store.read()[0])["run_id"] == held.holder.run_id
    held.release()


def test_a_live_lease_of_another_pid_namespace_with_this_hostname_is_refused(tmp_path):
    """A holder with this hostname, another PID namespace and a fresh heartbeat is alive, whatever its pid is here."""
    output = str(tmp_path / "out")
    put_raw(output, holder_fields(host=socket.gethostname(), pid=dead_pid(), boot_id="b", pid_ns="4026531836x"))
    with pytest.raises(lease.OutputBusy, match="in use by run feed0000000a"):
        lease.acquire(output)


@pytest.mark.parametrize("ahead_s, taken", [(30.0, False), (86400.0, True)])
def test_a_heartbeat_from_the_future_is_judged_against_the_skew_bound(tmp_path, ahead_s, taken):
    """A heartbeat ahead by less than the skew bound is live; one a day ahead is none: the lease is taken."""
    output = str(tmp_path / "out")
    put_raw(output, holder_fields(heartbeat=time.time() + ahead_s))
    if not taken:
        with pytest.raises(lease.OutputBusy, match=r"last heartbeat in the future by (29|30) s \(clock skew\?\)"):
            lease.acquire(output)
        return
    lease.acquire(output).release()


@pytest.mark.parametrize("ahead_s, said", [(-42.4, "42 s ago"), (0.0, "0 s ago"), (0.3, "0 s ago"),
                                           (0.6, "in the future by 1 s (clock skew?)"),
                                           (3600.0, "in the future by 3600 s (clock skew?)")])
def test_a_heartbeat_age_says_when_it_is_in_the_future(ahead_s, said):
    """A heartbeat stamped ahead of this clock is named as such, never "0 s ago"; a past one by its age."""
    holder = lease.Holder(**holder_fields(heartbeat=1_000_000.0 + ahead_s))
    assert lease.heartbeat_age(holder.heartbeat, 1_000_000.0) == said
    assert holder.describe(now=1_000_000.0).endswith(f"last heartbeat {said})")


def test_this_process_lease_names_its_namespace(tmp_path):
    """A lease written now names the boot and PID namespace its pid belongs to."""
    held = lease.acquire(str(tmp_path / "out"))
    try:
        fields = dataclasses.asdict(held.holder)
        assert fields["boot_id"] == open("/proc/sys/kernel/random/boot_id").read().strip()
        assert fields["pid_ns"] is not None and held.holder.local()
    finally:
        held.release()


def test_a_lease_round_trips_and_no_other_encoding_is_read(tmp_path):
    """A lease reads back as the holder that wrote it; one with a field missing or one too many (not what
    ``encode`` writes) reads as no holder, so the run takes it over as unreadable."""
    output = str(tmp_path / "out")
    held = lease.acquire(output)
    try:
        data, _ = lease._store(output, None).read()
        assert lease.Holder.decode(data) == held.holder
        fields = json.loads(data)
    finally:
        held.release()
    for key in fields:
        assert lease.Holder.decode(json.dumps({k: v for k, v in fields.items() if k != key}).encode()) is None, key
    assert lease.Holder.decode(json.dumps(fields | {"extra": 1}).encode()) is None
    put_raw(output, {k: v for k, v in fields.items() if k not in ("boot_id", "pid_ns")} | {"heartbeat": time.time()})
    taken = lease.acquire(output)
    taken.release()
