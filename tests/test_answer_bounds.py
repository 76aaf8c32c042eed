"""Budgeted grammars (issue 64, item 3): a final reply bounded by :func:`bound_to_budget` always closes inside its
token budget, whatever the schema and whatever text its strings hold.

Schemas are generated (Hypothesis): objects nested in objects, texts, numbers, whole numbers, dates, enums, lists
of texts and maps of lists of texts, optional or required; values are drawn to fill every bound (any Unicode text
but control characters, which the bounded grammar refuses), cut where the grammar would cut them, and counted with
the packaged tokenizer.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from memagent.engines.json_schema import (
    FORMAT_PATTERNS, MIN_BUDGET_CHARS, MIN_BUDGET_ITEMS, TEXT_PATTERN, bound_to_budget, budget_bounds, longest_bytes,
    render_schema, text_bounded,
)
from memagent.extraction.schema import INPUT_COLUMNS
from memagent.result_schema import EXTRA_OUTPUT_COLUMNS, RESULT_COLUMNS
from memagent_testing.oracle.records_oracle import constrain

TEXT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=0, max_size=400)
LEAVES = st.sampled_from([
    {"type": "string"}, {"type": "number"}, {"type": "integer"}, {"type": "boolean"},
    {"type": "string", "format": "date"}, {"enum": ["open", "closed", "pending review"]},
    {"type": "array", "items": {"type": "string"}},
    {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
    *({"type": "string", "pattern": p} for p in FORMAT_PATTERNS.values()),  # formats the grammar holds to patterns
    {"type": "array", "items": {"type": "string", "pattern": FORMAT_PATTERNS["uri"]}},
])
# Not a name the job's columns take (``question``, ``error``, ...): such a schema is refused, naming the column.
NAME = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12).filter(
    lambda n: n not in (*INPUT_COLUMNS, *RESULT_COLUMNS, *EXTRA_OUTPUT_COLUMNS))


def _objects(children):
    return st.dictionaries(NAME, children, min_size=1, max_size=5).map(
        lambda props: {"type": "object", "properties": props, "required": sorted(props)[: len(props) // 2]})


SCHEMAS = _objects(st.recursive(LEAVES, _objects, max_leaves=12))


def _fill(node, draw):
    """A value of ``node`` that reaches every bound (strings of any Unicode text, arrays and maps full)."""
    if "enum" in node:
        return draw(st.sampled_from(node["enum"]))
    kind = node.get("type")
    if kind == "string" and node.get("pattern") in FORMAT_PATTERNS.values():
        return draw(st.from_regex(node["pattern"], fullmatch=True))
    if kind == "string":
        return "2021-03-14" if node.get("format") == "date" else draw(TEXT)
    if kind == "number":
        return -999999999999999.5
    if kind == "integer":
        return -10**15
    if kind == "boolean":
        return False
    if kind == "array":
        return [_fill(node["items"], draw) for _ in range(node.get("maxItems", 20))]
    if "patternProperties" in node:
        [value] = node["patternProperties"].values()
        return {draw(TEXT.filter(bool)) + str(i): _fill(value, draw) for i in range(node.get("maxProperties", 20))}
    return {k: _fill(v, draw) for k, v in node.get("properties", {}).items()}


def _cut(value, node):
    """``value`` as the grammar ends it: :func:`constrain` (strings and arrays) and map keys at their bound."""
    if isinstance(value, dict) and "patternProperties" in node:
        [(pattern, sub)] = node["patternProperties"].items()
        size = int(pattern.rsplit(",", 1)[1].split("}")[0])
        return {k[:size]: _cut(v, sub) for k, v in list(value.items())[: node["maxProperties"]]}
    if isinstance(value, dict):
        return {k: _cut(v, node["properties"][k]) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v, node["items"]) for v in value[: node["maxItems"]]]
    return constrain(value, node)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(SCHEMAS, st.integers(40, 3000), st.data())
def test_every_reply_the_budgeted_grammar_allows_closes_within_its_budget(tokenizer, schema, budget, data):
    """Under the bounds of :func:`bound_to_budget`, the longest reply the grammar allows is at most ``budget`` bytes,
    and a reply filling every bound with any text tokenizes to at most ``budget`` tokens: it always closes."""
    bounded = render_schema(bound_to_budget(schema, budget))
    chars, items = budget_bounds(text_bounded(schema), budget)
    fits = longest_bytes(render_schema(schema), 0, 0) <= budget
    event(f"empty strings fit: {fits}")
    if not fits:
        return  # not even empty strings fit: the grouping refuses such a leaf (GroupTooLarge)
    assert longest_bytes(bounded) <= budget
    reply = json.dumps(_cut(_fill(bounded, data.draw), bounded), ensure_ascii=False, separators=(",", ":"))
    assert len(tokenizer(reply, add_special_tokens=False)["input_ids"]) <= len(reply.encode()) <= budget
    assert chars >= MIN_BUDGET_CHARS or items <= 2


def test_free_strings_refuse_control_characters_and_keep_their_own_pattern():
    """A budgeted free string takes no control character (no blank-line loop, 4 bytes a character at most); a
    string with a pattern of its own keeps it, with room for 64 characters (a date-time's pattern needs 20)."""
    bounded = bound_to_budget({"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": "string", "pattern": "^[A-Z]+$"}}}, 600)
    assert bounded["properties"]["a"]["pattern"] == TEXT_PATTERN
    assert bounded["properties"]["b"]["pattern"] == "^[A-Z]+$"
    assert bounded["properties"]["a"]["maxLength"] >= MIN_BUDGET_CHARS and bounded["properties"]["b"]["maxLength"] == 64


RESUME = {"type": "object", "properties": {
    "media": {"type": "array", "items": {"type": "string"}},
    "languages": {"type": "array", "items": {"type": "string"}},
    "socialLinks": {"type": "array", "items": {"type": "string", "format": "uri"}},
    "personalInfo": {"type": "object", "properties": {
        "contact": {"type": "object", "properties": {
            "emails": {"type": "array", "items": {"type": "string", "format": "email"}},
            "phones": {"type": "array", "items": {"type": "string"}}}},
        "fullName": {"type": "string"}, "personalStatement": {"type": "string"}}}}}


USER_LEAVES = st.sampled_from([  # leaves as a user writes them: formats, not the grammar's patterns
    {"type": "string"}, {"type": "number"}, {"type": "boolean"}, {"type": "string", "format": "date"},
    {"type": "string", "format": "uri"}, {"type": "string", "format": "email"},
    {"type": "string", "format": "date-time"}, {"type": "array", "items": {"type": "string"}},
    {"type": "array", "items": {"type": "string", "format": "uri"}},
    {"type": "array", "items": {"type": "string", "format": "email"}},
])
USER_SCHEMAS = _objects(st.recursive(USER_LEAVES, _objects, max_leaves=12))


@settings(max_examples=60, deadline=None)
@given(USER_SCHEMAS, st.integers(120, 1500))
@example(RESUME, 200)
@example(RESUME, 360)
@example(RESUME, 700)
def test_every_answer_group_leaves_each_list_two_items_links_and_addresses_too(schema, budget):
    """Under any answer budget the job would run with (at least :func:`smallest_group_tokens`, which a derived
    budget always is), each field group of any reply, bounded to that budget, leaves every list at least two items
    and every text 16 characters (the room the packing counts on): a format's pattern is ASCII, one byte a
    character, so lists of URIs or addresses are not priced out of their group (the résumé's were: 0 items)."""
    from memagent.extraction import schema_from
    from memagent.extraction.groups import group_fields, group_schema, smallest_group_tokens

    extraction = schema_from(schema)
    if not extraction.fields:
        return
    budget = max(budget, smallest_group_tokens(extraction.fields))
    decoding = extraction.decoding_schema()
    for group in group_fields(extraction.fields, budget):
        chars, items = budget_bounds(text_bounded(group_schema(decoding["properties"], group)), budget)
        assert items >= MIN_BUDGET_ITEMS and chars >= MIN_BUDGET_CHARS, (group.describe(), chars, items)


SWIMMING = {"type": "object", "properties": {
    "championship": {"type": "string"},
    "event_details": {"type": "object", "properties": {
        "sex": {"type": "string"}, "length": {"type": "string"}, "category": {"type": "string"}}},
    "age_groups": {"type": "array", "items": {"type": "object", "properties": {
        "age_group": {"type": "string"},
        "results": {"type": "array", "items": {"type": "object", "properties": {
            "rank": {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "time": {"type": "string"},
            "athlete": {"type": "string"}}}}}}}}}


@pytest.mark.slow  # the real hf engine and its grammar over a scripted LM
def test_a_model_looping_inside_a_string_still_gives_a_row_with_its_values():
    """The issue's results table: a model that loops inside a string (which ran the reply past answer_tokens: an
    invalid_output row of nothing) is cut at the string's bound by the grammar; the row holds the values written
    before it and the looping one, cut and named in values_cut, within the default answer budget."""
    import asyncio

    from memagent.batch import answer_row
    from memagent.config import AgentConfig
    from memagent_testing.oracle.scripted_lm import scripted_engine

    looping = ('{"championship":"European Masters Championships 2024","event_details":{"sex":"Women",'
               '"length":"100m","category":"Masters ' + "25-29 " * 300 + '"}}')

    def reply(prompt: str) -> str:
        if "Updated memory" in prompt:
            return "Women 100m Freestyle, European Masters Championships 2024."
        return "[]" if "Reply with a JSON array" in prompt else looping

    config = AgentConfig(preset="small", extraction=SWIMMING)
    row = asyncio.run(answer_row(scripted_engine(reply), {"id": "swim", "context": "Women 100m Freestyle."}, config))
    assert row["error"] is None, row["error"]
    got = json.loads(row["extraction"])
    assert got["championship"] == "European Masters Championships 2024"
    details = got["event_details"]
    assert details["sex"] == "Women" and details["length"] == "100m"
    assert details["category"].startswith("Masters 25-29 25-29") and len(details["category"]) < 300 * 6
    assert [c.split(":")[0] for c in row["values_cut"]] == ["event_details.category"]
    answers = [s for s in row["steps"] if s["kind"] == "answer"]
    assert len(answers) == 1 and answers[0]["finish_reason"] == "stop"
    assert answers[0]["completion_tokens"] <= config.answer_tokens
