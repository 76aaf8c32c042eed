"""Flow ``evaluate-memagent``: the task x length accuracy matrix of a model, both methods.

The stage runs :func:`pipelines.evaluate.run_evaluation` (items -> one Ray Data batch job per
method -> table, heatmap, line plot) and publishes the table as a Markdown artifact. The run
directory is resumable: a retried or re-run stage reuses the items and every finished
prediction. The train flow calls the same task for its last stage on the new checkpoint.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact

from flows.params import CPU_EVAL, EvalStage, LocalDir, resolve_local
from flows.report import publish_report
from flows.stages import task_owned_ray
from memagent.config import JOB_PRESET, AgentConfig, preset
from memagent.engines import DEFAULT_MODEL
from pipelines.job import JobConfig


# Holds the model on the accelerator: counts against the "gpu" tag concurrency limit.
@task(name="evaluate", tags=["gpu"], retries=1, retry_delay_seconds=5)
def evaluate_model(model: str, evaluation: EvalStage, agent: AgentConfig, out_dir: str,
                   job: JobConfig = JobConfig()) -> dict[str, Any]:
    """Evaluate ``model`` on ``evaluation.tasks`` x ``evaluation.lengths``; report under ``out_dir``."""
    from memagent.engines import EngineConfig
    from pipelines.evaluate import EvalConfig, run_evaluation

    t0 = time.perf_counter()
    sources = {k: resolve_local(v) for k in ("haystack", "hotpotqa", "squad") if (v := getattr(evaluation, k))}
    cfg = EvalConfig(
        out=out_dir, items=evaluation.items().model_copy(update=sources), methods=evaluation.methods,
        engine=EngineConfig(model=model), agent=agent, job=job.model_copy(update={"progress": False}),
    )
    with task_owned_ray():
        summary = run_evaluation(cfg)
    with open(summary.results_md) as f:
        table = f.read()
    create_markdown_artifact(key="evaluate-memagent-results", markdown=(
        f"# Evaluation of `{model}`\n\n{table}\n\nHeatmap: `{summary.heatmap}`  \n"
        f"Accuracy vs length: `{summary.lines_plot}`  \nPredictions and traces: `{out_dir}/predictions/`\n"),
        description=f"{summary.items} items x {len(cfg.methods)} methods")
    publish_report(out_dir, key="evaluate-memagent-report")
    return {"dir": out_dir, "skipped": False, "seconds": round(time.perf_counter() - t0, 1),
            "outputs": {"results": summary.results_csv, "heatmap": summary.heatmap, "lines": summary.lines_plot},
            "summary": {"items": summary.items, **{f"{m}_seconds": s for m, s in summary.seconds_per_method.items()},
                        "full_context_window": summary.full_context_window}}


@flow(name="evaluate-memagent", log_prints=True)
def evaluate_memagent(
    model: str = DEFAULT_MODEL,
    evaluation: EvalStage = CPU_EVAL,
    agent: AgentConfig = preset(JOB_PRESET),
    job: JobConfig = JobConfig(),
    out: LocalDir = "runs/evaluate",
) -> dict[str, Any]:
    """Task x length accuracy of ``model`` (memory agent and full-context baseline); Markdown artifact."""
    return evaluate_model(model, evaluation, agent, resolve_local(out), job)
