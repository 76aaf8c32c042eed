"""Flow ``batch-qa``: the Ray Data batch QA job of ``pipelines/`` as a Prefect task, plus artifacts.

    [demo lake if asked and absent] -> run the job (task, retries) -> table + Markdown artifacts

The job runs inside an ordinary task (``ray.init`` on a local Ray or ``job.ray_address``);
no Prefect task runner is involved. Retrying the task is safe because the job resumes by
``id``: rows already written are skipped, so a retry only does what is left.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.logging import get_run_logger
from pydantic import NonNegativeInt

from flows.params import DEMO_INPUT, DEMO_OUTPUT, DatasetURI, resolve_local
from flows.report import publish_report
from flows.stages import local_input, task_owned_ray
from memagent.batch import Method
from memagent.config import JOB_PRESET, AgentConfig, preset
from memagent.data.demo import DemoCorpus
from memagent.documents import DocumentLimits
from memagent.engines import EngineConfig
from memagent.verify import Metric
from pipelines.job import JobConfig
from pipelines.storage import S3Options

if TYPE_CHECKING:
    from pipelines.batch_qa import BatchQAConfig

TRACE_COLUMNS = ["id", "question", "answers", "prediction", "score", "error", "n_chunks", "context_tokens", "steps"]


@task(name="ensure-demo-lake", retries=1)
def ensure_demo_lake(input: str, model: str, demo: DemoCorpus) -> dict[str, Any]:
    """Write the generated demo corpus to ``input`` unless it already holds Parquet files."""
    from memagent.data.demo import write_demo_corpus

    path, existing = local_input(input)
    if existing:
        return {"generated": False, "files": existing}
    # Sized in the tokens of the model that reads them.
    target, n_rows = write_demo_corpus(path, model, tuple(demo.lengths), demo.qa_items, demo.seed)
    get_run_logger().info("demo lake: %d generated rows -> %s", n_rows, target)
    return {"generated": True, "rows": n_rows, "path": str(target)}


@task(name="run-batch-qa", retries=2, retry_delay_seconds=5)
def run_job(config: dict[str, Any]) -> dict[str, Any]:
    """Run the Ray Data job to completion; returns its summary (JSON-able)."""
    from pipelines.batch_qa import BatchQAConfig, run_batch_qa

    cfg = BatchQAConfig.model_validate(config)
    with task_owned_ray():
        summary = run_batch_qa(cfg)
    for line in summary.lines():
        get_run_logger().info(line)
    return summary.record()


def generate_then_run(cfg: BatchQAConfig, generate: Callable[[], object] | None, what: str) -> dict[str, Any]:
    """Write a generated corpus to the job's (local) input first when ``generate`` is given, then run
    the job as the ``run-batch-qa`` task; returns its summary.

    Actors holding GPUs count against the "gpu" tag concurrency limit (infra/prefect_stack.sh).
    """
    if generate is not None:
        if "://" in cfg.input:
            raise ValueError(f"{what} generation writes local paths only; give a local input")
        generate()
    job_task = run_job.with_options(tags=["gpu"]) if cfg.job.num_gpus > 0 else run_job
    return job_task(cfg.model_dump(mode="json"))


def example_traces(output: str, s3: S3Options, n: int) -> list[dict[str, Any]]:
    """The first ``n`` output rows by id, small columns only (never ``context``/``response``)."""
    import pyarrow.compute as pc

    from pipelines import storage

    fs, path = storage.filesystem(output, s3)
    files = storage.complete_parquet_files(fs, path)
    if not files or n == 0:
        return []
    import pyarrow.parquet as pq

    with fs.open_input_file(files[0]) as f:
        have = set(pq.read_schema(f).names)  # `question`/`answers` are optional input columns
    table = storage.read_columns(fs, files, [c for c in TRACE_COLUMNS if c in have])
    table = table.take(pc.sort_indices(table, [("id", "ascending")])[:n])
    return [{c: r.get(c) for c in TRACE_COLUMNS} for r in table.to_pylist()]


def _clip(text: str | None, limit: int = 200) -> str:
    text = " ".join((text or "").split())
    return text[:limit] + " …" if len(text) > limit else text


def traces_markdown(rows: list[dict[str, Any]], header: str) -> str:
    """Markdown: per example the question, expected/predicted answer, and every memory step."""
    out = [f"# Batch QA: example traces\n\n{header}\n"]
    for r in rows:
        out.append(f"## `{r['id']}`\n")
        out.append(f"- **question**: {r['question'] or '(job-level question)'}")
        out.append(f"- **expected**: {', '.join(r['answers'] or []) or 'n/a'}")
        if r["error"]:
            out.append(f"- **error**: {r['error']}\n")
            continue
        out.append(f"- **predicted**: {_clip(r['prediction'])} (score {r['score']})")
        out.append(f"- **chunks**: {r['n_chunks']} ({r['context_tokens']} tokens)\n")
        out.append("| step | kind | chars | memory / answer |\n|---|---|---|---|")
        for s in r["steps"] or []:
            text = _clip(s["memory"]).replace("|", "\\|")
            span = f"{s['char_start']}–{s['char_end']}" if s["char_start"] is not None else ""
            out.append(f"| {s['step']} | {s['kind']} | {span} | {text} |")
        out.append("")
    return "\n".join(out)


@flow(name="batch-qa", log_prints=True)
def batch_qa(
    input: DatasetURI = DEMO_INPUT,
    output: DatasetURI = DEMO_OUTPUT,
    engine: EngineConfig = EngineConfig(),
    agent: AgentConfig = preset(JOB_PRESET),
    job: JobConfig = JobConfig(),
    s3: S3Options = S3Options(),
    question: str | None = None,
    metric: Metric = "sub_em",
    method: Method = "memagent",
    redo_changed: bool = False,
    force_unlock: str | None = None,
    questions: str | None = None,
    documents_cache: str | None = None,
    document_limits: DocumentLimits = DocumentLimits(),
    demo: DemoCorpus | None = None,
    examples: NonNegativeInt = 3,
) -> dict[str, Any]:
    """Batch QA over a Parquet document lake; publishes a summary table and example traces.

    Args:
        input / output: Parquet lake and answers directory (local or s3://); reruns resume.
        engine / agent / job / s3: model backend, budgets, Ray job shape, S3 endpoint.
        question: a job-level question for inputs without a ``question`` column.
        metric: how ``answers`` are scored.
        method / redo_changed / force_unlock: as :class:`pipelines.batch_qa.BatchQAConfig` (every
            field of the job's config is a parameter here; a test keeps the two in step).
        questions / documents_cache / document_limits: a documents input (a folder, glob or S3 prefix of
            PDF, HTML, DOCX and text files): per-document questions, the conversion cache, file limits.
        demo: when set and ``input`` (local) has no Parquet files, generate the demo corpus there.
        examples: traces shown in the Markdown artifact.
    """
    from pipelines.batch_qa import BatchQAConfig

    input, output = resolve_local(input), resolve_local(output)
    cfg = BatchQAConfig(  # cross-field checks (e.g. GPUs with device cpu) before any work
        input=input, output=output, s3=s3, engine=engine, agent=agent, question=question, metric=metric,
        method=method, redo_changed=redo_changed, force_unlock=force_unlock, questions=questions,
        documents_cache=documents_cache, document_limits=document_limits,
        job=job.model_copy(update={"progress": False}),
    )
    generate = None if demo is None else functools.partial(ensure_demo_lake, input, engine.model, demo)
    summary = generate_then_run(cfg, generate, "demo lake")
    publish_summary_and_traces(cfg, summary, examples)
    summary["report"] = publish_report(output, key="batch-qa-report", s3=s3, job_summary=summary)
    return summary


def publish_summary_and_traces(cfg: BatchQAConfig, summary: dict[str, Any], examples: int) -> None:
    """The run's Prefect artifacts: its summary as a table, and ``examples`` example memory traces as Markdown."""
    a, model, output = cfg.agent, cfg.engine.model, cfg.output
    acc = "n/a" if summary["accuracy"] is None else round(summary["accuracy"], 4)
    create_table_artifact(
        key="batch-qa-summary",
        table=[{**summary, "accuracy": acc, "model": model, "preset": a.preset or "custom",
                "budgets": f"chunk {a.chunk_tokens} / memory {a.memory_tokens} / answer {a.answer_tokens}"}],
        description=f"Batch QA {cfg.input} -> {output}: rows, errors, accuracy ({cfg.metric}), tokens read per second.",
    )
    rows = example_traces(output, cfg.s3, examples)
    header = (f"Model `{model}`, budgets chunk {a.chunk_tokens} / memory {a.memory_tokens} / answer "
              f"{a.answer_tokens} tokens. Output: `{output}`. Char spans index the input `context`.")
    create_markdown_artifact(key="batch-qa-traces", markdown=traces_markdown(rows, header),
                             description=f"{len(rows)} example memory traces from {output}")
