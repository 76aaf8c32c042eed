"""Continuous admission: keep up to ``max_in_flight`` documents reading in each actor.

The memory agent reads a document strictly in sequence, so a batch that waits for its longest
document leaves the engine running fewer and fewer sequences. Instead each actor takes many
small Ray Data calls at once (``ActorPoolStrategy(max_concurrent_calls_per_actor=...)``; Ray Data
queues twice that many calls at the actor) and every row passes one actor-wide gate of
``max_in_flight`` slots: the moment a document finishes, the next waiting row starts, whichever
call it came in. A call returns its own rows, and only those, as soon as they are done, so
blocks stay small and a retried call (dead actor) or a rerun (resume by ``id``) redoes exactly
the rows that were not written.

One source of truth for the default: :func:`default_max_in_flight`.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator

from memagent.engines import EngineConfig
from pipelines.job import JobConfig

if TYPE_CHECKING:
    from memagent.chunking import ChunkedDocument

# hf on CPU: 16 documents at once is what benchmarks/concurrency.py measured (16 documents
# through one engine of max_batch_size 16: 2.58x the sequential rate, 0.80 of this CPU's bound);
# more only queue behind the engine's batch.
HF_CPU_MAX_IN_FLIGHT = 16
# Rows per Ray Data call under continuous admission: one, so a row leaves the actor the moment it
# is done (a call returns once all its rows are).
ROWS_PER_CALL = 1
# vLLM: continuous batching holds hundreds of sequences (max_num_seqs default 256); documents
# beyond its running set wait in vLLM's own queue, ready the moment a sequence ends.
VLLM_MAX_IN_FLIGHT = 256


def default_max_in_flight(engine: EngineConfig) -> int:
    """Documents one actor keeps reading at once when the job does not say."""
    if engine.engine == "openai":
        return engine.max_concurrency  # the client's own cap on requests in flight
    if engine.engine == "vllm":
        return max(VLLM_MAX_IN_FLIGHT, engine.max_batch_size)
    # hf: as many as one forward batches (max_batch_size, 16 by default = HF_CPU_MAX_IN_FLIGHT).
    return engine.max_batch_size


def resolve_max_in_flight(max_in_flight: int | None, engine: EngineConfig) -> int:
    """``JobConfig.max_in_flight``, or the engine's default when it is None."""
    return max_in_flight if max_in_flight is not None else default_max_in_flight(engine)


def count_document(tokenizer: object, context: object, min_tokens: int | None, chunk_tokens: int,
                   max_chunks: int | None = None) -> tuple[bool, ChunkedDocument | None]:
    """Whether ``context`` has at least ``min_tokens`` tokens (a long document reserves its actor's gate), and
    the document chunked as the read chunks it when it was counted (the read takes it: one tokenisation).

    Counting costs a tokenisation (the worker runs it off its loop): only texts of ``min_tokens``
    characters or more are counted (a token spans at least one character in the scripts BPE
    vocabularies cover well). A text the tokenizer fails on is not counted: its read fails the same
    way, as its own row's error.
    """
    if min_tokens is None or not isinstance(context, str) or len(context) < min_tokens:
        return False, None
    from memagent.chunking import chunk_document

    try:
        doc = chunk_document(tokenizer, context, chunk_tokens, max_chunks)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - the read raises it again, inside the row's error handling
        return False, None
    return doc.context_tokens >= min_tokens, doc


@dataclass(frozen=True)
class AdmissionPlan:
    """How rows reach an actor: rows per Ray Data call, calls per actor at once, documents in flight.

    ``max_in_flight`` is enforced by the actor's gate; ``calls_per_actor`` only has to be large
    enough that a row is always waiting at the gate when a slot frees.
    """

    max_in_flight: int
    rows_per_call: int = 1
    calls_per_actor: int = 0  # 0: derive (max_in_flight / rows_per_call, so the gate is always fed)
    # Calls Ray Data may queue at an actor beyond those running (its default is as many again):
    # a few hide the dispatch latency; many strand rows behind one actor's long documents at the
    # end of the job while the other actors idle. None: a quarter of the running calls, at least 1.
    queued_per_actor: int | None = None

    def __post_init__(self) -> None:
        if self.max_in_flight < 1 or self.rows_per_call < 1 or self.calls_per_actor < 0:
            raise ValueError(f"bad admission plan {self}")

    @property
    def calls(self) -> int:
        return self.calls_per_actor or max(1, -(-self.max_in_flight // self.rows_per_call))

    @property
    def tasks_in_flight(self) -> int:
        """``ActorPoolStrategy(max_tasks_in_flight_per_actor=...)``: running plus queued calls."""
        queued = self.queued_per_actor if self.queued_per_actor is not None else max(1, self.calls // 4)
        return self.calls + queued

    @classmethod
    def for_job(cls, job: JobConfig, engine: EngineConfig) -> AdmissionPlan:
        """``job.admission``'s plan: continuous (one row per call) or a barrier (one call of
        ``max_in_flight`` rows per actor, all read together)."""
        docs = resolve_max_in_flight(job.max_in_flight, engine)
        if job.admission == "barrier":
            return cls(max_in_flight=docs, rows_per_call=docs, calls_per_actor=1, queued_per_actor=1)
        return cls(max_in_flight=docs, rows_per_call=ROWS_PER_CALL)


@dataclass
class Gate:
    """An actor-wide limit of ``limit`` documents in flight, with the time integral of the count.

    ``reserve_limit``: while a *long* document (``slot(long=True)``) reads, new documents are
    admitted only while fewer than this many are reading, so that the engine's steps, which carry
    every running sequence's prefill, stay short and the long document's read (one conversation after
    another) runs near its speed alone (benchmarks/README.md "Long documents"). None: no reservation.

    Used from one event loop (the actor's): Ray Data runs every concurrent call of an async
    callable class on the same loop.
    """

    limit: int
    reserve_limit: int | None = None
    in_flight: int = 0
    long_in_flight: int = 0
    peak: int = 0
    admitted: int = 0
    done: int = 0
    first_start: float | None = None  # wall clock (time.time) of the first admission
    last_change: float | None = None
    last_done: float | None = None
    integral: float = 0.0  # document-seconds in flight
    _cond: asyncio.Condition | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.limit < 1 or (self.reserve_limit is not None and not 1 <= self.reserve_limit <= self.limit):
            raise ValueError(f"gate limit {self.limit}, reserve_limit {self.reserve_limit}: need "
                             "1 <= reserve_limit <= limit")

    @property
    def current_limit(self) -> int:
        """The limit now: ``reserve_limit`` while a long document reads, else ``limit``."""
        return self.reserve_limit if self.long_in_flight and self.reserve_limit is not None else self.limit

    def _tick(self, now: float) -> None:
        if self.last_change is not None:
            self.integral += self.in_flight * (now - self.last_change)
        self.last_change = now

    @asynccontextmanager
    async def slot(self, long: bool = False) -> AsyncIterator[None]:
        if self._cond is None:
            self._cond = asyncio.Condition()
        async with self._cond:
            await self._cond.wait_for(lambda: self.in_flight < self.current_limit)
            now = time.time()
            self._tick(now)
            if self.first_start is None:
                self.first_start = now
            self.in_flight += 1
            self.long_in_flight += long
            self.admitted += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            yield
        finally:
            async with self._cond:
                now = time.time()
                self._tick(now)
                self.in_flight -= 1
                self.long_in_flight -= long
                self.done += 1
                self.last_done = now
                self._cond.notify_all()

    def snapshot(self) -> dict:
        now = time.time()
        integral = self.integral + (self.in_flight * (now - self.last_change) if self.last_change else 0.0)
        return {"limit": self.limit, "reserve_limit": self.reserve_limit, "in_flight": self.in_flight,
                "peak": self.peak, "admitted": self.admitted, "done": self.done, "first_start": self.first_start,
                "last_done": self.last_done, "integral": integral, "at": now}


def occupancy(snapshots: dict[str, dict], window: tuple[float, float] | None = None) -> tuple[float | None, dict[str, float]]:
    """Mean in-flight / max_in_flight: overall (over the job's window) and per actor (over its own).

    ``snapshots`` maps an actor key (``actor_id:pid``) to its last :meth:`Gate.snapshot`. The overall figure spreads
    every actor's document-seconds over the whole window (first admission to last finish, or
    ``window``), so an actor idle at the end counts as empty.
    """
    live = {k: s for k, s in snapshots.items() if s.get("first_start") is not None}
    if not live:
        return None, {}
    per: dict[str, float] = {}
    for key, s in live.items():
        span = (s["last_done"] or s["at"]) - s["first_start"]
        per[key] = s["integral"] / (s["limit"] * span) if span > 0 else 0.0
    t0 = min(s["first_start"] for s in live.values()) if window is None else window[0]
    t1 = max((s["last_done"] or s["at"]) for s in live.values()) if window is None else window[1]
    # A restarted actor reports under a new key (same actor id, new pid): count its slots once.
    limits = {k.split(":")[0]: s["limit"] for k, s in live.items()}
    capacity = sum(limits.values()) * (t1 - t0)
    return (sum(s["integral"] for s in live.values()) / capacity if capacity > 0 else 0.0), per


class OccupancyLedger:
    """A small Ray actor (named per run) the workers report their gate to; the driver reads it at the end."""

    def __init__(self) -> None:
        self.snapshots: dict[str, dict] = {}

    def report(self, key: str, snapshot: dict) -> None:
        self.snapshots[key] = snapshot

    def read(self) -> dict[str, dict]:
        return self.snapshots
