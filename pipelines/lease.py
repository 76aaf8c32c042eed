"""One writer per output: a lease object in the output directory, taken before any model loads.

Two runs writing into one output would each skip only what was there when they started, and
both write every other id: duplicates that a rerun keeps. So a run first creates
``OUTPUT/_memagent.lease`` *conditionally* (only if absent) and holds it to the end:

- local disk: the lease file is created, replaced and deleted only under an exclusive ``flock``
  of ``_memagent.lease.lock`` held for microseconds (the kernel drops it if the process dies),
  so each change is a compare-and-swap on the lease's bytes;
- S3: ``PutObject`` with ``If-None-Match: *`` creates it, ``If-Match: <etag>`` renews or takes it
  over. AWS S3 honours both (since Aug / Nov 2024), as do MinIO and moto's server (5.1+); a
  server that ignores them would let two runs in, which :func:`check_output` then refuses.

The lease holds the run id, host, pid (and the pid's start time, against reuse), the start time
and a heartbeat renewed every :data:`HEARTBEAT_S`. A second run refuses with one line naming
the holder. A lease is stale, and taken over (conditionally: of two takers one wins), when its
holder is gone: same host, boot and PID namespace and that process is not running, or, from
anywhere else, no heartbeat for :data:`STALE_AFTER_S` (or one stamped further in the future than
:data:`MAX_CLOCK_SKEW_S`). A renewal answered 412 reads the lease back: if it names this run, its
own write landed (a retried request) and the lease is kept. Guarantees and assumptions: docs/batch.md.
``force`` (``--force-unlock RUN_ID``) takes a lease that still looks alive only from another host
(or PID namespace) and only when it names the holder's run id (the manual case: a host known to be
dead, 5 minutes too long to wait); a holder alive on this host is never forced, since two live runs
writing one output duplicate rows. Release deletes it on any exit of the ``with`` block,
error and Ctrl-C included; a killed process leaves it, and the next run takes it over.

The writer checks the lease itself before each output file (:func:`check_held`, read from the
store, not from this process's heartbeat): a run whose lease was taken stops writing at its next
file, not at the end of the job.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

from memagent.data.io import S3Options, filesystem, is_s3

log = logging.getLogger(__name__)

LEASE_NAME = "_memagent.lease"  # "_": never read as input or as output rows
HEARTBEAT_S = 30.0
STALE_AFTER_S = 300.0  # a lease of another PID namespace without a heartbeat this long is taken over
# Assumption: hosts' clocks agree within this (NTP keeps them within milliseconds). A heartbeat further
# in the future than this is not one a live holder with a sane clock wrote: the lease is taken as stale.
MAX_CLOCK_SKEW_S = 60.0
_MAX_TIME = 2.0**36  # a timestamp past year 4000 is not one (time.gmtime overflows further on)
FORCE_UNLOCK_HELP = ("The run id of a run on another host that still seems to hold the output's lease (as the "
                     "'in use by run ...' error names it): take its lease anyway, only when that run is known to be "
                     "gone (its host died); a run alive on this host is never forced. Two runs writing one output "
                     "duplicate rows.")


class OutputBusy(OSError):
    """Another run holds the output's lease (the CLI prints it as one line, exit 2)."""

    _memagent_checked = True  # already one line naming the output (storage_errors.io_errors passes it on)


class LeaseLost(OutputBusy):
    """This run's lease was taken by another run while it wrote: it stops writing."""


@dataclass(frozen=True)
class Holder:
    run_id: str
    host: str
    pid: int
    pid_start: str | None  # the process's start time (Linux /proc), so a reused pid is not taken for it
    started: float
    heartbeat: float
    # Where ``pid`` means something: the kernel's boot id and the PID namespace (its inode), None where
    # /proc does not say. Two containers with one hostname (``--network host``) differ in the namespace.
    boot_id: str | None
    pid_ns: str | None

    @classmethod
    def me(cls) -> Holder:
        now = time.time()
        return cls(uuid.uuid4().hex[:12], socket.gethostname(), os.getpid(), _pid_start(os.getpid()), now, now,
                   *_namespace())

    def local(self) -> bool:
        """Whether ``pid`` names a process this one can see: same host, boot and PID namespace."""
        return self.host == socket.gethostname() and (self.boot_id, self.pid_ns) == _namespace()

    def describe(self, now: float | None = None) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        return (f"run {self.run_id} (host {self.host}, pid {self.pid}, started {started}, "
                f"last heartbeat {heartbeat_age(self.heartbeat, time.time() if now is None else now)})")

    def stale(self, now: float | None = None) -> bool:
        """Whether the holder is gone (see the module doc)."""
        if self.local():
            return not _alive(self.pid, self.pid_start)
        age = (now or time.time()) - self.heartbeat
        return age > STALE_AFTER_S or age < -MAX_CLOCK_SKEW_S  # silent, or stamped past the skew bound

    def encode(self) -> bytes:
        """The lease's bytes: every field, as JSON (the one encoding :meth:`decode` reads)."""
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> Holder | None:
        """The holder a lease file names, or None for torn, foreign or hand-edited content (a
        holder that is gone): every field is checked, since anything may have touched the file; a
        field missing or one too many is not a lease :meth:`encode` wrote."""
        try:
            holder = cls(**json.loads(data))
        except (ValueError, TypeError, RecursionError, AttributeError):
            return None
        ok = (isinstance(holder.run_id, str) and isinstance(holder.host, str)
              and type(holder.pid) is int and 0 < holder.pid < 2**31
              and all(v is None or isinstance(v, str) for v in (holder.pid_start, holder.boot_id, holder.pid_ns))
              and all(type(t) in (int, float) and 0 <= t < _MAX_TIME for t in (holder.started, holder.heartbeat)))
        return holder if ok else None


def heartbeat_age(heartbeat: float, now: float) -> str:
    """How long ago ``heartbeat`` was, in words; one stamped a second or more past ``now`` says so (the
    holder's clock runs ahead of this one's), never "0 s ago"."""
    ahead = heartbeat - now
    if round(ahead) >= 1:
        return f"in the future by {ahead:.0f} s (clock skew?)"
    return f"{max(0.0, -ahead):.0f} s ago"


@functools.lru_cache(maxsize=1)
def _namespace() -> tuple[str | None, str | None]:
    """This process's (boot id, PID namespace inode); None where /proc does not say (not Linux)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = None
    try:
        ns = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        ns = None
    return boot, ns


def _pid_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: alive
    return start is None or _pid_start(pid) in (None, start)


class _LocalStore:
    """Compare-and-swap on a local file: every change under a short exclusive flock."""

    def __init__(self, directory: str):
        self.path = Path(directory) / LEASE_NAME
        self.lock = Path(directory) / (LEASE_NAME + ".lock")

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.lock, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def read(self) -> tuple[bytes, str] | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return data, hashlib.sha256(data).hexdigest()

    def put(self, data: bytes, expect: str | None, force: bool = False) -> str | None:
        """Write ``data`` if the lease is absent (``expect`` None) or still has version ``expect``."""
        with self._locked():
            now = self.read()
            if not force and (now[1] if now else None) != expect:
                return None
            tmp = self.path.with_name(f"{LEASE_NAME}.{uuid.uuid4().hex[:8]}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, self.path)
        return hashlib.sha256(data).hexdigest()

    def delete(self, expect: str) -> bool:
        with self._locked():
            now = self.read()
            if now is None or now[1] != expect:
                return False
            self.path.unlink()
        return True


class _S3Store:
    """Conditional writes on S3: ``If-None-Match: *`` to create, ``If-Match: etag`` to replace."""

    def __init__(self, path: str, s3: S3Options | None):
        s3 = s3 or S3Options()
        self.bucket, _, prefix = path.partition("/")
        self.key = f"{prefix.rstrip('/')}/{LEASE_NAME}" if prefix.strip("/") else LEASE_NAME
        region = s3.region_name()
        # botocore's DEBUG records print the signed request, session token included: a --verbose
        # job must not log them (raise the level to INFO, never lower it: a quiet job stays quiet).
        botocore_log = logging.getLogger("botocore")
        if botocore_log.getEffectiveLevel() < logging.INFO:
            botocore_log.setLevel(logging.INFO)
        self.client = _s3_client(s3.endpoint(), region)

    def _conflict(self, exc: Exception) -> bool:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        return code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409", "NoSuchKey", "404")

    def read(self) -> tuple[bytes, str] | None:
        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=self.key)
        except self.client.exceptions.NoSuchKey:
            return None
        return obj["Body"].read(), obj["ETag"]

    def put(self, data: bytes, expect: str | None, force: bool = False) -> str | None:
        from botocore.exceptions import ClientError

        cond = {} if force else {"IfMatch": expect} if expect else {"IfNoneMatch": "*"}
        try:
            return self.client.put_object(Bucket=self.bucket, Key=self.key, Body=data, **cond)["ETag"]
        except ClientError as exc:
            if self._conflict(exc):
                return None
            raise

    def delete(self, expect: str) -> bool:
        now = self.read()  # DeleteObject's If-Match is not honoured everywhere: check, then delete
        if now is None or now[1] != expect:
            return False
        self.client.delete_object(Bucket=self.bucket, Key=self.key)
        return True


@functools.lru_cache(maxsize=8)
def _s3_client(endpoint: str | None, region: str):  # noqa: ANN202 - botocore's generated class
    """One client per endpoint (loading botocore's S3 model takes a second); clients are thread-safe."""
    import botocore.session

    return botocore.session.get_session().create_client("s3", endpoint_url=endpoint, region_name=region)


def _store(output: str, s3: S3Options | None) -> _LocalStore | _S3Store:
    _, path = filesystem(output, s3)
    if is_s3(output):
        return _S3Store(path, s3)
    Path(path).mkdir(parents=True, exist_ok=True)
    return _LocalStore(path)


class Lease:
    """A held lease; renewed by a daemon thread until :meth:`release`."""

    def __init__(self, output: str, store: _LocalStore | _S3Store, holder: Holder, version: str):
        self.output, self.store, self.holder, self.version = output, store, holder, version
        self.lost: str | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._beat, name="memagent-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.renew()

    def renew(self) -> None:
        with self._lock:
            if self.lost or self._stop.is_set():
                return
            beat = Holder(**{**asdict(self.holder), "heartbeat": time.time()})
            try:
                version = self.store.put(beat.encode(), expect=self.version)
            except Exception as exc:  # noqa: BLE001 - a missed beat is not fatal; STALE_AFTER_S is 10 beats
                log.warning("output %s: could not renew the lease (%s)", self.output, exc)
                return
            if version is None:  # a 412: taken over, or our own write whose response was lost and retried
                try:
                    now = self.store.read()
                except Exception as exc:  # noqa: BLE001 - proves nothing either way: the next beat reads again
                    log.warning("output %s: could not read the lease back (%s)", self.output, exc)
                    return
                other = Holder.decode(now[0]) if now else None
                if other is not None and other.run_id == self.holder.run_id:
                    self.holder, self.version = other, now[1]  # still ours: our write landed
                    return
                self.lost = other.describe() if other else "nobody (the lease was removed)"
                log.error("output %s: this run's lease was taken over by %s", self.output, self.lost)
            else:
                self.holder, self.version = beat, version

    def release(self) -> None:
        with self._lock:
            self._stop.set()
            if not self.lost:
                try:
                    self.store.delete(self.version)
                except Exception as exc:  # noqa: BLE001 - a lease left behind is taken over as stale
                    log.warning("output %s: could not release the lease (%s)", self.output, exc)


def acquire(output: str, s3: S3Options | None = None, *, force: str | None = None) -> Lease:
    """Take the output's lease, or raise :class:`OutputBusy` naming the holder; a failure to
    write it (full disk, S3 error) is one line naming the output. ``force``: the run id of a
    holder on another host to take the lease from although it looks alive."""
    from botocore.exceptions import BotoCoreError, ClientError

    from pipelines.storage_errors import output_errors

    with output_errors(output, s3):
        try:
            return _acquire(output, s3, force)
        except (BotoCoreError, ClientError) as exc:
            raise OSError(f"cannot take the output's lease {LEASE_NAME} ({exc})") from None


def _refusal(output: str, other: Holder, force: str | None) -> str | None:
    """Why a lease that looks alive is not taken (None: ``force`` names its holder on another host)."""
    busy = f"output {output} is in use by {other.describe()}"
    if other.local():  # alive here (else it would be stale): forcing would duplicate rows
        return (f"{busy}, which is running on this host; wait for it to finish or stop it (kill {other.pid}): "
                "--force-unlock never takes the lease of a live run")
    if force == other.run_id:
        return None
    if force:
        return (f"{busy}; --force-unlock {force} does not name that run: if it is gone, rerun with "
                f"--force-unlock {other.run_id}")
    return f"{busy}; wait for it to finish, or, if it is gone, rerun with --force-unlock {other.run_id}"


def _acquire(output: str, s3: S3Options | None, force: str | None) -> Lease:
    store = _store(output, s3)
    me = Holder.me()
    for _ in range(5):  # a few rounds: the lease may change between our read and our write
        now = store.read()
        if now is None:
            version = store.put(me.encode(), expect=None)
        else:
            other = Holder.decode(now[0])
            if other is not None and other.run_id == me.run_id:  # our create landed; its retry got the 412
                return Lease(output, store, me, now[1])
            live = other is not None and not other.stale()
            refused = _refusal(output, other, force) if live else None
            if refused:
                raise OutputBusy(refused)
            what = "forcing the" if live else "taking over a stale"
            log.warning("output %s: %s lease of %s", output, what, other.describe() if other else "an unreadable lease")
            version = store.put(me.encode(), expect=now[1])
        # Read back: a store whose conditional write is not atomic (moto checks, then writes)
        # can let two creators through; the one whose write landed last keeps the lease.
        if version is not None and (store.read() or (b"", ""))[1] == version:
            return Lease(output, store, me, version)
    raise OutputBusy(f"output {output}: its lease keeps changing hands; another run is starting on it")


@contextmanager
def hold(output: str, s3: S3Options | None = None, *, force: str | None = None) -> Iterator[Lease]:
    """``with hold(output): ...`` — the lease for the block; released on any exit (error, Ctrl-C)."""
    lease = acquire(output, s3, force=force)
    try:
        yield lease
    finally:
        lease.release()
    if lease.lost:
        raise LeaseLost(lost_message(output, lease.lost))


def lost_message(output: str, holder: str) -> str:
    return (f"output {output}: while this run wrote, its lease was taken over by {holder}; this run stopped "
            f"writing; check for duplicate ids with: memagent repair-output --output {output}")


def check_held(output: str, s3: S3Options | None, run_id: str) -> None:
    """Raise :class:`LeaseLost` unless the output's lease (read from the store now) is ``run_id``'s.

    Called by the writer before each output file, wherever it runs (a Ray worker): one small read.
    """
    try:
        now = _store(output, s3).read()
    except Exception as exc:  # noqa: BLE001 - a failed read proves nothing: the write goes on, as before the check
        log.warning("output %s: could not read the lease before writing (%s)", output, exc)
        return
    holder = Holder.decode(now[0]) if now else None
    if holder is None or holder.run_id != run_id:
        raise LeaseLost(lost_message(output, holder.describe() if holder else "nobody (the lease was removed)"))
