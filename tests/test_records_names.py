"""Names that cannot break the records dataset (memagent/extraction/parse.py, pipelines/records_output.py):
a schema's record type and property names are refused at load with one line, or every record type
writes to and reads from its own folder only, and every leaf of a record comes back under its own path."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent.extraction import schema_from
from memagent.extraction.records import Evidence, Record
from pipelines.records_output import RECORDS_DIR, read_records
from memagent_testing.records_helpers import write_documents

# The building blocks of hostile names: dots, separators, CJK (3 UTF-8 bytes each), combining marks
# and precomposed letters (equal after NFC), compatibility forms (equal after NFKC: the fi ligature,
# the Kelvin sign), case variants, percent signs (a quoted name could collide with a literal one).
PIECES = ["pay", "Pay", "date", "中文", ".", "..", "a", "A", "b", "/", "%2E", "%", "_", "-", " ", "中", "中" * 21, "中" * 22, "e\u0301", "\u00e9",
          "\ufb01", "fi", "\u212a", "k", "ß", "SS", "x" * 30, "Ω", "\u03a9"]
NAMES = st.lists(st.sampled_from(PIECES), min_size=1, max_size=4).map("".join)


def fold(name: str) -> str:
    """The oracle's idea of one folder name: NFKC and case folded until it stops changing."""
    while (folded := unicodedata.normalize("NFKC", name.casefold())) != name:
        name = folded
    return name


def item(props: dict[str, dict]) -> dict:
    return {"type": "object", "properties": props}


def schema_of(types: dict[str, list[str]]) -> dict:
    """A schema whose record types hold string properties (the last of each type nested as ``obj.<name>``)."""
    out = {}
    for name, props in types.items():
        leaves = {p: {"type": "string"} for p in props}
        leaves["obj"] = item({props[-1]: {"type": "string"}})
        out[name] = {"type": "array", "items": item(leaves)}
    return {"type": "object", "properties": out}


def load_error(schema: dict) -> str | None:
    try:
        schema_from(schema)
    except ValueError as exc:
        return str(exc)
    return None


def leaves_of(fields, prefix: tuple[str, ...] = ()):
    """The name chain of every leaf, from the record down (the oracle never splits a name)."""
    for f in fields:
        if hasattr(f, "fields"):
            yield from leaves_of(f.fields, (*prefix, f.name))
        else:
            yield (*prefix, f.name)


def values_of(record_type) -> dict:
    """One distinct value per leaf of ``record_type`` (nested objects as dicts)."""
    out: dict = {}
    for names in leaves_of(record_type.fields):
        node = out
        for name in names[:-1]:
            node = node.setdefault(name, {})
        node[names[-1]] = f"{record_type.name}:{names}"
    return out


def get(row: dict, names: tuple[str, ...]):
    for name in names:
        row = row.get(name) if isinstance(row, dict) else None
    return row


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(types=st.dictionaries(NAMES, st.lists(NAMES, min_size=1, max_size=3, unique=True), min_size=1, max_size=3))
def test_a_schema_loads_with_one_line_or_each_type_writes_and_reads_its_own_folder(types, tmp_path_factory):
    """A schema of hostile names either fails to load with one line, or every record type writes to and
    reads from its own folder only, folders are distinct after case folding and NFKC, and every leaf of
    a written record is read back with its value under its own path."""
    schema = schema_of(types)
    error = load_error(schema)
    if error is not None:
        assert "\n" not in error and error.strip(), error
        return
    parsed = schema_from(schema)
    root = tmp_path_factory.mktemp("out")
    records = {r.name: [Record(r.name, values_of(r), {"obj": Evidence(0, 0, 1)}, 1, 0, 0)]
               for r in parsed.record_types}
    write_documents(str(root), parsed, [("doc", records)])
    files = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() and p.name != "block-0.parquet")
    folders = [f.parts[1] for f in files]
    assert all(f.parts[0] == RECORDS_DIR and len(f.parts) == 3 and f.name.startswith("records-") for f in files)
    assert len(files) == len(parsed.record_types) == len({fold(f) for f in folders})
    assert all(f.strip(".") for f in folders)  # never the records root or the output root
    for r in parsed.record_types:
        paths = [p for p, _, _ in r.leaves({})]
        assert len(paths) == len(set(paths))  # two leaves never share a path (the report's columns)
        [row] = read_records(str(root), r.name).to_pylist()
        assert row["record_type"] == r.name
        chains = list(leaves_of(r.fields))
        assert {c: get(row, c) for c in chains} == {c: f"{r.name}:{c}" for c in chains}


STRING = {"type": "string"}


@pytest.mark.parametrize("name", [".", "..", "...."])
def test_a_name_of_dots_only_is_refused_at_load(name):
    """A record type or property named only with dots is refused with one line naming its path."""
    for schema, path in [({"type": "object", "properties": {name: {"type": "array", "items": item({"a": STRING})}}},
                          f'properties["{name}"]'),
                         ({"type": "object", "properties": {name: STRING}}, f'properties["{name}"]'),
                         ({"type": "object", "properties": {"p": {"type": "array", "items": item({name: STRING})}}},
                          f'properties.p.items.properties["{name}"]')]:
        error = load_error(schema)
        assert error and f"{path}: " in error and "dots only" in error and "\n" not in error, error


def test_a_type_name_is_limited_in_bytes_of_its_folder_name(tmp_path):
    """A record type's name over 64 bytes of UTF-8 is refused with one line naming it; 21 CJK
    characters (63 bytes) load, write and read back."""
    error = load_error({"type": "object", "properties": {"中" * 64: {"type": "array", "items": item({"a": STRING})}}})
    assert error and "properties[" in error and "64 bytes" in error and "\n" not in error, error
    parsed = schema_from({"type": "object", "properties": {"中" * 21: {"type": "array", "items": item({"a": STRING})}}})
    write_documents(str(tmp_path), parsed, [("d", {"中" * 21: [Record("中" * 21, {"a": "x"}, {}, 1, 0, 0)]})])
    assert read_records(str(tmp_path), "中" * 21).column("a").to_pylist() == ["x"]


@pytest.mark.parametrize("a, b", [("Payments", "payments"), ("caf\u00e9", "cafe\u0301"), ("\ufb01le", "file"),
                                  ("\u212aey", "key"), ("straße", "STRASSE")])
def test_names_equal_after_case_folding_or_normalisation_are_refused(a, b):
    """Two record types, or two properties of one object, whose names fold to one (NFKC, case) are
    refused with one line naming both."""
    types = {"type": "object", "properties": {a: {"type": "array", "items": item({"x": STRING})},
                                              b: {"type": "array", "items": item({"x": STRING})}}}
    props = {"type": "object", "properties": {"p": {"type": "array", "items": item({a: STRING, b: STRING})}}}
    for schema in (types, props):
        error = load_error(schema)
        assert error and "after case folding and Unicode normalisation" in error and "\n" not in error, error
        assert repr(a) in error and repr(b) in error


def test_a_dotted_record_property_is_refused_with_a_nested_object_hint():
    """``rate.pct`` (once written as null) and ``bank.name`` beside ``bank{name}`` (two leaves, one
    path) are refused with one line naming the JSON path and suggesting a nested object."""
    error = load_error({"type": "object", "properties": {"p": {"type": "array", "items": item({"rate.pct": STRING})}}})
    assert error and 'properties.p.items.properties["rate.pct"]: ' in error and "\n" not in error, error
    assert '"rate": {"type": "object"' in error
    twin = item({"bank.name": STRING, "bank": item({"name": STRING})})
    assert "may not contain '.'" in load_error({"type": "object", "properties": {"p": {"type": "array", "items": twin}}})


def test_the_shipped_schemas_still_load():
    """Every schema in docs/schemas loads under the name rules."""
    shipped = sorted(Path(__file__).parent.parent.joinpath("docs", "schemas").glob("*.json"))
    assert shipped
    for path in shipped:
        schema_from(json.loads(path.read_text()))


def test_a_type_reads_only_files_directly_in_its_folder(tmp_path):
    """Records files below a type's folder (what a type named ``.`` or ``payments/x`` once left
    there) are not that type's records: the listing is one folder deep."""
    parsed = schema_from({"type": "object", "properties": {"payments": {"type": "array", "items": item({"a": STRING})}}})
    write_documents(str(tmp_path), parsed, [("d", {"payments": [Record("payments", {"a": "x"}, {}, 1, 0, 0)]})])
    [own] = (tmp_path / RECORDS_DIR / "payments").glob("*.parquet")
    below = own.parent / "other"
    below.mkdir()
    table = pq.read_table(own)
    pq.write_table(table.set_column(table.column_names.index("a"), "a", pa.array(["y"])), below / own.name)
    assert read_records(str(tmp_path), "payments").column("a").to_pylist() == ["x"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(docs=st.lists(st.tuples(st.sampled_from(["b", "a", "中", "B", "a1"]), st.integers(1, 3)), min_size=1, max_size=6))
def test_records_read_back_sorted_by_document_and_index(docs, tmp_path_factory):
    """However files and documents are written (one id may own two committed files, exported or not), a type's
    records read back sorted by (id, record_index), each written record once."""
    root = tmp_path_factory.mktemp("out")
    parsed = schema_from({"type": "object", "properties": {"p": {"type": "array", "items": item({"a": STRING})}}})
    for k, (doc, n) in enumerate(docs):
        write_documents(str(root), parsed, [(doc, {"p": [Record("p", {"a": f"{doc}{i}"}, {}, 1, 0, 0)
                                                         for i in range(n)]})], name=f"block-{k}.parquet")
    got = [(r["id"], r["record_index"], r["a"]) for r in read_records(str(root), "p").to_pylist()]
    assert got == sorted((doc, i, f"{doc}{i}") for doc, n in docs for i in range(n))
