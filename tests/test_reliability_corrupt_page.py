"""An input file with an intact footer and a corrupt data page: one line naming the file and row group.

As reported: such a file passes the plan (its footer and ``id`` column read fine), then the job
failed after 41 s with one 3.9 KB Ray error line. Now the failed read is traced to its file and
row group (``pipelines.input_plan.unreadable_input``) and Ray Data's traceback stays in its log.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.batch_qa import BatchQAConfig
from pipelines.input_plan import plan_input, unreadable_input
from tests.pipeline_helpers import FAST_AGENT, good_rows


def corrupt_file(path: Path, rows: int = 8, per_group: int = 4, bad_group: int = 1) -> Path:
    """A Parquet file whose ``bad_group``-th row group's context page header is overwritten."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(good_rows(rows)), path, row_group_size=per_group)
    group = pq.read_metadata(path).row_group(bad_group)
    column = next(group.column(i) for i in range(group.num_columns) if group.column(i).path_in_schema == "context")
    data = bytearray(path.read_bytes())
    data[column.data_page_offset:column.data_page_offset + 40] = b"\xff" * 40
    path.write_bytes(bytes(data))
    return path


def test_the_failed_read_is_traced_to_its_file_and_row_group(tmp_path):
    bad = corrupt_file(tmp_path / "in" / "b.parquet", rows=12, bad_group=2)
    good = tmp_path / "in" / "a.parquet"
    pq.write_table(pa.Table.from_pylist(good_rows(15)[12:]), good)
    cfg = BatchQAConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out"), agent=FAST_AGENT)
    plan = plan_input(cfg)  # the footer and the ids are intact: the plan passes
    assert plan.files == [str(good), str(bad)]
    # As Ray Data's read task fails (its message names the fragment; without it, every file is read).
    for exc in (OSError(f"Deserializing page header failed.\nFailed to read fragment {bad} after 1/10 attempts"),
                OSError("Deserializing page header failed.")):
        message = str(unreadable_input(cfg, plan.files, exc))
        assert message.startswith(f"input file {bad}: row group 2 of 3 (rows 8-11 of the file) is unreadable (")
        assert message.endswith("rewrite the file or take it out of the input, then run the same command again "
                                "(rows already written are kept)") and "\n" not in message
    assert unreadable_input(cfg, [str(good)], OSError("x")) is None  # nothing unreadable: the error stands
    assert unreadable_input(cfg, plan.files, RuntimeError("a bug")) is None  # not a read failure: not scanned


@pytest.mark.slow
def test_batch_names_the_file_and_row_group_in_one_line(tiny_llama_dir, tmp_path):
    bad = corrupt_file(tmp_path / "in" / "a.parquet")
    cmd = [sys.executable, "-m", "memagent_cli", "batch", "--input", str(tmp_path / "in"),
           "--output", str(tmp_path / "out"), "--model", str(tiny_llama_dir), "--chunk-tokens", "64",
           "--memory-tokens", "8", "--answer-tokens", "6", "--batch-size", "1", "--no-progress",
           "--torch-threads", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: input file {bad}: row group 1 of 2 (rows 4-7 of the file) is unreadable (")
    assert "Traceback" not in proc.stderr and "ReadFiles" not in proc.stderr, proc.stderr[-3000:]
