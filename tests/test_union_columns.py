"""Unions that no one column type holds (issue 64: a résumé's ``skills``, a list or an object of lists, was refused):
a ``json`` column holding the value's JSON text, the value itself in ``extraction``, checked against the user's union.

Schemas and values are generated (Hypothesis): unions of a list of texts, an object with properties, a map of
lists of texts, a text and a whole number, at least one branch an object or a map. The perfect model answers the
final call with the drawn value; the hf grammar (llguidance over the packaged tokenizer) is checked to accept it
under the call's budgeted schema.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent.batch import answer_row
from memagent.config import AgentConfig
from memagent.engines.json_schema import longest_bytes, render_schema
from memagent.extraction import output_fields, schema_from
from memagent.extraction.kinds import JSON_TEXT_METADATA
from memagent_testing.oracle.servers import OracleEngine

WORD = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=12)
BRANCHES = {
    "list": ({"type": "array", "items": {"type": "string"}}, st.lists(WORD, max_size=3)),
    "object": ({"type": "object", "properties": {"name": {"type": "string"}, "level": {"type": "integer"}},
                "required": ["name"]},
               st.fixed_dictionaries({"name": WORD}, optional={"level": st.integers(0, 10)})),
    "map": ({"type": "object", "description": "lists by category",
             "additionalProperties": {"type": "array", "items": {"type": "string"}}},
            st.dictionaries(WORD, st.lists(WORD, max_size=2), max_size=2)),
    "text": ({"type": "string"}, WORD),
    "number": ({"type": "integer"}, st.integers(-1000, 1000)),
}
# At least one object: a text or a number with a list of texts is the older value-or-list column (a string column,
# resolve.py), and objects only are merged into one struct.
UNIONS = st.lists(st.sampled_from(sorted(BRANCHES)), min_size=2, max_size=3, unique=True).filter(
    lambda names: any(n in ("object", "map") for n in names) and set(names) != {"object", "map"})


@st.composite
def union_and_value(draw):
    names = draw(UNIONS)
    word = draw(st.sampled_from(("anyOf", "oneOf")))
    schema = {"type": "object", "properties": {"u": {word: [BRANCHES[n][0] for n in names],
                                                     "evaluation_config": "array_llm"}}}
    value = draw(BRANCHES[draw(st.sampled_from(names))][1])
    if word == "oneOf" and sum(_valid(BRANCHES[n][0], value) for n in names) != 1:
        word = "anyOf"  # a value two branches take is no oneOf value
        schema["properties"]["u"] = {"anyOf": schema["properties"]["u"]["oneOf"]}
    return schema, value


def _valid(node, value) -> bool:
    return jsonschema.Draft202012Validator(node).is_valid(value)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


class _Recording(OracleEngine):
    """The perfect model, keeping the final call's sampling parameters."""

    finals: list = []

    async def chat(self, messages, params):
        if params.json_schema is not None:
            self.finals.append(params)
        return await super().chat(messages, params)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(union_and_value())
def test_a_union_without_one_column_type_is_a_json_text_column_of_the_user_s_union(tokenizer, drawn):
    """Any union of an object or a map with other types loads (never refused), its column holds the value's JSON
    text (the Arrow field says so), ``extraction`` holds the value valid under the user's union, and the final
    call's grammar closes within its budget."""
    raw, value = drawn
    schema = schema_from(raw)
    [spec] = schema.fields
    assert spec.kind == "json"
    [field] = [f for f in output_fields(schema) if f.name == "u"]
    assert field.metadata == JSON_TEXT_METADATA
    engine = _Recording(lambda p: "noted" if "Updated memory" in p else json.dumps({"u": value}), tokenizer)
    engine.finals = []
    config = AgentConfig(chunk_tokens=256, memory_tokens=256, query_tokens=512, extraction=raw)
    row = asyncio.run(answer_row(engine, {"id": "d", "context": "The value is stated here."}, config))
    assert row["error"] is None and row["schema_errors"] == [], (row["error"], row["schema_errors"])
    [params] = engine.finals
    assert longest_bytes(render_schema(json.loads(params.json_schema))) <= params.max_tokens == config.answer_tokens
    got = json.loads(row["extraction"])["u"]
    assert _valid(raw["properties"]["u"], got)
    if not row["values_cut"]:
        assert got == value and json.loads(row["u"]) == value


def test_the_hf_grammar_takes_a_map_of_lists_under_its_budget(tokenizer):
    """The budgeted grammar of a list-or-map union (a map's keys held to a pattern) accepts a map of lists and a
    list, and refuses a map with more keys than its bound."""
    from memagent.engines.grammar import make_constraint

    raw = {"type": "object", "properties": {"skills": {"anyOf": [BRANCHES["list"][0], BRANCHES["map"][0]]}}}
    schema = schema_from(raw)
    [group] = schema.field_groups(600)
    _, bounded = schema.answer_schemas(group, 600)
    limit = bounded["properties"]["skills"]["anyOf"][1]["maxProperties"]

    def accepts(value) -> bool:
        constraint = make_constraint(json.dumps(bounded), tokenizer, len(tokenizer))
        ids = tokenizer(json.dumps({"skills": value}, separators=(",", ":")), add_special_tokens=False)["input_ids"]
        return all(constraint.accept(i) for i in ids) and constraint.is_finished()

    assert accepts({"Languages": ["Python", "Go"]}) and accepts(["Python"])
    assert not accepts({f"k{i}": [] for i in range(limit + 1)})
