"""The JSON Schema users already have (Pydantic models, $defs, anyOf, nested records) resolved and read back."""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field

from memagent.extraction import ExtractionSchema, load_schema, schema_from
from memagent.extraction.resolve import resolve, without_nulls
from tests.pydantic_models import instances, models


def flatten(schema: ExtractionSchema, gold: dict[str, Any]) -> tuple[dict[str, Any], dict[str, list[dict]]]:
    """The inverse of ``assemble``: a user's object as the job holds it (document values, records per type,
    children carrying their parent's key in link properties). Written from the ``Link`` table alone."""
    types = schema.resolved.types
    doc, records = copy.deepcopy(gold), {t: [] for t in types}

    def take(obj: dict, path: tuple[str, ...]) -> list:
        for name in path[:-1]:
            obj = obj.get(name) if isinstance(obj.get(name), dict) else {}
        return obj.pop(path[-1], None) or []

    for t, link in types.items():  # parents come before their children
        if link.parent is None:
            records[t] = take(doc, link.path)
    for t, link in types.items():
        if link.parent is not None:
            for parent in records[link.parent]:
                records[t] += [{**{a: parent[k] for a, k in link.links}, **c} for c in take(parent, link.path)]
    derived = schema.decoding_schema()["properties"]
    return {k: v for k, v in doc.items() if k in derived}, records


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_generated_pydantic_model_is_accepted_and_reads_back_through_itself(data):
    """Every model the strategy draws is accepted; its gold object, held as the job holds it, passes the
    grammar's schemas (the final object, each record type's items) and assembles back into an object the
    model validates and that equals the gold one."""
    model, fields = data.draw(models())
    gold = data.draw(instances(fields))
    schema = schema_from(model)
    doc, records = flatten(schema, gold)
    doc, records = without_nulls(doc), {t: [without_nulls(r) for r in rs] for t, rs in records.items()}
    assert schema.reply_errors(doc) == []
    for name, found in records.items():
        assert schema.valid_records(name, found) == (found, 0), name
    whole = schema.assemble(doc, records)
    assert schema.errors(whole) == []
    assert model.model_validate(whole) == model.model_validate(gold)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_schema_file_wrapped_under_one_key_reads_as_the_schema_it_wraps(tmp_path_factory, data):
    """A file holding a schema under `schema` (OpenAI's json_schema object), `json_schema` or
    `schema_definition` (ExtractBench), beside a name and description, gives the same fields and records as
    the bare schema; two wrapper keys are not guessed between, and the refusal names the file."""
    model, _ = data.draw(models())
    bare = model.model_json_schema()
    keys = data.draw(st.lists(st.sampled_from(["schema", "json_schema", "schema_definition"]), min_size=1,
                              max_size=2))
    wrapped: Any = bare
    for key in keys:
        wrapped = {"name": "x", "description": "a wrapper", key: wrapped, "strict": True}
    path = tmp_path_factory.mktemp("wrapped") / "s.json"
    path.write_text(json.dumps(wrapped))
    got, want = load_schema(path), schema_from(bare)
    assert (got.fields, got.resolved) == (want.fields, want.resolved)
    path.write_text(json.dumps({"schema": bare, "schema_definition": bare}))
    with pytest.raises(ValueError, match=r"schema file .*s\.json"):
        load_schema(path)


class Party(BaseModel):
    name: str
    role: Optional[str] = None


class Line(BaseModel):
    item: str
    amount: float = Field(ge=0)


class Invoice(BaseModel):
    number: str = Field(description="invoice number")
    issued: dt.date
    lines: list[Line] = []


class Filing(BaseModel):
    lender: Party
    borrowers: list[Party]
    invoices: list[Invoice]
    total: int | float | None


def test_a_nested_pydantic_model_resolves_to_record_types_tied_to_their_parent():
    schema = load_schema(Filing)
    assert [f.name for f in schema.fields] == ["lender", "total"]
    assert [r.name for r in schema.record_types] == ["borrowers", "invoices", "invoices.lines"]
    lines = schema.record_type("invoices.lines")
    assert lines.key == () and [f.name for f in lines.fields] == ["invoices_number", "item", "amount"]
    assert schema.record_type("invoices").key == ("number",)  # the first required scalar, by default
    whole = schema.assemble({"lender": {"name": "Acme"}, "total": 3},
                            {"invoices": [{"number": "A-1", "issued": "2024-01-02"}],
                             "invoices.lines": [{"invoices_number": "a-1", "item": "bolts", "amount": 2.5}]})
    assert Filing.model_validate(whole).invoices[0].lines == [Line(item="bolts", amount=2.5)]
    assert "role" not in whole["lender"] and whole["borrowers"] == []


def test_model_spec_loads_from_a_module(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text("from pydantic import BaseModel\nclass Deal(BaseModel):\n    party: str\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [f.name for f in load_schema("my_models:Deal").fields] == ["party"]
    with pytest.raises(ValueError, match="has no 'Nope'"):
        load_schema("my_models:Nope")
    with pytest.raises(ValueError, match="module 'no_such_mod' cannot be imported"):
        load_schema("no_such_mod:Deal")


def test_a_recursive_ref_is_refused_naming_the_cycle():
    node = {"type": "object", "properties": {"name": {"type": "string"},
                                             "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}}
    with pytest.raises(ValueError, match=r"recursive \$ref '#/\$defs/Node' \(Node -> Node\)"):
        resolve({"type": "object", "$defs": {"Node": node}, "properties": {"root": {"$ref": "#/$defs/Node"}}})


def test_annotations_are_listed_never_refused_and_constraints_are_checked_after_decoding():
    schema = ExtractionSchema({"type": "object", "x-tool": {"v": 1}, "properties": {
        "mail": {"type": "string", "format": "email", "examples": ["a@b.co"], "deprecated": False},
        "id_code": {"type": "string", "format": "uuid", "default": "x"},
        "n": {"type": ["integer", "null"], "minimum": 2},
        "kind": {"const": 3}}})
    assert schema.resolved.annotations == ("default", "deprecated", "examples", "x-tool")
    assert schema.decoding_schema()["properties"]["mail"]["pattern"]  # a format the grammar enforces as a pattern
    obj, dropped = schema.resolved.conform_document({"mail": "a@b.co", "id_code": "not-a-uuid", "n": 1, "kind": 3})
    assert obj == {"mail": "a@b.co", "kind": 3} and [d.split(":")[0] for d in dropped] == ["id_code", "n"]


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "object", "properties": {"a": {"$ref": "https://x.org/s.json"}}}, "remote schemas are not fetched"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "patternProperties": {"^x": {}}},
     "'patternProperties' (properties named by a pattern)"),
    ({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}}},
     "properties.a.items: an array of arrays"),
])
def test_constructs_that_cannot_be_columns_are_refused_in_one_line_naming_them(schema, message):
    with pytest.raises(ValueError) as err:
        schema_from(schema)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_records_union_of_objects_merges_their_properties():
    """LangExtract's shape: an array whose items are anyOf objects, with null unions inside."""
    schema = ExtractionSchema({"type": "object", "properties": {"extractions": {"type": "array", "items": {"anyOf": [
        {"type": "object", "properties": {"person": {"type": "string"}, "person_attributes": {
            "anyOf": [{"type": "object", "properties": {"age": {"type": "string"}}}, {"type": "null"}]}}},
        {"type": "object", "properties": {"place": {"type": "string"}}}]}}}})
    [extractions] = schema.record_types
    assert [p for p, _, _ in extractions.leaves({})] == ["person", "person_attributes.age", "place"]
    assert json.loads(schema.records_schema_json("extractions"))["items"]["required"] == []


def test_langextract_schemas_from_its_own_builder_are_accepted():
    """The schema LangExtract's OpenAI provider builds from examples (an array of anyOf objects, attributes
    as anyOf unions of lists, scalars and null) is accepted as one record type of every class's fields."""
    import langextract as lx
    from langextract.providers.schemas.openai import OpenAISchema

    examples = [lx.data.ExampleData(text="Romeo loves Juliet.", extractions=[
        lx.data.Extraction("character", "Romeo", attributes={"mood": "loving", "aliases": ["Montague"]}),
        lx.data.Extraction("relation", "loves", attributes={"strength": 3})]),
        lx.data.ExampleData(text="Juliet, a Capulet.", extractions=[
            lx.data.Extraction("character", "Juliet", attributes={"mood": "hopeful", "aliases": "Capulet"})])]
    built = OpenAISchema.from_examples(examples).schema_dict
    schema = schema_from(built)
    [extractions] = schema.record_types
    leaves = {p: f.kind for p, f, _ in extractions.leaves({})}
    assert leaves["character"] == "string" and leaves["character_attributes.aliases"] == "string"
    ok, bad = schema.valid_records("extractions", [{"character": "Romeo", "character_attributes": {
        "mood": "sad", "aliases": ["Montague"]}}, {"relation": "loves", "relation_attributes": {"strength": 3}}])
    assert bad == 0 and len(ok) == 2


_JSON = st.recursive(st.none() | st.integers() | st.text(max_size=3),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner,
                                                                                 max_size=3),
                     max_leaves=30)


def _nulls_out(obj: Any) -> Any:
    """The rule written out: nulls leave objects, objects inside objects walked, arrays kept."""
    return {k: _nulls_out(v) for k, v in obj.items() if v is not None} if isinstance(obj, dict) else obj


@settings(deadline=None)
@given(_JSON)
def test_without_nulls_takes_nulls_out_of_objects_and_leaves_its_input(value):
    """without_nulls drops every null property of objects inside objects (not inside arrays) and edits no input."""
    before = copy.deepcopy(value)
    assert without_nulls(value) == _nulls_out(value)
    assert value == before


def test_without_nulls_walks_a_reply_deeper_than_the_recursion_limit():
    """An object nested 5,000 deep (a model's reply) comes back with its nulls out, not a RecursionError."""
    root: dict[str, Any] = {}
    node = root
    for _ in range(5_000):
        node["a"], node["b"] = {}, None
        node = node["a"]
    out, depth = without_nulls(root), 0
    while out:
        assert "b" not in out
        out, depth = out["a"], depth + 1
    assert depth == 5_000
