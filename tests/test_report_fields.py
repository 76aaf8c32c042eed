"""The report's extraction section: per-field filled rates and enum distributions, values linked to their
evidence spans in the row timeline (row views, and the page in headless Chromium)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memagent.report.fields import field_view, fields_html, schema_fields
from memagent.report.html import row_view
from pipelines.report import build_report
from infra.report_browser import open_page
from tests.test_report import data_of, needs_chromium, step

SCHEMA = {"type": "object", "required": ["party", "law"],
          "properties": {"party": {"type": "string"}, "law": {"enum": ["Delaware", "Texas"]},
                         "fee": {"type": "number"}, "renews": {"type": "boolean"}}}
CONFIG = json.dumps({"chunk_tokens": 64, "extraction": SCHEMA})
TEXT = ("Filler words come first here. The Client is Harlow Freight Ltd. More filler text. "
        "The total fee is USD 48250. This Agreement is governed by the laws of Delaware. The end.")


def ev(field: str, value, step_: int | None, text: str | None) -> dict:
    at = TEXT.index(text) if text else None
    return {"field": field, "value": json.dumps(value), "step": step_, "char_start": at,
            "char_end": at + len(text) if text else None}


def extraction_row(rid: str, law: str | None = "Delaware", party: str | None = "Harlow Freight Ltd") -> dict:
    values = {"party": party, "law": law, "fee": 48250, "renews": None}
    steps = [step(0, 0, 60, "party: Harlow Freight Ltd"), step(1, 60, 120, "party: Harlow Freight Ltd; fee 48250"),
             step(2, 120, len(TEXT), f"party: Harlow Freight Ltd; fee 48250; law {law}"),
             step(3, None, None, "", "answer")]
    evidence = [ev("party", party, 0, party) if party else ev("party", None, None, None),
                ev("law", law, 2, "Delaware") if law == "Delaware" else ev("law", law, None, None),
                ev("fee", 48250, 1, "48250"), ev("renews", None, None, None)]
    return {"id": rid, "question": "Extract these fields", "context": TEXT, "prediction": json.dumps(values),
            "response": json.dumps(values), "n_chunks": 3, "context_tokens": 40, "truncated": False, "steps": steps,
            "score": None, "error": None, "model": "m", "config": CONFIG, "seconds": 0.2,
            "extraction": json.dumps(values), "field_evidence": evidence, "party": party, "law": law, "fee": 48250.0,
            "renews": None}


def extraction_run(root: Path) -> Path:
    rows = [extraction_row("c1"), extraction_row("c2"), extraction_row("c3", law="Texas", party=None)]
    err = {**{k: None for k in rows[0]}, "id": "c4", "question": "Q", "context": TEXT, "model": "m",
           "config": CONFIG, "error": "invalid_output: reply does not match the schema"}
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows + [err]), root / "part-0.parquet")
    return root


def test_field_view_keeps_values_spans_and_short_snippets():
    v = row_view(extraction_row("c1"))
    assert v["x"][0] == ["party", '"Harlow Freight Ltd"', 0, TEXT.index("Harlow"), TEXT.index("Harlow") + 18]
    assert v["x"][3] == ["renews", None, None, None, None]
    snips = {s[0]: s for s in v["xs"]}
    assert set(snips) == {"party", "law", "fee"}  # only values found in the text have a span
    name, offset, text, marks = snips["fee"]
    assert text[marks[0][0]:marks[0][1]] == "48250" and offset == max(0, TEXT.index("48250") - 60)
    assert field_view({"id": "x", "context": TEXT}, TEXT) == {}  # not an extraction row
    assert schema_fields(CONFIG)[1] == {"name": "law", "kind": "enum", "enum": ["Delaware", "Texas"]}
    assert schema_fields('{"chunk_tokens": 1}') is None and schema_fields("not json") is None


def test_fields_section_counts_filled_and_enum_distribution():
    views = [row_view(r) for r in [extraction_row("a"), extraction_row("b", law="Texas", party=None)]]
    views.append(row_view({"id": "e", "error": "invalid_output: bad", "config": CONFIG, "field_evidence": None,
                           "extraction": None}))
    html = fields_html(views, schema_fields(CONFIG))
    row = {m.group(1): m.group(0) for m in re.finditer(r"<tr><td><code>(\w+)</code>.*?</tr>", html, re.S)}
    assert set(row) == {"party", "law", "fee", "renews"}
    assert ">1</a> of 3 (33.3%)" in row["party"] and ">2 empty</a>" in row["party"]  # the error row fills nothing
    assert "1 of 1" in row["party"]  # with evidence
    assert "Delaware" in row["law"] and "Texas" in row["law"] and "(50%)" in row["law"]
    assert 'href="#filter=field=law&amp;value=%22Texas%22"' in row["law"]
    assert "1 distinct" in row["fee"] and "enum" in row["law"] and "boolean" in row["renews"]
    assert fields_html([row_view({"id": "q", "context": TEXT})], None) == ""  # not an extraction run
    only_errors = fields_html(views[2:], schema_fields(CONFIG))  # every row invalid: the section says so
    assert ">0</a> of 1 (0.0%)" in only_errors and "law" in only_errors


def test_report_of_extraction_run_has_the_fields_section(tmp_path):
    page = Path(build_report(str(extraction_run(tmp_path / "out"))))
    html = page.read_text()
    assert '<h3 id="fields">Extracted fields</h3>' in html and "invalid_output" in html
    rows = {r["id"]: r for r in data_of(html)["rows"]}
    assert rows["c1"]["x"][1][:3] == ["law", '"Delaware"', 2] and "x" not in rows["c4"]
    assert TEXT not in html  # snippets only, never the whole document


@pytest.mark.slow
@needs_chromium
def test_fields_in_chromium(tmp_path):
    page = Path(build_report(str(extraction_run(tmp_path / "out"))))
    dom = open_page(page, fragment="row=c1").dom
    assert 'data-ready="1"' in dom
    head = re.search(r'<table id="rows">.*?</thead>', dom, re.S).group(0)
    assert all(f">{f}</th>" in head for f in ("party", "law", "fee")) and ">prediction<" not in head
    detail = re.search(r'<section id="detail">(.*)</section>', dom, re.S).group(1)
    fields = re.search(r"<h3>Extracted fields</h3>(.*?)</table>", detail, re.S).group(1)
    law = TEXT.index("Delaware")
    # the value links to its evidence snippet, which marks the span in the source text
    assert f'href="#fsn-1" data-snip="fsn-1"><mark class="fld">Delaware</mark>' in fields
    assert f"chars {law}–{law + 8}" in fields and "first in memory at step 2" in fields
    assert 'value not found' not in fields  # renews is null, not missing from the text
    snip = re.search(r'<div class="snip" id="fsn-1">(.*?)</div>', detail, re.S).group(1)
    assert '<mark class="fld">Delaware</mark>' in snip
    assert 'class="badge b-fld">law first in memory' in detail and 'class="fmk"' in detail
    assert "<mark class=\"fld\">48250</mark>" in detail  # values highlighted in the memories
    dom = open_page(page, fragment="filter=field=law&value=%22Texas%22").dom
    assert "1 of 4 rows · law = Texas" in dom and 'data-k="c3"' in dom and 'data-k="c1"' not in dom
    dom = open_page(page, fragment="filter=field=party&value=").dom
    assert "2 of 4 rows · party empty" in dom
    open_page(page, fragment="row=c1", screenshot=tmp_path / "fields.png", window=(1280, 900))
    assert (tmp_path / "fields.png").stat().st_size > 10_000


@pytest.mark.parametrize("start, end", [("3", 8), (3, "8"), (3.0, 8), (True, 8), (9, 3), (3, 999)])
def test_field_evidence_that_is_not_a_span_of_the_text_cuts_no_snippet(start, end):
    row = {"extraction": json.dumps({"total": 48250}),
           "field_evidence": [{"field": "total", "value": "48250", "step": 0, "char_start": start, "char_end": end}]}
    view = field_view(row, "Total: 48250 due.")
    assert view["x"] == [["total", "48250", 0, start, end]] and view["xs"] is None


def test_field_evidence_within_the_text_cuts_its_snippet():
    row = {"field_evidence": [{"field": "total", "value": "48250", "step": 0, "char_start": 7, "char_end": 12}]}
    (name, offset, text, marks), = field_view(row, "Total: 48250 due.")["xs"]
    assert name == "total" and text[marks[0][0]:marks[0][1]] == "48250"
