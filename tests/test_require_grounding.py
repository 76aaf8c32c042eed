"""``require_grounding`` (AgentConfig; ``--require-grounding``): record values copied from nowhere are
dropped, records whose key is not in the document are dropped, both counted in the row and the summary."""

from __future__ import annotations

import argparse
import asyncio
import json

import pyarrow as pa
import pytest
from transformers import AutoTokenizer

from memagent.batch import answer_row
from memagent.config import AgentConfig
from memagent.engines.base import Completion
from memagent_cli.options import add_agent_flags, agent_config
from pipelines.summary import BatchSummary
from memagent_testing.records_helpers import CONFIG, SCHEMA, RecordsEngine, document, payment, planted, section


class InventingEngine(RecordsEngine):
    """Answers records calls with the passage's planted payments, a bank the text never names on each, and
    one payment of a payer found nowhere (a value copied from a prompt's example, as LangExtract #209)."""

    async def chat(self, messages, params):
        content = messages[-1]["content"]
        if "Reply with a JSON array of the payments" not in content:
            return await super().chat(messages, params)
        found = [{**p, "bank": {"name": "Phantombank"}} for p in planted(section(content))]
        found.append({"payer": "Ghost Ltd", "date": "1999-01-01", "amount": 7})
        return Completion(text=json.dumps(found), prompt_tokens=50, completion_tokens=20, finish_reason="stop")


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    return AutoTokenizer.from_pretrained(str(tiny_llama_dir))


def read_row(tokenizer, config):
    text = document([payment("Acme Ltd", 1250, "2021-03-14")], [payment("Birch Ltd", 300, "2021-04-01")])
    row = asyncio.run(answer_row(InventingEngine(tokenizer), {"id": "d1", "context": text}, config))
    assert row["error"] is None
    return row


def test_values_and_records_found_nowhere_are_dropped_and_counted(tokenizer):
    strict = CONFIG.with_overrides(require_grounding=True)
    kept, dropped = read_row(tokenizer, CONFIG), read_row(tokenizer, strict)
    assert kept["grounding_dropped_values"] == 0 and kept["grounding_dropped_records"] == 0
    # Off: the invented payment is a record (its values have no span). On: gone, and so is every invented bank.
    chunks = dropped["n_chunks"]
    assert kept["n_records_payments"] == 3 and dropped["n_records_payments"] == 2
    assert dropped["grounding_dropped_records"] == chunks  # one Ghost Ltd per chunk's records call
    assert dropped["grounding_dropped_values"] == 2  # Phantombank, once per planted payment
    assert json.loads(dropped["config"])["require_grounding"] is True
    assert json.loads(kept["config"])["require_grounding"] is False
    # The job summary adds them up over the rows.
    table = pa.Table.from_pylist([{k: r[k] for k in ("id", "error", "score", "context_tokens", "n_records_payments",
                                                     "grounding_dropped_values", "grounding_dropped_records")}
                                  for r in (dropped, {**dropped, "id": "d2"})])
    summary = BatchSummary.from_rows(table, rows_in=2, skipped=0, seconds=1.0, output="out", require_grounding=True)
    assert summary.records == {"payments": 4}
    assert (summary.dropped_values, summary.dropped_records) == (4, 2 * chunks)
    assert "records:        4 payments" in summary.lines()
    assert any("4 value(s) and" in line and "--require-grounding" in line for line in summary.lines())
    assert summary.record()["dropped_records"] == 2 * chunks


def test_the_flag_comes_from_the_field_and_needs_record_types(tmp_path):
    schema_file = tmp_path / "s.json"
    schema_file.write_text(json.dumps(SCHEMA))
    parser = argparse.ArgumentParser()
    add_agent_flags(parser, schema=True)
    assert "--require-grounding" in parser.format_help()
    args = parser.parse_args(["--schema", str(schema_file), "--require-grounding", "--preset", "small"])
    assert agent_config(args).require_grounding is True
    plain = parser.parse_args(["--require-grounding"])
    with pytest.raises(ValueError, match="--require-grounding applies to record types"):
        agent_config(plain)
    with pytest.raises(ValueError, match="record types"):
        AgentConfig(require_grounding=True, extraction={"type": "object", "properties": {"a": {"type": "string"}}})
    # Commands that do not extract do not offer it.
    other = argparse.ArgumentParser()
    add_agent_flags(other)
    assert "--require-grounding" not in other.format_help()


def test_synth_statements_writes_a_batch_input_with_its_gold(tmp_path):
    import pyarrow.parquet as pq

    from memagent.extraction import load_schema
    from memagent_cli.main import main

    out = tmp_path / "s.parquet"
    assert main(["synth", "statements", "--out", str(out), "--docs", "2", "--tokens", "600", "--seed", "3"]) == 0
    rows = pq.read_table(out).to_pylist()
    assert [r["id"] for r in rows] == ["statement-000", "statement-001"]
    for r in rows:  # every planted payment's payer and amount are in the text
        gold = json.loads(r["gold"])
        assert gold and all(str(g["amount"]) in r["context"] for g in gold)
    again = tmp_path / "t.parquet"
    main(["synth", "statements", "--out", str(again), "--docs", "2", "--tokens", "600", "--seed", "3"])
    assert pq.read_table(again).equals(pq.read_table(out))  # a function of the seed
    assert load_schema("docs/schemas/statement.json").record_types[0].key == ("payer", "date")


def test_ground_elsewhere_is_an_opt_in_flag_from_its_field_and_not_with_require_grounding(tmp_path):
    """The whole-document search is off by default (its cost: a scan per value the window lacks); the flag
    comes from the field, extracting commands only, and cannot be set with require_grounding (which drops
    the very values it would label); what it changes is held by tests/test_records_oracle.py."""
    schema_file = tmp_path / "s.json"
    schema_file.write_text(json.dumps(SCHEMA))
    parser = argparse.ArgumentParser()
    add_agent_flags(parser, schema=True)
    assert AgentConfig().ground_elsewhere is False and "--ground-elsewhere" in parser.format_help()
    args = parser.parse_args(["--schema", str(schema_file), "--ground-elsewhere"])
    assert agent_config(args).ground_elsewhere is True
    both = parser.parse_args(["--schema", str(schema_file), "--ground-elsewhere", "--require-grounding"])
    with pytest.raises(ValueError, match="--ground-elsewhere labels .* --require-grounding drops those very values"):
        agent_config(both)
    other = argparse.ArgumentParser()
    add_agent_flags(other)
    assert "--ground-elsewhere" not in other.format_help()
