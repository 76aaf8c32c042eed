"""A malformed training-data file is named by file and line (``FILE:LINE: what is
wrong``, not ``Expecting value: line 1 column 1``), before any model loads: ``memagent train``,
``memagent filter`` and ``memagent synth`` alike."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memagent_cli.main import main

GOOD = {"id": "q1", "question": "What is the number?", "context": "The number is 7.", "answers": ["7"]}


def jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def bad_jsonl(tmp_path) -> Path:
    """Line 3 is not JSON (a truncated record), after a blank line 2."""
    return jsonl(tmp_path / "train.jsonl", [json.dumps(GOOD), "", '{"id": "q2", "question": ', json.dumps(GOOD)])


def test_json_lines_errors_name_file_and_line(bad_jsonl, tmp_path):
    from memagent.data.io import read_json, read_json_lines

    with pytest.raises(ValueError, match=rf"^{bad_jsonl}:3: invalid JSON at column 26: Expecting value$"):
        read_json(str(bad_jsonl))
    as_json = tmp_path / "lines.json"  # JSON Lines in a .json file: read as lines, errors by line too
    as_json.write_text(bad_jsonl.read_text())
    with pytest.raises(ValueError, match=rf"^{as_json}:3: invalid JSON"):
        read_json(str(as_json))
    doc = tmp_path / "doc.json"
    doc.write_text('[\n  {"id": 1},\n  {"id": }\n]')
    with pytest.raises(ValueError, match=rf"^{doc}:3: invalid JSON at column 10: Expecting value$"):
        read_json(str(doc))
    ok = jsonl(tmp_path / "ok.jsonl", ["\ufeff" + json.dumps(GOOD), json.dumps({**GOOD, "context": "a\u2028b"})])
    ok.write_text(ok.read_text())  # a byte-order mark, and a U+2028 inside a string, are fine
    assert [line for line, _ in read_json_lines(str(ok))] == [1, 2]


@pytest.mark.parametrize("line, message", [
    ('"just a string"', "expected a JSON object with id, question, context, answers, got str"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "answers"}), "missing answers"),
    (json.dumps({**GOOD, "answers": 7}), "answers must be a non-empty list of strings, got 7"),
    (json.dumps({**GOOD, "answers": []}), "answers must be a non-empty list of strings"),
    (json.dumps({**GOOD, "question": None}), "question must be a string, got NoneType"),
])
def test_bad_records_name_their_line(tmp_path, line, message):
    from memagent.rl.data import load_examples

    path = jsonl(tmp_path / "d.jsonl", [json.dumps(GOOD), json.dumps({**GOOD, "id": "q2"}), "", line])
    with pytest.raises(ValueError, match=rf"^{path}:4: {message}"):
        load_examples(path)


def test_good_files_load(tmp_path):
    from memagent.rl.data import check_source, load_examples

    lines = jsonl(tmp_path / "d.jsonl", [json.dumps(GOOD), json.dumps({**GOOD, "id": "q2", "answers": "7"})])
    assert [r["answers"] for r in load_examples(lines)] == [["7"], ["7"]]
    listed = tmp_path / "d.json"
    listed.write_text(json.dumps([GOOD, {**GOOD, "id": "q2"}], indent=2))  # a JSON list: fine too
    assert [r["id"] for r in load_examples(listed)] == ["q1", "q2"]
    pq.write_table(pa.Table.from_pylist([GOOD]), tmp_path / "d.parquet")
    check_source(str(tmp_path / "d.parquet"))
    assert load_examples(str(tmp_path / "d.parquet"))[0]["id"] == "q1"


def test_parquet_errors_name_the_row(tmp_path):
    from memagent.rl.data import check_source, load_examples

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([GOOD, {**GOOD, "id": "q2", "question": None}]), path)
    with pytest.raises(ValueError, match=rf"^{path}: row 1: question must be a string"):
        check_source(str(path))  # where the job starts, contexts unread
    with pytest.raises(ValueError, match=rf"^{path}: row 1: question must be a string"):
        load_examples(str(path))
    pq.write_table(pa.Table.from_pylist([{"id": "a", "question": "q", "context": "c"}]), path)
    with pytest.raises(ValueError, match=rf"^{path}: missing column\(s\) answers"):
        check_source(str(path))


def test_ray_train_job_checks_data_before_starting_workers(bad_jsonl, tmp_path):
    from memagent.config import AgentConfig
    from memagent.rl.config import TrainConfig
    from pipelines.train_job import TrainJob, run_training

    # workers=2 goes through Ray Train; the file is refused here, before Ray or any model starts.
    with pytest.raises(ValueError, match=rf"^{bad_jsonl}:3: invalid JSON"):
        run_training(TrainJob(workers=2), config=TrainConfig(batch_size=2), agent_config=AgentConfig(),
                     data=str(bad_jsonl), out_dir=tmp_path / "run", model=str(tmp_path / "no-such-model"))


# -- the commands: one line naming the file and the line, before any model loads ----------------


def run_cli(args: list[str], capsys) -> str:
    assert main(args) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: "), errors  # one line, no traceback
    return errors[0]


@pytest.mark.slow  # imports DeepSpeed
def test_train_names_file_and_line(bad_jsonl, tmp_path, capsys):
    # A model that does not exist: the data error must come first.
    err = run_cli(["train", "--data", str(bad_jsonl), "--out", str(tmp_path / "run"),
                   "--model", str(tmp_path / "no-such-model"), "--steps", "1"], capsys)
    assert f"{bad_jsonl}:3: invalid JSON" in err and "no-such-model" not in err


def test_filter_names_file_and_line(bad_jsonl, tmp_path, capsys):
    err = run_cli(["filter", "--input", str(bad_jsonl), "--output", str(tmp_path / "kept.parquet"),
                   "--model", str(tmp_path / "no-such-model")], capsys)
    assert f"{bad_jsonl}:3: invalid JSON" in err


def test_synth_names_file_and_line(bad_jsonl, tmp_path, capsys):
    err = run_cli(["synth", "hotpotqa", "--source", str(bad_jsonl), "--num-docs", "5",
                   "--out", str(tmp_path / "o.parquet"), "--tokenizer", str(tmp_path / "no-such-tokenizer")], capsys)
    assert f"{bad_jsonl}:3: invalid JSON" in err
