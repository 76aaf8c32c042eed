"""Typed, validated parameters of the Prefect flows: one model per concern.

Flows take these as top-level parameters (``input``, ``engine``, ``agent``, ``job``, …) rather
than one big object, because a deployment run merges parameters at the top level only:
``prefect deployment run 'batch-qa/nightly' -p engine='{"model": "…"}'`` replaces ``engine``
and keeps every other deployment default. Prefect validates each parameter with pydantic
before the flow body runs (a bad URI or a negative size fails the run up front), and
deployments enforce the JSON schema these models produce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from memagent.config import PRESETS, AgentConfig, preset
from memagent.rl.config import TrainConfig

Metric = Literal["sub_em", "em", "f1", "string_match_all", "boxed_em"]

# Defaults of the nightly deployment: the local demo lake (a flow task generates it if absent).
DEMO_INPUT = "runs/lake/docs"
DEMO_OUTPUT = "runs/lake/answers"


def check_dataset_uri(uri: str) -> str:
    """A local path or ``s3://bucket/prefix``; any other scheme is rejected with the reason."""
    if not uri or not uri.strip():
        raise ValueError("must not be empty")
    if "://" in uri and not uri.startswith("s3://"):
        scheme = uri.split("://", 1)[0]
        raise ValueError(f"{uri!r}: unsupported scheme {scheme!r}; use a local path or s3://bucket/prefix")
    if uri.startswith("s3://") and not uri[len("s3://"):].strip("/"):
        raise ValueError(f"{uri!r}: give a bucket, e.g. s3://bucket/prefix")
    return uri


def check_local_dir(path: str) -> str:
    """A local directory path (DeepSpeed checkpoints and stage manifests are written locally)."""
    if not path or not path.strip():
        raise ValueError("must not be empty")
    if "://" in path:
        raise ValueError(f"{path!r}: must be a local directory (no URI scheme); checkpoints are written locally")
    return path


DatasetURI = Annotated[str, AfterValidator(check_dataset_uri)]
LocalDir = Annotated[str, AfterValidator(check_local_dir)]


class AgentParams(BaseModel):
    """Agent budgets: a named preset plus optional overrides (validated into an ``AgentConfig``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: str = Field("small", description=f"One of {', '.join(PRESETS)}.")
    chunk_tokens: int | None = Field(None, gt=0, description="Override the preset's chunk size.")
    memory_tokens: int | None = Field(None, gt=0, description="Override the preset's memory budget.")
    answer_tokens: int | None = Field(None, gt=0, description="Override the preset's answer budget.")
    query_tokens: int | None = Field(None, gt=0, description="Override the preset's question budget.")
    max_chunks: int | None = Field(None, gt=0, description="Centre-truncate documents to this many chunks.")

    @model_validator(mode="after")
    def _valid(self) -> AgentParams:
        self.config()  # unknown preset or inconsistent budgets fail at parameter validation
        return self

    def config(self) -> AgentConfig:
        return preset(self.preset).with_overrides(
            chunk_tokens=self.chunk_tokens, memory_tokens=self.memory_tokens, answer_tokens=self.answer_tokens,
            query_tokens=self.query_tokens, max_chunks=self.max_chunks,
        )


class JobParams(BaseModel):
    """Where and how wide the Ray Data job runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ray_address: str | None = Field(None, description="Ray cluster address; None = a local Ray on 127.0.0.1.")
    concurrency: int = Field(1, gt=0, description="Actors, each holding one engine.")
    batch_size: int = Field(16, gt=0, description="Rows per batch (read concurrently by one actor).")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per actor (0 on CPU; a GPU request on a CPU cluster hangs).")
    num_cpus: float = Field(1.0, gt=0, description="CPUs reserved per actor.")
    resources: dict[str, float] = Field(default_factory=dict, description="Custom Ray resources per actor.")


class DemoLakeParams(BaseModel):
    """The generated demo corpus written to the input when it holds no Parquet files (local only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lengths: list[Annotated[int, Field(gt=0)]] = Field([1000, 2500, 5000], min_length=1,
                                                        description="Needle-in-a-haystack lengths in tokens.")
    qa_items: int = Field(3, ge=0, description="Multi-document QA items.")
    seed: int = 0


class SynthParams(BaseModel):
    """HotpotQA long-context synthesis (spec §2.1): questions hidden among distractor documents."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: DatasetURI = Field("../shared/data/hotpotqa_sample.json", description="Official HotpotQA JSON/JSONL.")
    samples: int | None = Field(8, gt=0, description="First N questions (None: all).")
    num_docs: list[Annotated[int, Field(gt=0)]] = Field(default_factory=list, description="Documents per sample.")
    tokens: list[Annotated[int, Field(gt=0)]] = Field([1024], description="Target context tokens per sample.")
    seed: int = 42
    use_ray: bool = Field(False, description="Generate with a Ray Data job (a local Ray, or job's ray_address).")
    workers: int = Field(2, gt=0, description="Ray actors when use_ray.")

    @model_validator(mode="after")
    def _sizes(self) -> SynthParams:
        if not self.num_docs and not self.tokens:
            raise ValueError("give at least one size: num_docs or tokens")
        return self


class FilterParams(BaseModel):
    """The no-context filter (spec §2.3): drop questions a model answers without the document."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    models: list[str] = Field(default_factory=list, description="Models to ask (empty: the base model).")
    k: int = Field(2, gt=0, description="Samples per model (best-of-k).")
    max_tokens: int = Field(64, gt=0, description="New tokens per probe (paper: 512).")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(0.7, gt=0, le=1)
    max_keep: int | None = Field(None, gt=0, description="Keep at most the first N survivors.")
    device: str = Field("auto", description="'auto', 'cpu' or 'cuda'.")


class EvalParams(BaseModel):
    """The task x length evaluation matrix (``memagent eval``); defaults are CPU-sized (minutes)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(True, description="False skips the stage in the train flow.")
    tasks: list[str] = Field(["niah_single_1", "vt"], min_length=1,
                             description="RULER tasks (hotpotqa = qa_2 needs `hotpotqa`; essay NIAH needs `haystack`).")
    lengths: list[Annotated[int, Field(gt=0)]] = Field([1024, 2048], min_length=1, description="Item lengths in tokens.")
    samples: int = Field(4, gt=0, description="Items per (task, length).")
    methods: list[Literal["memagent", "full-context"]] = Field(["memagent", "full-context"], min_length=1)
    haystack: str | None = Field(None, description="Essay text file for the essay NIAH tasks.")
    hotpotqa: str | None = Field(None, description="HotpotQA JSON for qa_2.")
    squad: str | None = Field(None, description="SQuAD JSON for qa_1.")
    seed: int = 42

    @model_validator(mode="after")
    def _known(self) -> EvalParams:
        from memagent.data.ruler import resolve_task

        for t in self.tasks:
            resolve_task(t)  # unknown task names fail at parameter validation
        return self


# CPU-sized training: two DAPO steps of 2 questions x 2 trajectories finish in minutes; 1024-token
# micro-batches keep the vocabulary-wide logits (and peak memory) small.
SMALL_TRAIN = TrainConfig(steps=2, batch_size=2, group_size=2, warmup_steps=0, save_every=2, lr=1e-6,
                          micro_batch_tokens=1024)


def resolve_local(path: str) -> str:
    """Absolute form of a local path (relative paths are relative to the working directory,
    the repository root under the deployments' pull step); URIs are returned unchanged."""
    return path if "://" in path else str(Path(path).expanduser().resolve())


__all__ = [
    "AgentParams", "DEMO_INPUT", "DEMO_OUTPUT", "DatasetURI", "DemoLakeParams", "EvalParams", "FilterParams",
    "JobParams", "LocalDir", "Metric", "SMALL_TRAIN", "SynthParams", "TrainConfig", "check_dataset_uri",
    "check_local_dir", "resolve_local",
]
