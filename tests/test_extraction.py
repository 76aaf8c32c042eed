"""Corpus extraction: schema checks, the one-chain read, typed columns, invalid output, evidence.

The engine here is scripted (a unit-test stand-in for the logic around engines); the constrained
decoding itself is tested with the engines, and end to end in tests/test_extraction_e2e.py.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pyarrow as pa
import pytest
from pydantic import ValidationError

from memagent.agent import check_config, read_document
from memagent.batch import RESULT_COLUMNS, answer_rows, result_schema
from memagent.config import AgentConfig
from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams
from memagent.engines.json_schema import TEXT_PATTERN, longest_bytes, render_schema
from memagent.extraction import ExtractionSchema, field_evidence, load_schema, output_fields, parse_reply
from memagent.extraction.output import InvalidOutput

SCHEMA = {
    "type": "object",
    "properties": {
        "party": {"type": "string", "description": "The client's company name"},
        "effective_date": {"type": "string", "format": "date"},
        "amount": {"type": "number"},
        "term_months": {"type": "integer"},
        "renewal": {"type": "boolean"},
        "law": {"enum": ["New York", "Delaware"]},
        "signatories": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["party", "amount"],
}
CFG = AgentConfig(chunk_tokens=64, memory_tokens=200, answer_tokens=460, query_tokens=200, extraction=SCHEMA)
DOC = ("This agreement is made with Harlow Freight Ltd as the Client. It takes effect on March 14, 2021. "
       "The total fee is USD 48,250 payable in advance. The term is 24 months. Signed by Ann Lee and Bo Kim. "
       "The laws of Delaware govern it. The late fee is USD 250.")
GOOD = {"party": "Harlow Freight Ltd", "effective_date": "2021-03-14", "amount": 48250, "term_months": 24,
        "renewal": True, "law": "Delaware", "signatories": ["Ann Lee", "Bo Kim"]}


class ScriptedEngine(Engine):
    """Memory replies and final replies from functions of the prompt; records every call's params."""

    def __init__(self, tokenizer, memory, answer):
        self.name, self.context_window, self.tokenizer, self.stats = "scripted", 8192, tokenizer, EngineStats()
        self.memory, self.answer, self.calls = memory, answer, []

    async def chat(self, messages, params: SamplingParams) -> Completion:
        prompt = messages[0]["content"]
        self.calls.append((prompt, params))
        text = self.memory(prompt) if "Updated memory" in prompt else self.answer(prompt)
        return Completion(text=text, prompt_tokens=10, completion_tokens=3, finish_reason="stop")


def scripted(tiny_engine, answer, memory=lambda p: "Client Harlow Freight Ltd; fee USD 48,250") -> ScriptedEngine:
    return ScriptedEngine(tiny_engine.tokenizer, memory, answer if callable(answer) else (lambda p: answer))


# -- the schema -------------------------------------------------------------------------------------


def with_props(**props) -> dict:
    return {"type": "object", "properties": props}


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "array", "items": {"type": "string"}}, 'must have "type": "object"'),
    (["party"], "valid dictionary"),
    (with_props(), "has no properties"),
    ({"type": "object"}, "has no properties"),
    ({**with_props(a={"type": "string"}), "anyOf": []}, "anyOf: not a valid JSON Schema: [] should be non-empty"),
    (with_props(address={"type": "object"}), "properties.address.properties: an object needs at least one property"),
    (with_props(size={"description": "no type"}), "property 'size' has no type"),
    (with_props(size={"not": {"type": "string"}}), "properties.size: 'not' (negation) cannot be extracted"),
    (with_props(size={"if": {}, "then": {}}), "properties.size: 'if' (a conditional)"),
    (with_props(m={"type": "object", "additionalProperties": {"type": "string"}}),
     "properties.m.additionalProperties: an object with open keys (a map)"),
    (with_props(m={"$ref": "other.json#/x"}), "remote schemas are not fetched"),
    (with_props(law={"enum": ["A", 3]}), "properties.law.enum: mixes integer and string values"),
    (with_props(law={"type": "integer", "enum": [1.5, "x"]}), "properties.law.enum: mixes number and string values"),
    (with_props(tags={"type": "array", "items": {"type": "number"}}), "property 'tags': an array must have items"),
    (with_props(tags={"type": "array"}), "property 'tags': an array must have items"),
    (with_props(error={"type": "string"}), "property 'error' clashes with a column"),
    (with_props(id={"type": "string"}), "property 'id' clashes with a column"),
    (with_props(field_evidence={"type": "string"}), "property 'field_evidence' clashes"),
    ({**with_props(a={"type": "string"}), "required": ["b"]}, "required names property 'b'"),
])
def test_schema_errors_name_what_is_wrong(schema, message):
    with pytest.raises(ValidationError) as err:
        ExtractionSchema(schema)
    assert message in str(err.value)


def test_every_result_column_is_reserved():
    for name in [*RESULT_COLUMNS, "context", "question", "answers", "node_id", "input_fingerprint", "extraction"]:
        with pytest.raises(ValidationError, match="clashes with a column"):
            ExtractionSchema(with_props(**{name: {"type": "string"}}))


def test_schema_file_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"schema file .*nope.json not found"):
        load_schema(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"schema file .*bad.json is not valid JSON"):
        load_schema(tmp_path / "bad.json")
    (tmp_path / "t.json").write_text(json.dumps(with_props(x={"type": "null"})))
    with pytest.raises(ValueError) as err:
        load_schema(tmp_path / "t.json")
    assert str(err.value).startswith(f"schema file {tmp_path / 't.json'}: properties.x: property 'x': type \"null\"")
    (tmp_path / "ok.json").write_text(json.dumps(SCHEMA))
    assert load_schema(tmp_path / "ok.json").names == tuple(SCHEMA["properties"])


def test_config_records_the_schema_and_checks_budgets():
    assert CFG.answer_style == "json" and CFG.extraction.root == SCHEMA
    assert AgentConfig.model_validate_json(CFG.model_dump_json()) == CFG  # the `config` column reads back
    assert json.loads(CFG.model_dump_json())["extraction"] == SCHEMA
    assert CFG.with_overrides(chunk_tokens=96).extraction == CFG.extraction
    assert AgentConfig(preset="small").with_overrides(memory_tokens=200, answer_tokens=120,
                                                      extraction=SCHEMA).answer_style == "json"
    with pytest.raises(ValidationError, match="memory_tokens=48 cannot hold the 7 field"):
        AgentConfig(memory_tokens=48, answer_tokens=200, extraction=SCHEMA)
    with pytest.raises(ValidationError, match="answer_tokens=5 cannot hold field '.*' of the schema.*the smallest "
                                              "group.*raise answer_tokens to"):  # a wider reply is split in groups
        AgentConfig(memory_tokens=200, answer_tokens=5, extraction=SCHEMA)
    with pytest.raises(ValidationError, match="answer_style must be 'json'"):
        AgentConfig(memory_tokens=200, answer_tokens=200, answer_style="boxed", extraction=SCHEMA)


def test_output_columns_are_typed():
    types = {f.name: f.type for f in output_fields(CFG.extraction)}
    assert types == {"party": pa.string(), "effective_date": pa.date32(), "amount": pa.float64(),
                     "term_months": pa.int64(), "renewal": pa.bool_(), "law": pa.string(),
                     "signatories": pa.list_(pa.string()), "extraction": pa.string(),
                     "field_evidence": types["field_evidence"], "schema_errors": pa.list_(pa.string()),
                     "values_cut": pa.list_(pa.string()),
                     "record_splits": pa.int32(),
                     "record_failed_pieces": pa.int32(), "record_runaway_pieces": pa.int32(),
                     "record_invalid_items": pa.int32(),
                     "grounding_dropped_values": pa.int32(), "grounding_dropped_records": pa.int32(),
                     "record_incomplete": pa.int32(), "record_calls": pa.int32(),
                     "record_prompt_tokens": pa.int32(), "record_completion_tokens": pa.int32()}
    assert [f.name for f in types["field_evidence"].value_type] == ["field", "value", "step", "char_start", "char_end"]
    assert result_schema(CFG).names[:len(RESULT_COLUMNS)] == list(RESULT_COLUMNS)



def _without_bounds(node):
    """A rendered schema less the bounds and defaults :func:`render_schema` and the answer budget add."""
    if isinstance(node, list):
        return [_without_bounds(v) for v in node]
    if not isinstance(node, dict):
        return node
    added = {"maxLength", "maxItems", "minimum", "maximum", "multipleOf"}
    return {k: _without_bounds(v) for k, v in node.items() if k not in added and not (
        k == "pattern" and (node.get("format") == "date" or v == TEXT_PATTERN))}

# -- the read ---------------------------------------------------------------------------------------


def test_one_chain_with_the_field_list_and_a_constrained_answer(tiny_engine):
    engine = scripted(tiny_engine, json.dumps(GOOD))
    result = asyncio.run(read_document(engine, None, DOC, CFG))
    memory_calls = [(p, s) for p, s in engine.calls if "Updated memory" in p]
    (final, final_params), = [(p, s) for p, s in engine.calls if "Updated memory" not in p]
    assert len(memory_calls) == result.n_chunks >= 2  # one chain for all seven fields
    assert all("- effective_date (date, YYYY-MM-DD)" in p and "- party (text, required): The client's company name"
               in p and s.json_schema is None for p, s in memory_calls)
    typed_enum = {**SCHEMA["properties"], "law": {**SCHEMA["properties"]["law"], "type": "string"}}
    sent = json.loads(final_params.json_schema)  # the decoding schema bounded so that every reply closes
    assert longest_bytes(render_schema(sent)) <= CFG.answer_tokens == final_params.max_tokens
    assert _without_bounds(sent) == {**SCHEMA, "properties": typed_enum, "required": ["party", "amount"],
                                     "additionalProperties": False}
    assert "Reply with one JSON object with the keys party, effective_date" in final and "Always give party, amount" \
        in final
    assert json.loads(result.response) == GOOD
    with pytest.raises(ValueError, match="pass question=None"):
        asyncio.run(read_document(engine, "Who?", DOC, CFG))


def test_the_field_list_must_fit_the_query_budget(tiny_engine):
    engine = scripted(tiny_engine, "{}")
    check_config(engine, CFG)
    with pytest.raises(ValueError, match=r"field list is \d+ tokens, over query_tokens=40; raise query_tokens"):
        check_config(engine, CFG.with_overrides(query_tokens=40))


def test_typed_columns_nulls_and_error_rows(tiny_engine):
    replies = {"full": json.dumps(GOOD), "partial": json.dumps({"party": "Harlow Freight Ltd", "amount": 12.5}),
               "wrong": json.dumps({"party": "X", "amount": "a lot"})}
    rows = [{"id": k, "context": DOC, "question": "passes through", "x": i} for i, k in enumerate(replies)]
    rows.append({"id": "empty", "context": " ", "question": None, "x": 9})
    engine = scripted(tiny_engine, lambda p: next(v for k, v in replies.items() if f"[{k}]" in p),
                      memory=lambda p: next(f"[{k}]" for k in replies if k in p))
    for r in rows[:3]:
        r["context"] = f"{r['id']} " + r["context"]
    out = asyncio.run(answer_rows(engine, rows, CFG))
    table = pa.Table.from_pylist(out, schema=pa.schema([("id", pa.string()), ("context", pa.string()),
                                                        ("question", pa.string()), ("x", pa.int64()),
                                                        *result_schema(CFG)]))
    full, partial, wrong, empty = table.to_pylist()
    assert full["error"] is None and full["question"] == "passes through" and full["x"] == 0
    assert (full["party"], full["effective_date"], full["amount"], full["term_months"], full["renewal"],
            full["law"], full["signatories"]) == ("Harlow Freight Ltd", dt.date(2021, 3, 14), 48250.0, 24, True,
                                                  "Delaware", ["Ann Lee", "Bo Kim"])
    assert json.loads(full["extraction"]) == GOOD and full["prediction"] == full["extraction"]
    assert full["score"] is None and full["evidence_step"] is None  # no gold answer: no QA scoring
    assert partial["error"] is None and partial["amount"] == 12.5 and partial["effective_date"] is None
    assert partial["signatories"] is None and partial["renewal"] is None
    assert wrong["error"].startswith("invalid_output: field 'amount' does not match the schema")
    assert wrong["party"] is None and wrong["extraction"] is None and wrong["field_evidence"] is None
    assert wrong["steps"] and wrong["response"] == replies["wrong"]  # the trace is kept for debugging
    assert empty["error"].startswith("input: context is empty") and empty["party"] is None
    assert empty["field_evidence"] is None


@pytest.mark.parametrize(("reply", "message"), [
    ("The client is Harlow.", "reply is not valid JSON"),
    ('{"party": "X"}', "'amount' is a required property"),
    ('{"party": "X", "amount": 1, "colour": "red"}', "Additional properties are not allowed"),
    ('{"party": "X", "amount": 1, "law": "Texas"}', "field 'law' does not match"),
    ('{"party": "X", "amount": 1, "effective_date": "2021-13-01"}', "field 'effective_date' does not match"),
    ('{"party": "X", "amount": 1, "effective_date": "20210314"}', "'20210314' is not a 'date'"),
    ('{"party": "X", "amount": 1, "term_months": 2.5}', "field 'term_months' does not match"),
    ('{"party": "X", "amount": 1, "signatories": ["a", 2]}', "field 'signatories.1' does not match"),
    ('["party", "X"]', "reply does not match the schema"),
    ('{"party": "X", "amount": 1, "renewal": "yes"}', "field 'renewal' does not match"),
])
def test_non_conforming_replies_are_invalid_output(reply, message):
    with pytest.raises(InvalidOutput, match=message.replace("[", r"\[").replace(".", r"\.")):
        parse_reply(CFG.extraction, reply)


def test_an_invalid_reply_is_an_error_row_not_a_crash(tiny_engine):
    engine = scripted(tiny_engine, '{"party": "X", "amount": 1, "law": "Texas"}')
    [row] = asyncio.run(answer_rows(engine, [{"id": "a", "context": DOC}], CFG))
    assert row["error"].startswith("invalid_output: field 'law' does not match the schema: 'Texas' is not one of")
    assert row["law"] is None and row["party"] is None and row["memory"]

    class Truncating(ScriptedEngine):  # the answer budget ran out inside the object
        async def chat(self, messages, params):
            done = await super().chat(messages, params)
            return done if params.json_schema is None else Completion(done.text[:20], 10, 120, "length")

    engine = Truncating(tiny_engine.tokenizer, lambda p: "memory", lambda p: json.dumps(GOOD))
    [row] = asyncio.run(answer_rows(engine, [{"id": "a", "context": DOC}], CFG))
    assert row["error"].startswith("invalid_output: reply does not match the schema: 'party' is a required property; "
                                   "left out: party: no value: its reply ran past answer_tokens=460 alone and was cut")
    assert row["error"].endswith("(the reply stopped at answer_tokens=460: raise answer_tokens)")


# -- evidence ----------------------------------------------------------------------------------------


def test_field_evidence_step_and_span():
    steps = [
        {"step": 0, "kind": "memory", "char_start": 0, "char_end": 100, "memory": "Client: Harlow Freight Ltd"},
        {"step": 1, "kind": "memory", "char_start": 100, "char_end": len(DOC),
         "memory": "Client: Harlow Freight Ltd. Fee 48,250; term 24 months; signed Ann Lee, Bo Kim"},
        {"step": 2, "kind": "answer", "char_start": None, "char_end": None, "memory": "everything 2021-03-14"},
    ]
    obj = {**GOOD, "effective_date": "2021-03-14", "term_months": 25}
    ev = {(e["field"], e["value"]): e for e in field_evidence(CFG.extraction, obj, steps, DOC)}

    def span(field, value):
        e = ev[(field, json.dumps(value))]
        return e["step"], (DOC[e["char_start"]:e["char_end"]] if e["char_start"] is not None else None)

    assert span("party", "Harlow Freight Ltd") == (0, "Harlow Freight Ltd")
    assert span("amount", 48250) == (1, "48,250")  # written with a thousands separator
    assert span("effective_date", "2021-03-14") == (None, "March 14, 2021")  # no memory held it; the text does
    assert span("term_months", 25) == (None, None)  # not in the document (24 is)
    assert span("renewal", True) == (None, None)  # a boolean has no span
    assert span("law", "Delaware") == (None, "Delaware")
    assert span("signatories", "Ann Lee") == (1, "Ann Lee") and span("signatories", "Bo Kim") == (1, "Bo Kim")
    assert len(ev) == 8  # one entry per value, one per array item


def test_evidence_prefers_the_occurrence_in_the_chunk_that_first_held_it():
    doc = "Fee: USD 250 late fee. " + "x " * 40 + "Total fee USD 250."
    later = doc.rindex("250")
    steps = [{"step": 0, "kind": "memory", "char_start": 0, "char_end": 30, "memory": "nothing yet"},
             {"step": 1, "kind": "memory", "char_start": 30, "char_end": len(doc), "memory": "total fee 250"}]
    schema = ExtractionSchema(with_props(amount={"type": "number"}))
    [e] = field_evidence(schema, {"amount": 250}, steps, doc)
    assert (e["step"], e["char_start"], e["char_end"]) == (1, later, later + 3)
    [e] = field_evidence(schema, {"amount": 25}, steps, doc)  # "25" inside "250" is no occurrence
    assert (e["step"], e["char_start"]) == (None, None)


# -- the batch job's plan: columns, clashes, resume ----------------------------------------------------


def extraction_job(tmp_path, schema=SCHEMA, **kw):
    from pipelines.batch_qa import BatchQAConfig
    from pipelines.job import JobConfig

    return BatchQAConfig(input=str(tmp_path / "in"), output=str(tmp_path / "out"),
                         agent=CFG.with_overrides(extraction=schema), job=JobConfig(progress=False), **kw)


def test_plan_needs_no_question_and_types_the_output(tmp_path):
    from pipelines.batch_qa import plan_input
    from tests.pipeline_helpers import write_rows

    write_rows(tmp_path / "in" / "a.parquet", [{"id": "c1", "context": DOC}])
    schema = plan_input(extraction_job(tmp_path)).output_schema
    assert schema.field("effective_date").type == pa.date32() and schema.field("amount").type == pa.float64()
    assert schema.field("signatories").type == pa.list_(pa.string()) and "field_evidence" in schema.names
    assert schema.names.index("extraction") > schema.names.index("method")  # after the batch columns
    with pytest.raises(ValueError, match="field list is the question: give no question"):
        extraction_job(tmp_path, question="Who?")
    with pytest.raises(ValueError, match="keep method 'memagent'"):
        extraction_job(tmp_path, method="full-context")
    # An input column named like a field column is carried as input_<name>, beside the typed field column.
    write_rows(tmp_path / "in" / "a.parquet", [{"id": "c1", "context": DOC, "party": "a column of the input"}])
    plan = plan_input(extraction_job(tmp_path))
    assert plan.carried == {"party": "input_party"} and plan.output_schema.field("input_party").type == pa.string()
    assert plan.output_schema.names.count("party") == 1 and plan.output_schema.names.index("party") > \
        plan.output_schema.names.index("method")
    write_rows(tmp_path / "in" / "a.parquet", [{"id": "c1", "context": DOC, "party": "x", "input_party": "y"}])
    with pytest.raises(ValueError, match=r"input column 'party' is named like an output column and is carried as "
                                         r"'input_party', but the input has a column 'input_party' too"):
        plan_input(extraction_job(tmp_path))


def test_a_changed_schema_on_the_same_output_is_refused(tmp_path):
    """Output rows carry the fingerprint the job would write; a rerun with another schema is refused."""
    from pipelines.batch_qa import plan_input
    from pipelines.fingerprint import COLUMN, answer_key, fingerprint, job_question
    from tests.pipeline_helpers import write_rows

    rows = [{"id": f"c{i}", "context": f"{DOC} ({i})", "question": "ignored"} for i in range(3)]
    write_rows(tmp_path / "in" / "a.parquet", rows)
    first = extraction_job(tmp_path)
    written = [{"id": r["id"], "error": None, COLUMN: fingerprint(job_question(first), r["context"], answer_key(first))}
               for r in rows]
    write_rows(tmp_path / "out" / "part-0.parquet", written)
    assert plan_input(first).skipped == 3  # same schema: everything is done

    renamed = {**SCHEMA, "properties": {**SCHEMA["properties"], "law": {"enum": ["New York", "Texas"]}}}
    with pytest.raises(ValueError) as err:
        plan_input(extraction_job(tmp_path, renamed))
    assert str(err.value).startswith(f"3 id(s) already in {tmp_path / 'out'} were answered from a different input "
                                     "(question, context, schema or answer-changing settings)")
    assert "--redo-changed" in str(err.value)
    again = plan_input(extraction_job(tmp_path, renamed, redo_changed=True))
    assert again.skipped == 0 and sorted(again.redo_ids.to_pylist()) == ["c0", "c1", "c2"]
    rows[0]["question"] = "another question"  # the question column is not read with a schema: not a change
    write_rows(tmp_path / "in" / "a.parquet", rows)
    assert plan_input(first).skipped == 3
