"""The report's records view: per record type a table of the run's records and, per record, the
document text around its evidence spans (no I/O; ``pipelines/report.py`` reads the records output).

:func:`records_view` turns one record type's rows (as ``pipelines.records_output.read_records``
gives them: ``id``, ``record_index``, one column per item field, nested objects as dicts,
``record_evidence``, ``first_chunk``, ``last_chunk``, ``mentions``) and the documents' texts into
the compact data the page embeds under ``records``: the columns (item leaves, dotted for nested
objects) and per record its values as text and its snippets: windows of the document around its
spans (close spans share one window), each span marked with the field it grounds. The page
(``assets/report.js``) sorts, filters and shows them; every value is escaped there.

The page is bounded whatever the records hold: a value is cut at :data:`VALUE_CHARS` and a
snippet at :data:`SNIPPET_MAX_CHARS`, each with a visible ``…(N more characters)`` mark, and a
type embeds records until :data:`MAX_RECORDS_PER_TYPE` or :data:`MAX_RECORD_DATA_CHARS` of
values and snippets (the page shows the type's total beside what it embeds).

Snippets need the documents' texts, which the caller reads after the records (a text is read,
never kept): :func:`records_view` leaves ``sn`` empty without ``contexts``, and
``wanted`` and :func:`add_snippets` fill it one document at a time.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any, Iterable, Mapping, Sequence

from memagent.documents.evidence_pages import EVIDENCE_PAGES_COLUMN, page_label
from memagent.report.fields import VALUE_CHARS, cap, is_int
from memagent.result_schema import RECORD_COLUMNS

RECORD_SNIPPET_CHARS = 80  # document text kept either side of a record's span (or group of close spans)
MAX_RECORD_SNIPPETS = 6  # windows per record; further spans are listed, not shown
MAX_RECORDS_PER_TYPE = 20_000  # records embedded per type (the page says when there are more)
SNIPPET_MAX_CHARS = 2 * RECORD_SNIPPET_CHARS + VALUE_CHARS  # one window's text (a long span is cut)
MAX_RECORD_DATA_CHARS = 8_000_000  # characters of values and snippets embedded per type (~8 MB of page)


def _leaves(value: Any, prefix: str) -> Iterable[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _leaves(v, f"{prefix}.{k}")
    else:
        yield prefix, value


def _text(value: Any) -> str | int | float | None:
    """A value as the table shows it: numbers stay numbers (they sort as numbers), the rest text."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    if isinstance(value, (list, tuple)):
        return cap(", ".join(str(v) for v in value))
    return cap(str(value))


def _int(x: Any) -> int | None:
    return x if is_int(x) else None


def record_snippets(context: str | None, evidence: Sequence[Mapping[str, Any]] | None,
                    pad: int = RECORD_SNIPPET_CHARS) -> list[list[Any]]:
    """``[[offset, text, [[start, end, field], ...]], ...]``: windows of ``context`` around the spans
    (offsets into the document; span bounds relative to the window's text), close spans merged; a window
    of spans with ``pages`` (a converted document's) has a fourth element, their pages ("p. 14")."""
    if not isinstance(context, str):
        return []
    spans = sorted((s, e, _label(ev), tuple(ev.get("pages") or ())) for ev in evidence or ()
                   if isinstance(ev, Mapping) and (s := _int(ev.get("char_start"))) is not None
                   and (e := _int(ev.get("char_end"))) is not None and 0 <= s < e <= len(context))
    groups: list[list[tuple[int, int, str, tuple[int, ...]]]] = []
    for span in spans:
        if groups and span[0] - max(g[1] for g in groups[-1]) <= 2 * pad:
            groups[-1].append(span)
        else:
            groups.append([span])
    out = []
    for group in groups[:MAX_RECORD_SNIPPETS]:
        lo = max(0, group[0][0] - pad)
        hi = min(len(context), max(g[1] for g in group) + pad)
        text = context[lo:hi]
        if len(text) > SNIPPET_MAX_CHARS:
            text = cap(text, SNIPPET_MAX_CHARS)
        snippet = [lo, text, [[s - lo, min(e - lo, SNIPPET_MAX_CHARS), f] for s, e, f, _ in group
                              if s - lo < SNIPPET_MAX_CHARS]]
        label = page_label(sorted({n for g in group for n in g[3]}))
        out.append(snippet + [label] if label else snippet)  # a converted document's: "p. 14"
    return out


def _label(ev: Mapping[str, Any]) -> str:
    """A span's mark: its field and how it was grounded (``amount (exact)``, ``payer (memory)``)."""
    return f"{ev.get('field')} ({ev['grounding']})" if ev.get("grounding") else str(ev.get("field"))


def conflicts(row: Mapping[str, Any]) -> list[list[Any]]:
    """``[[field, value, step], ...]``: the values other mentions stated that the record does not keep."""
    return [[str(c.get("field")), cap(str(c.get("value")), VALUE_CHARS), _int(c.get("step"))]
            for c in row.get("record_conflicts") or () if isinstance(c, Mapping)]


def _flat(row: Mapping[str, Any]) -> dict[str, Any]:
    """A record's leaves by dotted path (the first of two leaves with one path wins; the schema refuses such names)."""
    values: dict[str, Any] = {}
    for key, value in row.items():
        if key not in RECORD_COLUMNS and key != EVIDENCE_PAGES_COLUMN:
            for path, leaf in _leaves(value, key):
                values.setdefault(path, leaf)
    return values


def _size(values: Iterable[Any]) -> int:
    return sum(len(v) if isinstance(v, str) else 8 for v in values)


def _snippet_chars(spans: list[dict[str, Any]]) -> int:
    """At most how many characters of text a record's snippets take (close spans share a window)."""
    sizes = sorted((min(2 * RECORD_SNIPPET_CHARS + e - s, SNIPPET_MAX_CHARS) for ev in spans
                    if is_int(s := ev.get("char_start")) and is_int(e := ev.get("char_end")) and e > s), reverse=True)
    return sum(sizes[:MAX_RECORD_SNIPPETS])


def _spans(evidence: Any, pages: Any = None) -> list[dict[str, Any]]:
    """What a record's snippets need of its evidence: each entry's field and char span, and its pages when the
    record's ``evidence_pages`` (a converted document's) names them."""
    by_span = {e.get("span"): e.get("pages") for e in pages or () if isinstance(e, Mapping)}
    return [{**{k: ev.get(k) for k in ("field", "char_start", "char_end", "grounding")},
             "pages": by_span.get(f"record_evidence[{j}]")}
            for j, ev in enumerate(evidence or ()) if isinstance(ev, Mapping)]


Wanted = dict[str, list[tuple[dict[str, Any], list[dict[str, Any]]]]]


def records_view(name: str, rows: Iterable[Mapping[str, Any]], contexts: Mapping[str, str] | None = None,
                 limit: int = MAX_RECORDS_PER_TYPE, budget: int = MAX_RECORD_DATA_CHARS,
                 wanted: Wanted | None = None) -> dict[str, Any]:
    """One record type's part of the page data: ``{"name", "cols", "rows", "total"}``; each row is
    ``{"d": doc id, "i": record index, "v": [values in cols order], "m", "fc", "lc", "sn": snippets,
    "cf": conflicts}`` (:func:`conflicts`; a snippet's marks name the field and its grounding).

    ``rows`` are read once; up to ``limit`` records and ``budget`` characters of values and
    snippets are embedded.
    ``sn`` is empty without ``contexts``: with ``wanted`` given, each embedded row is added there
    (document id -> rows with their spans) for :func:`add_snippets` to fill in."""
    cols: list[str] = []
    out_rows: list[dict[str, Any]] = []
    shown: list[dict[str, Any]] = []
    total = 0
    for row in rows:
        total += 1
        if len(out_rows) >= limit or budget < 0:
            continue
        values = {path: _text(leaf) for path, leaf in _flat(row).items()}
        doc, spans = str(row.get("id")), _spans(row.get("record_evidence"), row.get(EVIDENCE_PAGES_COLUMN))
        budget -= _size(values.values()) + _snippet_chars(spans)
        if budget < 0 and out_rows:
            continue
        cols.extend(p for p in values if p not in cols)
        out = {"d": doc, "i": _int(row.get("record_index")), "m": _int(row.get("mentions")),
               "fc": _int(row.get("first_chunk")), "lc": _int(row.get("last_chunk")),
               "sn": record_snippets((contexts or {}).get(doc), spans), "cf": conflicts(row)}
        if wanted is not None:
            wanted.setdefault(doc, []).append((out, spans))
        out_rows.append(out)
        shown.append(values)
    for out, values in zip(out_rows, shown):
        out["v"] = [values.get(c) for c in cols]
    return {"name": name, "cols": cols, "rows": out_rows, "total": total}


def add_snippets(wanted: Wanted, doc: str, context: Any) -> None:
    """Cut the snippets of document ``doc``'s records (taken out of ``wanted``) from its text."""
    for out, spans in wanted.pop(doc, ()):
        out["sn"] = record_snippets(context if isinstance(context, str) else None, spans)


def schema_record_types(config: str | Mapping[str, Any] | None) -> list[str]:
    """The record type names of the extraction schema recorded in a row's ``config`` (none: [])."""
    try:
        cfg = json.loads(config) if isinstance(config, str) else dict(config or {})
        schema = cfg.get("extraction") if isinstance(cfg, dict) else None
        if not isinstance(schema, dict):
            return []
        from memagent.extraction.schema import ExtractionSchema

        return [r.name for r in ExtractionSchema.model_validate(schema).record_types]
    except (ValueError, TypeError):  # a schema this version cannot read: no records view
        return []
