"""Two kinds of failure, because a caller acts on them differently.

- **Row errors** (``input:``, ``agent:``, ``answer:``, ``invalid_output:``): the row itself
  cannot be read — bad input, a prompt the endpoint rejects as too long, a reply that is not
  JSON when JSON was asked, an extraction reply that does not match its schema. Retrying gives
  the same answer: the error row is written and is done for good.
- **Infrastructure errors** (``infra:``): the machinery failed, not the row — the endpoint
  unreachable or answering 429/5xx after its retries, a bad key (401/403), an unknown model or
  path (404), an engine that died. The row is written with the ``infra:`` prefix, which a
  resume does not count as done: a plain rerun removes it and reads the row again. A batch job
  stops early once they dominate (the batch job's circuit breaker).

The kind travels as the prefix of the ``error`` column, so every output written before this
existed keeps its meaning (its ``agent:`` rows are row errors).
"""

from __future__ import annotations

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
# restarted by Ray and its calls retried; checkpoints make long documents resume).
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
