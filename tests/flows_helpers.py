"""Helpers shared by the flow tests: tiny-model parameters and reading artifacts back."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]

# Small enough that the random 2-layer model reads a document in well under a second.
TINY_AGENT: dict[str, Any] = {"preset": "tiny", "chunk_tokens": 64, "memory_tokens": 8, "answer_tokens": 6,
                              "query_tokens": 96}


def tiny_engine(model_dir: Path) -> dict[str, Any]:
    return {"model": str(model_dir), "device": "cpu", "dtype": "fp32"}


def fail_once(monkeypatch: Any, module: Any, name: str, marker: Path, *, when: Callable[..., bool] | None = None) -> None:
    """Make ``module.name`` raise once (the marker file records that it did), so a task retry is observable.

    The flows run in this process under the test harness, so patching the function a task calls
    reaches the task (no switch in the product code).
    """
    real = getattr(module, name)

    def failing(*args: Any, **kwargs: Any) -> Any:
        if (when is None or when(*args, **kwargs)) and not marker.exists():
            marker.write_text(f"{name} failed once on purpose\n")
            raise RuntimeError(f"injected failure in {name}")
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, failing)


def artifacts_of(flow_run_id: Any) -> dict[str, Any]:
    """Artifacts of one flow run (through the current Prefect API), by key."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return {a.key: a for a in found if a.key}


def task_runs_of(flow_run_id: Any) -> dict[str, Any]:
    """Task runs of one flow run, by task name (the last one of each name)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return {r.name.rsplit("-", 1)[0]: r for r in runs}  # names are "<task name>-<suffix>"
