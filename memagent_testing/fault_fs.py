"""One fault injector for every store the batch job writes through: pyarrow filesystems and the lease store.

:class:`FaultHandler` is a ``pyarrow.fs.FileSystemHandler`` over a real filesystem (local disk, or S3 on
a moto server): ``pyarrow.fs.PyFileSystem(FaultHandler(...))`` is a real pyarrow filesystem, so Parquet
writers, Ray Data's write tasks and the checkpoint and records code all write through it unchanged (it
pickles, so it travels to Ray workers). :class:`FaultyStore` wraps the lease's compare-and-swap store.

Every call is counted by ``(site, call)``, the site being what the path belongs to (:func:`site_of`:
``checkpoint`` under ``_progress``, ``records`` under ``_records``, ``lease``, else ``output``); a plan
maps ``(site, call, n)`` (the n-th such call, 0-based) to a fault:

- ``fail``: the call raises ``OSError`` and does nothing;
- ``lost``: the call lands, then raises (a response lost after the write; a lease ``put`` answers
  412, as botocore's retry of a landed conditional write does);
- ``kill_before`` / ``kill_after``: the process dies before the call, or after it landed;
- ``delay``: the call waits, then runs; ``reorder``: a listing comes back reversed.

How a process dies is the caller's ``kill``: in process, an exception nothing catches (:class:`Killed`);
in a real job, SIGKILL (tests/fault_hook). Counts live in memory or, for many processes, in a file.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.fs as pafs

FAULTS = ("fail", "lost", "kill_before", "kill_after", "delay", "reorder")  # and, in process, "preempt"
SITES = ("checkpoint", "records", "output", "lease")
WRITES = ("create_dir", "open_output_stream", "move", "delete_file", "delete_dir_contents", "delete_dir", "copy_file",
          "put", "delete")
LISTS = ("get_file_info_selector",)

Plan = dict[tuple[str, str, int], str]  # (site, call, n-th such call) -> fault


class Killed(BaseException):
    """The process died here (not an Exception: nothing in the code under test catches it)."""


class Preempted(Killed):
    """The machine died here, the driver with it (``preempt``: a fault of the in-process harness only)."""


def site_of(path: str) -> str:
    """Which store a path belongs to: the chain checkpoints, the records files, the lease, or the output."""
    parts = path.replace("\\", "/").split("/")
    if "_progress" in parts:
        return "checkpoint"
    if "_records" in parts:
        return "records"
    if parts and parts[-1].startswith("_memagent.lease"):
        return "lease"
    return "output"


def applies(fault: str, call: str) -> bool:
    """Whether ``fault`` means something at ``call`` (a read cannot be lost; only a listing is reordered)."""
    if fault == "reorder":
        return call in LISTS
    if fault in ("lost", "kill_after"):
        return call in WRITES
    return True


class MemoryCounts:
    """Call counts of one process (the in-process harness)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.injected: list[tuple[str, str, int, str]] = []

    def next(self, key: str) -> int:
        n = self.counts.get(key, 0)
        self.counts[key] = n + 1
        return n

    def note(self, site: str, call: str, n: int, fault: str) -> None:
        self.injected.append((site, call, n, fault))


class FileCounts:
    """Call counts shared by every process of a job (driver, actors, write tasks): a JSON file under flock."""

    def __init__(self, path: str):
        self.path = path

    def _update(self, change: Callable[[dict], Any]) -> Any:
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, 1 << 24, 0)
            state = json.loads(raw) if raw.strip() else {"counts": {}, "injected": []}
            out = change(state)
            data = json.dumps(state).encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)  # a SIGKILL right after must not lose the count (the retried call would be hit again)
            return out
        finally:
            os.close(fd)

    def next(self, key: str) -> int:
        def bump(state: dict) -> int:
            n = state["counts"].get(key, 0)
            state["counts"][key] = n + 1
            return n
        return self._update(bump)

    def note(self, site: str, call: str, n: int, fault: str) -> None:
        self._update(lambda state: state["injected"].append([site, call, n, fault, os.getpid()]))

    def read(self) -> dict:
        return json.loads(Path(self.path).read_text()) if Path(self.path).exists() else {"counts": {}, "injected": []}


def raise_killed(where: str) -> None:
    raise Killed(where)


@dataclass
class Injector:
    """Counts each call and applies the plan's fault, if any, around it."""

    plan: Plan
    counts: Any = field(default_factory=MemoryCounts)  # MemoryCounts or FileCounts
    kill: Callable[[str], None] = raise_killed
    delay_s: float = 0.002

    def call(self, site: str, call: str, run: Callable[[], Any], lost: Callable[[Any], Any] | None = None,
             deferred: Callable[[Any, Callable[[], Any]], Any] | None = None) -> Any:
        """``run()`` under the planned fault. A landed call whose response is lost returns ``lost(result)``
        (default: raises ``OSError``); ``deferred(result, after)`` makes a call land later (a stream, when
        it closes), ``after`` then being the fault."""
        n = self.counts.next(f"{site}/{call}")
        fault = self.plan.get((site, call, n))
        if fault is None or not applies(fault, call):
            return run()
        self.counts.note(site, call, n, fault)
        where = f"{site} {call} #{n}"
        if fault == "fail":
            raise OSError(f"injected: {where} failed")
        if fault == "kill_before":
            self.kill(where)
        if fault == "preempt":
            raise Preempted(where)
        if fault == "delay":
            time.sleep(self.delay_s)
        result = run()
        if fault == "reorder":
            return list(reversed(result))
        if fault not in ("lost", "kill_after"):
            return result

        def after() -> Any:
            if fault == "kill_after":
                self.kill(where)
            if lost is not None:
                return lost(result)
            raise OSError(f"injected: {where} landed, its response was lost")
        return deferred(result, after) if deferred is not None else after()


class _LandThen:
    """An output stream whose close lands the file, then applies the fault (a lost response, a kill)."""

    def __init__(self, inner: pa.NativeFile, after: Callable[[], None]):
        self.inner, self.after, self.closed = inner, after, False

    def write(self, data: Any) -> int:
        return self.inner.write(data)

    def flush(self) -> None:
        self.inner.flush()

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.inner.tell()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.inner.close()
            self.after()


class FaultHandler(pafs.FileSystemHandler):
    """A pyarrow filesystem handler over ``inner`` that injects ``injector``'s faults (module docstring)."""

    def __init__(self, inner: pafs.FileSystem, injector: Injector):
        self.inner, self.injector = inner, injector

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FaultHandler) and self.inner.equals(other.inner)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def _do(self, path: str, call: str, run: Callable[[], Any]) -> Any:
        return self.injector.call(site_of(path), call, run)

    def get_type_name(self) -> str:
        return self.inner.type_name

    def normalize_path(self, path: str) -> str:
        return self.inner.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self._do(paths[0] if paths else "", "get_file_info", lambda: self.inner.get_file_info(paths))

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self._do(selector.base_dir, "get_file_info_selector", lambda: self.inner.get_file_info(selector))

    def create_dir(self, path: str, recursive: bool) -> None:
        self._do(path, "create_dir", lambda: self.inner.create_dir(path, recursive=recursive))

    def delete_dir(self, path: str) -> None:
        self._do(path, "delete_dir", lambda: self.inner.delete_dir(path))

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self._do(path, "delete_dir_contents", lambda: self.inner.delete_dir_contents(path, missing_dir_ok=missing_dir_ok))

    def delete_root_dir_contents(self) -> None:
        self.inner.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        self._do(path, "delete_file", lambda: self.inner.delete_file(path))

    def move(self, src: str, dest: str) -> None:
        self._do(dest, "move", lambda: self.inner.move(src, dest))

    def copy_file(self, src: str, dest: str) -> None:
        self._do(dest, "copy_file", lambda: self.inner.copy_file(src, dest))

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self._do(path, "open_input_stream", lambda: self.inner.open_input_stream(path))

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self._do(path, "open_input_file", lambda: self.inner.open_input_file(path))

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        # The write lands when the stream closes: a lost response or a kill after it happens there.
        return self.injector.call(site_of(path), "open_output_stream",
                                  lambda: self.inner.open_output_stream(path, metadata=metadata),
                                  deferred=lambda stream, after: pa.PythonFile(_LandThen(stream, after), mode="w"))

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return self.inner.open_append_stream(path, metadata=metadata)


def faulty(fs: pafs.FileSystem, injector: Injector) -> pafs.FileSystem:
    """``fs`` with ``injector``'s faults: a real pyarrow filesystem."""
    return pafs.PyFileSystem(FaultHandler(fs, injector))


class FaultyStore:
    """The lease's compare-and-swap store (``read``/``put``/``delete``) under ``injector``'s faults."""

    def __init__(self, inner: Any, injector: Injector):
        self.inner, self.injector = inner, injector

    def read(self) -> Any:
        return self.injector.call("lease", "read", self.inner.read)

    def put(self, data: bytes, expect: str | None, force: bool = False) -> str | None:
        # A landed conditional write whose response was lost: botocore retries it, and the retry gets 412.
        return self.injector.call("lease", "put", lambda: self.inner.put(data, expect, force), lost=lambda _: None)

    def delete(self, expect: str) -> bool:
        return self.injector.call("lease", "delete", lambda: self.inner.delete(expect))
