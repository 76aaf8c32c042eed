"""Record types read together: a filing's 52 lists asked for in a few group calls per chunk, nothing lost.

Checked against the perfect filing reader (memagent_testing/oracle/filings.py) on generated filings
(memagent/data/filings.py), with the packaged model's tokenizer and 8K window and the job's default preset.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest

from memagent.agent import check_config, read_document
from memagent.config import AgentConfig
from memagent.data.filings import SCHEMA, filing
from memagent.extraction.record_groups import RecordGroup, group_reply_tokens, read_group_reply
from memagent.extraction.schema import schema_from
from memagent_testing.oracle.filings import FilingOracle

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def test_the_shipped_filing_schema_is_the_generators():
    """docs/schemas/filing.json is the schema the filing generator writes gold objects for."""
    assert json.loads((ROOT / "docs/schemas/filing.json").read_text()) == SCHEMA


def test_a_filings_52_lists_pack_into_at_most_3_groups_each_family_described_once():
    """Every record type is in exactly one group, at most 3 groups at the default reply budget, and each group's
    request states the shared metric definition's fields once, not once per list."""
    schema = schema_from(SCHEMA)
    groups = schema.record_groups(group_reply_tokens(160, 1024, 8192, 500))
    names = [n for g in groups for n in g.names]
    assert len(schema.record_types) == 52 and sorted(names) == sorted(r.name for r in schema.record_types)
    assert len(groups) <= 3
    for g in groups:
        request = schema.group_records_instruction(g)
        assert request.count("Each of these lists holds metric records") == 1
        assert request.count("- data_period (") == 1


def test_a_cut_group_reply_keeps_the_arrays_it_closed():
    """A reply cut inside its third array keeps the first two, names the third as cut and the rest as missing."""
    group = RecordGroup(("a.x", "a.y", "b.z", "b.w"))
    reply = read_group_reply(group, '{"x": [{"v": 1}], "y": [], "z": [{"v": 2}, {"v')
    assert reply.arrays == {"a.x": [{"v": 1}], "a.y": []} and reply.cut == "b.z" and reply.missing == ("b.w",)
    assert read_group_reply(group, "not json").cut == "a.x"


def _gold(doc: dict) -> Counter:
    return Counter((f"{sec}.{name}", json.dumps({k: v for k, v in m.items() if v is not None}, sort_keys=True))
                   for sec, props in doc["gold"].items() if sec != "meta" for name, ms in props.items() for m in ms)


@pytest.mark.parametrize("seed", [1, 7])
def test_a_perfect_reader_gets_every_gold_metric_of_a_filing_in_few_calls(tokenizer, seed):
    """With the job's default preset and the packaged model's window, a generated filing's every gold metric comes
    out exactly once, the object validates against the filing schema, the records calls are far fewer than one per
    list per chunk (dense tables overflow a group's reply: those lists are read alone, nothing is lost), and the
    result counts each of them with its tokens."""
    doc = filing(seed)
    schema = schema_from(SCHEMA)
    cfg = AgentConfig(preset="small", extraction=schema)
    engine = FilingOracle(tokenizer, [doc])
    check_config(engine, cfg)
    result = asyncio.run(read_document(engine, None, doc["text"], cfg))
    got = Counter((name, json.dumps(r.values, sort_keys=True)) for name, recs in result.records.items() for r in recs)
    assert got == _gold(doc)
    obj = schema.assemble(json.loads(result.response), {n: [r.values for r in rs] for n, rs in result.records.items()})
    assert schema.errors(obj) == []
    calls = [n for kind, n in engine.calls if kind == "records"]
    assert len(calls) < 52 * result.n_chunks / 4 and result.records_tally.failed == 0
    # The row counts every records call and its tokens (groups, lists read alone), beside its steps.
    assert result.records_tally.calls == len(calls) and result.records_tally.prompt_tokens == sum(calls)


def test_a_sparse_chunk_is_read_in_one_call_per_group(tokenizer):
    """A filing chunk that states a few metrics (no dense table) costs as many records calls as there are groups."""
    doc = filing(3)
    lines = doc["text"].splitlines()
    keep = [i for i, ln in enumerate(lines) if "stood at" in ln or "Guidance" in ln]
    text = "\n".join(lines[i] for i in keep)
    starts, pos = {}, 0
    for i in keep:
        starts[i] = pos
        pos += len(lines[i]) + 1
    line_of = {sum(len(ln) + 1 for ln in lines[:i]): i for i in keep}
    statements = [{**s, "start": starts[line_of[s["start"]]], "end": starts[line_of[s["start"]]] + s["end"] - s["start"]}
                  for s in doc["statements"] if s["start"] in line_of]
    sparse = {**doc, "text": text, "statements": statements}
    schema = schema_from(SCHEMA)
    cfg = AgentConfig(preset="small", extraction=schema)
    engine = FilingOracle(tokenizer, [sparse])
    result = asyncio.run(read_document(engine, None, text, cfg))
    assert result.n_chunks == 1 and sum(len(r) for r in result.records.values()) == len(statements)
    calls = sum(1 for kind, _ in engine.calls if kind == "records")
    n = len(tokenizer(schema.memory_question(cfg.answer_tokens), add_special_tokens=False)["input_ids"])
    assert calls == len(schema.record_groups(group_reply_tokens(cfg.memory_tokens, cfg.chunk_tokens, 8192, n))) <= 3



@pytest.mark.slow
def test_the_hf_engine_with_its_grammar_reads_every_gold_metric_of_a_filing():
    """On the hf path (the real engine, its chat template and grammar, over the perfect filing reader) a generated
    filing's every gold metric comes out once and the object validates against the filing schema."""
    from memagent_testing.oracle.filings import FilingReader
    from memagent_testing.oracle.scripted_lm import scripted_engine

    doc = filing(5, filler=0)
    reader = FilingReader([doc])
    engine = scripted_engine(reader.reply)
    schema = schema_from(SCHEMA)
    cfg = AgentConfig(preset="small", extraction=schema)
    check_config(engine, cfg)
    result = asyncio.run(read_document(engine, None, doc["text"], cfg))
    _holds_every_gold_metric(result, doc, schema, reader)


def _holds_every_gold_metric(result, doc, schema, reader) -> None:
    """The read's records are the filing's gold metrics, each once; the assembled object validates; every records
    call the reader answered is counted in the row."""
    got = Counter((name, json.dumps(r.values, sort_keys=True)) for name, recs in result.records.items() for r in recs)
    assert got == _gold(doc)
    obj = schema.assemble(json.loads(result.response), {n: [r.values for r in rs] for n, rs in result.records.items()})
    assert schema.errors(obj) == [] and result.records_tally.calls == reader.calls.count("records")


def test_synth_filings_writes_documents_whose_gold_validates(tmp_path, capsys):
    """``memagent synth filings`` writes id, context and gold columns; each gold object is valid under the
    filing schema and lists its metrics once."""
    import pyarrow.parquet as pq

    from memagent_cli.main import main

    out = tmp_path / "filings.parquet"
    assert main(["synth", "filings", "--out", str(out), "--docs", "2", "--seed", "4"]) == 0
    rows = pq.read_table(out).to_pylist()
    schema = schema_from(SCHEMA)
    assert [r["id"] for r in rows] == ["filing-4", "filing-5"]
    for row in rows:
        gold = json.loads(row["gold"])
        assert schema.errors(gold) == [] and row["context"] == filing(int(row["id"].split("-")[1]))["text"]
    assert json.loads(capsys.readouterr().out)["metrics"] == sum(_gold(filing(s)).total() for s in (4, 5))


@pytest.mark.slow
def test_the_openai_engine_over_http_reads_every_gold_metric_of_a_filing(tokenizer):
    """On the openai path (the real engine over HTTP, a server replying as the perfect filing reader under the
    request's schema and max_tokens) a generated filing's every gold metric comes out once, the object valid."""
    from memagent.engines.openai import OpenAIEngine
    from memagent_testing.oracle.filings import FilingReader
    from memagent_testing.oracle.servers import oracle_app
    from tests.reliability_helpers import free_port, serving

    doc = filing(6, filler=1)
    reader = FilingReader([doc])
    schema = schema_from(SCHEMA)
    cfg = AgentConfig(preset="small", extraction=schema)
    with serving(oracle_app(reader.reply, tokenizer), free_port()) as url:
        engine = OpenAIEngine(url, "oracle", tokenizer, 8192)
        check_config(engine, cfg)
        result = asyncio.run(read_document(engine, None, doc["text"], cfg))
    _holds_every_gold_metric(result, doc, schema, reader)


def test_a_schema_that_cannot_fit_is_refused_in_one_line_naming_its_longest_line(tokenizer):
    """A schema whose compact field list alone overflows the window is refused with one line that names the
    budget and the schema's longest line (the type whose names take the most)."""
    from memagent.engines.budget import TokenBudget

    metric = {"type": "object", "properties": {"value": {"type": "number"}}}
    names = {f"line_item_number_{i}_of_the_consolidated_statement": {"type": "array", "items": {"$ref": "#/$defs/m"}}
             for i in range(600)}
    wide = {"type": "object", "$defs": {"m": metric}, "properties": {"statement": {"type": "object",
                                                                                   "properties": names}}}
    cfg = AgentConfig(preset="small", extraction=wide)
    with pytest.raises(ValueError) as err:
        check_config(TokenBudget(tokenizer, 8192), cfg)
    message = str(err.value)
    assert "\n" not in message and "context window of 8192 tokens" in message
    assert "longest line: '- each of these lists holds m records (value): statement.{li' (" in message


def test_a_group_reply_that_loops_leaves_the_rest_to_single_type_calls(tokenizer):
    """A model that loops inside a group reply until its budget is asked for the remaining lists one at a time (at
    the memory's budget), never as a group again, and the records of the lists it closed are kept."""
    from memagent.engines.base import Completion

    from memagent_testing.oracle.filings import FilingReader

    doc = filing(2)
    reader = FilingReader([doc])

    class Looping(FilingOracle):
        group_calls = 0

        async def chat(self, messages, params):
            if "Reply with a JSON object of record lists" in messages[-1]["content"]:
                Looping.group_calls += 1
                good = json.loads(reader.reply(messages[-1]["content"]))
                first = next(iter(good))
                text = json.dumps({first: good[first]})[:-1] + ', "' + next(iter(list(good)[1:])) + '": [' \
                    + '{"unit": "USD", "scale": 1, ' * 400
                return Completion(text=text, prompt_tokens=1, completion_tokens=params.max_tokens,
                                  finish_reason="length")
            return await super().chat(messages, params)

    schema = schema_from(SCHEMA)
    cfg = AgentConfig(preset="small", extraction=schema)
    engine = Looping(tokenizer, [doc])
    result = asyncio.run(read_document(engine, None, doc["text"], cfg))
    got = Counter((name, json.dumps(r.values, sort_keys=True)) for name, recs in result.records.items() for r in recs)
    assert got == _gold(doc)
    assert Looping.group_calls == 2 * result.n_chunks  # 2 groups of 26 lists: one call each per chunk, no regrouping
