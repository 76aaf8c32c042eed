"""The batch job's configuration: one frozen, validated :class:`BatchQAConfig` per run."""

from __future__ import annotations


from pydantic import BaseModel, ConfigDict, Field, model_validator

from memagent.batch import Method
from memagent.documents import DocumentLimits
from memagent.config import JOB_PRESET, AgentConfig, preset
from memagent.engines import EngineConfig
from memagent.engines.config import SPECULATION_WITH_SCHEMA
from memagent.verify import Metric
from pipelines import lease, storage
from pipelines.job import JobConfig
from pipelines.storage import S3Options


class BatchQAConfig(BaseModel):
    """One batch QA job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: str = Field(..., description="Parquet file or directory, local or s3://bucket/prefix. In a directory: "
                       "files named *.parquet (any case) at any depth, except under names starting with _ or . "
                       "(docs/deployment.md). Or documents: a folder, glob (*, **) or S3 prefix of .pdf, .html, "
                       ".htm, .docx, .txt, .md files (a folder whose first files hold no .parquet), each one row, its id the path under "
                       "the input root (docs/documents.md).")
    output: str = Field(..., description="Output directory, local or s3://; reruns resume into it.")
    s3: S3Options = Field(default_factory=S3Options)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    agent: AgentConfig = Field(default_factory=lambda: preset(JOB_PRESET))
    question: str | None = Field(None, description="Job-level question for inputs without a question column.")
    questions: str | None = Field(None, description="Documents input: a JSON Lines file of {\"id\": ..., "
                                  "\"question\": ...}, one question per document id (local or s3://).")
    documents_cache: str | None = Field(None, description="Documents input: where conversions are cached "
                                        "(default: .memagent-documents beside the output).")
    document_limits: DocumentLimits = Field(default_factory=DocumentLimits,
                                            description="Documents input: the largest file and PDF converted.")
    metric: Metric = Field(
        "sub_em", description="Score against `answers` when the input has them; a `metric` column overrides it per row."
    )
    method: Method = Field(
        "memagent", description="'memagent' reads chunk by chunk; 'full-context' is the one-prompt baseline."
    )
    job: JobConfig = Field(default_factory=JobConfig, description="Actors, batching, resources and timeouts.")
    redo_changed: bool = Field(
        False, description="On a rerun into the same output, redo (and replace) the rows whose input (question, "
        "context) or answer-changing settings differ from what they were answered from, instead of refusing.")
    force_unlock: str | None = Field(None, description=lease.FORCE_UNLOCK_HELP)

    @model_validator(mode="after")
    def _check(self) -> BatchQAConfig:
        storage.check_uri(self.input, "input")
        storage.check_uri(self.output, "output")
        if self.questions is not None and (self.question is not None or self.agent.extraction is not None):
            raise ValueError("a questions file gives each document its question: give no job-level question "
                             "and no extraction schema with it")
        if self.documents_cache is not None:
            storage.check_uri(self.documents_cache, "documents_cache")
        if self.question is not None and not self.question.strip():
            raise ValueError("question must not be empty")
        if self.agent.extraction is not None and (self.question is not None or self.method != "memagent"):
            raise ValueError("an extraction schema's field list is the question: give no question with it, "
                             "and keep method 'memagent'")
        if self.agent.extraction is not None and self.engine.engine == "vllm" and self.engine.speculates():
            raise ValueError(SPECULATION_WITH_SCHEMA)
        if self.job.num_gpus > 0 and self.engine.device == "cpu":
            raise ValueError("num_gpus > 0 with engine device 'cpu': use device 'auto' or 'cuda'")
        if self.engine.engine == "openai" and self.job.num_gpus > 0:
            # The model runs behind the endpoint; a GPU held by an HTTP client is a GPU wasted.
            raise ValueError("num_gpus > 0 with engine 'openai': the actors only call the endpoint; use num_gpus 0")
        if self.engine.engine == "vllm" and self.job.num_gpus <= 0 and self.engine.device != "cpu":
            # vLLM places its engine on the GPUs Ray grants the actor; with none it cannot start.
            raise ValueError(f"engine 'vllm' needs num_gpus > 0 per actor (e.g. num_gpus="
                             f"{self.engine.tensor_parallel_size}) unless device is 'cpu'")
        return self
