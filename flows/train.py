"""Flow ``train-memagent``: synthesise -> no-context filter -> Multi-Conv DAPO -> evaluate -> artifact.

Every stage is a task whose output directory is ``<workdir>/<stage>-<hash of its inputs and
upstream keys>`` with a completion manifest (see ``flows/stages.py``), so a retried task or a
re-run flow skips finished stages and changing one stage's parameters redoes it and what
follows, nothing before. The training stage resumes from its latest DeepSpeed checkpoint
when an earlier attempt was interrupted.

The evaluation stage (``flows.evaluate.evaluate_model``) scores the new checkpoint on the
task x length matrix; if it fails, the results artifact is still published and the flow run
ends Failed with the stage's error. ``evaluation.enabled=false`` skips it.
"""

from __future__ import annotations

import os

# A local Ray (synthesis with use_ray) started by this process binds 127.0.0.1 (read at import).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import json
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.logging import get_run_logger

from flows.evaluate import evaluate_model
from flows.params import (
    SMALL_TRAIN, AgentParams, EvalParams, FilterParams, LocalDir, SynthParams, TrainConfig, resolve_local,
)
from flows.stages import run_stage, stage_dir, task_owned_ray


def _log(msg: str) -> None:
    get_run_logger().info(msg)


@task(name="synthesize", retries=1, retry_delay_seconds=2)
def synthesize_stage(workdir: str, model: str, synth: SynthParams, ray_address: str | None) -> dict[str, Any]:
    """HotpotQA questions hidden among distractors at each size -> ``data`` (Parquet)."""
    source = resolve_local(synth.source)
    # use_ray/workers change where the work runs, not the rows (synthesis is seeded per sample).
    inputs = {"source": source, "tokenizer": model, **synth.model_dump(exclude={"source", "use_ray", "workers"})}

    def body(d: Path) -> tuple[dict, dict]:
        from memagent.data.hotpotqa import TRAINING_SCHEMA, load_hotpotqa, sizes_from, synthesize
        from memagent.data.io import load_tokenizer, write_parquet

        sizes = sizes_from(synth.num_docs, synth.tokens)
        if synth.use_ray:
            from pipelines.synthesize import synthesize_hotpotqa

            with task_owned_ray():
                rows = synthesize_hotpotqa(source, str(d / "data"), sizes, samples=synth.samples, seed=synth.seed,
                                           tokenizer=model, workers=synth.workers, address=ray_address)
            data = str(d / "data")
        else:
            out = list(synthesize(load_hotpotqa(source), sizes, seed=synth.seed, samples=synth.samples,
                                  tokenizer=load_tokenizer(model)))
            data, rows = write_parquet(out, str(d / "data.parquet"), TRAINING_SCHEMA), len(out)
        return {"data": data}, {"rows": rows, "sizes": [f"{k}={v}" for k, v in sizes]}

    return run_stage(workdir, "synthesize", inputs, body, log=_log)


# Holds models on the accelerator when there is one: counts against the "gpu" tag limit.
@task(name="filter", tags=["gpu"], retries=1, retry_delay_seconds=2)
def filter_stage(workdir: str, model: str, filtering: FilterParams, upstream: dict[str, Any]) -> dict[str, Any]:
    """Drop questions a model answers without the document (best-of-k) -> ``data`` (kept rows)."""
    models = filtering.models or [model]
    inputs = {"upstream": upstream["key"], "models": models,
              **filtering.model_dump(exclude={"models", "device", "enabled"})}

    def body(d: Path) -> tuple[dict, dict]:
        import asyncio

        from memagent.data.filter import filter_no_context, output_schema
        from memagent.data.io import read_parquet_table, write_parquet
        from memagent.engines.hf import TransformersEngine
        from memagent.models import resolve_model

        table = read_parquet_table(upstream["outputs"]["data"])
        engines = [TransformersEngine(resolve_model(m), device=filtering.device, max_batch_size=16, name=m)
                   for m in models]
        result = asyncio.run(filter_no_context(
            table.to_pylist(), engines, k=filtering.k, max_tokens=filtering.max_tokens,
            temperature=filtering.temperature, top_p=filtering.top_p))
        kept = result.kept if filtering.max_keep is None else result.kept[: filtering.max_keep]
        schema = output_schema(table.schema)
        data = write_parquet(kept, str(d / "kept.parquet"), schema)
        write_parquet(result.dropped, str(d / "dropped.parquet"), schema)
        return {"data": data, "dropped": str(d / "dropped.parquet")}, {**result.summary(), "written_kept": len(kept)}

    return run_stage(workdir, "filter", inputs, body, log=_log)


@task(name="train", tags=["gpu"], retries=1, retry_delay_seconds=2)
def train_stage(workdir: str, model: str, agent: AgentParams, training: TrainConfig,
                upstream: dict[str, Any]) -> dict[str, Any]:
    """Multi-Conv DAPO through DeepSpeed -> the final checkpoint's HF export and metrics."""
    agent_config = agent.config()
    inputs = {"upstream": upstream["key"], "model": model, "agent": agent_config.model_dump(),
              "training": training.model_dump()}

    def body(d: Path) -> tuple[dict, dict]:
        import shutil

        from memagent.rl.plumbing import latest_tag, step_tag
        from memagent.rl.trainer import train

        rows = upstream["summary"].get("written_kept", upstream["summary"].get("rows", 0))
        if not rows:
            raise ValueError(f"no training rows: stage {upstream['stage']} wrote 0 rows to {upstream['outputs']['data']}")
        resume = latest_tag(d / "checkpoints") is not None
        if not resume:  # nothing worth keeping from an attempt that died before its first checkpoint
            shutil.rmtree(d)
            d.mkdir(parents=True)
        else:
            _log(f"stage train: resuming from checkpoint {latest_tag(d / 'checkpoints')} in {d}")
        train(config=training, agent_config=agent_config, data=upstream["outputs"]["data"], out_dir=d, model=model,
              resume=resume)
        metrics = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]
        last = metrics[-1]
        summary = {"steps": len(metrics), **{k: last.get(k) for k in (
            "reward_generated_mean", "accuracy_generated", "reward_mean", "accuracy", "kl", "pg_loss", "entropy",
            "step_s", "rollout_tokens_per_s")}}
        ckpt = d / "checkpoints" / step_tag(training.steps) / "hf"
        return {"checkpoint": str(ckpt), "metrics": str(d / "metrics.jsonl")}, summary

    return run_stage(workdir, "train", inputs, body, clear=False, log=_log)


def _row(stage: str, status: str, record: dict[str, Any] | None = None, note: str = "") -> dict[str, Any]:
    record = record or {}
    summary = record.get("summary") or {}
    return {"stage": stage, "status": status, "seconds": record.get("seconds"),
            "output": next(iter((record.get("outputs") or {}).values()), ""),
            "summary": note or ", ".join(f"{k}={v}" for k, v in summary.items())}


@flow(name="train-memagent", log_prints=True)
def train_memagent(
    workdir: LocalDir = "runs/train-memagent",
    model: str = "smollm2-135m",
    synth: SynthParams = SynthParams(),
    filtering: FilterParams = FilterParams(),
    agent: AgentParams = AgentParams(preset="tiny"),
    training: TrainConfig = SMALL_TRAIN,
    evaluation: EvalParams = EvalParams(),
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Synthesise, filter, train, evaluate; publishes a ``train-memagent-results`` table artifact.

    Args:
        workdir: local root of the stage directories (one per stage and input hash).
        model: base policy (registered name or local HF directory); also the synthesis tokenizer
            and the filter's model unless ``filtering.models`` is given.
        synth / filtering / agent / training / evaluation: the stages' parameters.
        ray_address: Ray cluster for synthesis with ``synth.use_ray`` (None: a local Ray).
    """
    workdir = resolve_local(workdir)
    records: dict[str, dict[str, Any]] = {}
    records["synthesize"] = synthesize_stage(workdir, model, synth, ray_address)
    data = records["synthesize"]
    if filtering.enabled:
        records["filter"] = data = filter_stage(workdir, model, filtering, data)
    records["train"] = train_stage(workdir, model, agent, training, data)

    rows = [_row(name, "skipped (done earlier)" if rec["skipped"] else "completed", rec)
            for name, rec in records.items()]
    if not filtering.enabled:
        rows.insert(1, _row("filter", "disabled"))
    eval_state = None
    if evaluation.enabled:
        eval_dir, _ = stage_dir(workdir, "evaluate", {"upstream": records["train"]["key"],
                                                      **evaluation.model_dump(exclude={"enabled"})})
        eval_state = evaluate_model(records["train"]["outputs"]["checkpoint"], evaluation, agent, str(eval_dir),
                                    return_state=True)
        if eval_state.is_completed():
            records["evaluate"] = eval_state.result()
            rows.append(_row("evaluate", "completed", records["evaluate"]))
        else:
            rows.append(_row("evaluate", "failed", note=str(eval_state.message)))
    else:
        rows.append(_row("evaluate", "disabled"))
    create_table_artifact(key="train-memagent-results", table=rows,
                          description=f"train-memagent stages under {workdir} (checkpoint: "
                                      f"{records['train']['outputs']['checkpoint']})")
    if eval_state is not None and not eval_state.is_completed():
        eval_state.result()  # re-raises the stage's error: the run ends Failed with its message
    return {name: {k: rec[k] for k in ("dir", "outputs", "summary", "skipped")} for name, rec in records.items()}
