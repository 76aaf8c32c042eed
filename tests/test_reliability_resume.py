"""Resume checks what it skips; the summary's accuracy counts error rows.

Case 6 as reported: rerunning into the same output with a *different* input whose ids overlap
kept the old answers for those ids without a word. Now each output row carries
``input_fingerprint`` and such a rerun refuses (how many ids, one example) unless
``--redo-changed``, which redoes and replaces those rows (still exactly once).

Case 8 as reported: ``accuracy: 1.000`` with 3 of 6 rows in error. Now error rows count as
wrong (as the evaluation does) and both numbers are shown.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from memagent.engines import EngineConfig
from pipelines.batch_qa import BatchQAConfig, plan_input, summarise
from pipelines.fingerprint import COLUMN, answer_key, fingerprint
from pipelines.job import JobConfig
from tests.pipeline_helpers import FAST_AGENT, good_rows, read_output, write_rows


def job(tmp_path, input="in", **kw) -> BatchQAConfig:
    return BatchQAConfig(input=str(tmp_path / input), output=str(tmp_path / "out"), agent=kw.pop("agent", FAST_AGENT),
                         job=JobConfig(batch_size=2, progress=False), **kw)


def test_fingerprint_covers_what_changes_answers(tmp_path):
    cfg = job(tmp_path)
    key = answer_key(cfg)
    assert fingerprint("q", "c", key) == fingerprint("q", "c", key)
    assert len({fingerprint("q", "c", key), fingerprint("q2", "c", key), fingerprint("q", "c2", key),
                fingerprint("q", "c", answer_key(job(tmp_path, agent=FAST_AGENT.with_overrides(chunk_tokens=96)))),
                fingerprint("q", "c", answer_key(job(tmp_path, method="full-context")))}) == 5
    assert answer_key(job(tmp_path, metric="em")) == key  # the metric changes scores, not answers


def test_accuracy_counts_error_rows_as_wrong(tmp_path):
    """The reported case: 3 of 6 rows in error, the other 3 right."""
    rows = good_rows(6)
    write_rows(tmp_path / "in" / "a.parquet", rows)
    cfg = job(tmp_path)
    plan = plan_input(cfg)
    out = [{**r, "score": 1.0 if i < 3 else None, "error": None if i < 3 else "input: context is empty",
            "context_tokens": 10} for i, r in enumerate(rows)]
    out[5]["error"] = "infra: EndpointError: POST http://h/v1/chat/completions failed after 6 attempt(s)"
    write_rows(tmp_path / "out" / "part-0.parquet", out, schema=pa.schema(
        [f for f in plan.output_schema if f.name in out[0]]))
    summary = summarise(cfg, plan, 1.0)
    assert summary.accuracy == 0.5 and summary.accuracy_answered == 1.0 and summary.scored_rows == 6
    assert summary.error_rows == 3 and summary.infra_errors == 1
    lines = "\n".join(summary.lines())
    assert "accuracy:       0.500 over 6 rows, error rows counted wrong (1.000 over the rows without error)" in lines
    assert "error rows:     3 (2 row errors, done; 1 infrastructure errors, redone by a rerun" in lines


@pytest.mark.slow
def test_changed_input_for_written_ids_refused_then_redone(tiny_llama_dir, tmp_path):
    import ray

    from pipelines.batch_qa import run_batch_qa

    rows = good_rows(4)
    write_rows(tmp_path / "in" / "a.parquet", rows)
    changed = [dict(r) for r in rows] + good_rows(1, start=4)
    changed[1]["context"] = "A different document. " + changed[1]["context"]
    changed[2]["question"] = "Another question?"
    write_rows(tmp_path / "in2" / "a.parquet", changed)
    engine = EngineConfig(model=str(tiny_llama_dir))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        first = run_batch_qa(job(tmp_path, engine=engine))
        assert first.rows_out == 4
        before = {r["id"]: r for r in read_output(tmp_path / "out")}
        assert all(r[COLUMN] for r in before.values())
        with pytest.raises(ValueError) as err:
            plan_input(job(tmp_path, "in2", engine=engine))
        assert str(err.value).startswith(f"2 id(s) already in {tmp_path / 'out'} were answered from a different input")
        assert "e.g. 'doc-001'" in str(err.value) and "--redo-changed" in str(err.value)
        again = run_batch_qa(job(tmp_path, "in2", engine=engine, redo_changed=True))
    finally:
        ray.shutdown()
    assert again.skipped == 2 and again.rows_out == 3  # doc-001 and doc-002 redone, doc-004 new
    after = {r["id"]: r for r in read_output(tmp_path / "out")}
    assert len(read_output(tmp_path / "out")) == 5 and sorted(after) == [r["id"] for r in changed]
    assert after["doc-002"]["question"] == "Another question?" and after["doc-001"]["context"].startswith("A different")
    assert after["doc-000"][COLUMN] == before["doc-000"][COLUMN]
    assert after["doc-001"][COLUMN] != before["doc-001"][COLUMN]
    assert plan_input(job(tmp_path, "in2", engine=engine)).skipped == 5  # consistent now: nothing refused
