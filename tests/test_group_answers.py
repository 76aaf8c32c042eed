"""Final answers valid by construction (issue 64) and a group reply that breaks anyway (issue 50: the 400-leaf run
on the packaged model lost its row to 2 of 21 group replies cut at answer_tokens).

Each final call's grammar is bounded to its budget, so a perfect model's reply always closes: a value longer than
its bound is kept cut there and named in ``values_cut``. A reply that breaks anyway (a server that ignores the
bounds) has its group asked again in halves, for any number of groups, and a leaf that breaks even alone is left
out and named while the rest of the row is kept.

Read by a perfect model in process (memagent_testing/oracle/servers.OracleEngine, which honours the request's bounds and
cuts a reply at ``max_tokens`` as a server does) of generated wide schemas (memagent_testing/wide_schemas.py) whose
free-text values are drawn near the grammar's 200-character bound, far past the size the groups are packed by.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from memagent.batch import answer_row
from memagent.extraction import schema_from
from memagent.engines.base import Completion
from memagent.extraction.groups import smallest_group_tokens
from memagent.extraction.parse import iter_leaves
from memagent.extraction.resolve import without_nulls
from memagent.extraction.group_answers import halves
from memagent_testing.oracle.servers import OracleEngine
from tests.test_schema_resolve import flatten
from memagent_testing.wide_schemas import WideReader, gold_for, reader_config, statement, wide_schema

WIDE = st.tuples(st.integers(50, 300), st.integers(0, 10**6))
QUICK = settings(max_examples=6, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@settings(max_examples=40, deadline=None)
@given(WIDE, st.integers(0, 300))
def test_halves_split_a_group_s_leaves_in_two_in_order(drawn, extra):
    """Each group of more than one leaf halves into two non-empty groups whose leaves, in order, are the group's;
    a single leaf has no halves."""
    leaves, seed = drawn
    schema = schema_from(wide_schema(leaves, seed))
    for group in schema.field_groups(smallest_group_tokens(schema.fields) + extra):
        pair = halves(group)
        if len(group.leaves()) == 1:
            assert pair is None
            continue
        assert pair is not None and all(p.leaves() for p in pair)
        assert pair[0].leaves() + pair[1].leaves() == group.leaves()


class _NoBounds(OracleEngine):
    """A server whose grammar ignores string bounds (``maxLength``): a long value can run a reply past its budget."""

    async def chat(self, messages, params):
        if params.json_schema is not None:
            params = replace(params, json_schema=json.dumps(_unbounded(json.loads(params.json_schema))))
        return await super().chat(messages, params)


def _unbounded(node):
    if isinstance(node, dict):
        return {k: _unbounded(v) for k, v in node.items() if k != "maxLength"}
    return [_unbounded(v) for v in node] if isinstance(node, list) else node


def _cut_paths(gold: dict, got: dict, prefix: str = "") -> list[str]:
    """The paths where ``got`` differs from ``gold``, each asserted to be a value cut short: a prefix of the
    gold string, or of the gold array."""
    out = []
    for k, v in gold.items():
        if isinstance(v, dict):
            out += _cut_paths(v, got.get(k) or {}, f"{prefix}{k}.")
        elif got.get(k) != v:
            assert isinstance(v, (str, list)) and type(got.get(k)) is type(v) and v[:len(got[k])] == got[k], \
                (k, v, got.get(k))
            out.append(prefix + k)
    return out


@QUICK
@given(WIDE, st.integers(0, 400), st.floats(0.5, 1.0))
def test_every_reply_of_the_perfect_model_closes_and_a_cut_value_is_kept_and_named(tokenizer, drawn, extra, long):
    """Under every answer budget, each constrained final reply of the perfect model closes within max_tokens (never
    cut, never asked again); a value longer than its bound is kept, cut at the bound, and named with its path in
    ``values_cut`` (a value named there that is whole reached its bound exactly); every other value is the gold."""
    leaves, seed = drawn
    raw = wide_schema(leaves, seed)
    schema = schema_from(raw)
    gold = gold_for(raw, seed, long=long)
    doc, _ = flatten(schema, gold)
    reader = WideReader(without_nulls(doc), {})
    budget = smallest_group_tokens(schema.fields) + extra
    row = asyncio.run(answer_row(OracleEngine(reader.reply, tokenizer), {"id": "d", "context": statement(gold)},
                                 reader_config(raw, budget)))
    assert row["error"] is None and row["schema_errors"] == [], (row["error"], row["schema_errors"])
    answers = [s for s in row["steps"] if s["kind"] == "answer"]
    assert len(answers) == reader.final_calls == len(schema.field_groups(budget))
    assert all(s["finish_reason"] == "stop" for s in answers)
    got = json.loads(row["extraction"])
    cut = _cut_paths(gold, got)
    event(f"values cut: {'none' if not cut else 'some'}")
    named = [v.split(":", 1)[0] for v in row["values_cut"]]
    assert set(cut) <= set(named) and len(named) == len(set(named))


@QUICK
@given(WIDE, st.integers(0, 60), st.floats(0.5, 1.0))
def test_a_reply_that_breaks_anyway_is_asked_again_in_halves(tokenizer, drawn, extra, long):
    """Behind a server that ignores string bounds, long values cut some group replies at answer_tokens; the halves
    asked again give the gold object whole, every call one answer step, nothing left out."""
    leaves, seed = drawn
    raw = wide_schema(leaves, seed)
    schema = schema_from(raw)
    gold = gold_for(raw, seed, long=long)
    doc, _ = flatten(schema, gold)
    reader = WideReader(without_nulls(doc), {})
    budget = max(smallest_group_tokens(schema.fields) + extra, 120)
    row = asyncio.run(answer_row(_NoBounds(reader.reply, tokenizer), {"id": "d", "context": statement(gold)},
                                 reader_config(raw, budget)))
    assert row["error"] is None, row["error"]
    assert json.loads(row["extraction"]) == gold and row["schema_errors"] == []
    groups = schema.field_groups(budget)
    answers = [s for s in row["steps"] if s["kind"] == "answer"]
    assert len(answers) == reader.final_calls >= len(groups) > 1
    cut = sum(s["finish_reason"] == "length" for s in answers)
    event(f"group replies cut: {'none' if not cut else 'some'}")
    assert len(answers) == len(groups) + 2 * cut  # each cut reply's group asked again as two halves


def _with_note(raw: dict, required: bool) -> dict:
    raw = json.loads(json.dumps(raw))
    raw["properties"]["note"] = {"type": "string"}
    if required:
        raw["required"] = [*raw.get("required", []), "note"]
    return raw


def test_a_leaf_that_breaks_alone_is_named_and_the_rest_kept(tokenizer):
    """Behind a server that ignores string bounds, a value whose reply alone runs past answer_tokens (400 digits:
    one token each) is left out and named in
    ``schema_errors``, every other value kept; when the user's schema requires it, the row is an
    ``invalid_output`` error row that names it."""
    for required in (False, True):
        raw = _with_note(wide_schema(120, 7), required)
        schema = schema_from(raw)
        gold = {**gold_for(raw, 7), "note": "1234567890" * 40}
        doc, _ = flatten(schema, gold)
        reader = WideReader(without_nulls(doc), {})
        budget = smallest_group_tokens(schema.fields)  # every value its least room: the gold fits but the note
        row = asyncio.run(answer_row(_NoBounds(reader.reply, tokenizer), {"id": "d", "context": statement(gold)},
                                     reader_config(raw, budget)))
        why = f"note: no value: its reply ran past answer_tokens={budget} alone and was cut"
        if required:
            assert row["error"].startswith("invalid_output: ") and why in row["error"], row["error"]
            continue
        assert row["error"] is None, row["error"]
        assert row["schema_errors"] == [why]
        assert json.loads(row["extraction"]) == {k: v for k, v in gold.items() if k != "note"}


class _NoStructuredOutputs(OracleEngine):
    """A server that ignores the schema and answers in prose (no structured outputs)."""

    async def chat(self, messages, params):
        if params.json_schema is None:
            return await super().chat(messages, params)
        self.calls += 1
        return Completion(text="I could not find these values.", prompt_tokens=0, completion_tokens=7,
                          finish_reason="stop")


def test_every_leaf_broken_is_named_once_never_a_silently_empty_row(tokenizer):
    """A server whose every final reply is prose, not JSON: each leaf is named once in ``schema_errors`` as no
    JSON object (a row of nulls), never a silently empty row."""
    raw = wide_schema(80, 3)
    raw["required"] = []
    schema = schema_from(raw)
    engine = _NoStructuredOutputs(lambda prompt: "The memory holds nothing.", tokenizer)
    row = asyncio.run(answer_row(engine, {"id": "d", "context": "Nothing is stated here."}, reader_config(raw, 120)))
    assert row["error"] is None, row["error"]
    paths = [p for p, _, _ in iter_leaves(schema.fields, {})]
    assert sorted(row["schema_errors"]) == sorted(f"{p}: no value: its reply was no JSON object" for p in paths)
    assert json.loads(row["extraction"]) == {}


def test_a_schema_of_one_group_is_asked_again_in_halves_too(tokenizer):
    """A schema whose fields fit one reply: behind a server that ignores string bounds, a value that runs the
    reply past answer_tokens no longer costs the row: the group is asked again in halves, the long value named,
    every other value kept."""
    raw = {"type": "object", "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                                            "note": {"type": "string"}, "year": {"type": "integer"}}}
    schema = schema_from(raw)
    gold = {"name": "Harlow Freight", "city": "Leeds", "note": "1234567890" * 60, "year": 2021}
    reader = WideReader(gold, {})
    budget = 300
    assert len(schema.field_groups(budget)) == 1
    row = asyncio.run(answer_row(_NoBounds(reader.reply, tokenizer), {"id": "d", "context": statement(gold)},
                                 reader_config(raw, budget)))
    assert row["error"] is None, row["error"]
    assert json.loads(row["extraction"]) == {k: v for k, v in gold.items() if k != "note"}
    assert row["schema_errors"] == [f"note: no value: its reply ran past answer_tokens={budget} alone and was cut"]
    answers = [s for s in row["steps"] if s["kind"] == "answer"]
    assert answers[0]["finish_reason"] == "length" and len(answers) > 1
