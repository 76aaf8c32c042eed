"""Hostile outputs, as they were found: a schema property named ``<img src=x onerror=...>`` ran
its script in the report (the field name went into the row table's header unescaped), and a
hand-edited output with a string in a numeric column (``n_chunks``, ``answer_found_step``) ran
script in the row view. Every value that comes from the data, names included, is escaped.

Each attack row sits in its own Parquet file (as a hand edit would leave it: a column's type
changed in one file). Checked three ways: the page builds (no traceback on a string where a
number was), the page's script source concatenates no row value into HTML unescaped (fast),
and in headless Chromium no handler of the data ever runs (slow).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from infra.report_browser import find_chromium, open_page
from memagent.report.html import JS, render, row_view
from pipelines.report import build_report

# The handler marks the page in two ways a test can read from the dumped DOM.
PAYLOAD = "<img src=x onerror=\"document.title='PWNED';document.body.dataset.pwned=1\">"
NUMERIC = ["n_chunks", "context_tokens", "score", "seconds", "answer_found_step", "answer_lost_step",
           "evidence_step", "evidence_char_start", "evidence_char_end"]
TEXT = "Intro text. The payer is Harlow Freight Ltd and the amount is 48250. More text follows here. End."


def step(i: int, a, b, memory: str, kind: str = "memory", **kw) -> dict:
    return {"step": i, "kind": kind, "chunk_index": i if kind == "memory" else None, "char_start": a, "char_end": b,
            "memory": memory, "prompt_tokens": 10, "completion_tokens": 5, "finish_reason": "stop", "seconds": 0.1,
            **kw}


def base_row(rid: str) -> dict:
    steps = [step(0, 0, 50, "payer Harlow"), step(1, 50, len(TEXT), "payer Harlow, amount 48250"),
             step(2, None, None, "", "answer")]
    return {"id": rid, "question": "Who pays?", "context": TEXT, "answers": ["Harlow Freight Ltd"],
            "prediction": "Harlow Freight Ltd", "response": "Harlow Freight Ltd", "n_chunks": 2, "context_tokens": 30,
            "truncated": False, "steps": steps, "score": 1.0, "error": None, "model": "m", "config": "{}",
            "seconds": 0.3, "evidence_step": 0, "evidence_char_start": 0, "evidence_char_end": 50,
            "answer_spans": [{"char_start": TEXT.index("Harlow"), "char_end": TEXT.index("Harlow") + 18}],
            "answer_found_step": 0, "answer_lost_step": None}


def field_name_row() -> dict:
    """The first report: an extraction schema whose property name is markup."""
    at = TEXT.index("48250")
    schema = {"type": "object", "properties": {PAYLOAD: {"type": "number"}, "payer": {"type": "string"}}}
    values = {PAYLOAD: 48250, "payer": "Harlow Freight Ltd"}
    evidence = [{"field": PAYLOAD, "value": "48250", "step": 1, "char_start": at, "char_end": at + 5},
                {"field": "payer", "value": json.dumps(PAYLOAD), "step": 0, "char_start": None, "char_end": None}]
    row = {**base_row("field-name"), "config": json.dumps({"chunk_tokens": 64, "extraction": schema}),
           "extraction": json.dumps(values), "field_evidence": evidence}
    return row


def numeric_rows() -> list[dict]:
    """The second report: a string in one numeric column at a time, and all of them at once."""
    rows = [{**base_row(f"num-{col}"), col: PAYLOAD} for col in NUMERIC]
    everything = {**base_row("num-all"), **{col: PAYLOAD for col in NUMERIC}}
    everything["steps"] = [step(PAYLOAD, PAYLOAD, PAYLOAD, "payer Harlow", completion_tokens=PAYLOAD),
                           step("1", "50", str(len(TEXT)), "payer Harlow, amount 48250", completion_tokens="5")]
    everything["answer_spans"] = [{"char_start": PAYLOAD, "char_end": PAYLOAD}]
    field_step = {**field_name_row(), "id": "field-step"}  # a string step in field_evidence
    at = TEXT.index("Harlow")
    field_step["field_evidence"] = [{"field": "payer", "value": '"Harlow Freight Ltd"', "step": PAYLOAD,
                                     "char_start": at, "char_end": at + 18}]
    return rows + [everything, field_step]


def hostile_output(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for i, row in enumerate([field_name_row(), *numeric_rows()]):
        pq.write_table(pa.Table.from_pylist([row]), root / f"part-{i:02d}.parquet")
    return root


def outside_data(page: str) -> str:
    """The page without its JSON data block (where the payload is escaped for a script context)."""
    return re.sub(r'<script type="application/json" id="report-data">.*?</script>', "", page, flags=re.S)


# -- fast: the page builds, and its markup and script hold no unescaped data ----------------------


def test_hostile_output_builds_and_its_markup_is_escaped(tmp_path):
    page = Path(build_report(str(hostile_output(tmp_path / "out")), str(tmp_path / "r.html"))).read_text()
    rows = json.loads(re.search(r'id="report-data">(.*?)</script>', page, re.S).group(1))["rows"]
    assert len(rows) == 2 + len(NUMERIC) + 1  # every row is in the page, none dropped
    by_id = {r["id"]: r for r in rows}
    assert by_id["num-n_chunks"]["n"] == PAYLOAD and by_id["num-answer_found_step"]["f"] == PAYLOAD  # shown as text
    assert "<img" not in outside_data(page).lower()  # the summary (field table, config) escapes the name
    assert "&lt;img src=x onerror=" in outside_data(page)


def test_numeric_strings_do_not_break_the_summary():
    views = [row_view(r) for r in numeric_rows()]
    from memagent.report.html import accuracy

    acc = accuracy(views)  # a string score is no score: the others count
    assert acc is not None and acc["n"] == len(views) - 2 and acc["accuracy"] == 1.0


# Row values (r.NAME) and tuple entries (x[0], s[2], ...) may reach HTML only through esc() or
# a function that escapes (hl, marked, diffHtml, cell): never concatenated to a literal directly.
_RAW = re.compile(r"""['"]\s*\+\s*(?:r\.\w+|\b\w\[\d\]|total)\b(?!\s*[(.\[])|(?:r\.\w+|\b\w\[\d\]|total)\s*\+\s*['"]""")


def unescaped_concatenations(js: str) -> list[str]:
    return [line.strip() for line in js.splitlines() if _RAW.search(line)]


def test_report_script_concatenates_no_row_value_unescaped():
    # The rule catches the reported lines as they were ...
    assert unescaped_concatenations(
        """let th = "<tr>" + COLS.map((c) => '<th data-k="' + c[1] + '">' + c[0] + "</th>").join("") + "</tr>";\n"""
        """      "found at step " + r.f + (r.l == null ? ", kept" : ', <span class="bad">lost at step ' + r.l + "</span>")\n"""
        """    ["document", (r.n != null ? r.n + " chunks" : "")]""") != []
    assert unescaped_concatenations("""'<th>' + esc(c[0]) + "</th>" + esc(r.f) + " chunks" """) == []
    # ... and the script has none left; nor template literals, which would slip past it.
    assert unescaped_concatenations(JS) == [], unescaped_concatenations(JS)
    assert "`" not in JS


# -- slow: the page in headless Chromium -----------------------------------------------------------

CHROMIUM = find_chromium()


def assert_nothing_ran(dom: str, title: str) -> None:
    assert 'data-ready="1"' in dom, "the page's script did not finish"
    assert "data-pwned" not in dom, "a handler from the data ran"
    assert re.search(r"<title>(.*?)</title>", dom, re.S).group(1) == title, "a handler from the data ran"
    assert not re.search(r"<img\b[^>]*onerror", dom, re.I), "an element was made from the data"


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (`make browser`): the page cannot be opened")
def test_no_script_from_the_data_runs_in_chromium(tmp_path):
    page = Path(build_report(str(hostile_output(tmp_path / "out")), str(tmp_path / "r.html")))
    title = "MemAgent report — out"
    dom = open_page(page).dom
    assert_nothing_ran(dom, title)
    header = re.search(r"<thead>(.*?)</thead>", dom, re.S).group(1)
    assert "&lt;img src=x onerror=" in header  # the field's column, its name shown as text
    # The row view of every attack row, and the table filtered on the hostile field.
    for key in ["field-name", "field-step", "num-all", *(f"num-{c}" for c in NUMERIC)]:
        dom = open_page(page, fragment="row=" + quote(key, safe="")).dom
        assert_nothing_ran(dom, title)
        assert "Timeline of row" in dom, key
    dom = open_page(page, fragment="filter=field=" + quote(PAYLOAD, safe="") + "&value=*").dom
    assert_nothing_ran(dom, title)
    assert "2 of 12 rows" in re.search(r'<span id="count"[^>]*>(.*?)</span>', dom, re.S).group(1)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (`make browser`): the page cannot be opened")
def test_the_check_sees_a_handler_that_runs(tmp_path):
    """The browser check can fail: the same payload placed as markup does run and is seen."""
    page = tmp_path / "p.html"
    page.write_text(render("t", "s", f"<p>{PAYLOAD}</p>", [row_view(base_row("x"))]))
    dom = open_page(page).dom
    with pytest.raises(AssertionError, match="handler"):
        assert_nothing_ran(dom, "t")
