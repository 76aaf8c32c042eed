"""Prefect flows in-process under Prefect's test harness, on real Ray and DeepSpeed with a tiny model.

Run: .venv/bin/pytest tests/test_flows.py   (the harness starts once for the module, ~15 s)
"""

from __future__ import annotations

import json

import pyarrow.dataset as pads
import pytest
from prefect.exceptions import ParameterTypeError

from flows.batch_qa import batch_qa
from flows.evaluate import evaluate_memagent
from flows.stages import MANIFEST
from flows.train import train_memagent
from pipelines.train_job import read_metrics
from memagent.data.samples import HOTPOTQA_DEV
from tests.flows_helpers import TINY_AGENT, artifacts_of, fail_once, task_runs_of, tiny_engine
from tests.pipeline_helpers import launches


@pytest.fixture(scope="module", autouse=True)
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


# -- parameter validation ----------------------------------------------------------------------


@pytest.mark.parametrize("params, message", [
    ({"input": "ftp://lake/docs"}, "unsupported scheme 'ftp'"),
    ({"output": "http://127.0.0.1:9000/out"}, "unsupported scheme 'http'"),
    ({"input": "s3://"}, "give a bucket"),
    ({"job": {"batch_size": -1}}, "greater than 0"),
    ({"job": {"concurrency": 0}}, "greater than 0"),
    ({"job": {"num_gpus": -1}}, "greater than or equal to 0"),
    ({"agent": {"chunk_tokens": -64}}, "greater than 0"),
    ({"agent": {"preset": "huge"}}, "unknown preset"),
    ({"demo": {"lengths": [1000, -5]}}, "greater than 0"),
    ({"examples": -1}, "greater than or equal to 0"),
    ({"engine": {"model": "x", "colour": "red"}}, "Extra inputs are not permitted"),
])
def test_batch_qa_rejects_bad_parameters(params, message):
    with pytest.raises(ParameterTypeError, match=message):
        batch_qa.validate_parameters(params)


@pytest.mark.parametrize("params, message", [
    ({"workdir": "s3://bucket/runs"}, "must be a local directory"),
    ({"synth": {"source": "gs://bucket/hotpot.json"}}, "unsupported scheme 'gs'"),
    ({"synth": {"source": "h.json", "samples": 0}}, "greater than 0"),
    ({"synth": {"source": "h.json", "tokens": [], "num_docs": []}}, "at least one size"),
    ({"filtering": {"k": -2}}, "greater than 0"),
    ({"training": {"steps": -1}}, "greater than 0"),
    ({"training": {"batch_size": 0}}, "greater than 0"),
])
def test_train_flow_rejects_bad_parameters(params, message):
    with pytest.raises(ParameterTypeError, match=message):
        train_memagent.validate_parameters(params)


def test_the_batch_flow_takes_every_field_of_the_job_config():
    import inspect

    from pipelines.batch_qa import BatchQAConfig

    params = set(inspect.signature(batch_qa.fn).parameters)
    assert set(BatchQAConfig.model_fields) <= params, set(BatchQAConfig.model_fields) - params


def test_a_bad_parameter_fails_the_run_before_the_body(tmp_path):
    state = batch_qa(input="ftp://lake/docs", output=str(tmp_path / "out"), return_state=True)
    assert state.is_failed() and "unsupported scheme" in state.message
    assert not (tmp_path / "out").exists()


# -- batch-qa end to end -----------------------------------------------------------------------


@pytest.mark.slow
def test_batch_qa_generates_demo_lake_retries_and_publishes_artifacts(tiny_llama_dir, tmp_path, monkeypatch):
    import pipelines.batch_qa

    marker = tmp_path / "failed-once"
    fail_once(monkeypatch, pipelines.batch_qa, "run_batch_qa", marker)
    lake = tmp_path / "lake"
    state = batch_qa(
        input=str(lake / "docs"), output=str(lake / "answers"), engine=tiny_engine(tiny_llama_dir),
        agent=TINY_AGENT, job={"batch_size": 4}, demo={"lengths": [150, 300], "qa_items": 1, "seed": 3},
        examples=2, return_state=True,
    )
    assert state.is_completed(), state.message
    summary = state.result()
    assert marker.exists()  # the job task failed once and its retry completed the flow
    runs = task_runs_of(state.state_details.flow_run_id)
    assert runs["run-batch-qa"].run_count == 2 and runs["run-batch-qa"].state.is_completed()

    corpus = pads.dataset(str(lake / "docs")).to_table().to_pylist()
    out = pads.dataset(str(lake / "answers"), exclude_invalid_files=True).to_table().to_pylist()
    assert sorted(r["id"] for r in out) == sorted(r["id"] for r in corpus) and len(out) == 3
    assert all(r["error"] is None and r["steps"] and json.loads(r["config"])["chunk_tokens"] == 64 for r in out)
    assert summary["rows_in"] == summary["rows_out"] == 3 and summary["error_rows"] == 0
    assert summary["context_tokens"] > 0 and summary["tokens_per_second"] > 0

    arts = artifacts_of(state.state_details.flow_run_id)
    assert arts["batch-qa-summary"].type == "table"
    table = json.loads(arts["batch-qa-summary"].data)
    assert table[0]["rows_out"] == 3 and table[0]["error_rows"] == 0 and "tokens_per_second" in table[0]
    assert table[0]["accuracy"] != "n/a"  # the demo corpus has answers
    md = arts["batch-qa-traces"].data
    first_two = sorted(r["id"] for r in out)[:2]
    assert all(f"`{i}`" in md for i in first_two) and "| step | kind | chars |" in md


# -- train-memagent: stages, retry, skip on re-run, evaluation of the checkpoint ---------------


@pytest.mark.slow
def test_train_flow_retries_a_stage_and_a_rerun_skips_finished_stages(tiny_llama_dir, tmp_path,
                                                                      monkeypatch):
    import flows.train

    marker = tmp_path / "filter-failed-once"
    fail_once(monkeypatch, flows.train, "run_stage", marker, when=lambda workdir, stage, *a, **k: stage == "filter")
    params = dict(
        workdir=str(tmp_path / "work"), model=str(tiny_llama_dir),
        synth={"source": str(HOTPOTQA_DEV), "samples": 2, "tokens": [256]},
        filtering={"k": 1, "max_tokens": 8}, filter_engine={"device": "cpu"}, agent=TINY_AGENT,
        training={"steps": 1, "batch_size": 2, "group_size": 2, "warmup_steps": 0, "save_every": 1,
                  "micro_batch_tokens": 1024, "lr": 1e-3},
    )
    state = train_memagent(**params, evaluation={"enabled": False}, return_state=True)
    assert state.is_completed(), state.message
    first = state.result()
    assert marker.exists()  # the filter stage failed once; its retry finished the flow
    assert task_runs_of(state.state_details.flow_run_id)["filter"].run_count == 2
    assert [first[s]["skipped"] for s in ("synthesize", "filter", "train")] == [False, False, False]
    for s in ("synthesize", "filter", "train"):
        assert (tmp_path / "work" / first[s]["dir"].rsplit("/", 1)[-1] / MANIFEST).is_file()
    assert (tmp_path / "work").resolve().as_posix() in first["train"]["dir"]
    assert first["synthesize"]["summary"]["rows"] == 2 and first["train"]["summary"]["steps"] == 1
    assert (tmp_path / "work").joinpath(first["train"]["dir"], "checkpoints", "step_000001", "hf",
                                        "model.safetensors").is_file()

    # Same inputs with evaluation on: every finished stage is skipped; the checkpoint is evaluated.
    evaluation = {"tasks": ["niah_single_1"], "lengths": [256], "samples": 2, "methods": ["memagent", "full-context"]}
    state = train_memagent(**params, evaluation=evaluation, return_state=True)
    assert state.is_completed(), state.message
    table = json.loads(artifacts_of(state.state_details.flow_run_id)["train-memagent-results"].data)
    status = {r["stage"]: r["status"] for r in table}
    assert status == {"synthesize": "skipped (done earlier)", "filter": "skipped (done earlier)",
                      "train": "skipped (done earlier)", "evaluate": "completed"}
    assert "items=2" in next(r["summary"] for r in table if r["stage"] == "evaluate")

    # A changed training parameter redoes training only; here on two Ray Train workers (a local Ray the
    # train task starts and stops), each rank's rollouts counted in the one metrics record per step.
    state = train_memagent(**{**params, "training": {**params["training"], "lr": 2e-3}},
                           train_job={"workers": 2}, evaluation={"enabled": False}, return_state=True)
    again = state.result()
    assert [again[s]["skipped"] for s in ("synthesize", "filter", "train")] == [True, True, False]
    assert again["train"]["dir"] != first["train"]["dir"]
    records = read_metrics(again["train"]["dir"])
    assert [(r["world_size"], r["trajectories"]) for r in records] == [(2, 4)]
    assert launches(again["train"]["dir"])[0]["workers"] == 2


@pytest.mark.slow
def test_evaluate_flow_writes_the_matrix_and_an_artifact(tiny_llama_dir, tmp_path):
    out = tmp_path / "eval"
    state = evaluate_memagent(model=str(tiny_llama_dir), out=str(out), agent=TINY_AGENT,
                              evaluation={"tasks": ["niah_single_1", "vt"], "lengths": [512], "samples": 2},
                              return_state=True)
    assert state.is_completed(), state.message
    result = state.result()
    assert result["summary"]["items"] == 4 and set(result["outputs"]) == {"results", "heatmap", "lines"}
    assert (out / "heatmap.png").is_file() and (out / "predictions" / "full-context").is_dir()
    md = artifacts_of(state.state_details.flow_run_id)["evaluate-memagent-results"].data
    assert "### memagent" in md and "### full-context" in md and "NIAH single (noise)" in md


def test_evaluate_flow_rejects_unknown_tasks(tmp_path):
    with pytest.raises(ParameterTypeError, match="unknown RULER task 'niah_2'"):
        evaluate_memagent(out=str(tmp_path / "e"), evaluation={"tasks": ["niah_2"]})


# -- extract-corpus ----------------------------------------------------------------------------

# Two fields whose JSON has a bounded length (an enum and a date), so even the random tiny model,
# decoding under the schema, finishes its answer inside the budget.
BOUNDED_FIELDS = {"type": "object", "required": ["effective_date", "governing_law"], "properties": {
    "effective_date": {"type": "string", "format": "date", "description": "Date the agreement takes effect"},
    "governing_law": {"enum": ["New York", "Delaware", "Texas"], "description": "Law that governs it"}}}
EXTRACT_AGENT = {**TINY_AGENT, "memory_tokens": 48, "answer_tokens": 64, "query_tokens": 160}


@pytest.mark.parametrize("params, message", [
    ({"extraction": {"type": "object", "properties": {"a": {"type": "object"}}}}, "properties.a.properties: an object needs at least one property"),
    ({"extraction": {"type": "object", "properties": {}}}, "has no properties"),
    ({"extraction": {"type": "object", "properties": {"id": {"type": "string"}}}}, "property 'id' clashes"),
    ({"corpus": {"min_tokens": 900, "max_tokens": 100}}, "min_tokens=900 is over max_tokens=100"),
    ({"input": "ftp://lake/docs"}, "unsupported scheme 'ftp'"),
])
def test_extract_flow_rejects_bad_parameters(params, message):
    from flows.extract import extract_corpus

    with pytest.raises(ParameterTypeError, match=message):
        extract_corpus.validate_parameters(params)


def test_extract_flow_checks_the_budgets_before_any_work(tmp_path):
    from flows.extract import extract_corpus

    state = extract_corpus(input=str(tmp_path / "docs"), output=str(tmp_path / "out"),
                           agent={"preset": "tiny", "memory_tokens": 40}, corpus={}, return_state=True)
    assert state.is_failed() and "memory_tokens=40 cannot hold the 5 field(s)" in state.message
    assert not (tmp_path / "docs").exists()


def test_extract_corpus_deployment_is_declared_on_the_work_pool():
    import yaml
    from prefect.flows import load_flow_from_entrypoint

    from memagent.data.contracts import CONTRACT_SCHEMA
    from tests.flows_helpers import REPO

    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    [dep] = [d for d in spec["deployments"] if d["entrypoint"] == "flows/extract.py:extract_corpus"]
    assert dep["name"] == "default" and dep["work_pool"]["name"] == "memagent-process"
    flow = load_flow_from_entrypoint(str(REPO / dep["entrypoint"]))
    assert flow.name == "extract-corpus"  # the deployment is extract-corpus/default
    params = flow.validate_parameters(dep.get("parameters") or {})
    assert params["extraction"].root == CONTRACT_SCHEMA and params["corpus"] is not None
    assert params["input"] == "runs/contracts/docs"


@pytest.mark.slow
def test_extract_flow_generates_contracts_and_writes_typed_columns(tiny_llama_dir, tmp_path):
    import datetime as dt

    from flows.extract import extract_corpus

    lake = tmp_path / "contracts"
    state = extract_corpus(input=str(lake / "docs"), output=str(lake / "out"), extraction=BOUNDED_FIELDS,
                           engine=tiny_engine(tiny_llama_dir), agent=EXTRACT_AGENT, job={"batch_size": 2},
                           corpus={"docs": 2, "min_tokens": 150, "max_tokens": 250}, return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    ds = pads.dataset(str(lake / "out"), exclude_invalid_files=True)
    assert str(ds.schema.field("effective_date").type) == "date32[day]"
    assert str(ds.schema.field("governing_law").type) == "string"
    out = ds.to_table().to_pylist()
    assert len(out) == 2 and summary["rows_out"] == 2 and all(r["question"] for r in out)  # passes through
    for r in out:  # decoded under the schema: valid even from a random model
        assert r["error"] is None, r["error"]
        assert isinstance(r["effective_date"], dt.date) and r["governing_law"] in ("New York", "Delaware", "Texas")
        assert json.loads(r["extraction"]) == {"effective_date": r["effective_date"].isoformat(),
                                               "governing_law": r["governing_law"]}
        assert {e["field"] for e in r["field_evidence"]} == {"effective_date", "governing_law"}
        assert json.loads(r["config"])["extraction"] == BOUNDED_FIELDS
    fields = json.loads(artifacts_of(state.state_details.flow_run_id)["extract-corpus-fields"].data)
    assert [(f["field"], f["filled"], f["rows"]) for f in fields] == [("effective_date", 2, 2), ("governing_law", 2, 2)]
