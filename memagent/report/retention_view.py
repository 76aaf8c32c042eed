"""The report's retention view: per row with known evidence, each item's life in the memory, step by step.

The evidence is rebuilt from the row itself (:func:`memagent.retention.row_evidence`: a NIAH row's
needles, a qa_2 row's supporting paragraphs, from its ``context``, ``answers`` and ``gold_positions``)
and matched against its memory steps with the rules the batch job's ``evidence_*`` columns use, so
the page and the columns agree. A row's view (``rt``) is compact and bounded:

- ``c``: ``[read, captured, retained]`` counts over all the row's items;
- ``i``: up to :data:`MAX_ITEMS` items, each ``[label, value, read_at, cells, captured, retained]``,
  ``cells`` one state per memory step, run-length coded (:func:`cells`): ``.`` not yet read, ``?``
  held before it was read (a guess), ``h`` read and held, ``x`` read and not held;
- ``more``: how many items were left out (present only when some were).

:func:`retention_summary` sums the counts of many row views into the run summary's rates.
"""

from __future__ import annotations

import html
from typing import Any, Iterable, Mapping

from memagent.retention import item_outcomes, memory_steps, row_evidence, timeline

MAX_ITEMS = 16  # items drawn per row; the counts cover every item
VALUE_CHARS = 80  # of an item's value (a supporting paragraph's title can be long)
STATES = {(False, False): ".", (False, True): "?", (True, True): "h", (True, False): "x"}


def cells(states: str) -> str:
    """``states`` (one character a step) run-length coded: each run as its character and its length
    (``"...hhx"`` -> ``".3h2x1"``), so a long read's steady stretches cost a few characters."""
    out, i = [], 0
    while i < len(states):
        j = i
        while j < len(states) and states[j] == states[i]:
            j += 1
        out.append(f"{states[i]}{j - i}")
        i = j
    return "".join(out)


def retention_view(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """The row's ``rt`` (module docstring); None for a row without known evidence or memory steps
    (an error row, the full-context baseline, a task whose answer is stated nowhere in particular)."""
    if row.get("error") or not isinstance(row.get("context"), str):
        return None
    try:  # a hand-edited row may hold anything: gold positions without their blocks, text as a position
        evidence = row_evidence(row)
        steps = memory_steps(s for s in row.get("steps") or [] if isinstance(s, Mapping))
    except (ValueError, TypeError, KeyError):
        return None
    if not evidence or not steps:
        return None
    table = timeline(evidence, steps)
    outcomes = item_outcomes(evidence, steps)
    items = []
    for j, (item, o) in enumerate(zip(evidence[:MAX_ITEMS], outcomes)):
        value = str(item.value)
        value = value if len(value) <= VALUE_CHARS else value[:VALUE_CHARS] + " …"
        items.append([item.label, value, o.read_at, cells("".join(STATES[t[j]] for t in table)),
                      int(o.captured), int(o.retained)])
    view: dict[str, Any] = {"c": [sum(o.read_at is not None for o in outcomes), sum(o.captured for o in outcomes),
                                  sum(o.retained for o in outcomes)], "i": items}
    if len(evidence) > MAX_ITEMS:
        view["more"] = len(evidence) - MAX_ITEMS
    return view


def retention_summary(views: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Counts over the row views that have an ``rt``: rows, items read, captured, retained, lost (captured,
    then gone at the answer: rows with any are the ``evlost`` filter), and the rates ``capture`` (captured /
    read) and ``retention`` (retained / captured), None over nothing; None when no row has known evidence."""
    rows = read = captured = retained = lost_rows = 0
    for v in views:
        rt = v.get("rt")
        if not rt:
            continue
        rows += 1
        read, captured, retained = read + rt["c"][0], captured + rt["c"][1], retained + rt["c"][2]
        lost_rows += rt["c"][1] > rt["c"][2]
    if not rows:
        return None
    return {"rows": rows, "read": read, "captured": captured, "retained": retained, "lost_rows": lost_rows,
            "capture": captured / read if read else None, "retention": retained / captured if captured else None}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def summary_items(views: list[Mapping[str, Any]], by_method: bool) -> list[tuple[str, str]]:
    """The run summary's capture/retention line(s) (HTML values, numbers only), per method in an eval run."""
    groups = sorted({v.get("m") for v in views if v.get("m")}) if by_method else []
    parts = [(f" · {m}", [v for v in views if v.get("m") == m]) for m in groups] or [("", views)]
    out = []
    for suffix, vs in parts:
        s = retention_summary(vs)
        if s is None:
            continue
        where = f"method={html.escape(suffix[3:])}&amp;" if suffix else ""
        lost = (f'; <a href="#filter={where}status=evlost">{s["lost_rows"]:,} row(s)</a> lost some'
                if s["lost_rows"] else "")
        out.append((f"capture / retention{suffix}",
                    f"capture {_pct(s['capture'])} ({s['captured']:,} of {s['read']:,} evidence items read were held "
                    f"after their read) · retention {_pct(s['retention'])} ({s['retained']:,} of {s['captured']:,} "
                    f"still held at the answer), over {s['rows']:,} row(s) with known evidence{lost}"))
    return out
