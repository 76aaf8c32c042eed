"""The report stays bounded and keeps going whatever the records output holds (pipelines/report.py,
memagent/report/records.py, fields.py): long values are cut with a visible mark, a foreign file in a
records folder is named in an ``error:`` line, and documents' texts are not kept while records load."""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from memagent.extraction import schema_from
from memagent.extraction.records import Evidence, Record
from pipelines.records_output import RECORDS_DIR
from pipelines.report import build_report
from memagent_testing.records_helpers import write_documents
from tests.test_report_records import page_data, schema

BIG = 100_000  # characters of one hostile value


def row(doc: str, context: str, extraction: dict | None = None) -> dict:
    steps = [{"step": 0, "kind": "memory", "chunk_index": 0, "char_start": 0, "char_end": len(context),
              "memory": "m", "prompt_tokens": 10, "completion_tokens": 5, "finish_reason": "stop", "seconds": 0.1}]
    return {"id": doc, "context": context, "prediction": "{}", "response": "{}", "n_chunks": 1, "context_tokens": 40,
            "truncated": False, "steps": steps, "score": None, "error": None, "model": "m", "seconds": 0.2,
            "config": json.dumps({"chunk_tokens": 64, "extraction": schema()}),
            "extraction": json.dumps(extraction or {}), "field_evidence": []}


def payment(payer: str, context: str) -> Record:
    at = context.index(payer)
    return Record("payments", {"payer": payer, "date": "2021-03-14", "amount": 1.0},
                  {"payer": Evidence(0, at, at + len(payer))}, 1, 0, 0)


def write_output(root: Path, docs: dict[str, list[str]]) -> None:
    """One row per document (its text: its payers) with its committed records, exported."""
    root.mkdir(parents=True)
    rows, found = [], []
    for doc, payers in docs.items():
        context = "".join(f"{p} paid 1 on 2021-03-14.\n" for p in payers)
        found.append((doc, {"payments": [payment(p, context) for p in payers]}))
        rows.append(row(doc, context, {"note": "n" * BIG}))
    write_documents(str(root), schema_from(schema()), found, name="part-0.parquet", extra=rows)


def test_long_values_and_spans_are_cut_with_a_visible_mark(tmp_path):
    """Records whose values and spans are 100,000 characters long make a page under 1 MB, every shown
    value and snippet at most a few hundred characters, each cut one marked with how much was left out."""
    payers = [f"{i}{'x' * BIG}" for i in range(20)]
    write_output(tmp_path / "out", {"doc-1": payers[:10], "doc-2": payers[10:]})
    page = Path(build_report(str(tmp_path / "out"), str(tmp_path / "r.html"))).read_text()
    assert len(page.encode()) < 1_000_000
    [view] = page_data(page)["records"]
    assert view["total"] == len(view["rows"]) == 20
    for r in view["rows"]:
        payer = r["v"][view["cols"].index("payer")]
        assert len(payer) < 1000 and re.search(r"…\(99,\d{3} more characters\)$", payer), payer[-40:]
        [[_, text, [[start, end, field]]]] = r["sn"]
        assert len(text) < 1000 and "more characters)" in text and field == "payer" and text[start:end].strip("0123456789x") == ""
    for v in page_data(page)["rows"]:
        assert all(len(x[1] or "") < 1000 and "more characters)" in x[1] for x in v["x"])


def test_a_foreign_file_in_a_records_folder_is_an_error_line_and_the_report_goes_on(tmp_path, capsys):
    """A file in a type's records folder that is not Parquet, or holds another table, is named in one
    ``error:`` line (stderr and the page) and left out; every document's records are shown."""
    write_output(tmp_path / "out", {"doc-1": ["Acme Ltd"], "doc-2": ["Birch Ltd"], "doc-3": ["Cedar Ltd"]})
    folder = tmp_path / "out" / RECORDS_DIR / "payments"
    (folder / "0000-notes.parquet").write_bytes(b"not a parquet file")
    pq.write_table(pa.table({"foreign": [1, 2]}), folder / "0001-other.parquet")
    page = Path(build_report(str(tmp_path / "out"), str(tmp_path / "r.html"))).read_text()
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(err) == 2 and all("records file" in line and "left out" in line for line in err), err
    assert "0000-notes" in err[0] and "0001-other" in err[1]
    [view] = page_data(page)["records"]
    assert [(r["d"], r["v"][0]) for r in view["rows"]] == [("doc-1", "Acme Ltd"), ("doc-2", "Birch Ltd"),
                                                            ("doc-3", "Cedar Ltd")]
    assert "0000-notes" in page and "0001-other" in page


def test_records_load_without_keeping_every_document_text(tmp_path):
    """Building the report of 1,000 rows with records, 60,000 characters of text each, never holds
    most of those texts at once: Python's peak stays under half of their 60 MB."""
    root = tmp_path / "out"
    root.mkdir()
    text = "Acme Ltd paid 1 on 2021-03-14.\n" + "filler words " * 4600
    rows, found = [], []
    for i in range(1000):
        context = f"{i:04d} {text}"
        found.append((f"d{i}", {"payments": [payment("Acme Ltd", context)] if i < 3 else []}))
        rows.append({**row(f"d{i}", context), "steps": []})
    write_documents(str(root), schema_from(schema()), found, name="part-0.parquet", extra=rows, row_group_size=100)
    del rows, found
    tracemalloc.start()
    try:
        page = Path(build_report(str(root), str(tmp_path / "r.html"))).read_text()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    [view] = page_data(page)["records"]
    assert len(view["rows"]) == 3 and all(r["sn"] for r in view["rows"])  # the shown records' snippets are cut
    assert peak < 30_000_000, f"peak {peak / 1e6:.1f} MB"


def test_a_type_embeds_records_within_its_character_budget():
    """However long and many a type's values and spans, the embedded values and snippets stay within
    the budget (the first record is always shown), and the view still counts every record."""
    from memagent.report.records import records_view

    text = "y" * 300_000
    rows = [{"id": "d", "record_index": i, "payer": "x" * 100_000, "note": "n" * 5,
             "record_evidence": [{"field": "payer", "char_start": 1000 * k, "char_end": 1000 * k + 90_000}
                                 for k in range(8)]} for i in range(200)]
    budget = 50_000
    view = records_view("payments", rows, {"d": text}, budget=budget)
    shown = sum(len(v) for r in view["rows"] for v in r["v"] if isinstance(v, str))
    shown += sum(len(s[1]) for r in view["rows"] for s in r["sn"])
    assert view["total"] == 200 and 1 <= len(view["rows"]) < 200 and shown <= budget, (len(view["rows"]), shown)
