"""Write a run's HTML report next to its output and publish it as Prefect artifacts.

Called at the end of the ``batch-qa`` and ``evaluate-memagent`` flows. The report is a
by-product: if it cannot be written the flow logs why and carries on (the job's output is
already complete and resumable).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.logging import get_run_logger

from pipelines.storage import S3Options


def report_link(path: str) -> str:
    """A link for the artifact: ``file://`` for local paths, the URI itself for s3://."""
    return path if "://" in path else Path(path).resolve().as_uri()


def publish_report(run: str, *, key: str, s3: S3Options = S3Options(),
                   job_summary: dict[str, Any] | None = None) -> str | None:
    """Build the report of ``run`` (written inside it, see :func:`pipelines.report.build_report`) and
    publish link + Markdown artifacts under ``key``; returns its path, or None if it failed."""
    from pipelines.report import build_report

    logger = get_run_logger()
    try:
        path = build_report(run, None, s3, job_summary=job_summary)
    except Exception as exc:  # noqa: BLE001 - a report must not fail a finished job
        logger.warning("report of %s not written: %s: %s", run, type(exc).__name__, exc)
        return None
    link = report_link(path)
    create_link_artifact(key=key, link=link, link_text="Open the run report (HTML)",
                         description=f"Self-contained HTML report of {run}: summary, rows, memory timelines")
    create_markdown_artifact(key=f"{key}-md", markdown=(
        f"# Run report\n\n[{path}]({link})\n\nOne self-contained HTML file (no server needed): run summary, "
        "filterable row table, and each row's memory timeline with its evidence span and where the gold "
        "answer was found or lost.\n"), description=f"Where the HTML report of {run} is")
    logger.info("report: %s", path)
    return path
