"""The run report as one self-contained HTML page: tables in, HTML string out (no I/O).

:func:`row_view` turns one batch output row into the compact record the page embeds (memory
steps as word diffs against the previous memory, snippets of the source text around the gold
answers and the evidence, never the whole context); :func:`render` lays out the summary, the
eval pictures and table, and the row table + on-demand timeline (``assets/report.css`` and
``report.js``, inlined: see :mod:`memagent.report`).
"""

from __future__ import annotations

import difflib
import html
import json
import re
from collections import Counter
from importlib import resources
from typing import Any, Iterable, Mapping, Sequence

from memagent.attribution import attribute, holds, memory_steps
from memagent.documents.columns import PAGES_COLUMN, page_spans
from memagent.documents.evidence_pages import page_label
from memagent.documents.model import pages_of
from memagent.evaluate import TASK_LABELS, length_label, wilson_interval
from memagent.report.fields import field_view, is_int, is_number
from memagent.report.retention_view import retention_view

SNIPPET_CHARS = 90  # context kept either side of a highlighted span
MAX_SNIPPETS = 4
CLIP = 400  # question / prediction / response characters kept per row
# Words and the whitespace between them; the page's script splits memories the same way.
_TOKENS = re.compile(r"[ \t\n\r\f\v]+|[^ \t\n\r\f\v]+")


def _asset(name: str) -> str:
    """A file of ``assets/``: package data, so it is read wherever the package is installed."""
    return (resources.files("memagent.report") / "assets" / name).read_text(encoding="utf-8")


# Read once, at import; every page inlines them (no CDN, no network: the page is one file).
CSS = _asset("report.css")
JS = _asset("report.js")


def clip(text: Any, limit: int = CLIP) -> str | None:
    if text is None:
        return None
    text = str(text)
    return text if len(text) <= limit else text[:limit] + " …"


def word_diff(before: str, after: str) -> list[Any]:
    """``after`` as diff ops against ``before`` on words: a plain string is unchanged text,
    ``[1, text]`` was added, ``[-1, text]`` removed. Joining the strings and additions gives ``after``."""
    a, b = _TOKENS.findall(before or ""), _TOKENS.findall(after or "")
    ops: list[Any] = []

    def emit(op: int, text: str) -> None:
        if not text:
            return
        last = ops[-1] if ops else None
        if op == 0 and isinstance(last, str):
            ops[-1] = last + text
        elif op != 0 and isinstance(last, list) and last[0] == op:
            last[1] += text
        else:
            ops.append(text if op == 0 else [op, text])

    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(str.isspace, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            emit(0, "".join(b[j1:j2]))
            continue
        if tag in ("delete", "replace"):
            emit(-1, "".join(a[i1:i2]))
        if tag in ("insert", "replace"):
            emit(1, "".join(b[j1:j2]))
    return ops


def diff_ops(before: str, after: str) -> list[int]:
    """The changes from ``before`` to ``after`` on words, compactly: flat ``[i1, i2, j1, j2, ...]``,
    one quadruple per change (before's words ``i1:i2`` replaced by after's ``j1:j2``; either may be
    empty). The page rebuilds :func:`word_diff` from it and both texts, so no text is stored twice."""
    a, b = _TOKENS.findall(before or ""), _TOKENS.findall(after or "")
    out: list[int] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(str.isspace, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            out += [i1, i2, j1, j2]
    return out


def _find(context: str, needle: str | None, start: int, end: int) -> tuple[int, int] | None:
    if not needle or not needle.strip():
        return None
    at = context.lower().find(needle.strip().lower(), start, end)
    return (at, at + len(needle.strip())) if at != -1 else None


def snippets(context: str, gold: Sequence[tuple[int, int]], evidence: tuple[int, int, int] | None,
             prediction: str | None, width: int = SNIPPET_CHARS) -> list[list[Any]]:
    """Short windows of the source text: around the gold answers and the prediction in its evidence
    chunk. Each is ``[label, offset, text, [[start, end, class], ...]]`` (marks relative to offset)."""
    marks: list[tuple[int, int, str, str]] = [(a, b, "gold", "gold answer") for a, b in gold]
    if evidence:
        step, c0, c1 = evidence
        hit = _find(context, prediction, c0, c1)
        label = f"evidence (step {step}, chars {c0}–{c1})"
        marks.append((*hit, "pred", label) if hit else (c0, min(c1, c0 + 1), "pred", label))
    marks.sort()
    windows: list[list[Any]] = []  # [start, end, labels, marks]
    for a, b, cls, label in marks:
        lo, hi = max(0, a - width), min(len(context), b + width)
        if windows and lo <= windows[-1][1]:
            w = windows[-1]
            w[1] = max(w[1], hi)
            if label not in w[2]:
                w[2].append(label)
            w[3].append((a, b, cls))
        elif len(windows) < MAX_SNIPPETS:
            windows.append([lo, hi, [label], [(a, b, cls)]])
    out = []
    for lo, hi, labels, ms in windows:
        rel, at = [], lo
        for a, b, cls in sorted(ms):
            a = max(a, at)
            if b > a:
                rel.append([a - lo, b - lo, cls])
                at = b
        out.append([", ".join(labels), lo, context[lo:hi], rel])
    return out


def row_view(row: Mapping[str, Any], key: str | None = None, metric: str = "sub_em") -> dict[str, Any]:
    """The compact record of one output row that the page embeds (``context`` is read, never kept).

    Attribution comes from the row's columns; outputs written before those columns existed get
    it computed here from ``steps``/``answers``/``context``. A hand-edited row may hold anything in
    any column (a string in ``n_chunks``): values are passed on as they are, for the page to show
    as text, and only whole numbers are used as positions (snippets are cut around those alone).
    """
    metric = row.get("metric") or metric
    steps = list(row.get("steps") or [])
    raw = row.get("answers")
    answers = [raw] if isinstance(raw, str) else [str(a) for a in raw or []]
    context = row.get("context") if isinstance(row.get("context"), str) else None
    prediction = row.get("prediction")
    ev, found, lost, spans, held = _attribution(row, steps, answers, context, metric)
    evidence = ev if ev[0] is not None else None
    st = _step_entries(steps)
    view = {
        "k": key or str(row.get("id")), "id": str(row.get("id")), "q": clip(row.get("question")),
        "a": [clip(a, 200) for a in answers] or None, "p": clip(prediction), "s": row.get("score"),
        "e": row.get("error"), "n": row.get("n_chunks"), "ct": row.get("context_tokens"),
        "cl": len(context) if context is not None else None, "tr": row.get("truncated") or None,
        "sec": row.get("seconds"), "ev": list(evidence) if evidence else None, "f": found, "l": lost,
        "as": [list(s) for s in spans] or None, "h": "".join("1" if h else "0" for h in held) or None,
        "st": st or None, "rs": clip(row.get("response"), 1000),
        "sn": _snippets(context, spans, evidence, prediction),
    }
    for col, short in (("method", "m"), ("task", "t"), ("length", "L")):
        if row.get(col) is not None:
            view[short] = row[col]
    view.update(field_view(row, context))  # extraction runs: per-field values and evidence spans
    add_page_labels(view, row.get(PAGES_COLUMN))
    view["rt"] = retention_view(row)  # known evidence (needles, supporting paragraphs) in the memory per step
    return {k: v for k, v in view.items() if v is not None}


def _attribution(row: Mapping[str, Any], steps: list[Any], answers: list[str], context: str | None,
                 metric: str) -> tuple[tuple[Any, Any, Any], Any, Any, list[tuple[Any, Any]], list[bool]]:
    """The row's evidence ``(step, char_start, char_end)``, the steps its answer was found and lost at, the gold
    answers' spans in the text and, per memory step, whether that memory held an answer: from the row's
    attribution columns, or computed here for an output written before them."""
    if "answer_found_step" in row and "evidence_step" in row:
        ev = (row.get("evidence_step"), row.get("evidence_char_start"), row.get("evidence_char_end"))
        spans = [(s["char_start"], s["char_end"]) for s in row.get("answer_spans") or []]
        held = [holds(metric, s.get("memory"), answers) for s in memory_steps(steps)] if answers else []
        return ev, row.get("answer_found_step"), row.get("answer_lost_step"), spans, held
    at = attribute(steps, row.get("prediction"), answers, context, metric) if not row.get("error") else None
    if at is None:
        return (None, None, None), None, None, [], []
    spans = [(s["char_start"], s["char_end"]) for s in (at.answer_spans or [])]
    return ((at.evidence_step, at.evidence_char_start, at.evidence_char_end), at.answer_found_step,
            at.answer_lost_step, spans, at.held)


def _step_entries(steps: list[Any]) -> list[list[Any]]:
    """Per step ``[step, kind, char_start, char_end, completion tokens, finish reason, memory, diff_ops]``; the
    answer step reads the last memory (its text is not repeated; full-context's is empty)."""
    prev, st = "", []
    for s in steps:
        mem = s.get("memory") or ""
        kind = "m" if s.get("kind", "memory") == "memory" else "a"
        entry = [s.get("step"), kind, s.get("char_start"), s.get("char_end"), s.get("completion_tokens"),
                 s.get("finish_reason")]
        if kind == "m":
            entry += [mem, diff_ops(prev, mem)]
            prev = mem
        elif mem and mem != prev:
            entry += [clip(mem, 4000), []]
        st.append(entry)
    return st


def add_page_labels(view: dict[str, Any], pages: Any) -> None:
    """A converted document's snippets (``sn``, ``xs``) each get a fifth element: the pages of their
    marked spans ("p. 14"), from the row's page map; nothing for a row without one (or a malformed one)."""
    try:
        page_map = page_spans(pages) if pages else []
    except (KeyError, TypeError, ValueError):  # a hand-edited output: no labels rather than no report
        return
    if not page_map:
        return
    for snips in (view.get("sn"), view.get("xs")):
        for snip in snips or []:
            offset, marks = snip[1], snip[3]
            numbers = sorted({n for a, b, _ in marks for n in pages_of(page_map, offset + a, offset + b)})
            snip.append(page_label(numbers) or None)


def _snippets(context: str | None, spans: list[tuple[Any, Any]], evidence: tuple[Any, ...] | None,
              prediction: Any) -> list[list[Any]] | None:
    """:func:`snippets` over the spans and evidence whose positions are whole numbers within the text."""
    if not context:
        return None
    spans = [(a, b) for a, b in spans if is_int(a) and is_int(b) and 0 <= a <= b <= len(context)]
    if evidence and not all(is_int(x) for x in evidence):
        evidence = None
    prediction = prediction if isinstance(prediction, str) else None
    return snippets(context, spans, evidence, prediction) if spans or evidence else None


_NUM = re.compile(r"\d+(\.\d+)?")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def error_pattern(message: str) -> str:
    """A row error message with its numbers and quoted values masked, to group alike errors."""
    return _NUM.sub("N", _QUOTED.sub("'…'", message.strip().splitlines()[0] if message.strip() else ""))


def group_errors(views: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Error rows grouped by :func:`error_pattern`, most frequent first; sets each view's ``eg``."""
    counts = Counter(error_pattern(str(v["e"])) for v in views if v.get("e"))
    groups = [{"pattern": p, "count": n, "example": None, "ids": []} for p, n in counts.most_common()]
    index = {g["pattern"]: i for i, g in enumerate(groups)}
    for v in views:
        if v.get("e"):
            g = groups[index[error_pattern(str(v["e"]))]]
            v["eg"] = index[g["pattern"]]
            g["example"] = g["example"] or str(v["e"])
            if len(g["ids"]) < 5:
                g["ids"].append(v["k"])
    return groups


def accuracy(views: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Mean score over rows with answers (an error row scores 0), with its 95% Wilson interval. A
    score that is not a number (a hand-edited output) counts as no score."""
    scores = [0.0 if v.get("e") else float(v["s"]) for v in views
              if v.get("a") and (v.get("e") or is_number(v.get("s")))]
    if not scores:
        return None
    mean = sum(scores) / len(scores)
    lo, hi = wilson_interval(mean, len(scores))
    return {"accuracy": mean, "ci_low": lo, "ci_high": hi, "n": len(scores)}


def attribution_counts(views: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    c = Counter()
    for v in views:
        if v.get("e") or not any(s[1] == "m" for s in v.get("st") or []):
            continue  # error rows, and rows without memory steps (the full-context baseline)
        if v.get("a"):
            c["lost" if v.get("l") is not None else "never" if v.get("f") is None else "kept"] += 1
        if v.get("p") and "x" not in v:  # an extraction's evidence is per field (report.fields)
            c["evidence" if v.get("ev") else "noev"] += 1
    return dict(c)


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def fmt_acc(acc: Mapping[str, Any] | None) -> str:
    if not acc:
        return "n/a (no answers)"
    return (f"{100 * acc['accuracy']:.1f}% [{100 * acc['ci_low']:.1f}, {100 * acc['ci_high']:.1f}] "
            f"(95% Wilson, n={acc['n']})")


def summary_html(items: Sequence[tuple[str, Any]], groups: list[dict[str, Any]], attr: Mapping[str, int],
                 config: str | None, fields: str = "") -> str:
    """The run summary: key/value table, extracted fields (HTML), attribution counts, grouped errors, configuration."""
    h = ['<table class="kv">'] + [f"<tr><th>{_e(k)}</th><td>{v}</td></tr>" for k, v in items] + ["</table>", fields]
    if attr:
        links = [("kept", "", "gold answer found and kept to the end"),
                 ("lost", "lost", "gold answer found, then lost"),
                 ("never", "never", "gold answer never in memory"),
                 ("evidence", "", "prediction traced to a memory step"),
                 ("noev", "noev", "prediction in no memory")]
        h.append("<h3>Evidence attribution</h3><ul>")
        for key, status, label in links:
            if key in attr:
                n = f'<a href="#filter=status={status}">{attr[key]}</a>' if status else str(attr[key])
                h.append(f"<li>{n} row{'' if attr[key] == 1 else 's'}: {_e(label)}</li>")
        h.append("</ul>")
    if groups:
        h.append("<h3>Error rows</h3><table><tr><th>rows</th><th>message</th><th>example ids</th></tr>")
        for i, g in enumerate(groups):
            ids = ", ".join(f'<a href="#row={_e(k)}"><code>{_e(k)}</code></a>' for k in g["ids"])
            h.append(f'<tr><td><a href="#filter=err={i}">{g["count"]}</a></td><td><code>{_e(g["example"])}</code>'
                     f"</td><td>{ids}</td></tr>")
        h.append("</table>")
    if config:
        try:
            config = json.dumps(json.loads(config), indent=2)
        except ValueError:
            pass
        h.append(f"<details><summary>Configuration</summary><pre>{_e(config)}</pre></details>")
    return "\n".join(h)


def eval_table_html(summary: Sequence[Mapping[str, Any]]) -> str:
    """Task × length accuracy per method; each cell links to its rows in the row table."""
    lengths = sorted({int(r["length"]) for r in summary})
    h = []
    for method in dict.fromkeys(r["method"] for r in summary):
        rows = [r for r in summary if r["method"] == method]
        h.append(f'<h3>{_e(method)}</h3><table class="evtab"><tr><th>task</th>'
                 + "".join(f"<th>{length_label(x)}</th>" for x in lengths) + "</tr>")
        for task in dict.fromkeys(r["task"] for r in rows):
            cells = []
            for length in lengths:
                r = next((r for r in rows if r["task"] == task and int(r["length"]) == length), None)
                if r is None:
                    cells.append("<td>–</td>")
                    continue
                acc = float(r["accuracy"])
                bg = f"hsl({120 * acc:.0f},60%,80%)"
                err = f", {int(r['errors'])} err" if int(r.get("errors") or 0) else ""
                href = f"#filter=method={_e(method)}&amp;task={_e(task)}&amp;length={length}"
                cells.append(f'<td class="cell" style="background:{bg}"><a href="{href}">{100 * acc:.0f}% '
                             f'<span class="mut">[{100 * float(r["ci_low"]):.0f}, {100 * float(r["ci_high"]):.0f}] '
                             f"n={int(r['n'])}{err}</span></a></td>")
            h.append(f"<tr><th>{_e(TASK_LABELS.get(task, task))}</th>{''.join(cells)}</tr>")
        h.append("</table>")
    return "\n".join(h)


def facets(views: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    out = {}
    for col, short in (("method", "m"), ("task", "t"), ("length", "L")):
        values = sorted({v[short] for v in views if short in v}, key=lambda x: (str(type(x)), x))
        if values and (col != "method" or len(values) > 1 or any("t" in v for v in views)):
            out[col] = values
    return out


# Inside <script> the HTML tokenizer acts on "</script", "<!--" and "<script" whatever the
# script's type, and U+2028/2029 end a line in older JS parsers: JSON may say all five as \uXXXX.
_SCRIPT_UNSAFE = {ord(c): f"\\u{ord(c):04x}" for c in "<>&\u2028\u2029"}


def script_json(data: Any) -> str:
    """``data`` as JSON that can sit verbatim inside ``<script>``: no text of it can close the
    element or open a comment/script state (``<``, ``>``, ``&``, U+2028/2029 written as escapes)."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    return text.translate(_SCRIPT_UNSAFE)  # only inside strings: JSON syntax itself has none of these


def render(title: str, subtitle: str, summary: str, views: list[dict[str, Any]],
           images: Sequence[tuple[str, str]] = (), eval_table: str = "",
           records: Sequence[Mapping[str, Any]] = ()) -> str:
    """The whole page. ``images`` are (caption, data: URI) pairs; ``summary``/``eval_table`` are HTML;
    ``records``: the records view's data per record type (:mod:`memagent.report.records`)."""
    data = script_json({"rows": views, "facets": facets(views), "records": list(records)})
    recs = ('<section id="records"><h2>Records</h2><p class=mut>Per record type: click a header to sort, type to '
            'filter, click a record for its spans in the document.</p><div id="rec-nav"></div>'
            '<div id="rec-filters"></div><table id="rec-table"><thead></thead><tbody></tbody></table>'
            '<div id="rec-detail"></div></section>') if records else ""
    pictures = "".join(f'<div><img alt="{_e(c)}" src="{src}"><div class="mut">{_e(c)}</div></div>' for c, src in images)
    evals = (f'<h2>Accuracy by task and length</h2><div class="grid">{pictures}</div>' if pictures else "") + (
        f"<h2>Task × length</h2><p class=mut>Click a cell to list its rows.</p>{eval_table}" if eval_table else "")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>{_e(title)}</title><style>
{CSS}</style></head>
<body><header><h1>{_e(title)}</h1><div class="sub">{_e(subtitle)}</div></header><main>
<section id="summary"><h2>Run summary</h2>{summary}</section>
{evals}
<section id="table"><h2>Rows</h2><p class=mut>Click a row for its timeline; click a header to sort.</p>
<div id="filters"></div><table id="rows"><thead></thead><tbody></tbody></table><div class="pager"></div></section>
{recs}
<section id="detail"></section>
</main>
<script type="application/json" id="report-data">{data}</script>
<script>
{JS}</script>
</body></html>
"""
