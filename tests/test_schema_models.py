"""``--schema module:Model`` held to the model itself, and schema loading that never hangs or prints a traceback
(issue 64, item 6): the model's own validators checked on every row, a module that fails to import named in one
line, a schema file read with a bound whatever the file is, dotted names that collide refused naming both.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent.batch import answer_row
from memagent.config import AgentConfig
from memagent.extraction import load_schema, schema_from
from memagent_testing.oracle.servers import OracleEngine

MODEL = '''
from pydantic import BaseModel, field_validator, model_validator


class Part(BaseModel):
    code: str
    qty: int | None = None

    @field_validator("code")
    @classmethod
    def upper(cls, v: str) -> str:
        if v != v.upper():
            raise ValueError("a code is upper case")
        return v


class Line(BaseModel):
    item: str
    amount: float | None = None
    note: str | None = None

    @field_validator("amount")
    @classmethod
    def positive(cls, v):
        if v is not None and v <= 0:
            raise ValueError("an amount is positive")
        return v

    @field_validator("item")
    @classmethod
    def named(cls, v: str) -> str:
        if not v.strip("-"):
            raise ValueError("an item has a name")
        return v


class Ledger(BaseModel):
    lines: list[Line] = []


class Filing(BaseModel):
    total: float | None = None
    currency: str | None = None
    part: Part | None = None

    @field_validator("total")
    @classmethod
    def small(cls, v):
        if v is not None and v > 1000:
            raise ValueError("a total is at most 1000")
        return v

    @model_validator(mode="after")
    def no_eur(self):
        if self.currency == "EUR" and self.total == 0:
            raise ValueError("a zero total is never in EUR")
        return self
'''


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    """A folder on sys.path (as the working directory is for ``module:Model``) for modules a test writes."""
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _write(folder, text: str) -> str:
    name = f"m_{uuid.uuid4().hex[:12]}"
    (folder / f"{name}.py").write_text(textwrap.dedent(text))
    return name


@pytest.fixture(scope="module")
def filing(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    sys.path.insert(0, str(folder))
    try:
        name = _write(folder, MODEL)
        yield f"{name}:Filing", load_schema(f"{name}:Filing")
    finally:
        sys.path.remove(str(folder))


VALUES = st.fixed_dictionaries({}, optional={
    "total": st.sampled_from([0.0, 12.5, 999.0, 1000.5, 5000.0]), "currency": st.sampled_from(["USD", "EUR"]),
    "part": st.fixed_dictionaries({"code": st.sampled_from(["AB", "ab", "Xy"])}, optional={"qty": st.integers(0, 9)})})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(VALUES)
def test_the_model_s_own_validators_drop_what_they_reject_and_schema_errors_say_so(tokenizer, filing, reply):
    """Every value the model's validators reject is dropped and named (path and the validator's message) in
    ``schema_errors``; what is left reads back through the model unless a whole-object validator rejects it, which
    is named too; nothing the model accepts is dropped."""
    spec, schema = filing
    model = schema.model
    assert spec.endswith(":Filing") and model.__name__ == "Filing"
    engine = OracleEngine(lambda p: "noted" if "Updated memory" in p else json.dumps(reply), tokenizer)
    config = AgentConfig(chunk_tokens=256, memory_tokens=256, query_tokens=512, extraction=schema)
    row = asyncio.run(answer_row(engine, {"id": "d", "context": "A filing."}, config))
    assert row["error"] is None, row["error"]
    got = json.loads(row["extraction"])
    bad_total = reply.get("total", 0) > 1000
    bad_code = "part" in reply and reply["part"]["code"] != reply["part"]["code"].upper()
    whole = reply.get("currency") == "EUR" and reply.get("total") == 0
    assert ("total" in got) == ("total" in reply and not bad_total)
    assert ("part" in got) == ("part" in reply and not bad_code)
    named = [e for e in row["schema_errors"] if "Pydantic model" in e]
    assert ("total: Value error, a total is at most 1000 (the Pydantic model's validation); dropped" in named) \
        == bad_total
    assert any(e.startswith("part.code: Value error, a code is upper case") for e in named) == bad_code
    assert any(e.startswith("(root): Value error, a zero total is never in EUR") for e in named) == whole
    if not whole:
        model.model_validate_json(row["extraction"])


class _LedgerEngine(OracleEngine):
    """The perfect reader for ``Ledger``: memory "noted", a records call ``lines`` (an array, or under every key
    of a group's object of arrays), the document's answer ``{}``."""

    def __init__(self, tokenizer, lines):
        super().__init__(lambda p: "", tokenizer)
        self.lines = lines

    async def chat(self, messages, params):
        schema = json.loads(params.json_schema) if params.json_schema else None
        props = (schema or {}).get("properties") or {}
        if (schema or {}).get("type") == "array":
            self.reply = lambda p: json.dumps(self.lines)
        elif props and all(p.get("type") == "array" for p in props.values()):
            self.reply = lambda p: json.dumps({k: self.lines for k in props})
        else:
            self.reply = lambda p: "noted" if schema is None else "{}"
        return await super().chat(messages, params)


LINES = st.lists(st.fixed_dictionaries({"item": st.sampled_from(["bolt", "nut", "--", "washer"])}, optional={
    "amount": st.sampled_from([-2.0, 0.0, 3.5, 10.0]), "note": st.sampled_from(["paid", "due"])}),
    max_size=4, unique_by=lambda d: d["item"])


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(LINES)
def test_the_records_columns_hold_what_the_model_s_validators_left(tokenizer, module_dir, lines):
    """After the model's validators drop a record's value (or the whole record), the ``records_<type>`` column and
    its count hold exactly the records and values the row's ``extraction`` holds, and the dropped value's evidence
    is gone with it."""
    name = _write(module_dir, MODEL)
    schema = load_schema(f"{name}:Ledger")
    config = AgentConfig(chunk_tokens=256, memory_tokens=256, query_tokens=512, extraction=schema)
    text = "\n".join(" ".join(str(v) for v in ln.values()) for ln in lines) or "No lines."
    row = asyncio.run(answer_row(_LedgerEngine(tokenizer, lines), {"id": "d", "context": text}, config))
    assert row["error"] is None, row["error"]
    assert row["grounding_dropped_records"] == 0, row
    got = json.loads(row["extraction"])["lines"]
    assert [ln["item"] for ln in got] == [ln["item"] for ln in lines if ln["item"] != "--"]
    assert all(ln.get("amount") is None or ln["amount"] > 0 for ln in got)
    columns = row["records_lines"]
    assert row["n_records_lines"] == len(columns) == len(got)
    for column, kept in zip(columns, got):
        assert {k: column[k] for k in ("item", "amount", "note") if column.get(k) is not None} == \
            {k: v for k, v in kept.items() if v is not None}
        assert {e["field"] for e in column["record_evidence"]} <= {k for k, v in kept.items() if v is not None}


@pytest.mark.parametrize("source, what", [
    ("raise RuntimeError('no database here')\n", "RuntimeError: no database here"),
    ("def broken(:\n    pass\n", "SyntaxError: "),
])
def test_a_module_that_fails_to_import_is_one_line(module_dir, source, what, capsys):
    """A model module that raises or does not parse is refused in one line naming the module and the error, on the
    API and on the command line (exit 2, no traceback)."""
    from memagent_cli.main import main

    name = _write(module_dir, source)
    with pytest.raises(ValueError) as err:
        load_schema(f"{name}:Model")
    assert f"schema {name}:Model: module {name!r} cannot be imported: {what}" in str(err.value)
    assert "\n" not in str(err.value)
    assert main(["batch", "--input", str(module_dir / "in"), "--output", str(module_dir / "out"), "--schema",
                 f"{name}:Model"]) == 2
    err_text = capsys.readouterr().err
    assert what in err_text and err_text.count("\n") == 1 and "Traceback" not in err_text, err_text


def test_a_schema_file_is_read_with_a_bound_whatever_it_is(tmp_path):
    """A file whose size the file system does not tell (``/dev/zero``) or that is too large is refused after
    reading at most the bound, never read without end."""
    with pytest.raises(ValueError, match="the schema is larger than 256 KiB"):
        load_schema("/dev/zero")
    big = tmp_path / "big.json"
    big.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "string", "description": "x" * 2**20}}}))
    with pytest.raises(ValueError, match="the schema is larger than 256 KiB"):
        load_schema(big)


@pytest.mark.parametrize("schema, both", [
    ({"type": "object", "properties": {"a.b": {"type": "string"},
                                       "a": {"type": "object", "properties": {"b": {"type": "integer"}}}}},
     ("field 'a.b'", "'a' {...}: field 'b'")),
    ({"type": "object", "properties": {
        "a": {"type": "object", "properties": {"b": {"type": "array", "items": {
            "type": "object", "properties": {"x": {"type": "string"}}}}}},
        "a.b": {"type": "string"}}},
     ("field 'a.b'", "record type 'a.b'")),
])
def test_dotted_names_that_collide_are_refused_naming_both(schema, both):
    """A top-level name with a dot beside the object path it spells (a leaf or a record type) is refused in one line
    naming both."""
    with pytest.raises(ValueError) as err:
        schema_from(schema)
    assert all(b in str(err.value) for b in both) and "one dotted name 'a.b'" in str(err.value), str(err.value)
