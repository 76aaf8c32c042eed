"""No document can blank the report. Every field of a row may hold text that ends or
re-opens a script (``</script>``, ``<!--<script>``, ``<!--``) or a JS line break (U+2028/2029):
the embedded JSON is escaped for a script context, so the page's table renders every row and no
element comes from the data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memagent.report.html import render, row_view
from pipelines.report import build_report
from infra.report_browser import find_chromium, open_page

HOSTILE = ["<!--<script>", "</script>", "<!--", "a\u2028b\u2029c", "</script><b id=\"injected\">x</b><script>",
           "<!--<script>alert(1)//", "<img id=\"injected-img\" src=x onerror=\"document.body.dataset.pwned=1\">",
           "]]>&amp;<>&\"'"]


def hostile_row(i: int, text: str) -> dict:
    """A batch output row with ``text`` in every text field (id, question, context, answers, memory,
    prediction, response, error-free) and the answer present in the memory and the context."""
    context = f"Filler {text} filler. The answer is {text} here. {text} more filler."
    steps = [{"step": 0, "kind": "memory", "chunk_index": 0, "char_start": 0, "char_end": len(context) // 2,
              "memory": f"memory {text}", "prompt_tokens": 10, "completion_tokens": 5, "finish_reason": text,
              "seconds": 0.1},
             {"step": 1, "kind": "memory", "chunk_index": 1, "char_start": len(context) // 2,
              "char_end": len(context), "memory": f"memory {text} and {text}", "prompt_tokens": 10,
              "completion_tokens": 5, "finish_reason": "stop", "seconds": 0.1},
             {"step": 2, "kind": "answer", "chunk_index": None, "char_start": None, "char_end": None,
              "memory": f"answer {text}", "prompt_tokens": 10, "completion_tokens": 5, "finish_reason": "stop",
              "seconds": 0.1}]
    return {"id": f"{text}-{i}", "question": f"What is {text}?", "context": context, "answers": [text],
            "prediction": text, "response": f"\\boxed{{{text}}}", "memory": f"memory {text} and {text}",
            "n_chunks": 2, "context_tokens": 20, "truncated": False, "steps": steps, "score": 1.0,
            "error": None, "model": text, "config": json.dumps({"note": text}), "seconds": 0.5,
            "method": text}


def error_row(i: int, text: str) -> dict:
    row = {k: None for k in hostile_row(0, "")}
    return {**row, "id": f"err-{text}-{i}", "question": text, "answers": [text], "error": f"input: {text}",
            "model": "m", "config": "{}", "method": text}


def test_script_json_escapes_for_a_script_context():
    from memagent.report.html import script_json

    data = {"k": "</script><!--<script>&\u2028\u2029>"}
    text = script_json(data)
    assert not re.search(r"[<>&\u2028\u2029]", text)
    assert "\\u003c/script\\u003e\\u003c!--\\u003cscript\\u003e\\u0026\\u2028\\u2029\\u003e" in text
    assert json.loads(text) == data  # still the same JSON


def test_page_has_no_raw_markup_inside_the_data_script():
    views = [row_view(hostile_row(i, t)) for i, t in enumerate(HOSTILE)]
    page = render("t", "s", "", views)
    body = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page, re.S).group(1)
    assert not re.search(r"[<>&\u2028\u2029]", body)  # nothing the HTML tokenizer or a JS parser acts on
    plain = render("t", "s", "", [row_view(hostile_row(0, "plain"))])  # the page's own scripts
    assert page.count("</script>") == plain.count("</script>") and page.count("<script") == plain.count("<script")
    assert [v["id"] for v in json.loads(body)["rows"]] == [f"{t}-{i}" for i, t in enumerate(HOSTILE)]


CHROMIUM = find_chromium()


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (`make browser`): the page cannot be opened")
def test_hostile_rows_render_in_chromium(tmp_path):
    rows = [hostile_row(i, t) for i, t in enumerate(HOSTILE)] + [error_row(i, t) for i, t in enumerate(HOSTILE[:3])]
    out = tmp_path / "out"
    out.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), out / "part-0.parquet")
    page = Path(build_report(str(out), str(tmp_path / "report.html")))
    dom = open_page(page).dom
    assert 'data-ready="1"' in dom, "the page's script did not run: the data swallowed it"
    table = re.search(r'<table id="rows">.*?</table>', dom, re.S).group(0)
    assert table.count("<tr data-k=") == len(rows)
    injected = re.compile(r"<(b|img)\b[^>]*\bid=\"injected")  # an element, not the text shown as &lt;b ...
    assert not injected.search(dom) and "data-pwned" not in dom
    plain = tmp_path / "plain"
    plain.mkdir()
    pq.write_table(pa.Table.from_pylist([hostile_row(0, "plain")]), plain / "part-0.parquet")
    plain_dom = open_page(build_report(str(plain), str(tmp_path / "plain.html"))).dom
    assert dom.count("<script") == plain_dom.count("<script")  # the page's own scripts, nothing else
    assert "&lt;!--&lt;script&gt;" in table  # the hostile text is shown as text
    # The timeline of a hostile row opens too (its key is in the URL fragment, percent-encoded).
    from urllib.parse import quote

    key = f"{HOSTILE[4]}-4"
    detail_dom = open_page(page, fragment="row=" + quote(key, safe="")).dom
    detail = re.search(r'<section id="detail">(.*)</section>', detail_dom, re.S).group(1)
    assert "Timeline of row" in detail and not injected.search(detail_dom) and "data-pwned" not in detail_dom
