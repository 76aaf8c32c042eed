"""Input and output checked before any work, one line naming the file/column.

The failing cases as reported: files whose schemas disagree ended in a 42-line
``ArrowTypeError: Unable to merge`` naming no file; a file lacking a column made error rows
(``got null``) and columns present only in later files were dropped; an unwritable output was
found after 190 s of inference; an output that is a regular or Parquet file, an unreachable S3
endpoint, a missing bucket and a corrupt input file (``'<Buffer>'``) gave tracebacks.

The rule for schemas (docs/batch.md, "What happens to bad input"): columns of every file are kept
(nulls where a file lacks an optional one); compatible types are widened (int32 + int64 ->
int64, int + float -> double); incompatible types stop the job naming the column and both
files; a file lacking a required column (id, context, question) is named.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from memagent.engines import EngineConfig
from pipelines.batch_qa import BatchQAConfig, plan_input
from pipelines.job import JobConfig
from tests.pipeline_helpers import FAST_AGENT, good_rows, read_output, write_rows


def job(tmp_path, input=None, output=None, **kw) -> BatchQAConfig:
    return BatchQAConfig(input=str(input or tmp_path / "in"), output=str(output or tmp_path / "out"),
                         agent=FAST_AGENT, job=JobConfig(batch_size=2, progress=False), **kw)


def cli(args: list[str], capsys) -> tuple[int, list[str]]:
    from memagent_cli.main import main

    rc = main(["batch", *args, "--chunk-tokens", "64", "--memory-tokens", "8", "--answer-tokens", "6",
               "--no-progress"])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_incompatible_types_name_the_column_and_both_files(tmp_path, capsys):
    rows = good_rows(4)
    write_rows(tmp_path / "in" / "a.parquet", rows[:2])
    write_rows(tmp_path / "in" / "b.parquet", [{**r, "context": i} for i, r in enumerate(rows[2:])])
    with pytest.raises(ValueError) as err:
        plan_input(job(tmp_path))
    msg = str(err.value)
    assert "input column 'context' is string in " in msg and "a.parquet but int64 in " in msg
    assert msg.endswith("b.parquet: the files disagree; cast the column to one type in every file")
    rc, err_lines = cli(["--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")], capsys)
    assert rc == 2 and len(err_lines) == 1 and err_lines[0].startswith("error: input column 'context' is string")


def test_file_lacking_a_required_column_is_named(tmp_path):
    rows = good_rows(4)
    write_rows(tmp_path / "in" / "a.parquet", rows[:2])
    write_rows(tmp_path / "in" / "b.parquet", [{k: v for k, v in r.items() if k != "context"} for r in rows[2:]])
    with pytest.raises(ValueError, match=r"input file .*/b\.parquet: missing column\(s\) context; have id"):
        plan_input(job(tmp_path))


def test_columns_of_every_file_kept_and_compatible_types_widened(tmp_path):
    rows = good_rows(4)
    write_rows(tmp_path / "in" / "a.parquet", [{**r, "n": i} for i, r in enumerate(rows[:2])],
               schema=pa.schema([("id", pa.string()), ("question", pa.string()), ("context", pa.string()),
                                 ("answers", pa.list_(pa.string())), ("source", pa.string()), ("n", pa.int32())]))
    write_rows(tmp_path / "in" / "b.parquet", [{**r, "n": 2.5, "late": "x"} for r in rows[2:]])
    plan = plan_input(job(tmp_path))
    assert plan.schema.field("n").type == pa.float64() and plan.schema.field("late").type == pa.string()
    assert "late" in plan.output_schema.names and plan.total_rows == 4


def test_corrupt_input_file_is_named(tmp_path):
    write_rows(tmp_path / "in" / "a.parquet", good_rows(2))
    (tmp_path / "in" / "b.parquet").write_bytes(b"PAR1 this is not parquet at all PAR1")
    with pytest.raises(ValueError, match=r"input file .*/in/b\.parquet is not a readable Parquet file"):
        plan_input(job(tmp_path))


@pytest.mark.parametrize("kind", ["regular", "parquet"])
def test_output_that_is_a_file_is_refused_in_one_line(tmp_path, capsys, kind):
    write_rows(tmp_path / "in" / "a.parquet", good_rows(2))
    out = tmp_path / "out.parquet"
    if kind == "parquet":
        write_rows(out, good_rows(1))
    else:
        out.write_text("notes\n")
    expected = "a Parquet file" if kind == "parquet" else "a regular file"
    with pytest.raises(ValueError, match=f"output .* is {expected}; give a directory"):
        plan_input(job(tmp_path, output=out))
    rc, err = cli(["--input", str(tmp_path / "in"), "--output", str(out)], capsys)
    assert rc == 2 and err == [f"error: output {out} is {expected}; give a directory (new, or an earlier output to "
                               "resume into)"]


def test_output_dir_of_foreign_parquet_is_refused(tmp_path):
    write_rows(tmp_path / "in" / "a.parquet", good_rows(2))
    write_rows(tmp_path / "out" / "x.parquet", [{"a": 1}])
    with pytest.raises(ValueError, match="not a batch output .no 'id' column.; give a new output directory"):
        plan_input(job(tmp_path))


def test_unwritable_output_is_found_before_any_work(tmp_path, capsys):
    write_rows(tmp_path / "in" / "a.parquet", good_rows(2))
    rc, err = cli(["--input", str(tmp_path / "in"), "--output", "/sys/memagent-out"], capsys)
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: output /sys/memagent-out: Cannot create directory")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(OSError, match="not writable|Permission denied"):
            plan_input(job(tmp_path, output=ro / "out"))


def test_s3_unreachable_endpoint_and_missing_bucket_are_one_line(tmp_path, monkeypatch, capsys):
    from infra.local_s3 import CREDENTIALS, s3_server
    from tests.reliability_helpers import free_port

    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    dead = f"http://127.0.0.1:{free_port()}"
    rc, err = cli(["--input", "s3://lake/in", "--output", str(tmp_path / "out"), "--s3-endpoint", dead], capsys)
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"error: input s3://lake/in at {dead}: cannot reach the S3 "
                                                           "endpoint"), err
    with s3_server(buckets=("lake",)) as endpoint:
        import pyarrow.fs as pafs

        fs = pafs.S3FileSystem(endpoint_override=endpoint.split("://")[1], scheme="http", region="us-east-1")
        pafs.copy_files(str(write_rows(tmp_path / "in.parquet", good_rows(2))), "lake/in/part-0.parquet",
                        destination_filesystem=fs)
        rc, err = cli(["--input", "s3://lake/in", "--output", "s3://nobucket/out", "--s3-endpoint", endpoint], capsys)
        assert rc == 2 and err == [f"error: output s3://nobucket/out: bucket 'nobucket' does not exist at {endpoint}"]
        with fs.open_output_stream("lake/taken") as f:
            f.write(b"x")
        with pytest.raises(ValueError, match="output s3://lake/taken is a regular file"):
            plan_input(job(tmp_path, input="s3://lake/in", output="s3://lake/taken",
                           s3={"endpoint_url": endpoint}))
        plan = plan_input(job(tmp_path, input="s3://lake/in", output="s3://lake/fresh", s3={"endpoint_url": endpoint}))
        assert plan.total_rows == 2
        assert [i.path for i in fs.get_file_info(pafs.FileSelector("lake/fresh", allow_not_found=True))] == []


@pytest.mark.slow
def test_schema_drift_job_keeps_every_column(tiny_llama_dir, tmp_path):
    """A real Ray job over files with a widened type and a late column: every row read, every column kept."""
    import ray

    from pipelines.batch_qa import run_batch_qa

    rows = good_rows(4)
    write_rows(tmp_path / "in" / "a.parquet", [{**r, "n": i} for i, r in enumerate(rows[:2])],
               schema=pa.schema([("id", pa.string()), ("question", pa.string()), ("context", pa.string()),
                                 ("answers", pa.list_(pa.string())), ("source", pa.string()), ("n", pa.int32())]))
    write_rows(tmp_path / "in" / "b.parquet", [{**r, "n": 7, "late": "x"} for r in rows[2:]])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        summary = run_batch_qa(job(tmp_path, engine=EngineConfig(model=str(tiny_llama_dir))))
    finally:
        ray.shutdown()
    out = {r["id"]: r for r in read_output(tmp_path / "out")}
    assert sorted(out) == [r["id"] for r in rows] and summary.error_rows == 0
    assert [out[r["id"]]["late"] for r in rows] == [None, None, "x", "x"] and out["doc-003"]["n"] == 7

