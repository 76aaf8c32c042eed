"""The report's records view (memagent/report/records.py, report.js): per record type a sortable,
filterable table of the committed records; a selected record shows its spans marked in the document
text. Fast: the page data. Slow: the page in headless Chromium (sort, filter, select through the URL
fragment the clicks write), and a record field named as markup runs no script."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlencode

import pytest

from infra.report_browser import find_chromium, open_page
from memagent.extraction import schema_from
from memagent.extraction.records import Evidence, Record
from memagent.report.html import JS
from memagent.report.records import record_snippets
from pipelines.report import build_report
from memagent_testing.records_helpers import write_documents
from tests.test_report_hostile import assert_nothing_ran, unescaped_concatenations

TEXT = ("Statement for Jane Roe.\nAcme Ltd paid 1250 on 2021-03-14.\n" + "Nothing happened that week.\n" * 12
        + "Birch Ltd paid 300 on 2021-04-01 via Northbank.\nCedar Ltd paid 75 on 2021-05-02.\n")


def schema(payer: str = "payer") -> dict:
    return {"type": "object", "properties": {"payments": {"type": "array", "x-key": [payer, "date"], "items": {
        "type": "object", "properties": {payer: {"type": "string"}, "date": {"type": "string", "format": "date"},
                                         "amount": {"type": "number"}}, "required": [payer, "date"]}}}}


def rec(payer_field: str, payer: str, amount: int, date: str, mentions: int = 1) -> Record:
    at = TEXT.index(payer)
    ev = {payer_field: Evidence(0, at, at + len(payer)),
          "amount": Evidence(0, TEXT.index(str(amount), at), TEXT.index(str(amount), at) + len(str(amount))),
          "date": Evidence(0, TEXT.index(date), TEXT.index(date) + len(date))}
    return Record("payments", {payer_field: payer, "date": date, "amount": float(amount)}, ev, mentions, 0, 1)


def output(root: Path, payer: str = "payer") -> Path:
    root.mkdir(parents=True)
    s = schema(payer)
    found = {"payments": [rec(payer, "Acme Ltd", 1250, "2021-03-14", 2), rec(payer, "Birch Ltd", 300, "2021-04-01"),
                          rec(payer, "Cedar Ltd", 75, "2021-05-02")]}
    steps = [{"step": 0, "kind": "memory", "chunk_index": 0, "char_start": 0, "char_end": len(TEXT), "memory": "m",
              "prompt_tokens": 10, "completion_tokens": 5, "finish_reason": "stop", "seconds": 0.1}]
    row = {"id": "doc-1", "context": TEXT, "prediction": "{}", "response": "{}", "n_chunks": 1, "context_tokens": 40,
           "truncated": False, "steps": steps, "score": None, "error": None, "model": "m", "seconds": 0.2,
           "config": json.dumps({"chunk_tokens": 64, "extraction": s}), "extraction": "{}", "field_evidence": [],
           "n_records_payments": 3}
    write_documents(str(root), schema_from(s), [("doc-1", found)], name="part-0.parquet", extra=[row])
    return root


def page_data(page: str) -> dict:
    return json.loads(re.search(r'id="report-data">(.*?)</script>', page, re.S).group(1))


def test_record_snippets_merge_close_spans_and_mark_each_field():
    text = "x" * 300 + "Acme Ltd paid 1250." + "y" * 300
    a = 300
    [[offset, window, marks]] = record_snippets(text, [{"field": "payer", "char_start": a, "char_end": a + 8},
                                                       {"field": "amount", "char_start": a + 14, "char_end": a + 18},
                                                       {"field": "bad", "char_start": "9", "char_end": None}])
    assert [window[s:e] for s, e, _ in marks] == ["Acme Ltd", "1250"] and offset == a - 80
    assert record_snippets(None, [{"field": "p", "char_start": 0, "char_end": 1}]) == []


def test_the_page_data_holds_each_record_with_its_spans(tmp_path):
    page = Path(build_report(str(output(tmp_path / "out")), str(tmp_path / "r.html"))).read_text()
    [view] = page_data(page)["records"]
    assert view["name"] == "payments" and view["cols"] == ["payer", "date", "amount"] and view["total"] == 3
    acme = view["rows"][0]
    assert acme["d"] == "doc-1" and acme["i"] == 0 and acme["v"] == ["Acme Ltd", "2021-03-14", 1250.0]
    assert (acme["m"], acme["fc"], acme["lc"]) == (2, 0, 1)
    [[_, window, marks]] = acme["sn"]
    assert sorted(window[s:e] for s, e, _ in marks) == ["1250", "2021-03-14", "Acme Ltd"]
    assert '<section id="records">' in page
    assert unescaped_concatenations(JS) == [] and "`" not in JS


CHROMIUM = find_chromium()
# A property name has at most 64 characters and no dot (dotted paths name nested objects).
HOSTILE = '<img src=x onerror="document[\'body\'][\'dataset\'][\'pwned\']=1">'
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (`make browser`)")


def body(dom: str) -> str:
    return re.search(r'<tbody>(.*?)</tbody>', dom[dom.index('id="rec-table"'):], re.S).group(1)


@pytest.mark.slow
@needs_chromium
def test_records_view_sorts_filters_and_highlights_in_chromium(tmp_path):
    page = Path(build_report(str(output(tmp_path / "out")), str(tmp_path / "r.html")))
    dom = open_page(page).dom
    assert 'data-ready="1"' in dom
    assert re.findall(r"<td>(\w+ Ltd)</td>", body(dom)) == ["Acme Ltd", "Birch Ltd", "Cedar Ltd"]
    frag = lambda **p: "records=" + urlencode({"type": "payments", **p})  # what a header/row click writes
    dom = open_page(page, fragment=frag(sort="amount", dir="-1")).dom  # amount, descending
    assert re.findall(r"<td>(\w+ Ltd)</td>", body(dom)) == ["Acme Ltd", "Birch Ltd", "Cedar Ltd"]
    dom = open_page(page, fragment=frag(sort="amount", dir="1")).dom
    assert re.findall(r"<td>(\w+ Ltd)</td>", body(dom)) == ["Cedar Ltd", "Birch Ltd", "Acme Ltd"]
    dom = open_page(page, fragment=frag(q="northbank")).dom  # no field holds it: filtered out
    assert "0 of 3 records" in dom
    dom = open_page(page, fragment=frag(q="birch")).dom
    assert re.findall(r"<td>(\w+ Ltd)</td>", body(dom)) == ["Birch Ltd"] and "1 of 3 records" in dom
    dom = open_page(page, fragment=frag(sort="amount", dir="1", doc="doc-1", i="1")).dom  # Birch selected
    detail = re.search(r'<div id="rec-detail">(.*?)</section>', dom, re.S).group(1)
    assert sorted(re.findall(r'<mark class="fld rec"[^>]*>(.*?)</mark>', detail)) == ["2021-04-01", "300", "Birch Ltd"]
    assert "via Northbank" in detail and 'class="sel"' in body(dom)


@pytest.mark.slow
@needs_chromium
def test_a_record_field_named_as_markup_runs_no_script(tmp_path):
    page = Path(build_report(str(output(tmp_path / "out", payer=HOSTILE)), str(tmp_path / "r.html")))
    for fragment in ("", "records=" + urlencode({"type": "payments", "sort": HOSTILE, "doc": "doc-1", "i": "0"})):
        dom = open_page(page, fragment=fragment).dom
        assert_nothing_ran(dom, "MemAgent report — out")
        head = re.search(r"<thead>(.*?)</thead>", dom[dom.index('id="rec-table"'):], re.S).group(1)
        assert "&lt;img src=x onerror=" in head
