"""The report draws retention (memagent/report/retention_view.py, report.js): per row with known evidence a
timeline of each item entering and leaving the memory, and capture/retention rates in the run summary."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.report_browser import find_chromium, open_page
from memagent.report.html import row_view
from memagent.report.retention_view import MAX_ITEMS, cells
from memagent.retention import retention_columns
from pipelines.report import build_report
from tests.test_report import data_of

FILL = "The grass is green and the sky is blue. "
VALUES = ("4417", "5550", "9021")  # needles A, C, B in text order


def scripted_row(rid: str = "doc-1") -> dict:
    """Needles A (4417) in chunk 1, C (5550) in chunk 2, B (9021) in chunk 3 of five; the scripted memories:
    B guessed before it is read (step 0), A captured at step 1 and lost at step 3, C never held, B captured
    at step 3 and kept to the answer."""
    parts = [FILL * 2] + [FILL + f"The special magic number for key-{k} is {v}. " + FILL
                          for k, v in zip("ACB", VALUES)] + [FILL * 2]
    bounds, at = [], 0
    for p in parts:
        bounds.append((at, at + len(p)))
        at += len(p)
    memories = ["maybe 9021", "key-A is 4417", "still 4417", "key-B is 9021", "answer 9021"]
    steps = [{"step": i, "kind": "memory", "chunk_index": i, "char_start": a, "char_end": b, "memory": m,
              "prompt_tokens": 10, "completion_tokens": 5, "finish_reason": "stop", "seconds": 0.1}
             for i, ((a, b), m) in enumerate(zip(bounds, memories))]
    steps.append({"step": 5, "kind": "answer", "chunk_index": None, "char_start": None, "char_end": None,
                  "memory": "answer 9021", "prompt_tokens": 10, "completion_tokens": 3, "finish_reason": "stop",
                  "seconds": 0.1})
    return {"id": rid, "question": "What are the special magic numbers?", "context": "".join(parts),
            "answers": ["4417", "5550", "9021"], "prediction": "9021", "response": "9021", "n_chunks": 5,
            "context_tokens": 300, "truncated": False, "steps": steps, "score": 0.33, "error": None, "model": "m",
            "config": "{}", "seconds": 0.5, "task": "niah_multivalue", "length": 1024}


# The script's cells, by hand: . unread, ? held before read, h held, x read and not held.
EXPECTED = {"4417": (".hhxx", 1, 1, 0), "5550": (".." + "xxx", 2, 0, 0), "9021": ("?..hh", 3, 1, 1)}


def decode(coded: str) -> str:
    return "".join(c * int(n) for c, n in re.findall(r"([.?hx])(\d+)", coded))


def test_the_row_view_holds_each_items_timeline():
    """Each needle's per-step states, read step, captured and retained are those the script made, and the
    counts are the batch job's evidence columns."""
    row = scripted_row()
    rt = row_view(row)["rt"]
    assert [it[1] for it in rt["i"]] == list(VALUES)
    for label, value, read_at, coded, captured, retained in rt["i"]:
        states, want_read, want_cap, want_ret = EXPECTED[value]
        assert (decode(coded), read_at, captured, retained) == (states, want_read, want_cap, want_ret), value
    cols = retention_columns(row, row["steps"])
    assert rt["c"] == [cols["evidence_read"], cols["evidence_captured"], cols["evidence_retained"]] == [3, 2, 1]


def test_no_timeline_without_known_evidence_or_memory():
    """Rows of a task without located evidence, error rows and the full-context baseline have no ``rt``."""
    row = scripted_row()
    assert "rt" not in row_view({**row, "task": "qa_1"})
    assert "rt" not in row_view({**row, "error": "input: boom", "steps": None})
    assert "rt" not in row_view({**row, "steps": [s for s in row["steps"] if s["kind"] == "answer"]})


@settings(max_examples=100, deadline=None)
@given(states=st.text(alphabet=".?hx", min_size=0, max_size=300))
def test_cells_run_length_code_round_trips(states):
    """The run-length code decodes to the states it coded, and a run of n states costs 1 + len(str(n)) chars."""
    coded = cells(states)
    assert decode(coded) == states
    runs = [m.group(0) for m in re.finditer(r"(.)\1*", states)]
    assert len(coded) == sum(1 + len(str(len(r))) for r in runs)


def test_a_long_read_stays_bounded():
    """A 2,000-step read with 40 needles: 16 items drawn (the rest counted), each item's cells a few runs."""
    values = [f"{7000 + i}" for i in range(40)]
    context = "".join(f"{FILL}The number is {v}. " for v in values)
    end = len(context)
    steps = [{"step": i, "kind": "memory", "char_start": end * i // 2000, "char_end": end * (i + 1) // 2000,
              "memory": " ".join(values[:min(40, i // 50)])} for i in range(2000)]
    rt = row_view({"id": "long", "context": context, "answers": values, "steps": steps, "task": "niah_multikey_2",
                   "prediction": None})["rt"]
    assert len(rt["i"]) == MAX_ITEMS and rt["more"] == 40 - MAX_ITEMS and rt["c"][0] == 40
    assert all(len(it[3]) < 30 for it in rt["i"])


def write_output(root: Path, rows: list[dict]) -> Path:
    root.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), root / "part-0.parquet")
    return root


def test_the_summary_shows_capture_and_retention_rates(tmp_path):
    """Over two scripted rows (3 read, 2 captured, 1 retained each) and one without evidence: capture 66.7%
    (4 of 6), retention 50.0% (2 of 4), both rows linked as having lost some evidence."""
    plain = {**scripted_row("doc-3"), "task": "qa_1"}
    out = write_output(tmp_path / "out", [scripted_row("doc-1"), scripted_row("doc-2"), plain])
    page = Path(build_report(str(out))).read_text()
    assert re.search(r"capture 66\.7% \(4 of 6 evidence items read were held after their read\) · retention "
                     r"50\.0% \(2 of 4 still held at the answer\), over 2 row\(s\) with known evidence; "
                     r'<a href="#filter=status=evlost">2 row\(s\)</a> lost some', page)
    rows = {r["id"]: r for r in data_of(page)["rows"]}
    assert "rt" in rows["doc-1"] and "rt" not in rows["doc-3"]


CHROMIUM = find_chromium()


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (make browser)")
def test_the_page_draws_the_cells(tmp_path):
    """In Chromium, the row's timeline has one line per needle with its read step, captured/retained, and one
    coloured run per stretch of equal states, placed at its steps; the evlost filter lists the row."""
    out = write_output(tmp_path / "out", [scripted_row("doc-1"), {**scripted_row("doc-2"), "task": "qa_1"}])
    page = Path(build_report(str(out)))
    detail = re.search(r'<section id="detail">(.*)</section>', open_page(page, fragment="row=doc-1").dom, re.S).group(1)
    assert "Evidence in memory" in detail and "3 item(s) read, 2 captured" in detail
    lines = re.findall(r'<tr class="rt-item">(.*?)</tr>', detail, re.S)
    assert len(lines) == 3
    want_runs = {"4417": [("u", 0, 1), ("h", 1, 2), ("x", 3, 2)], "5550": [("u", 0, 2), ("x", 2, 3)],
                 "9021": [("g", 0, 1), ("u", 1, 2), ("h", 3, 2)]}
    for line in lines:
        value = re.search(r'<span class="mut">(\d+)</span>', line).group(1)
        tds = re.findall(r"<td>(.*?)</td>", line, re.S)
        _, read_at, captured, retained = [re.sub(r"<[^>]+>", "", t) for t in tds[:4]]
        assert (int(read_at), captured, retained) == EXPECTED[value][1:2] + tuple(
            "yes" if b else "no" for b in EXPECTED[value][2:])
        runs = re.findall(r'<i class="rs rs-(\w)" style="left: ?([\d.]+)%; ?width: ?([\d.]+)%;?"', line)
        assert [(k, round(float(a) * 5 / 100), round(float(w) * 5 / 100)) for k, a, w in runs] == want_runs[value]
    dom = open_page(page, fragment="filter=status=evlost").dom
    table = re.search(r'<table id="rows">.*?</table>', dom, re.S).group(0)
    assert table.count("<tr data-k=") == 1 and 'data-k="doc-1"' in table
