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

from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.logging import get_run_logger

from flows.evaluate import evaluate_model
from flows.params import CPU_EVAL, CPU_TRAIN, EvalStage, LocalDir, resolve_local
from flows.stages import run_stage, stage_dir, task_owned_ray
from memagent.config import AgentConfig, preset
from memagent.data.filter import FilterConfig
from memagent.data.hotpotqa import HotpotSynthConfig
from memagent.data.samples import HOTPOTQA_DEV
from memagent.engines import DEFAULT_MODEL, EngineConfig
from memagent.rl.config import TrainConfig
from pipelines.synthesize import SynthJob
from pipelines.train_job import TrainJob

# The deployment's default source: the HotpotQA dev sample shipped in the package.
SAMPLE_SYNTH = HotpotSynthConfig(source=str(HOTPOTQA_DEV), samples=8, tokens=[1024])


def _log(msg: str) -> None:
    get_run_logger().info(msg)


@task(name="synthesize", retries=1, retry_delay_seconds=2)
def synthesize_stage(workdir: str, model: str, synth: HotpotSynthConfig, job: SynthJob) -> dict[str, Any]:
    """HotpotQA questions hidden among distractors at each size -> ``data`` (Parquet)."""
    synth = synth.model_copy(update={"source": resolve_local(synth.source)})
    # Where the work runs does not change the rows (synthesis is seeded per sample).
    inputs = {"tokenizer": model, **synth.model_dump()}

    def body(d: Path) -> tuple[dict, dict]:
        from pipelines.synthesize import write_hotpotqa

        with task_owned_ray():
            data, rows = write_hotpotqa(synth, str(d / ("data" if job.ray else "data.parquet")), model, job)
        return {"data": data}, {"rows": rows, "sizes": [f"{k}={v}" for k, v in synth.sizes()]}

    return run_stage(workdir, "synthesize", inputs, body, log=_log)


# Holds models on the accelerator when there is one: counts against the "gpu" tag limit.
@task(name="filter", tags=["gpu"], retries=1, retry_delay_seconds=2)
def filter_stage(workdir: str, filtering: FilterConfig, engine: EngineConfig,
                 upstream: dict[str, Any]) -> dict[str, Any]:
    """Drop questions a model answers without the document (best-of-k) -> ``data`` (kept rows)."""
    inputs = {"upstream": upstream["key"], "engine": engine.model_dump(exclude={"device"}),
              **filtering.model_dump()}

    def body(d: Path) -> tuple[dict, dict]:
        from memagent.data.filter import run_filter
        from memagent.data.io import read_parquet_table

        table = read_parquet_table(upstream["outputs"]["data"])
        summary = run_filter(table.to_pylist(), table.schema, filtering, engine, str(d / "kept.parquet"),
                             str(d / "dropped.parquet"))
        return {"data": summary.pop("output"), "dropped": summary.pop("dropped_output")}, summary

    return run_stage(workdir, "filter", inputs, body, log=_log)


@task(name="train", tags=["gpu"], retries=1, retry_delay_seconds=2)
def train_stage(workdir: str, model: str, agent: AgentConfig, training: TrainConfig,
                upstream: dict[str, Any], train_job: TrainJob = TrainJob()) -> dict[str, Any]:
    """Multi-Conv DAPO through DeepSpeed -> the final checkpoint's HF export and metrics.

    ``train_job.workers > 1`` or a ``ray_address``: a Ray Train run of that many workers
    (``pipelines.train_job``); else ``train()`` in this process.
    """
    inputs = {"upstream": upstream["key"], "model": model, "agent": agent.model_dump(),
              "training": training.model_dump()}
    # The world size (and GPU vs CPU) changes the samples and the checkpoint's layout, so it is
    # part of the stage's key; the single-process default keeps the key it always had.
    if train_job.workers > 1 or train_job.gpus_per_worker:
        inputs["workers"] = {"workers": train_job.workers, "gpu": train_job.gpus_per_worker > 0}

    def body(d: Path) -> tuple[dict, dict]:
        import shutil

        from memagent.rl.checkpoint import latest_tag, step_tag
        from pipelines.train_job import read_metrics, run_training

        rows = upstream["summary"].get("written_kept", upstream["summary"].get("rows", 0))
        if not rows:
            raise ValueError(f"no training rows: stage {upstream['stage']} wrote 0 rows to {upstream['outputs']['data']}")
        resume = latest_tag(d / "checkpoints") is not None
        if not resume:  # nothing worth keeping from an attempt that died before its first checkpoint
            shutil.rmtree(d)
            d.mkdir(parents=True)
        else:
            _log(f"stage train: resuming from checkpoint {latest_tag(d / 'checkpoints')} in {d}")
        if train_job.uses_ray:
            _log(f"stage train: {train_job.workers} Ray Train worker(s), {train_job.gpus_per_worker} GPU(s) each, "
                 f"on {train_job.ray_address or 'a local Ray'}")
        with task_owned_ray():
            run_training(train_job, config=training, agent_config=agent, data=upstream["outputs"]["data"],
                         out_dir=d, model=model, resume=resume)
        metrics = read_metrics(d)  # one record per step, even when a resumed attempt redid some
        last = metrics[-1]
        summary = {"steps": len(metrics), **{k: last.get(k) for k in (
            "reward_generated_mean", "accuracy_generated", "reward_mean", "accuracy", "kl", "pg_loss", "entropy",
            "step_s", "rollout_tokens_per_s")}}
        ckpt = d / "checkpoints" / step_tag(training.steps) / "hf"
        return {"checkpoint": str(ckpt), "metrics": str(d / "metrics.jsonl")}, summary

    return run_stage(workdir, "train", inputs, body, clear=False, log=_log)


def evaluate_stage(workdir: str, evaluation: EvalStage, agent: AgentConfig, records: dict[str, Any],
                   rows: list[dict[str, Any]]) -> Any:
    """The trained checkpoint's evaluation when enabled (its record and results row added); its Prefect state,
    or None when disabled: a failed evaluation is re-raised once the results table is published."""
    if not evaluation.enabled:
        rows.append(_row("evaluate", "disabled"))
        return None
    eval_dir, _ = stage_dir(workdir, "evaluate", {"upstream": records["train"]["key"],
                                                  **evaluation.model_dump(exclude={"enabled"})})
    eval_state = evaluate_model(records["train"]["outputs"]["checkpoint"], evaluation, agent, str(eval_dir),
                                return_state=True)
    if eval_state.is_completed():
        records["evaluate"] = eval_state.result()
        rows.append(_row("evaluate", "completed", records["evaluate"]))
    else:
        rows.append(_row("evaluate", "failed", note=str(eval_state.message)))
    return eval_state


def _row(stage: str, status: str, record: dict[str, Any] | None = None, note: str = "") -> dict[str, Any]:
    record = record or {}
    summary = record.get("summary") or {}
    return {"stage": stage, "status": status, "seconds": record.get("seconds"),
            "output": next(iter((record.get("outputs") or {}).values()), ""),
            "summary": note or ", ".join(f"{k}={v}" for k, v in summary.items())}


@flow(name="train-memagent", log_prints=True)
def train_memagent(
    workdir: LocalDir = "runs/train-memagent",
    model: str = DEFAULT_MODEL,
    synth: HotpotSynthConfig = SAMPLE_SYNTH,
    synth_job: SynthJob = SynthJob(),
    filtering: FilterConfig | None = FilterConfig(),
    filter_engine: EngineConfig = EngineConfig(),
    agent: AgentConfig = preset("tiny"),
    training: TrainConfig = CPU_TRAIN,
    train_job: TrainJob = TrainJob(),
    evaluation: EvalStage = CPU_EVAL,
) -> dict[str, Any]:
    """Synthesise, filter, train, evaluate; publishes a ``train-memagent-results`` table artifact.

    Args:
        workdir: local root of the stage directories (one per stage and input hash).
        model: base policy (registered name or local HF directory); also the synthesis tokenizer
            and the filter's model unless ``filtering.models`` is given.
        synth / synth_job: what to synthesise and where (in process, or a Ray job).
        filtering / filter_engine: the no-context filter (None skips it) and the backend it asks.
        agent / training / evaluation: the stages' parameters (``evaluation.enabled`` false skips it).
        train_job: how wide training runs: ``workers`` > 1 (GPUs each: ``gpus_per_worker``) or a
            ``ray_address`` run it as a Ray Train job whose workers each hold one DeepSpeed rank.
    """
    workdir = resolve_local(workdir)
    records: dict[str, dict[str, Any]] = {}
    records["synthesize"] = synthesize_stage(workdir, model, synth, synth_job)
    data = records["synthesize"]
    if filtering is not None:
        engine = filter_engine if "model" in filter_engine.model_fields_set else filter_engine.model_copy(
            update={"model": model})  # the policy is the filter's model unless one is named
        records["filter"] = data = filter_stage(workdir, filtering, engine, data)
    records["train"] = train_stage(workdir, model, agent, training, data, train_job)

    rows = [_row(name, "skipped (done earlier)" if rec["skipped"] else "completed", rec)
            for name, rec in records.items()]
    if filtering is None:
        rows.insert(1, _row("filter", "disabled"))
    eval_state = evaluate_stage(workdir, evaluation, agent, records, rows)
    create_table_artifact(key="train-memagent-results", table=rows,
                          description=f"train-memagent stages under {workdir} (checkpoint: "
                                      f"{records['train']['outputs']['checkpoint']})")
    if eval_state is not None and not eval_state.is_completed():
        eval_state.result()  # re-raises the stage's error: the run ends Failed with its message
    return {name: {k: rec[k] for k in ("dir", "outputs", "summary", "skipped")} for name, rec in records.items()}
