"""Record types in the extraction schema: accepted shapes, errors with JSON paths, size limits, Arrow types,
and the per-chunk records schema every engine constrains to (memagent/extraction/parse.py, schema.py)."""

from __future__ import annotations

import json

import jsonschema
import pyarrow as pa
import pytest

from memagent.engines.json_schema import MAX_STRING_CHARS, render_schema
from memagent.extraction import (
    KINDS, ExtractionSchema, load_schema, output_fields, record_fields, schema_from, typed_record,
)
from memagent.extraction.parse import MAX_DEPTH, MAX_ENUM_VALUES, MAX_SCHEMA_CHARS

PAYMENTS = {
    "type": "array",
    "description": "Every payment the statement lists",
    "minItems": 0, "x-key": ["payer", "date"],
    "items": {
        "type": "object",
        "properties": {
            "payer": {"type": "string", "description": "Who paid"},
            "date": {"type": "string", "format": "date"},
            "amount": {"type": "number"},
            "count": {"type": "integer"},
            "refunded": {"type": "boolean"},
            "currency": {"enum": ["USD", "EUR"]},
            "notes": {"type": "array", "items": {"type": "string"}},
            "address": {"type": "object", "title": "Address", "properties": {
                "city": {"type": "string"}, "geo": {"type": "object", "properties": {"lat": {"type": "number"}}}},
                "required": ["city"]},
        },
        "required": ["payer", "date", "amount"],
    },
}
SCHEMA = {"type": "object", "properties": {"account": {"type": "string"}, "payments": PAYMENTS},
          "required": ["account"]}


def record_schema(**item_props) -> dict:
    return {"type": "object", "properties": {"payments": {
        "type": "array", "items": {"type": "object", "properties": item_props}}}}


def test_a_record_schema_loads_beside_document_fields():
    schema = ExtractionSchema(SCHEMA)
    assert schema.names == ("account",) and [f.name for f in schema.fields] == ["account"]
    [payments] = schema.record_types
    assert payments.name == "payments" and payments.key == ("payer", "date")
    assert [f.name for f in payments.fields] == list(PAYMENTS["items"]["properties"])
    assert [(p, f.kind) for p, f, _ in payments.leaves({})] == [
        ("payer", "string"), ("date", "date"), ("amount", "number"), ("count", "integer"), ("refunded", "boolean"),
        ("currency", "enum"), ("notes", "string_array"), ("address.city", "string"), ("address.geo.lat", "number")]
    # The final answer is the document-level object; records have their own per-chunk schema.
    assert set(schema.decoding_schema()["properties"]) == {"account"}
    assert [f.name for f in output_fields(schema)] == ["account", "extraction", "field_evidence", "schema_errors",
                                                       "values_cut",
                                                       "n_records_payments", "record_splits", "record_failed_pieces",
                                                       "record_runaway_pieces", "record_invalid_items",
                                                       "grounding_dropped_values", "grounding_dropped_records",
                                                       "record_incomplete", "record_calls", "record_prompt_tokens",
                                                       "record_completion_tokens", "records_payments"]
    question = schema.question()
    assert "- account (text, required)" in question and "- payments: records identified by payer, date" in question
    assert "  - address (object)" in question and "    - city (text, required)" in question
    assert "[] when it states none" in schema.records_instruction("payments")
    assert ExtractionSchema.model_validate_json(json.dumps(SCHEMA)) == schema  # reads back from the config column
    assert ExtractionSchema({"type": "object", "properties": {"payments": PAYMENTS}}).fields == ()


@pytest.mark.parametrize(("schema", "message"), [
    (record_schema(a={"type": "object", "properties": {"b": {"type": "object", "properties": {"c": {
        "type": "object", "properties": {"d": {"type": "object", "properties": {"e": {"type": "object", "properties": {
            "f": {"type": "object", "properties": {"g": {"type": "string"}}}}}}}}}}}}}),
     "properties.payments.items.properties.a.properties.b.properties.c.properties.d.properties.e.properties.f: "
     "objects nest at most 6 levels"),
    (record_schema(lines={"type": "array", "items": {"type": "object", "properties": {"x": {"type": "string"}}}}),
     "properties.payments: record type 'payments' holds record types but no scalar property to tie them to it"),
    (record_schema(tags={"type": "array", "items": {"type": "array", "items": {"type": "string"}}}),
     "properties.payments.items.properties.tags.items: an array of arrays"),
    (record_schema(), "properties.payments.items.properties: an object needs at least one property"),
    ({"type": "object", "properties": {"payments": {**PAYMENTS, "x-key": ["nope"]}}},
     "properties.payments.x-key: names 'nope', which is not a property of the items"),
    ({"type": "object", "properties": {"payments": {**PAYMENTS, "x-key": ["count"]}}},
     "properties.payments.x-key: key property 'count' must be a required scalar"),
    ({"type": "object", "properties": {"payments": {**PAYMENTS, "x-key": ["address"]}}},
     "key property 'address' must be a required scalar"),
    ({"type": "object", "properties": {"payments": {**PAYMENTS, "x-key": "payer"}}},
     "properties.payments.x-key: must be a list of distinct property names"),
    ({"type": "object", "properties": {"payments": {**PAYMENTS, "maxItems": -1}}},
     "properties.payments.maxItems: not a valid JSON Schema: -1 is less than the minimum of 0"),
    ({"type": "object", "properties": {"payments": {**PAYMENTS, "items": {**PAYMENTS["items"], "required": ["x"]}}}},
     "properties.payments.items.required: required names property 'x'"),
    (record_schema(record_index={"type": "integer"}),
     "properties.payments.items.properties.record_index: property 'record_index' clashes with a column"),
    (record_schema(**{"x\ny": {"type": "string"}}), "a property name must be a non-empty string"),
    (record_schema(**{"n" * 65: {"type": "string"}}), "a property name has at most 64 characters"),
])
def test_record_schema_errors_name_the_json_path(schema, message):
    with pytest.raises(ValueError) as err:
        schema_from(schema)
    text = str(err.value)
    assert message in text and "\n" not in text


def test_huge_and_deep_schemas_are_one_line_errors_at_load(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)  # json.loads alone raises RecursionError
    big_enum = {"type": "object", "properties": {"code": {"enum": [f"v{i}" for i in range(5000)]}}}
    huge = {"type": "object", "properties": {"a": {"type": "string", "description": "x" * 5_000_000}}}
    cases = {deep: f"nested more than {MAX_DEPTH} levels deep",
             tmp_path / "enum.json": (big_enum, f"enum has 5000 values, at most {MAX_ENUM_VALUES}"),
             tmp_path / "huge.json": (huge, f"larger than {MAX_SCHEMA_CHARS // 1024} KiB"),
             tmp_path / "nest.json": ({"type": "object", "properties": {"a": _nested(200)}}, "nested more than")}
    for path, expected in cases.items():
        if isinstance(expected, tuple):
            path.write_text(json.dumps(expected[0]))
            expected = expected[1]
        with pytest.raises(ValueError) as err:
            load_schema(path)
        text = str(err.value)
        assert text.startswith(f"schema file {path}: ") and expected in text and "\n" not in text, text
        assert len(text) < 400, text
    # The same data given as a Python object (a flow parameter, AgentConfig) is refused the same way.
    for data in (_nested(100_000), huge, big_enum):
        with pytest.raises(ValueError, match="nested more than|larger than|enum has") as err:
            schema_from(data)
        assert "\n" not in str(err.value)


def _nested(depth: int) -> dict:
    node: dict = {"type": "string"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}}
    return node


def test_arrow_types_of_a_record_row():
    [payments] = ExtractionSchema(SCHEMA).record_types
    types = {f.name: f.type for f in record_fields(payments)}
    assert types == {
        "payer": pa.string(), "date": pa.date32(), "amount": pa.float64(), "count": pa.int64(),
        "refunded": pa.bool_(), "currency": pa.string(), "notes": pa.list_(pa.string()),
        "address": pa.struct([("city", pa.string()), ("geo", pa.struct([("lat", pa.float64())]))])}
    row = typed_record(payments, {"payer": "Ann", "date": "2021-03-14", "amount": 5, "address": {"city": "Oslo"}})
    table = pa.Table.from_pylist([row], schema=pa.schema(record_fields(payments)))
    assert table.column("date")[0].as_py().isoformat() == "2021-03-14" and table.column("amount")[0].as_py() == 5.0
    assert table.column("address")[0].as_py() == {"city": "Oslo", "geo": None}
    assert {name: k.arrow for name, k in KINDS.items()}["date"] == pa.date32()


def test_the_records_schema_is_an_array_of_items_bounded_by_render_schema():
    schema = ExtractionSchema(SCHEMA)
    records = json.loads(schema.records_schema_json("payments"))
    assert records["type"] == "array" and records["maxItems"] == 50
    assert "x-key" not in json.dumps(records) and "title" not in records["items"]["properties"]["address"]
    good = [{"payer": "Ann", "date": "2021-03-14", "amount": 5.5, "notes": ["a"], "address": {"city": "Oslo"}}]
    validator = jsonschema.Draft202012Validator(records, format_checker=jsonschema.FormatChecker())
    assert not list(validator.iter_errors(good)) and not list(validator.iter_errors([]))
    for bad in ([{"payer": "Ann", "date": "2021-13-01", "amount": 1}], [{"payer": "Ann", "amount": 1}],
                [{"payer": "Ann", "date": "2021-03-14", "amount": 1, "extra": 1}], {"payer": "Ann"}):
        assert list(validator.iter_errors(bad)), bad
    rendered = render_schema(schema.records_schema_json("payments"))
    item = rendered["items"]
    assert rendered["maxItems"] == 50 and item["additionalProperties"] is False
    assert item["properties"]["payer"]["maxLength"] == MAX_STRING_CHARS
    assert item["properties"]["address"]["properties"]["geo"]["additionalProperties"] is False
    with pytest.raises(KeyError, match="no record type 'parties'"):
        schema.records_schema("parties")
