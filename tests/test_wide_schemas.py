"""Wide schemas (issue 50, item 4): the document fields split into answer groups that fit the budgets.

Generated wide schemas (memagent_testing/wide_schemas.py: 50-400 leaves, nested objects, record types with a child
type) are grouped so that every group fits ``answer_tokens`` and every leaf is asked for exactly once;
read by a perfect model (the in-process oracle engine, and the hf engine's grammar over a scripted LM),
the merged groups assemble into the gold object. Budgets left at their defaults follow the schema; a
leaf that alone cannot fit is refused naming it and the flag to raise.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from memagent.agent import read_document
from memagent.config import AgentConfig
from memagent.extraction import schema_from
from memagent.extraction.groups import group_fields, merge_replies, smallest_group_tokens
from memagent.extraction.output import conform_reply, parse_reply
from memagent.extraction.parse import iter_leaves
from memagent.extraction.resolve import without_nulls
from memagent_testing.oracle.servers import OracleEngine
from tests.test_schema_resolve import flatten
from memagent_testing.wide_schemas import WideReader, count_leaves, gold_for, reader_config, statement, wide_schema

WIDE = st.tuples(st.integers(50, 400), st.integers(0, 10**6), st.integers(0, 2))
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                          HealthCheck.function_scoped_fixture])


@SETTINGS
@given(WIDE, st.integers(0, 400))
def test_groups_fit_the_budget_and_cover_every_leaf_once(drawn, extra):
    """Every group's reply estimate is within the budget and the groups ask for each document leaf once."""
    leaves, seed, types = drawn
    schema = schema_from(wide_schema(leaves, seed, types))
    budget = smallest_group_tokens(schema.fields) + extra
    groups = group_fields(schema.fields, budget)
    assert len(groups) == 1 or all(g.answer_tokens() <= budget for g in groups)
    asked = [path for g in groups for path in g.leaves()]
    assert sorted(asked) == sorted(path for path, _, _ in iter_leaves(schema.fields, {}))
    assert len(set(asked)) == len(asked)
    if schema.answer_tokens_needed() <= budget:
        assert len(groups) == 1 and groups[0].fields == schema.fields  # a schema that fits reads as before


@SETTINGS
@given(WIDE)
def test_each_group_schema_accepts_exactly_its_share_of_the_gold(drawn):
    """The gold object cut along the groups passes each group's decoding schema, and the shares merge back
    into the whole document object."""
    leaves, seed, types = drawn
    schema = schema_from(wide_schema(leaves, seed, types))
    doc, _ = flatten(schema, gold_for(schema.root, seed))
    doc = without_nulls(doc)
    groups = schema.field_groups(smallest_group_tokens(schema.fields) + 40)
    shares = []
    for g in groups:
        from jsonschema import Draft202012Validator

        share = _share(doc, g.fields)
        user, _ = schema.answer_schemas(g, smallest_group_tokens(schema.fields) + 40)  # what replies are checked with
        assert not list(Draft202012Validator(user).iter_errors(share))
        shares.append(share)
    assert merge_replies(shares) == doc


def _share(doc, fields):
    out = {}
    for f in fields:
        if f.name in doc:
            out[f.name] = _share(doc[f.name], f.fields) if hasattr(f, "fields") else doc[f.name]
    return out


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def _read_back(schema, result) -> dict:
    doc, dropped = conform_reply(schema, parse_reply(schema, result.response))
    assert dropped == []
    return schema.assemble(doc, {t: [r.values for r in rs] for t, rs in (result.records or {}).items()})


@settings(max_examples=5, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no slow shrink
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@example((217, 0, 0), 0)  # the reply of a group of digit-heavy names ran past its estimate (cut at the budget)
@given(WIDE, st.integers(0, 200))
def test_a_perfect_reader_of_a_wide_schema_gives_the_gold_object(tokenizer, drawn, extra):
    """In process, the grouped final answers of a perfect reader assemble into the gold object, valid under
    the user's schema, with one final call per group and one memory update per chunk."""
    leaves, seed, types = drawn
    raw = wide_schema(leaves, seed, types)
    schema = schema_from(raw)
    gold = gold_for(raw, seed)
    doc, records = flatten(schema, gold)
    reader = WideReader(without_nulls(doc), {t: [without_nulls(r) for r in rs] for t, rs in records.items()})
    engine = OracleEngine(reader.reply, tokenizer)
    budget = max(smallest_group_tokens(schema.fields) + extra, 120)
    result = asyncio.run(read_document(engine, None, statement(gold), reader_config(raw, budget)))
    whole = _read_back(schema, result)
    assert schema.errors(whole) == [] and whole == gold
    groups = schema.field_groups(budget)
    assert len(groups) > 1 and reader.final_calls == len(groups)
    assert [s.kind for s in result.steps].count("answer") == len(groups)
    assert [s.kind for s in result.steps].count("memory") == result.n_chunks


@pytest.mark.slow  # the hf engine's grammar over a scripted LM: real decoding under each group's schema
def test_the_hf_grammar_decodes_every_group_of_a_wide_schema(smollm2_dir):
    """Through the hf engine's grammar, a 400-leaf schema's groups decode whole and assemble into the gold."""
    from memagent_testing.oracle.scripted_lm import scripted_engine

    raw = wide_schema(400, 11, 1)
    schema = schema_from(raw)
    gold = gold_for(raw, 11)
    doc, records = flatten(schema, gold)
    reader = WideReader(without_nulls(doc), {t: [without_nulls(r) for r in rs] for t, rs in records.items()})
    engine = scripted_engine(reader.reply)
    config = AgentConfig(chunk_tokens=1000, memory_tokens=700, answer_tokens=600, query_tokens=4500, extraction=raw)
    result = asyncio.run(read_document(engine, None, statement(gold), config))  # in chunks: the 8K window
    assert len(schema.field_groups(600)) > 1
    whole = _read_back(schema, result)
    assert schema.errors(whole) == [] and whole == gold


def test_default_budgets_follow_the_schema():
    """With budgets left at the preset's, a 7-field schema (refused before: memory 160, answer 48) loads and
    reads in one final call; a 400-leaf one loads with its answer split into groups."""
    seven = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(7)}}
    cfg = AgentConfig(preset="small", extraction=seven)
    assert cfg.memory_tokens >= cfg.extraction.memory_tokens_needed()
    assert len(cfg.extraction.field_groups(cfg.answer_tokens)) == 1
    assert cfg.query_tokens >= len(cfg.extraction.question())
    assert AgentConfig(preset="small").with_overrides(extraction=seven) == cfg
    wide = AgentConfig(preset="small", extraction=wide_schema(400, 5, 2))
    assert count_leaves(wide.extraction.root) == 400 and len(wide.extraction.field_groups(wide.answer_tokens)) > 1
    assert wide.answer_tokens <= wide.memory_tokens  # groups cost no window: a reply is bounded by the larger
    explicit = AgentConfig(preset="small", answer_tokens=48, extraction=seven)
    assert explicit.answer_tokens == 48 and len(explicit.extraction.field_groups(48)) > 1


def test_a_leaf_that_cannot_fit_is_refused_naming_it_and_the_flag(tmp_path, capsys):
    """An answer budget under the smallest group is refused with one line naming the leaf and the flag."""
    from memagent_cli.main import main

    wide = {"type": "object", "properties": {"sec": {"type": "object", "properties": {
        "code": {"enum": ["a" * 90, "b"]}, "note": {"type": "string"}}}}}
    with pytest.raises(ValueError, match=r"answer_tokens=20 cannot hold field 'sec\.code'.*raise answer_tokens to"):
        AgentConfig(preset="small", answer_tokens=20, extraction=wide)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(wide))
    assert main(["batch", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--schema", str(path),
                 "--answer-tokens", "20"]) == 2
    err = capsys.readouterr().err
    assert "--answer-tokens=20 cannot hold field 'sec.code'" in err and err.count("\n") == 1, err


def test_the_memory_question_of_a_wide_schema_is_compact_and_complete():
    """A schema split into groups, or whose full question is over its share of the window, asks its memory updates
    with every leaf named once (objects in braces); one that fits both asks with the full question, as before."""
    from memagent.extraction.schema import MEMORY_QUESTION_TOKENS

    schema = schema_from(wide_schema(200, 3, 1))
    q = schema.memory_question(200)
    assert q != schema.question() and len(q) < len(schema.question()) / 2
    for path, _, _ in iter_leaves(schema.fields, {}):
        assert path.rsplit(".", 1)[-1] in q
    assert len(schema.question().encode()) > 3 * MEMORY_QUESTION_TOKENS and schema.memory_question(10**6) == q
    small = schema_from(wide_schema(20, 3, 1))
    assert small.memory_question(10**6) == small.question()


def test_the_batch_command_reports_the_grouping_before_the_job(tmp_path, capsys, monkeypatch):
    """``memagent batch`` with a wide schema says on stderr how many answer groups a document gets and what
    each holds, before the job starts."""
    import pipelines.batch_qa
    from memagent_cli.main import main

    def stop(*a, **k):
        raise SystemExit(3)

    monkeypatch.setattr(pipelines.batch_qa, "run_batch_qa", stop)
    path = tmp_path / "s.json"
    path.write_text(json.dumps(wide_schema(120, 4)))
    with pytest.raises(SystemExit):
        main(["batch", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--schema", str(path)])
    err = capsys.readouterr().err
    groups = AgentConfig(preset="small", extraction=wide_schema(120, 4))
    n = len(groups.extraction.field_groups(groups.answer_tokens))
    assert n > 1 and f"in {n} answer groups" in err and err.count("\n  group ") == n, err


def test_default_budgets_fit_the_packaged_models_window(smollm2_dir):
    """With only the preset and the schema, a 7-field and a 400-leaf schema pass the window check of the packaged
    model (8K tokens): nothing to raise by hand, one flag at a time."""
    from memagent.agent import check_config
    from memagent.engines import EngineConfig
    from memagent.engines.budget import token_budget

    engine = token_budget(EngineConfig(model=str(smollm2_dir)))
    seven = {"type": "object", "properties": {f"field_{i}": {"type": "string", "description": f"the value {i}"}
                                              for i in range(7)}}
    for raw in (seven, wide_schema(400, 21, 2), wide_schema(400, 5)):
        check_config(engine, AgentConfig(preset="small", extraction=raw))
