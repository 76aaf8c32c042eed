"""The Ray Data batch job on real local Ray: outputs, error rows, schema errors, resume, crashes, S3."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from pipelines.batch_qa import BatchQAConfig, plan_input, run_batch_qa
from pipelines.job import JobConfig
from pipelines.storage import QUARANTINE_DIR, S3Options
from memagent.engines import EngineConfig
from tests.pipeline_helpers import FAST_AGENT, CrashOnce, good_rows, read_output, write_rows

pytestmark = pytest.mark.slow


def job(tiny_llama_dir, input, output, **kw) -> BatchQAConfig:
    return BatchQAConfig(input=str(input), output=str(output), engine=EngineConfig(model=str(tiny_llama_dir)),
                         agent=kw.pop("agent", FAST_AGENT),
                         job=JobConfig(batch_size=kw.pop("batch_size", 4), progress=False), **kw)


def check_output(rows_in: list[dict], rows_out: list[dict]) -> None:
    assert sorted(r["id"] for r in rows_out) == sorted(r["id"] for r in rows_in)  # every id exactly once
    by_id = {r["id"]: r for r in rows_in}
    for out in rows_out:
        src = by_id[out["id"]]
        assert out["source"] == src["source"] and out["question"] == src["question"]  # passthrough
        if out["error"] is None:
            steps = [s for s in out["steps"] if s["kind"] == "memory"]
            assert len(steps) == out["n_chunks"] >= 1 and out["steps"][-1]["kind"] == "answer"
            assert steps[0]["char_start"] == 0 and steps[-1]["char_end"] == len(src["context"])
            assert "".join(src["context"][s["char_start"]:s["char_end"]] for s in steps) == src["context"]
            assert out["score"] in (0.0, 1.0) and out["model"] and '"chunk_tokens":64' in out["config"]


def test_local_job_with_error_rows(ray_local_s3, tiny_llama_dir, tmp_path):
    rows = good_rows(5)
    rows[1]["context"] = None
    rows[2]["context"] = "   \n"
    rows[3]["question"] = None
    rows[4]["question"] = "why " * 100  # over query_tokens: the agent refuses it
    rows += good_rows(3, start=5)
    write_rows(tmp_path / "in" / "part-0.parquet", rows)
    summary = run_batch_qa(job(tiny_llama_dir, tmp_path / "in", tmp_path / "out"))
    out = read_output(tmp_path / "out")
    check_output(rows, out)
    errors = {r["id"]: r["error"] for r in out if r["error"]}
    assert set(errors) == {"doc-001", "doc-002", "doc-003", "doc-004"}
    assert "context must be a string, got null" in errors["doc-001"]
    assert "context is empty" in errors["doc-002"]
    assert "question must be a non-empty string" in errors["doc-003"]
    assert "over query_tokens" in errors["doc-004"]
    for r in out:
        if r["error"]:
            assert r["prediction"] is None and r["steps"] is None and r["score"] is None
    assert summary.rows_in == 8 and summary.rows_out == 8 and summary.error_rows == 4
    assert summary.accuracy is not None and summary.context_tokens > 0
    # One input file, two batches: each batch's answers land in their own file when it is done.
    assert len(list((tmp_path / "out").glob("*.parquet"))) == 2


def test_non_string_context_column_gives_error_rows(ray_local_s3, tiny_llama_dir, tmp_path):
    rows = [{"id": f"n{i}", "question": "Q?", "context": i} for i in range(3)]
    write_rows(tmp_path / "in" / "x.parquet", rows)
    run_batch_qa(job(tiny_llama_dir, tmp_path / "in", tmp_path / "out"))
    out = read_output(tmp_path / "out")
    assert sorted(r["id"] for r in out) == ["n0", "n1", "n2"]
    assert all("context must be a string, got a value of type int" in r["error"] for r in out)


@pytest.mark.parametrize(
    ("rows", "kw", "message"),
    [
        ([{"id": "a", "context": "text"}], {}, "missing column(s) question"),
        ([{"id": "a", "question": "q"}], {}, "missing column(s) context"),
        ([{"id": "a", "question": "q", "context": "t"}, {"id": "a", "question": "q", "context": "u"}], {},
         "duplicates, e.g. a"),
        ([{"id": 1, "question": "q", "context": "t"}], {}, "id must be strings"),
        ([{"id": None, "question": "q", "context": "t"}, {"id": "b", "question": "q", "context": "t"}], {},
         "null value"),
        ([{"id": "a", "question": "q", "context": "t"}], {"question": "Q?"}, "drop one of them"),
        ([{"id": "a", "question": "q", "context": "t", "prediction": "x", "input_prediction": "y"}], {},
         "is carried as 'input_prediction', but the input has a column 'input_prediction' too"),
    ],
)
def test_schema_errors_before_any_work(tiny_llama_dir, tmp_path, rows, kw, message):
    schema = pa.schema([("id", pa.string()), ("question", pa.string()), ("context", pa.string())]) \
        if rows[0].get("id", "") is None else None
    write_rows(tmp_path / "in" / "x.parquet", rows, schema=schema)
    with pytest.raises(ValueError) as err:
        plan_input(job(tiny_llama_dir, tmp_path / "in", tmp_path / "out", **kw))
    assert message in str(err.value)


def test_bad_uris_and_options_rejected(tiny_llama_dir):
    with pytest.raises(ValueError, match="only local paths and s3://"):
        BatchQAConfig(input="gs://bucket/x", output="/tmp/o")
    with pytest.raises(ValueError, match="num_gpus"):
        BatchQAConfig(input="/tmp/i", output="/tmp/o", job=JobConfig(num_gpus=1), engine=EngineConfig(device="cpu"))
    with pytest.raises(ValueError, match="greater than 0"):
        JobConfig(concurrency=0)
    with pytest.raises(ValueError, match="no Parquet files"):
        plan_input(BatchQAConfig(input="/nonexistent/dir", output="/tmp/o"))


def test_resume_skips_done_ids_and_redoes_partial_files(ray_local_s3, tiny_llama_dir, tmp_path):
    rows = good_rows(7)
    write_rows(tmp_path / "subset" / "a.parquet", rows[:3])
    write_rows(tmp_path / "full" / "a.parquet", rows[:3])
    write_rows(tmp_path / "full" / "b.parquet", rows[3:])
    out = tmp_path / "out"
    first = run_batch_qa(job(tiny_llama_dir, tmp_path / "subset", out))
    assert first.rows_out == 3
    # A writer killed mid-file leaves bytes without a Parquet footer: not finished work.
    (out / "killed-writer.parquet").write_bytes(b"PAR1" + b"\0" * 100)
    second = run_batch_qa(job(tiny_llama_dir, tmp_path / "full", out))
    assert second.skipped == 3 and second.rows_out == 4
    check_output(rows, read_output(out))
    assert (out / QUARANTINE_DIR / "killed-writer.parquet").exists()
    third = run_batch_qa(job(tiny_llama_dir, tmp_path / "full", out))
    assert third.rows_out == 0 and third.skipped == 7
    check_output(rows, read_output(out))


def test_actor_crash_mid_job_is_retried(ray_local_s3, tiny_llama_dir, tmp_path):
    rows = good_rows(8)
    for i in range(4):
        write_rows(tmp_path / "in" / f"p{i}.parquet", rows[2 * i : 2 * i + 2])
    marker = tmp_path / "crashed"
    summary = run_batch_qa(job(tiny_llama_dir, tmp_path / "in", tmp_path / "out", batch_size=2),
                           build_engine=CrashOnce(5, marker))  # the 5th conversation: the second row or later
    assert marker.exists(), "the injected crash did not happen"
    check_output(rows, read_output(tmp_path / "out"))
    assert summary.rows_out == 8 and summary.error_rows == 0


def test_extraction_job_with_json_answers(ray_local_s3, tiny_llama_dir, tmp_path):
    rows = [{"id": r["id"], "context": r["context"], "source": "lake"} for r in good_rows(3)]
    write_rows(tmp_path / "in" / "docs.parquet", rows)
    agent = FAST_AGENT.with_overrides(answer_style="json", instruction="List every number in the text.")
    run_batch_qa(job(tiny_llama_dir, tmp_path / "in", tmp_path / "out", question="Which numbers appear?",
                     agent=agent))
    out = read_output(tmp_path / "out")
    assert sorted(r["id"] for r in out) == ["doc-000", "doc-001", "doc-002"]
    for r in out:
        # A random model does not write JSON: the parse error is recorded and the raw reply kept.
        if r["error"] is not None:
            assert r["error"].startswith("answer: reply is not valid JSON") and r["response"] is not None
            assert r["steps"] is not None
        assert "Task: List every number" in r["config"] or "List every number" in r["config"]


def test_s3_round_trip_on_loopback_server(ray_local_s3, tiny_llama_dir, tmp_path, monkeypatch):
    from infra.local_s3 import CREDENTIALS, s3_server

    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    rows = good_rows(4)
    with s3_server(buckets=("lake",)) as endpoint:
        s3 = S3Options(endpoint_url=endpoint)
        fs = pafs.S3FileSystem(endpoint_override=endpoint.split("://")[1], scheme="http", region="us-east-1")
        local = write_rows(tmp_path / "in.parquet", rows)
        pafs.copy_files(str(local), "lake/in/part-0.parquet", destination_filesystem=fs)
        cfg = BatchQAConfig(input="s3://lake/in", output="s3://lake/out", s3=s3,
                            engine=EngineConfig(model=str(tiny_llama_dir)), agent=FAST_AGENT,
                            job=JobConfig(batch_size=2, progress=False))
        summary = run_batch_qa(cfg)
        out = read_output("lake/out", filesystem=fs)
        check_output(rows, out)
        assert summary.rows_out == 4 and summary.output == "s3://lake/out"
        again = run_batch_qa(cfg)  # resume over S3: nothing left
        assert again.rows_out == 0 and again.skipped == 4
    assert os.environ["AWS_ACCESS_KEY_ID"] == "test"


def test_batch_cli_prints_summary(tiny_llama_dir, tmp_path):
    import subprocess
    import sys

    rows = good_rows(3)
    write_rows(tmp_path / "in" / "a.parquet", rows)
    cmd = [sys.executable, "-m", "memagent_cli", "batch", "--input", str(tmp_path / "in"), "--output",
           str(tmp_path / "out"), "--model", str(tiny_llama_dir), "--chunk-tokens", "64", "--memory-tokens", "8",
           "--answer-tokens", "6", "--batch-size", "2", "--no-progress"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rows out:       3 this run" in out.stdout and "error rows:     0" in out.stdout
    assert "tokens read/s" in out.stdout and str(tmp_path / "out") in out.stdout
    bad = subprocess.run(cmd[:4] + ["--input", str(tmp_path / "in"), "--output", str(tmp_path / "o2"),
                                    "--resource", "gpu"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "expected NAME=AMOUNT" in bad.stderr
