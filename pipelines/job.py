"""Where and how wide a Ray Data job runs: the one job configuration of batch QA and evaluation.

The command line (``memagent batch|demo|eval``), the jobs (``BatchQAConfig.job``,
``EvalConfig.job``) and the flows (their ``job`` parameter) all take this model, so each
default below is written once.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class JobConfig(BaseModel):
    """Actors, batching, resources and timeouts of one Ray Data job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int = Field(1, gt=0, description="Actors, each holding one engine.")
    batch_size: int = Field(16, gt=0, description="Rows per batch handed to an actor.")
    max_in_flight: int | None = Field(
        None, gt=0, description="Documents each actor keeps reading at once; the next row starts as soon as one "
        "finishes, across batches (default: the engine's: hf its max_batch_size (16), vllm 256, openai its "
        "max_concurrency).")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per actor (0 on CPU: a GPU request on a CPU cluster hangs).")
    num_cpus: float = Field(1.0, gt=0, description="CPUs reserved per actor.")
    torch_threads: int | None = Field(
        None, gt=0, description="Torch threads per actor (default: node cores / concurrency; 1 when other jobs "
        "share the cores).")
    resources: dict[str, float] = Field(
        default_factory=dict, description="Custom Ray resource per actor, e.g. gpu_worker=1 to pin node groups "
        "(repeatable)", json_schema_extra={"flag": "resource"})
    ray_address: str | None = Field(None, description="Ray cluster address (default: a local Ray on 127.0.0.1).")
    no_progress_timeout_s: float = Field(
        6 * 3600, description="Fail after this long without a finished batch: model loads and long documents on a "
        "CPU are slow (-1: never).", json_schema_extra={"flag": "no-progress-timeout"})
    progress: bool = Field(True, description="Show Ray Data progress bars (off for CI logs).")
    # Circuit breaker (issue 18): infrastructure errors (endpoint down, 5xx/429 after retries, bad
    # key, engine died) are written as retryable `infra:` rows; once they dominate, the job stops.
    max_consecutive_infra_errors: int = Field(
        5, ge=0, description="Stop the job after this many infrastructure errors in a row on one actor (endpoint "
        "down, 5xx after retries, engine died; 0: never). A rerun redoes those rows.",
        json_schema_extra={"flag": "max-consecutive-infra-errors"})
    infra_error_window: int = Field(
        50, ge=0, description="Rows per actor over which the infrastructure error rate is measured (0: no rate "
        "check).")
    max_infra_error_rate: float = Field(
        0.5, gt=0, le=1, description="Stop the job when at least this fraction of the last --infra-error-window "
        "rows of an actor failed on the infrastructure.")
