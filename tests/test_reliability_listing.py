"""The files checked are the files read; write failures are one line;
an output inside the input is refused up front.

As reported: the input checks skipped ``_``/``.`` paths and took only ``.parquet`` while Ray
Data's reader of the same directory read ``sub/_stash/old.parquet`` and ``extra.PARQUET`` too:
``rows in: 2``, ``rows out: 5``, two ids twice. A full disk printed a Ray traceback and left a
0-byte write-check file. An output inside the input failed its rerun with "input columns ...
clash with output columns". The rule now (docs/deployment.md "Input files"): an input file is a
file whose name ends in ``.parquet`` in any case, anywhere under the input directory, except
under a file or directory whose name starts with ``_`` or ``.``; the job hands exactly those
files to the reader.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pyarrow.fs as pafs
import pytest

from memagent.engines import EngineConfig
from pipelines import storage, storage_errors
from pipelines.batch_qa import BatchQAConfig, plan_input
from pipelines.job import JobConfig
from tests.pipeline_helpers import FAST_AGENT, good_rows, read_output, write_rows


def job(input, output, **kw) -> BatchQAConfig:
    return BatchQAConfig(input=str(input), output=str(output), agent=FAST_AGENT,
                         job=JobConfig(batch_size=2, progress=False), **kw)


def rows(*ids: str) -> list[dict]:
    return [{**r, "id": i} for i, r in zip(ids, good_rows(len(ids)))]


@pytest.mark.parametrize("name, counted", [
    ("part-0.parquet", True),
    ("extra.PARQUET", True),                 # the suffix in any case
    ("Mixed.Parquet", True),
    ("sub/deeper/c.parquet", True),          # any depth
    ("sub/_stash/old.parquet", False),       # under a "_" directory (Spark/Hadoop staging, _temporary)
    ("_partial.parquet", False),             # a "_" file
    (".hidden/d.parquet", False),            # under a "." directory
    (".e.parquet", False),                   # a "." file
    ("notes.txt", False),                    # another suffix
    ("f.parquet.crc", False),
    ("_SUCCESS", False),
])
def test_input_file_rule(tmp_path, name, counted):
    root = tmp_path / "in"
    write_rows(root / "keep.parquet", rows("k"))
    write_rows(root / name, rows("x"))
    found = storage.parquet_files(pafs.LocalFileSystem(), str(root))
    assert (str(root / name) in found) is counted and str(root / "keep.parquet") in found


def test_rule_applies_below_the_input_root_only(tmp_path):
    root = tmp_path / "_staging" / ".v2" / "in"  # the input itself may live under such names
    write_rows(root / "a.parquet", rows("a"))
    assert storage.parquet_files(pafs.LocalFileSystem(), str(root)) == [str(root / "a.parquet")]
    named = write_rows(tmp_path / "one.data", rows("b"))  # a file given by name is read whatever its suffix
    assert storage.parquet_files(pafs.LocalFileSystem(), str(named)) == [str(named)]


def test_the_reported_lake_is_refused_for_its_duplicate(tmp_path):
    """part-0 {mm1, mm2}, sub/_stash/old {mm1, mm3}, extra.PARQUET {mm2}: extra is an input file, so mm2 twice."""
    write_rows(tmp_path / "in" / "part-0.parquet", rows("mm1", "mm2"))
    write_rows(tmp_path / "in" / "sub" / "_stash" / "old.parquet", rows("mm1", "mm3"))
    write_rows(tmp_path / "in" / "extra.PARQUET", rows("mm2"))
    with pytest.raises(ValueError, match="input column id has duplicates, e.g. mm2; ids must be unique"):
        plan_input(job(tmp_path / "in", tmp_path / "out"))


@pytest.mark.slow
def test_the_job_reads_exactly_the_files_it_checked(ray_local, tiny_llama_dir, tmp_path):
    from pipelines.batch_qa import run_batch_qa

    write_rows(tmp_path / "in" / "part-0.parquet", rows("mm1", "mm2"))
    write_rows(tmp_path / "in" / "sub" / "_stash" / "old.parquet", rows("mm1", "mm3"))
    write_rows(tmp_path / "in" / ".trash" / "x.parquet", rows("mm2"))
    write_rows(tmp_path / "in" / "extra.PARQUET", rows("mm4"))
    cfg = job(tmp_path / "in", tmp_path / "out", engine=EngineConfig(model=str(tiny_llama_dir)))
    summary = run_batch_qa(cfg)
    assert summary.rows_in == 3 and summary.rows_out == 3
    assert sorted(r["id"] for r in read_output(tmp_path / "out")) == ["mm1", "mm2", "mm4"]
    assert run_batch_qa(cfg).rows_out == 0  # the rerun skips all three


# -- output inside the input ---------------------------------------------------------------------


def test_output_inside_the_input_is_refused_up_front(tmp_path):
    write_rows(tmp_path / "in" / "a.parquet", good_rows(2))
    for output in (tmp_path / "in" / "out", tmp_path / "in", tmp_path / "in" / "x" / "out"):
        with pytest.raises(ValueError) as err:
            plan_input(job(tmp_path / "in", output))
        assert str(err.value) == (f"output {output} is inside the input directory {tmp_path / 'in'}: the next run "
                                  "would read the output's files as input; give an output outside the input "
                                  "(or under a directory named _... there, which input listing skips)")
    plan_input(job(tmp_path / "in", tmp_path / "in" / "_answers"))  # skipped by the input rule: allowed
    with pytest.raises(ValueError, match=f"input {tmp_path / 'out' / 'in'} is inside the output directory"):
        write_rows(tmp_path / "out" / "in" / "a.parquet", good_rows(2))
        plan_input(job(tmp_path / "out" / "in", tmp_path / "out"))


def test_rerun_of_an_output_inside_the_input_names_where_the_output_is(tmp_path):
    """The reported case: the first run wrote in/out; the rerun said "input columns ... clash"."""
    write_rows(tmp_path / "in" / "a.parquet", good_rows(2))
    plan = plan_input(job(tmp_path / "in", tmp_path / "elsewhere"))
    written = [{**r, "error": None} for r in good_rows(2)]
    import pyarrow as pa

    write_rows(tmp_path / "in" / "out" / "part-0.parquet", written,
               schema=pa.schema([f for f in plan.output_schema if f.name in written[0]]))
    with pytest.raises(ValueError, match=f"output {tmp_path / 'in' / 'out'} is inside the input directory"):
        plan_input(job(tmp_path / "in", tmp_path / "in" / "out"))


# -- write failures ------------------------------------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path):
    """A real 1 MiB tmpfs (root only); yields (mount point, fill(leave_bytes))."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a full disk needs a tmpfs mount (root); not root here")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")

    def fill(leave: int) -> None:
        free = shutil.disk_usage(mnt).free
        with open(mnt / "filler", "wb") as f:
            f.write(b"\0" * max(0, free - leave))

    try:
        yield mnt, fill
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_at_the_write_check_is_one_line_and_leaves_no_probe(tmp_path, tiny_disk):
    mnt, fill = tiny_disk
    write_rows(tmp_path / "in" / "a.parquet", good_rows(2))
    (mnt / "out").mkdir()
    fill(0)
    for _ in range(2):  # the reported second try found the first try's 0-byte probe
        with pytest.raises(OSError) as err:
            plan_input(job(tmp_path / "in", mnt / "out"))
        assert [p.name for p in (mnt / "out").iterdir() if "write-check" in p.name] == []
        assert str(err.value) == (f"output {mnt / 'out'}: no space left on device; free some space (or give another "
                                  "output) and run the same command again: rows already written are kept")


@pytest.mark.slow
def test_disk_full_during_the_job_is_one_line_with_rerun_advice(tmp_path, tiny_llama_dir, tiny_disk):
    mnt, fill = tiny_disk
    write_rows(tmp_path / "in" / "a.parquet", good_rows(6))
    fill(3 * 4096)  # room for the lease and the write check (a page each), not for an output file
    cmd = [sys.executable, "-m", "memagent_cli", "batch", "--input", str(tmp_path / "in"), "--output",
           str(mnt / "out"), "--model", str(tiny_llama_dir), "--chunk-tokens", "64", "--memory-tokens", "8",
           "--answer-tokens", "6", "--batch-size", "2", "--no-progress", "--torch-threads", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: output {mnt / 'out'}: no space left on device; free some space"), \
        done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert [p.name for p in (mnt / "out").iterdir() if "write-check" in p.name] == []


@pytest.mark.slow
def test_s3_bucket_gone_during_the_job_is_one_line(ray_local, tiny_llama_dir, tmp_path, monkeypatch):
    """The output's bucket disappears after the checks (moto reset): one line naming the output and the cause."""
    import threading
    import time
    import urllib.request

    import boto3
    import ray

    from infra.local_s3 import CREDENTIALS, s3_server
    from pipelines.batch_qa import run_batch_qa
    from pipelines.lease import LEASE_NAME

    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    write_rows(tmp_path / "in" / "a.parquet", good_rows(4))
    with s3_server(buckets=("lake",)) as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint)

        def drop_bucket_once_the_actors_start() -> None:
            # The job holds the lease and its checks are done once it creates the run's occupancy
            # ledger (a named actor, made just before the dataset's actors): then the bucket goes.
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                keys = [o["Key"] for o in client.list_objects_v2(Bucket="lake").get("Contents", [])]
                started = any(n.startswith("memagent-occupancy-") for n in ray.util.list_named_actors())
                if f"out/{LEASE_NAME}" in keys and started:
                    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"))
                    return
                time.sleep(0.05)

        thread = threading.Thread(target=drop_bucket_once_the_actors_start, daemon=True)
        thread.start()
        cfg = job(tmp_path / "in", "s3://lake/out", engine=EngineConfig(model=str(tiny_llama_dir)),
                  s3={"endpoint_url": endpoint})
        with pytest.raises(OSError) as err:
            run_batch_qa(cfg)
        thread.join()
    msg = str(err.value)
    assert msg.startswith("output s3://lake/out") and "bucket 'lake' does not exist" in msg and "\n" not in msg, msg
    assert getattr(err.value, "_memagent_checked", False)


def test_output_listings_name_a_bucket_gone_between_calls_in_one_line(monkeypatch):
    """The bucket goes between the output's check and its listing (the race a job loses when the
    bucket is deleted mid-run): the checkpoint sweeper, at its start and at a sweep, says so in one line."""
    import urllib.request

    import pyarrow.fs as pafs

    from infra.local_s3 import CREDENTIALS, s3_server
    from pipelines import checkpoints

    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    real_filesystem = storage.filesystem

    class BucketGoesBeforeListing:
        """The real S3 filesystem; the bucket is dropped (moto reset) right before a listing."""

        def __init__(self, fs, endpoint):
            self.fs, self.endpoint = fs, endpoint

        def get_file_info(self, what):
            if isinstance(what, pafs.FileSelector):
                urllib.request.urlopen(urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST"))
            return self.fs.get_file_info(what)

        def __getattr__(self, name):
            return getattr(self.fs, name)

    def assert_one_line(err) -> None:
        msg = str(err.value)
        assert msg.startswith("output s3://lake/out") and "bucket 'lake' does not exist" in msg, msg
        assert "\n" not in msg and getattr(err.value, "_memagent_checked", False)

    with s3_server(buckets=("lake",)) as endpoint:
        import boto3

        opts = storage.S3Options(endpoint_url=endpoint)
        boto3.client("s3", endpoint_url=endpoint).put_object(Bucket="lake", Key="out/a.parquet", Body=b"x")
        sweeper = checkpoints.Sweeper("s3://lake/out", opts)  # the bucket is there at the start
        sweeper.fs = BucketGoesBeforeListing(sweeper.fs, endpoint)
        with pytest.raises(OSError) as err:
            sweeper.sweep()
        assert_one_line(err)

        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="lake")
        boto3.client("s3", endpoint_url=endpoint).put_object(Bucket="lake", Key="out/a.parquet", Body=b"x")
        monkeypatch.setattr(storage, "filesystem", lambda uri, s3=None: (
            BucketGoesBeforeListing(real_filesystem(uri, s3)[0], endpoint), real_filesystem(uri, s3)[1]))
        with pytest.raises(OSError) as err:
            checkpoints.Sweeper("s3://lake/out", opts)
        assert_one_line(err)


@pytest.mark.parametrize("uri, error, expected", [
    ("/data/out", OSError(28, "No space left on device"), "output /data/out: no space left on device; free some space"),
    ("/data/out", OSError(122, "Disk quota exceeded"), "output /data/out: disk quota exceeded; free some quota"),
    ("/data/out", PermissionError(13, "Permission denied"), "output /data/out: permission denied; fix its permissions"),
    ("s3://lake/out", OSError("Bucket 'lake' not found. To create buckets, enable the allow_bucket_creation option."),
     "output s3://lake/out at http://h:1: bucket 'lake' does not exist; create it"),
    ("s3://lake/out", OSError("When uploading part for key 'out/a.parquet': AWS Error ACCESS_DENIED during UploadPart "
                              "operation: Access Denied"),
     "output s3://lake/out at http://h:1: S3 error while writing: access denied (check the credentials"),
    ("s3://lake/out", OSError("When listing objects under key 'out/' in bucket 'lake': AWS Error NO_SUCH_BUCKET during "
                              "ListObjectsV2 operation: The specified bucket does not exist"),
     "output s3://lake/out at http://h:1: bucket 'lake' does not exist; create it"),
    ("s3://lake/out", OSError("When listing objects under key 'in/' in bucket 'docs': AWS Error NO_SUCH_BUCKET during "
                              "ListObjectsV2 operation: The specified bucket does not exist"), None),  # the input's
    ("/data/out", ValueError("context is not a string"), None),
])
def test_write_failures_mapped_to_one_line(uri, error, expected):
    """Logic around the real failures above (quota cannot be made here): the cause is found in a Ray-like chain."""
    class TaskError(RuntimeError):  # Ray's task errors keep the worker's exception as ``.cause``
        def __init__(self, cause):
            super().__init__("ray::Write() failed\nTraceback ...")
            self.cause = cause

    mapped = storage_errors.write_failure(TaskError(error), uri, "http://h:1")
    if expected is None:
        assert mapped is None
    else:
        assert str(mapped).startswith(expected) and str(mapped).endswith(storage_errors.RERUN_ADVICE), str(mapped)


def test_ray_data_console_tracebacks_of_a_write_failure_are_hidden():
    import io
    import logging

    stream = io.StringIO()
    logger = logging.getLogger("test.ray.data")
    logger.propagate = False
    logger.addHandler(logging.StreamHandler(stream))
    try:
        with storage_errors.quiet_write_failures("/data/out", logger=logger.name):
            logger.error("unrelated failure")
            try:
                raise OSError(28, "No space left on device")
            except OSError:
                logger.exception("An exception was raised from a task of operator Write")
            logger.error("Exception occurred in Ray Data or Ray Core internal code")
            logger.warning("still shown")
        logger.error("after the write")
    finally:
        logger.handlers.clear()
    assert stream.getvalue().splitlines() == ["unrelated failure", "still shown", "after the write"]
