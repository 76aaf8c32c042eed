"""Resumable flow stages: each stage's output directory is a function of its inputs.

    <workdir>/<stage>-<key>/         key = hash of (stage, its parameters, upstream stage keys)
        …outputs…
        _stage.json                  written last (atomically): the stage is complete

A stage whose directory already holds ``_stage.json`` is skipped and its recorded outputs are
returned, so a retried task or a re-run flow (or another flow run with the same inputs) does
only the unfinished work. A directory without the manifest is an interrupted attempt: it is
cleared and redone (the training stage instead resumes from its latest checkpoint).

Why a manifest next to the data rather than Prefect's input-keyed result cache: the outputs
(Parquet, DeepSpeed checkpoints) live on disk anyway and are what later stages read, so the
manifest cannot claim work whose files are gone; it needs no result storage shared between
workers, survives a reset Prefect database, and a user can read what each directory holds.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

MANIFEST = "_stage.json"

StageBody = Callable[[Path], tuple[dict[str, Any], dict[str, Any]]]


def local_input(input: str) -> tuple[str, int]:
    """A flow's generated-corpus input: its local path and how many Parquet files it already holds."""
    from pipelines import storage
    from pipelines.storage import S3Options

    fs, path = storage.filesystem(input, S3Options())
    return path, len(storage.parquet_files(fs, path))


def stage_key(stage: str, inputs: dict[str, Any]) -> str:
    """A short, stable hash of the stage name and its (JSON-able) inputs."""
    blob = json.dumps({"stage": stage, **inputs}, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def stage_dir(workdir: str | Path, stage: str, inputs: dict[str, Any]) -> tuple[Path, str]:
    key = stage_key(stage, inputs)
    return Path(workdir).expanduser().resolve() / f"{stage}-{key}", key


def read_manifest(directory: Path) -> dict[str, Any] | None:
    path = directory / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def run_stage(workdir: str | Path, stage: str, inputs: dict[str, Any], body: StageBody, *,
              clear: bool = True, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run ``body(dir) -> (outputs, summary)`` unless ``dir`` already holds a manifest.

    Returns the stage record: ``stage, key, dir, inputs, outputs, summary, seconds, skipped``.
    ``clear=False`` leaves an interrupted attempt's files for ``body`` to resume from.
    """
    directory, key = stage_dir(workdir, stage, inputs)
    done = read_manifest(directory)
    if done is not None:
        log(f"stage {stage}: already complete in {directory}; skipping")
        return {**done, "skipped": True}
    if clear and directory.exists():
        log(f"stage {stage}: clearing an interrupted attempt in {directory}")
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    outputs, summary = body(directory)
    record = {"stage": stage, "key": key, "dir": str(directory), "inputs": inputs, "outputs": outputs,
              "summary": summary, "seconds": round(time.perf_counter() - t0, 2),
              "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    tmp = directory / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(record, indent=2, default=str))
    tmp.replace(directory / MANIFEST)  # atomic: a manifest is never half-written
    log(f"stage {stage}: done in {record['seconds']} s -> {directory}")
    return {**record, "skipped": False}


@contextmanager
def task_owned_ray() -> Iterator[None]:
    """Shut down a local Ray that the body started: a long-lived worker (or the next task in the
    same process) must not inherit it; a Ray that was already up is left alone."""
    import ray

    owns_ray = not ray.is_initialized()
    try:
        yield
    finally:
        if owns_ray and ray.is_initialized():
            ray.shutdown()
