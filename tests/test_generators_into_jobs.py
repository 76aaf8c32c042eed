"""Every generator's output goes into the jobs as written: `memagent synth ruler|hotpotqa|statements|contracts`
then `batch` (and, for the QA sets, `eval`), with no renaming by hand; columns named like output columns are
carried under `input_`."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memagent.engines import EngineConfig
from memagent.extraction import load_schema
from memagent_cli.main import main
from pipelines.batch_qa import BatchQAConfig, run_batch_qa
from pipelines.evaluate import EvalConfig, run_evaluation
from pipelines.job import JobConfig
from tests.pipeline_helpers import FAST_AGENT, read_output

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, tuple[Path, str | None]]:
    """Each generator's output as its command writes it, and the schema a user reads it with (None: QA)."""
    d = tmp_path_factory.mktemp("synth")
    hotpot = ROOT / "memagent" / "data" / "samples" / "hotpotqa_dev.json"
    assert main(["synth", "ruler", "--tasks", "niah_single_1,qa_2", "--lengths", "256", "--samples", "1",
                 "--out", str(d / "ruler.parquet")]) == 0
    assert main(["synth", "hotpotqa", "--source", str(hotpot), "--samples", "2", "--tokens", "256",
                 "--out", str(d / "hotpotqa.parquet")]) == 0
    assert main(["synth", "statements", "--docs", "2", "--tokens", "200", "--out", str(d / "statements.parquet")]) == 0
    assert main(["synth", "contracts", "--docs", "2", "--min-tokens", "300", "--max-tokens", "400",
                 "--out", str(d / "contracts")]) == 0
    return {"ruler": (d / "ruler.parquet", None), "hotpotqa": (d / "hotpotqa.parquet", None),
            "statements": (d / "statements.parquet", str(ROOT / "docs" / "schemas" / "statement.json")),
            "contracts": (d / "contracts" / "contracts.parquet", str(d / "contracts" / "contract.schema.json"))}


@pytest.mark.parametrize("kind", ["ruler", "hotpotqa", "statements", "contracts"])
def test_each_generator_output_runs_through_batch(ray_local, generated, tiny_llama_dir, tmp_path, kind):
    """Every generated row comes out exactly once, and an input column named like an output column keeps its
    value under `input_<name>` while the job writes its own."""
    path, schema = generated[kind]
    agent = FAST_AGENT if schema is None else FAST_AGENT.with_overrides(
        extraction=load_schema(schema), chunk_tokens=256, memory_tokens=160, answer_tokens=128, query_tokens=512)
    cfg = BatchQAConfig(input=str(path), output=str(tmp_path / "out"), agent=agent,
                        engine=EngineConfig(model=str(tiny_llama_dir)), job=JobConfig(progress=False))
    summary = run_batch_qa(cfg)
    rows_in = pq.read_table(path).to_pylist()
    rows_out = {r["id"]: r for r in read_output(tmp_path / "out")}
    assert sorted(rows_out) == sorted(r["id"] for r in rows_in) and summary.rows_out == len(rows_in)
    for row in rows_in:
        out = rows_out[row["id"]]
        if "context_tokens" in row:  # the generator's measure, carried; the job's own count beside it
            assert out["input_context_tokens"] == row["context_tokens"]
            assert out["error"] is not None or out["context_tokens"] > 0
        assert all(out[c] == v for c, v in row.items() if c != "context_tokens")  # every other column as it was


def test_a_training_set_runs_through_eval(ray_local, generated, tiny_llama_dir, tmp_path):
    """A generated training set (no task, length or metric columns) is an eval item set as written: every item is
    scored under its source as the task (RULER sets, which have those columns, are tests/test_evaluate.py's)."""
    path, _ = generated["hotpotqa"]
    cfg = EvalConfig(out=str(tmp_path / "eval"), items_file=str(path), methods=["memagent"], agent=FAST_AGENT,
                     engine=EngineConfig(model=str(tiny_llama_dir)), job=JobConfig(progress=False))
    summary = run_evaluation(cfg)
    rows = pq.read_table(path).to_pylist()
    assert summary.items == len(rows)
    results = (tmp_path / "eval" / "results.csv").read_text()
    assert {r["source"] for r in rows} == {"hotpotqa"} and "hotpotqa" in results
