"""The generated contract corpus: planted spans point at the gold values, lengths fit, amendments override."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memagent.data.contracts import CONTRACT_SCHEMA, FIELDS, ContractCorpus, contract_corpus, contract_row, draw_lengths


def gold_of(row: dict) -> dict:
    return json.loads(row["gold"])


def words(text: str) -> int:  # a deterministic stand-in tokenizer for sizing
    return len(text.split())


@pytest.mark.parametrize("target", [300, 1000, 4000])
def test_spans_point_at_the_gold_values_and_length_fits(target):
    for idx in range(8):
        row = contract_row(idx, target, seed=3, count=words)
        gold, ctx = gold_of(row), row["context"]
        assert target - 25 <= words(ctx) <= target  # within one sentence of the target
        assert [s["field"] for s in row["gold_spans"]] == list(FIELDS)
        for s in row["gold_spans"]:
            assert ctx[s["char_start"]:s["char_end"]] == str(gold[s["field"]])
            assert ctx.count(str(gold[s["field"]])) == 1  # a text search finds exactly this span
        for d in row["distractors"]:
            value = json.loads(d["value"])
            assert ctx[d["char_start"]:d["char_end"]] == str(value) and value != gold[d["field"]]
        assert {d["field"] for d in row["distractors"] if d["kind"] == "near_miss"} == set(FIELDS)


def test_amendment_comes_later_and_overrides():
    rows = [contract_row(i, 800, seed=1, count=words, amend=True) for i in range(10)]
    for row in rows:
        gold = gold_of(row)
        assert 1 <= len(row["amended"]) <= 2
        spans = {s["field"]: s for s in row["gold_spans"]}
        for f in row["amended"]:
            old = next(d for d in row["distractors"] if d["field"] == f and d["kind"] == "superseded")
            assert json.loads(old["value"]) != gold[f]
            assert old["char_end"] < spans[f]["char_start"]  # the amendment is later in the text
            assert "Amendment:" in row["context"][spans[f]["char_start"] - 120:spans[f]["char_start"]]
    assert not contract_row(0, 800, seed=1, count=words, amend=False)["amended"]


def test_values_are_typed_as_the_schema_says_and_seeded():
    import jsonschema

    corpus = ContractCorpus(docs=12, min_tokens=200, max_tokens=600, seed=7)
    rows = contract_corpus(corpus, count=words)
    assert rows == contract_corpus(corpus, count=words)  # seeded
    assert rows != contract_corpus(corpus.model_copy(update={"seed": 8}), count=words)
    for row in rows:
        jsonschema.validate(gold_of(row), CONTRACT_SCHEMA)
        assert isinstance(gold_of(row)["term_months"], int)
    assert 0 < sum(bool(r["amended"]) for r in rows) < len(rows)  # some documents amended, not all
    lengths = draw_lengths(200, 1000, 8000)
    assert min(lengths) >= 1000 and max(lengths) <= 8000 and sum(x < 2828 for x in lengths) > 60  # log-uniform
    with pytest.raises(ValueError, match="min_tokens"):
        draw_lengths(3, 500, 100)


def test_shipped_schema_file_matches():
    shipped = Path(__file__).resolve().parents[1] / "docs" / "schemas" / "contract.json"
    assert json.loads(shipped.read_text()) == CONTRACT_SCHEMA


@pytest.mark.slow  # loads the packaged model's tokenizer to size the documents
def test_cli_writes_batch_input_and_schema(tmp_path, capsys):
    import pyarrow.parquet as pq

    from memagent_cli.main import main

    assert main(["synth", "contracts", "--out", str(tmp_path / "c"), "--docs", "3", "--min-tokens", "300",
                 "--max-tokens", "500"]) == 0
    table = pq.read_table(tmp_path / "c" / "contracts.parquet")
    assert table.num_rows == 3 and {"id", "question", "context", "gold", "gold_spans"} <= set(table.column_names)
    assert json.loads((tmp_path / "c" / "contract.schema.json").read_text()) == CONTRACT_SCHEMA
    assert json.loads(capsys.readouterr().out)["rows"] == 3
    # One corpus config: its checks are the command's, in the command's words.
    assert main(["synth", "contracts", "--out", str(tmp_path / "d"), "--min-tokens", "900", "--max-tokens", "500"]) == 2
    assert "--min-tokens=900 is over --max-tokens=500" in capsys.readouterr().err
