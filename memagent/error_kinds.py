"""Two kinds of failure, because a caller acts on them differently.

- **Row errors** (``input:``, ``agent:``, ``answer:``, ``invalid_output:``): the row itself
  cannot be read — bad input, a prompt the endpoint rejects as too long, a reply that is not
  JSON when JSON was asked, an extraction reply that does not match its schema. Retrying gives
  the same answer: the error row is written and is done for good.
- **Infrastructure errors** (``infra:``): the machinery failed, not the row — the endpoint
  unreachable or answering 429/5xx after its retries, a bad key (401/403), an unknown model or
  path (404), an engine that died. The row is written with the ``infra:`` prefix, which a
  resume does not count as done: a plain rerun removes it and reads the row again. A batch job
  stops early once they dominate (:class:`InfraBreaker`).

The kind travels as the prefix of the ``error`` column, so every output written before this
existed keeps its meaning (its ``agent:`` rows are row errors).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Literal

from memagent.engines.base import EndpointError

ErrorKind = Literal["row", "infra"]

INFRA_PREFIX = "infra: "
# An extraction reply that does not parse as, or validate against, the schema (memagent.extraction).
INVALID_OUTPUT_PREFIX = "invalid_output: "

# HTTP statuses that say nothing about the row: every row would get them.
_INFRA_STATUSES = {401, 403, 404, 407, 408, 409, 425, 429}
# Exceptions of an engine that died, by class name: vLLM, torch and Ray need not be imported.
_INFRA_CLASSES = {"EngineDeadError", "EngineGenerateError", "OutOfMemoryError", "AcceleratorError",
                  "RayActorError", "ActorDiedError", "NodeDiedError", "WorkerCrashedError"}


def error_kind(exc: BaseException) -> ErrorKind:
    """Whether ``exc`` (raised while reading one row) is the row's fault or the infrastructure's."""
    if isinstance(exc, EndpointError):
        status = exc.status
        if status is None or status >= 500 or status in _INFRA_STATUSES or 200 <= status < 300:
            return "infra"  # unreachable / timed out / 5xx after retries; auth; malformed replies
        return "row"  # 400, 413, 422: this request (this row's prompt) was refused
    if isinstance(exc, (ConnectionError, TimeoutError, MemoryError)):
        return "infra"
    if any(cls.__name__ in _INFRA_CLASSES for cls in type(exc).__mro__):
        return "infra"
    if isinstance(exc, RuntimeError) and ("VLLMEngine is shut down" in str(exc) or "CUDA error" in str(exc)):
        return "infra"
    return "row"


def error_prefix(exc: BaseException) -> str:
    """The ``error`` column's prefix for an exception a row raised: ``infra`` or ``agent``."""
    return "infra" if error_kind(exc) == "infra" else "agent"


# An engine that raised one of these cannot read another row: its process must go (a Ray actor is
# restarted by Ray and its calls retried; chain checkpoints make long documents resume).
_DEAD_CLASSES = {"EngineDeadError", "AcceleratorError"}


def engine_is_dead(exc: BaseException) -> bool:
    """Whether ``exc`` says the engine itself is gone (not the row, not a passing endpoint failure)."""
    if any(cls.__name__ in _DEAD_CLASSES for cls in type(exc).__mro__):
        return True
    return isinstance(exc, RuntimeError) and ("VLLMEngine is shut down" in str(exc) or "CUDA error" in str(exc))


def is_infra_error(message: str | None) -> bool:
    """Whether an ``error`` column value is an infrastructure error (redone by a rerun)."""
    return bool(message) and message.startswith(INFRA_PREFIX)


class InfrastructureFailure(OSError):
    """A job stopped because infrastructure errors dominated (one line; a rerun resumes)."""


@dataclass
class InfraBreaker:
    """Trips when infrastructure errors dominate the rows just finished.

    ``consecutive``: this many infrastructure errors in a row trip it (0: off). ``window`` and
    ``rate``: at least ``rate`` of the last ``window`` finished rows were infrastructure errors
    (rate 1.0 with a window of 0: off). A row error or a success resets the consecutive count.
    """

    consecutive: int = 5
    window: int = 50
    rate: float = 0.5
    _run: int = 0
    _recent: collections.deque = field(default_factory=collections.deque)
    last_error: str | None = None
    infra_errors: int = 0
    tripped: bool = False

    def record(self, error: str | None) -> str | None:
        """Count one finished row (its ``error`` value); returns why the breaker tripped, or None."""
        infra = is_infra_error(error)
        if infra:
            self._run += 1
            self.infra_errors += 1
            self.last_error = error[len(INFRA_PREFIX):] if error else None
        else:
            self._run = 0
        if self.window > 0:
            self._recent.append(infra)
            while len(self._recent) > self.window:
                self._recent.popleft()
        if self.consecutive > 0 and self._run >= self.consecutive:
            return f"{self._run} infrastructure errors in a row"
        if self.window > 0 and len(self._recent) >= self.window and sum(self._recent) >= self.rate * self.window:
            return f"{sum(self._recent)} of the last {self.window} rows failed on the infrastructure"
        return None

    def message(self, reason: str) -> str:
        return (f"stopped early: {reason} (last: {self.last_error}). Rows already written are kept; fix the cause "
                "and run the same command again: it resumes and redoes the failed rows")

    def check(self, record: dict) -> dict:
        """Count a finished row's record and return it; raises :class:`InfrastructureFailure` when it trips.

        It raises once: that one failure stops the job, and rows still in flight return normally
        (an error raised by each would be logged by Ray as an unhandled error, traceback and all).
        """
        reason = self.record(record.get("error"))
        if reason and not self.tripped:
            self.tripped = True
            raise InfrastructureFailure(self.message(reason))
        return record
