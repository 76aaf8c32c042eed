"""Corpus extraction end to end: the Ray Data batch job, the hf engine's constrained decoding
(memagent/engines/grammar.py), typed Parquet columns with evidence, resume with a schema; and the
packaged model extracting every field type of the contract schema.

Run: .venv/bin/pytest tests/test_extraction_e2e.py   (Ray + a tiny model; one packaged-model read)
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json

import pyarrow.dataset as pads
import pytest

from memagent.config import AgentConfig
from memagent.data.contracts import CONTRACT_SCHEMA, contract_row
from memagent.engines import EngineConfig
from memagent.extraction import EVIDENCE_TYPE
from pipelines.batch_qa import BatchQAConfig, plan_input, run_batch_qa
from pipelines.job import JobConfig
from tests.pipeline_helpers import write_rows

pytestmark = pytest.mark.slow

# Fields whose JSON has a bounded length (date, enum, boolean): even a random model decoding under
# the schema closes the object inside the answer budget, so every row must come out valid.
BOUNDED = {"type": "object", "required": ["effective_date", "governing_law", "renewal"], "properties": {
    "effective_date": {"type": "string", "format": "date", "description": "Date the agreement takes effect"},
    "governing_law": CONTRACT_SCHEMA["properties"]["governing_law"],
    "renewal": {"type": "boolean", "description": "Whether the term renews automatically"}}}
TINY = AgentConfig(chunk_tokens=64, memory_tokens=72, answer_tokens=64, query_tokens=200, extraction=BOUNDED)


def job(tmp_path, model, agent: AgentConfig = TINY, **kw) -> BatchQAConfig:
    return BatchQAConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out"),
                         engine=EngineConfig(model=str(model), device="cpu", dtype="fp32"), agent=agent,
                         job=JobConfig(batch_size=2, progress=False), **kw)


def test_batch_extraction_writes_typed_columns_and_resume_covers_the_schema(tiny_llama_dir, tmp_path):
    import ray

    contracts = [contract_row(i, 250, seed=5) for i in range(3)]
    write_rows(tmp_path / "in" / "contracts.parquet", contracts)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        summary = run_batch_qa(job(tmp_path, tiny_llama_dir))
    finally:
        ray.shutdown()
    assert summary.rows_out == 3 and summary.error_rows == 0
    ds = pads.dataset(str(tmp_path / "out"), exclude_invalid_files=True)
    assert {n: str(ds.schema.field(n).type) for n in BOUNDED["properties"]} == {
        "effective_date": "date32[day]", "governing_law": "string", "renewal": "bool"}
    assert ds.schema.field("field_evidence").type.value_type == EVIDENCE_TYPE
    by_id = {r["id"]: r for r in contracts}
    for row in ds.to_table().to_pylist():
        assert row["error"] is None and row["question"] == by_id[row["id"]]["question"]  # passes through
        assert isinstance(row["effective_date"], dt.date) and isinstance(row["renewal"], bool)
        assert row["governing_law"] in BOUNDED["properties"]["governing_law"]["enum"]
        assert json.loads(row["extraction"]) == {"effective_date": row["effective_date"].isoformat(),
                                                 "governing_law": row["governing_law"], "renewal": row["renewal"]}
        assert [e["field"] for e in row["field_evidence"]] == list(BOUNDED["properties"])
        context = by_id[row["id"]]["context"]
        for e in row["field_evidence"]:  # a cited span holds the value as the document writes it
            if e["char_start"] is not None:
                assert context[e["char_start"]:e["char_end"]].lower() == str(json.loads(e["value"])).lower()
        assert json.loads(row["config"])["extraction"] == BOUNDED

    # Resume covers the schema: the same schema skips everything, another one is refused.
    assert plan_input(job(tmp_path, tiny_llama_dir)).skipped == 3
    fewer = {**BOUNDED, "properties": {k: v for k, v in BOUNDED["properties"].items() if k != "renewal"},
             "required": ["effective_date", "governing_law"]}
    with pytest.raises(ValueError, match=r"3 id\(s\) already in .* schema .*--redo-changed"):
        plan_input(job(tmp_path, tiny_llama_dir, TINY.with_overrides(extraction=fewer)))


def test_the_packaged_model_fills_every_field_type_of_the_contract_schema(smollm2_engine):
    """One contract read by SmolLM2-135M: decoded under the schema, every required field gets a
    value of its type (string, date, number, integer, enum). Accuracy is the benchmark's business."""
    from memagent.agent import check_config, read_document
    from memagent.data.hotpotqa import count_tokens
    from memagent.extraction import extraction_columns

    config = AgentConfig(preset="small", memory_tokens=120, answer_tokens=96, extraction=CONTRACT_SCHEMA)
    check_config(smollm2_engine, config)
    row = contract_row(0, 300, seed=5, count=functools.partial(count_tokens, smollm2_engine.tokenizer), amend=False)
    result = asyncio.run(read_document(smollm2_engine, None, row["context"], config))
    assert result.steps[-1].finish_reason == "stop"  # the grammar closed the object inside the budget
    columns = extraction_columns(config.extraction, result.response, result.steps, row["context"])
    assert isinstance(columns["party"], str) and isinstance(columns["effective_date"], dt.date)
    assert isinstance(columns["amount"], float) and isinstance(columns["term_months"], int)
    assert columns["governing_law"] in CONTRACT_SCHEMA["properties"]["governing_law"]["enum"]
    assert [e["field"] for e in columns["field_evidence"]] == list(CONTRACT_SCHEMA["properties"])
