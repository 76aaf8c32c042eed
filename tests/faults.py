"""A fault-injection harness for the batch job's checkpoint storage (local disk or S3 on a moto server).

:class:`FaultyFS` wraps the pyarrow filesystem a :class:`pipelines.checkpoints.ChainLog` writes through
and, at chosen calls, fails the call, loses its response after it landed (the client sees an error,
the store holds the write), kills the reader before or after it (:class:`Killed`: SIGKILL of the actor
or the driver at that point), delays it, or reorders a listing. :func:`run_job` is a batch job in
miniature over the real checkpoint code (``ChainLog.resume_args`` and ``answer_row``, as each actor
calls them): rows are committed once answered (the driver's write), a kill ends the run, and reruns
without faults follow until every id is done. A deterministic engine makes each step's memory a hash
of the memory before it and the chunk, so a trace mixed from two chains cannot pass for one.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow.fs as pafs

from memagent.batch import answer_row
from memagent.config import AgentConfig
from memagent.engines.base import Completion, Engine, EngineStats
from pipelines.checkpoints import ChainLog, remove_logs

FAULTS = ("fail", "lost", "kill_before", "kill_after", "delay", "reorder")
# The calls through which a ChainLog writes (its write sites) and lists.
WRITES = ("create_dir", "open_output_stream", "move", "delete_file", "delete_dir_contents", "delete_dir")
LISTS = ("get_file_info",)
AGENT = AgentConfig(chunk_tokens=32, memory_tokens=8, answer_tokens=6, query_tokens=64, temperature=0.0)


class Killed(BaseException):
    """The process holding the read died here (not an Exception: nothing in the code under test catches it)."""


class HashEngine(Engine):
    """Replies with a hash of the prompt: each memory depends on the memory before it and its chunk."""

    def __init__(self, tokenizer: Any):
        self.name, self.context_window, self.tokenizer, self.stats = "hash", 4096, tokenizer, EngineStats()
        self.updates = 0  # memory updates asked for: chunks read, re-reads included

    async def chat(self, messages: Any, params: Any) -> Completion:
        content = messages[-1]["content"]
        update = "Updated memory" in content
        self.updates += update
        text = hashlib.sha256(content.encode()).hexdigest()[:8] if update else "So the answer is 42."
        return Completion(text=text, prompt_tokens=10, completion_tokens=3, finish_reason="stop")


class _Stream:
    """An output stream whose close lands the object, then reports ``after`` (a lost response, a kill)."""

    def __init__(self, inner: Any, after: BaseException):
        self.inner, self.after = inner, after

    def write(self, data: bytes) -> int:
        return self.inner.write(data)

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.inner.close()
        if exc[0] is None:
            raise self.after


@dataclass
class FaultyFS:
    """A pyarrow filesystem that injects ``plan[(call name, n)]`` at the n-th call (0-based) of that name."""

    inner: Any
    plan: dict[tuple[str, int], str] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    injected: list[tuple[str, int, str]] = field(default_factory=list)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in WRITES + LISTS + ("open_input_stream",):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            n = self.calls.get(name, 0)
            self.calls[name] = n + 1
            fault = self.plan.get((name, n))
            if fault is None or (fault == "reorder") != (name in LISTS):  # a listing is reordered, nothing else
                return attr(*args, **kwargs)
            self.injected.append((name, n, fault))
            return _inject(fault, name, attr, args, kwargs)

        return call


def _inject(fault: str, name: str, attr: Any, args: tuple, kwargs: dict) -> Any:
    if fault == "fail":
        raise OSError(f"injected: {name} failed")
    if fault == "kill_before":
        raise Killed(name)
    if fault == "delay":
        time.sleep(0.002)
        return attr(*args, **kwargs)
    result = attr(*args, **kwargs)
    if fault == "reorder":
        return list(reversed(result)) if isinstance(result, list) else result
    after: BaseException = OSError(f"injected: {name} response lost") if fault == "lost" else Killed(name)
    if name == "open_output_stream":
        return _Stream(result, after)
    raise after


@dataclass
class Outcome:
    committed: dict[str, list[dict]]  # id -> every record committed for it (exactly one expected)
    updates: int  # memory updates asked of the engine over all runs
    runs: int
    injected: list[tuple[str, int, str]]


Plan = dict[tuple[int, str, int], str]  # (run, call name, n-th call of that name in that run) -> fault


def run_job(rows: list[dict], output: str, s3: Any, tokenizer: Any, plan: Plan, every_steps: int = 2,
            max_runs: int = 6, calls: dict[tuple[int, str], int] | None = None) -> Outcome:
    """Run the job, then plain reruns until every id is done (or ``max_runs``), each run with its part
    of ``plan``; ``calls`` counts each run's storage calls by name."""
    engine = HashEngine(tokenizer)
    committed: dict[str, list[dict]] = {}
    injected: list = []
    runs = 0
    for runs in range(1, max_runs + 1):
        todo = [r for r in rows if r["id"] not in committed]
        if not todo:
            break
        chains = ChainLog(output, s3, every_steps=every_steps, every_s=3600)
        mine = {(name, n): f for (run, name, n), f in plan.items() if run == runs}
        counted: dict[str, int] = {}
        chains.fs = fs = FaultyFS(chains.fs, mine, counted)
        try:
            for row in todo:
                args = chains.resume_args(row["id"], "key")
                record = asyncio.run(answer_row(engine, row, AGENT, **args))
                if record["error"] is not None and record["error"].startswith("infra"):
                    continue  # an infra: row is redone by the rerun
                committed.setdefault(row["id"], []).append(record)
        except Killed:
            pass  # the run died: what it committed stays, the rest is the rerun's
        injected += [(runs, *i) for i in fs.injected]
        if calls is not None:
            calls.update({(runs, k): v for k, v in counted.items()})
        remove_logs(output, s3, list(committed))  # the driver's sweep (and the rerun's plan)
    return Outcome(committed, engine.updates, runs, injected)


def steps_without_times(record: dict) -> list[dict]:
    keep = ("step", "kind", "chunk_index", "char_start", "char_end", "memory")
    return [{k: (s[k] if isinstance(s, dict) else asdict(s)[k]) for k in keep} for s in record["steps"]]
