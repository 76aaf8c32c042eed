"""Flow ``evaluate-memagent``: the task x length evaluation matrix of a model (issue 7).

The evaluation code (``memagent/evaluate.py``) does not exist yet, so the stage fails with a
message that says so instead of producing numbers it did not measure. The train flow uses the
same task for its last stage.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from prefect import flow, task

from flows.params import AgentParams, EvalParams, LocalDir, resolve_local

NOT_IMPLEMENTED = "evaluation is not implemented yet: see issue 7"


class EvaluationNotImplemented(NotImplementedError):
    """The evaluation stage has no implementation to run."""


# Holds the model on the accelerator: counts against the "gpu" tag concurrency limit.
@task(name="evaluate", tags=["gpu"], retries=0)
def evaluate_model(model: str, evaluation: EvalParams, agent: AgentParams, out_dir: str) -> dict[str, Any]:
    """Evaluate ``model`` on ``evaluation.tasks`` x ``evaluation.lengths``; write tables under ``out_dir``."""
    if importlib.util.find_spec("memagent.evaluate") is None:
        raise EvaluationNotImplemented(NOT_IMPLEMENTED)
    # The module has landed but this flow is not wired to it yet: still no numbers to report.
    raise EvaluationNotImplemented(f"{NOT_IMPLEMENTED} (memagent.evaluate exists; wire it into flows/evaluate.py)")


@flow(name="evaluate-memagent", log_prints=True)
def evaluate_memagent(
    model: str = "smollm2-135m",
    evaluation: EvalParams = EvalParams(),
    agent: AgentParams = AgentParams(),
    out: LocalDir = "runs/evaluate",
) -> dict[str, Any]:
    """Task x length accuracy matrix of ``model``; artifact with the table and the heatmap."""
    return evaluate_model(model, evaluation, agent, resolve_local(out))
