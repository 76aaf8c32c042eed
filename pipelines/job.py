"""Where and how wide a Ray Data job runs: the one job configuration of batch QA and evaluation.

The command line (``memagent batch|demo|eval``), the jobs (``BatchQAConfig.job``,
``EvalConfig.job``) and the flows (their ``job`` parameter) all take this model, so each
default below is written once.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


def ray_init_address(explicit: str | None) -> str | None:
    """The address ``ray.init`` is given: ``explicit`` when set; else ``RAY_ADDRESS`` when set (``ray job
    submit``: None lets Ray read it); else "local", a fresh local Ray, not whatever cluster ``ray start``
    left in /tmp/ray/ray_current_cluster (``ray.init()`` without an address would join that one)."""
    return explicit or (None if os.environ.get("RAY_ADDRESS") else "local")


class JobConfig(BaseModel):
    """Actors, batching, resources and timeouts of one Ray Data job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    concurrency: int = Field(1, gt=0, description="Actors, each holding one engine.")
    batch_size: int = Field(16, gt=0, description="Rows per batch handed to an actor.")
    max_in_flight: int | None = Field(
        None, gt=0, description="Documents each actor keeps reading at once; the next row starts as soon as one "
        "finishes, across batches (default: the engine's: hf its max_batch_size (16), vllm 256, openai its "
        "max_concurrency).")
    admission: Literal["continuous", "barrier"] = Field(
        "continuous", description="How rows reach an actor: 'continuous' (one row per Ray Data call; the next document "
        "starts the moment one of the --max-in-flight finishes) or 'barrier' (one call of --max-in-flight rows per "
        "actor, read together; the next call starts when its slowest document is done: the engine runs emptier as "
        "a call's documents finish: the 'scale' rows of benchmarks/README.md).")
    longest_first: bool = Field(
        False, description="Start the documents with the longest context first: with heavy-tailed lengths the "
        "longest documents' reads (one conversation after another) decide when the job ends. A global sort: the "
        "whole input is read (and shuffled by Ray Data, one CPU a task: leave CPUs beside the actors) before the first "
        "document starts.")
    long_document_tokens: int | None = Field(
        None, gt=0, description="A document of at least this many tokens reserves its actor: while it reads, new "
        "documents start there only while fewer than --long-document-in-flight are reading, so that the engine's "
        "steps stay short and the long read runs near its speed alone (use with --longest-first; texts shorter than "
        "this many characters are never counted; default: off).")
    long_document_in_flight: int = Field(
        4, gt=0, description="Documents an actor keeps reading while a --long-document-tokens document reads "
        "there (itself included; at most --max-in-flight).")
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
    # Circuit breaker: infrastructure errors (endpoint down, 5xx/429 after retries, bad
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

    checkpoint_every_steps: int = Field(
        10, ge=0, description="Checkpoint a document's read (memory, position, trace) under the output's _progress/ "
        "every this many memory updates, so that a retried task or a rerun resumes inside the document (0: never; "
        "documents with fewer chunks write none unless --checkpoint-every-s passes first).")
    checkpoint_every_s: float = Field(
        300.0, gt=0, description="Also checkpoint a read when this many seconds passed since its last checkpoint "
        "(slow engines: bounds the work a kill loses).",)

    @model_validator(mode="after")
    def _check(self) -> JobConfig:
        if (self.long_document_tokens is not None and self.max_in_flight is not None
                and self.long_document_in_flight > self.max_in_flight):
            raise ValueError(f"long_document_in_flight ({self.long_document_in_flight}) must be at most max_in_flight "
                             f"({self.max_in_flight})")
        return self
