"""Edges of a batch job's input and end: zero rows, blank ids, logs left under _progress."""

from __future__ import annotations

import pyarrow as pa
import pytest

from pipelines import batch_qa
from pipelines.batch_config import BatchQAConfig
from pipelines.checkpoints import PROGRESS_DIR, CheckpointLog, log_key
from pipelines.input_plan import plan_input
from pipelines.job import JobConfig
from tests.pipeline_helpers import FAST_AGENT, good_rows, write_rows

SCHEMA = pa.schema([("id", pa.string()), ("question", pa.string()), ("context", pa.string())])


def job(tmp_path) -> BatchQAConfig:
    return BatchQAConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out"), agent=FAST_AGENT,
                         job=JobConfig(batch_size=2, progress=False))


def test_zero_rows_is_one_line_exit_0_and_no_ray(tmp_path, monkeypatch, capsys):
    """An input with no rows ends with exit 0 and one line, and never starts Ray."""
    from memagent_cli.main import main

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started for an input with no rows")

    monkeypatch.setattr(batch_qa, "_start", no_ray)
    write_rows(tmp_path / "in" / "empty.parquet", [], schema=SCHEMA)
    code = main(["batch", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(out) == 1 and "no rows" in out[0]


@pytest.mark.parametrize("blank", ["", " ", "\t\n"])
def test_a_blank_id_is_refused_at_load_naming_the_row(tmp_path, blank):
    """A blank or whitespace id is refused before any work, in one line naming its row."""
    rows = good_rows(3)
    rows[2]["id"] = blank
    write_rows(tmp_path / "in" / "a.parquet", rows)
    with pytest.raises(ValueError) as err:
        plan_input(job(tmp_path))
    msg = str(err.value)
    assert "\n" not in msg and "row 2" in msg and "id" in msg


def test_at_a_runs_end_only_the_logs_a_rerun_resumes_stay(tmp_path):
    """remove_stray keeps the logs of the ids given and removes every other log and every torn temp file."""
    from memagent.agent import ReadState, Step
    from pipelines.checkpoints import remove_stray

    out = tmp_path / "out"
    step = Step(0, "memory", 0, 0, 5, "m", 1, 1, "stop", 0.1)
    state = ReadState(1, 5, "m", (step,))
    log = CheckpointLog(str(out), None, every_steps=1, every_s=60)
    for row_id in ("redo", "done", "gone-from-input"):
        log.write(row_id, "k", state, 0)
    (out / PROGRESS_DIR / log_key("redo") / ".abcd1234.tmp").write_text("torn")
    assert remove_stray(str(out), None, ["redo"]) == 2
    left = sorted(p.relative_to(out / PROGRESS_DIR).as_posix() for p in (out / PROGRESS_DIR).rglob("*"))
    assert left == [log_key("redo"), f"{log_key('redo')}/00000000-00000001.json"]
    assert remove_stray(str(out), None, []) == 1 and not (out / PROGRESS_DIR).exists()
