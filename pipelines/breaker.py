"""The batch job's circuit breaker: it stops the job once infrastructure errors dominate.

A row error is the row's fault and the job goes on; a run of ``infra:`` rows (an endpoint down,
a bad key, a dead engine) would only fill the output with rows a rerun must redo, so the job
stops with one line (:class:`~memagent.error_kinds.InfrastructureFailure`) and a rerun resumes.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from memagent.error_kinds import INFRA_PREFIX, InfrastructureFailure, is_infra_error


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
