"""The lazy part of tests/fault_hook/sitecustomize.py: patch the job's stores as their modules load.

Right after ``memagent.data.io`` executes, ``memagent.data.io.filesystem`` is replaced by a wrapper
returning ``(faulty(fs, injector), path)`` (so ``pipelines.storage`` and ``pipelines.lease``, which bind
it by name with ``from memagent.data.io import filesystem``, get the wrapper); right after
``pipelines.lease`` executes, ``pipelines.lease._store`` is wrapped to return a ``FaultyStore``. The
injector shares its counts with every process of the job in ``<plan dir>/counts.json`` and kills with
SIGKILL: the whole process group when this process leads it (the CLI driver, started in a new session,
takes its local Ray with it, as a lost machine would), else only itself (a Ray actor or write-task
worker: Ray restarts it and retries).

Plan file: ``{"plan": [[site, call, n, fault], ...]}``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

_PLAN_FILE: str | None = None
_INJECTOR: Any = None


def kill(where: str) -> None:
    """Die now, with no handler run: the process group if this process leads it, else this process."""
    try:
        sys.stderr.write(f"fault_hook: SIGKILL at {where} (pid {os.getpid()})\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - dying anyway
        pass
    pid = os.getpid()
    if os.getpgid(0) == pid:
        os.killpg(pid, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)


_CURRENT = threading.local()  # the path of the call being counted (for the trace)


def injector() -> Any:
    global _INJECTOR
    if _INJECTOR is None:
        from memagent_testing.fault_fs import Injector

        raw = json.loads(Path(_PLAN_FILE).read_text())
        plan = {(site, call, int(n)): fault for site, call, n, fault in raw["plan"]}
        _INJECTOR = Injector(plan, _tracing_counts()(str(Path(_PLAN_FILE).parent / "counts.json")), kill)
    return _INJECTOR


def _tracing_counts() -> type:
    """``FileCounts`` that also keeps a trace: ``[site/call, n, path, pid]`` of every call, in count order
    (the tests pick their kill points from the fault-free run's trace, and see which process died)."""
    from memagent_testing.fault_fs import FileCounts

    class TracingCounts(FileCounts):
        def next(self, key: str) -> int:
            def bump(state: dict) -> int:
                n = state["counts"].get(key, 0)
                state["counts"][key] = n + 1
                state.setdefault("trace", []).append([key, n, getattr(_CURRENT, "path", None), os.getpid()])
                return n
            return self._update(bump)

    return TracingCounts


def _faulty(fs: Any) -> Any:
    import pyarrow.fs as pafs

    return pafs.PyFileSystem(_tracing_handler()(fs, injector()))


_HANDLER: Any = None


def _tracing_handler() -> type:
    global _HANDLER
    if _HANDLER is None:
        from memagent_testing.fault_fs import FaultHandler

        class TracingHandler(FaultHandler):
            def _do(self, path: str, call: str, run: Any) -> Any:
                _CURRENT.path = path
                return super()._do(path, call, run)

            def open_output_stream(self, path: str, metadata: Any) -> Any:
                _CURRENT.path = path
                return super().open_output_stream(path, metadata)

            def __reduce__(self) -> Any:  # unpickled in a Ray worker: over that process's own injector
                return (_rebuild_handler, (self.inner,))

        _HANDLER = TracingHandler
    return _HANDLER


def _rebuild_handler(inner: Any) -> Any:
    return _tracing_handler()(inner, injector())


def _patch_io(module: Any) -> None:
    real = module.filesystem
    if getattr(real, "_fault_hook", False):
        return

    def filesystem(uri: str, s3: Any = None) -> tuple[Any, str]:
        fs, path = real(uri, s3)
        return _faulty(fs), path

    filesystem._fault_hook = True  # type: ignore[attr-defined]
    filesystem.__wrapped__ = real  # type: ignore[attr-defined]
    module.filesystem = filesystem


def _patch_lease(module: Any) -> None:
    real = module._store
    if getattr(real, "_fault_hook", False):
        return

    def _store(output: str, s3: Any) -> Any:
        from memagent_testing.fault_fs import FaultyStore

        class TracedStore(FaultyStore):
            def read(self) -> Any:
                _CURRENT.path = "_memagent.lease"
                return super().read()

            def put(self, data: bytes, expect: str | None, force: bool = False) -> str | None:
                _CURRENT.path = "_memagent.lease"
                return super().put(data, expect, force)

            def delete(self, expect: str) -> bool:
                _CURRENT.path = "_memagent.lease"
                return super().delete(expect)

        return TracedStore(real(output, s3), injector())

    _store._fault_hook = True  # type: ignore[attr-defined]
    module._store = _store


PATCHES = {"memagent.data.io": _patch_io, "pipelines.lease": _patch_lease}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, patch: Any):
        self.inner, self.patch = inner, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        self.patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package ... of the real loader
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, PATCHES[name])
                return spec
        return None


def install(plan_file: str) -> None:
    global _PLAN_FILE
    _PLAN_FILE = plan_file
    for name, patch in PATCHES.items():  # already imported (not at startup; kept for completeness)
        if name in sys.modules:
            patch(sys.modules[name])
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
