"""The report's extraction part: per-field values and evidence of each row, and the per-field summary.

An extraction run (``memagent batch --schema``) writes ``extraction`` (the reply's JSON text) and
``field_evidence`` (per field: the value's JSON text, the memory step where it first appeared and
its char span in the document). :func:`field_view` turns them into the compact ``x``/``xs`` keys
of a row view (values with their evidence, and short windows of the source text around each
span); :func:`fields_html` is the summary's section: filled rate per field, the value
distribution of enum and boolean fields, each value count linking to its rows.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from typing import Any, Mapping, Sequence
from urllib.parse import quote

FIELD_SNIPPET_CHARS = 60  # source text kept either side of a field's evidence span
DISTRIBUTION_KINDS = ("enum", "boolean")
MAX_DISTINCT_SHOWN = 12  # an enum's values beyond this are summed as "other"
VALUE_CHARS = 500  # characters of one value the report shows; the rest is counted in a visible mark


def cap(text: str, limit: int = VALUE_CHARS) -> str:
    """``text`` cut at ``limit`` characters, with a visible mark of how many more there were."""
    return text if len(text) <= limit else f"{text[:limit]}…({len(text) - limit:,} more characters)"


def is_int(x: Any) -> bool:
    """A whole number, not a bool (a hand-edited output may hold anything in a numeric column)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def schema_fields(config: str | Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """``[{"name", "kind", "enum"}]`` of the extraction schema recorded in a row's ``config``, or None."""
    try:
        cfg = json.loads(config) if isinstance(config, str) else dict(config or {})
    except (ValueError, TypeError):
        return None
    schema = cfg.get("extraction") if isinstance(cfg, dict) else None
    if not isinstance(schema, dict):
        return None
    try:
        from memagent.extraction.schema import parse_fields

        return [{"name": f.name, "kind": f.kind, "enum": list(f.enum)} for f in parse_fields(schema)]
    except (ImportError, ValueError):  # a schema this version cannot parse: names and enums as written
        props = schema.get("properties") or {}
        return [{"name": k, "kind": "enum" if "enum" in p else str(p.get("type", "string")),
                 "enum": list(p.get("enum") or [])} for k, p in props.items() if isinstance(p, dict)]


def _paths(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted paths of an extraction object's leaves (objects walked; arrays are leaves)."""
    return [p for k, v in values.items() for p in
            (_paths(v, f"{prefix}{k}.") if isinstance(v, Mapping) and v else [f"{prefix}{k}"])]


def _at(values: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted leaf path of an extraction object (``lender.name``), or None."""
    if path in values:
        return values[path]
    node: Any = values
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def _capped_json(value: str) -> str:
    """A value's JSON text with a long string cut by :func:`cap` (still JSON, so the page shows it as text)."""
    if len(value) <= VALUE_CHARS:
        return value
    try:
        decoded = json.loads(value)
    except ValueError:
        return cap(value)
    return json.dumps(cap(decoded), ensure_ascii=False) if isinstance(decoded, str) else cap(value)


def _evidence(row: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = row.get("field_evidence")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return []
    return [dict(e) for e in raw or [] if isinstance(e, Mapping) and e.get("field")]


def field_view(row: Mapping[str, Any], context: str | None) -> dict[str, Any]:
    """``{"x": [[field, value JSON or None, step, char_start, char_end], ...], "xs": [snippet, ...]}``
    of an extraction row (empty for other rows). A snippet is ``[field, offset, text, [[start, end, "fld"]]]``
    like :func:`memagent.report.html.snippets`' windows."""
    if "field_evidence" not in row and "extraction" not in row:
        return {}
    try:
        values = json.loads(row["extraction"]) if row.get("extraction") else {}
    except ValueError:
        values = {}
    values = values if isinstance(values, dict) else {}
    evidence = {e["field"]: e for e in _evidence(row)}
    x, snips = [], []
    for name in dict.fromkeys([*evidence, *_paths(values)]):
        e = evidence.get(name, {})
        value = e.get("value")
        if value is None and _at(values, name) is not None:
            value = json.dumps(_at(values, name), ensure_ascii=False)
        if value == "null":
            value = None
        value = _capped_json(value) if isinstance(value, str) else value
        step, a, b = e.get("step"), e.get("char_start"), e.get("char_end")
        x.append([name, value, step, a, b])
        # A hand-edited output may hold anything there: only whole numbers within the text cut a snippet.
        if context and all(is_int(v) for v in (a, b)) and 0 <= a <= b <= len(context):
            lo, hi = max(0, a - FIELD_SNIPPET_CHARS), min(len(context), b + FIELD_SNIPPET_CHARS)
            limit = 2 * FIELD_SNIPPET_CHARS + VALUE_CHARS  # a long span is cut like a long value
            snips.append([name, lo, cap(context[lo:hi], limit), [[a - lo, min(b - lo, limit), "fld"]]])
    if not x:
        return {}
    return {"x": x, "xs": snips or None}


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _href(field: str, value: str) -> str:
    return _e(f"#filter=field={quote(field, safe='')}&value={quote(value, safe='')}")


def fields_html(views: Sequence[Mapping[str, Any]], fields: list[dict[str, Any]] | None) -> str:
    """The per-field summary of the extraction rows among ``views``; "" when there are none.

    Filled: rows whose value is not null, of all rows (an error row fills nothing). Evidence: of
    the filled, those whose value was found in the text (a span to click in the row's timeline).
    """
    # With the schema known (from ``config``) every row counts, even when none produced a value.
    rows = list(views) if fields else [v for v in views if v.get("x") is not None]
    if not rows:
        return ""
    kinds = {f["name"]: f for f in fields or []}
    names = list(dict.fromkeys([*kinds, *(x[0] for v in rows for x in v.get("x") or [])]))
    h = ['<h3 id="fields">Extracted fields</h3><p class="mut">Filled: rows with a value, of all rows. '
         "With evidence: values found in the document (click a row, then the value, for its span). "
         "Click a count to list its rows.</p>",
         '<table class="fields"><tr><th>field</th><th>type</th><th>filled</th><th>with evidence</th>'
         "<th>values</th></tr>"]
    h += [_field_row(name, rows, kinds.get(name) or {}) for name in names]
    h.append("</table>")
    return "\n".join(h)


def _field_row(name: str, rows: Sequence[Mapping[str, Any]], spec: Mapping[str, Any]) -> str:
    """One field's row of the summary: its type, how many rows filled it, how many of those with evidence, and its
    values (a distribution for an enum, a boolean or a kind in DISTRIBUTION_KINDS; else the most frequent)."""
    n = len(rows)
    got = [dict(zip(("f", "v", "s", "a", "b"), x)) for v in rows for x in v.get("x") or [] if x[0] == name]
    filled = [g for g in got if g["v"] is not None]
    with_ev = sum(1 for g in filled if g["a"] is not None)
    kind = spec.get("kind") or ("boolean" if filled and all(g["v"] in ("true", "false") for g in filled) else "")
    rate = f"{100 * len(filled) / n:.1f}%" if n else "n/a"
    fill = (f'<a href="{_href(name, "*")}">{len(filled)}</a> of {n} ({rate})'
            + (f' · <a href="{_href(name, "")}">{n - len(filled)} empty</a>' if len(filled) < n else ""))
    ev = f"{with_ev} of {len(filled)}" if filled else "–"
    counts = Counter(g["v"] for g in filled)
    if kind in DISTRIBUTION_KINDS or spec.get("enum"):
        values = _distribution(name, spec, kind, counts, len(filled))
    else:
        top = ", ".join(f'<a href="{_href(name, v)}"><code>{_e(v)}</code></a>&nbsp;×{c}'
                        for v, c in counts.most_common(3) if c > 1)
        values = f"{len(counts)} distinct" + (f"; most frequent: {top}" if top else "")
    return (f"<tr><td><code>{_e(name)}</code></td><td>{_e(kind)}</td><td>{fill}</td><td>{ev}</td>"
            f"<td>{values}</td></tr>")


def _distribution(name: str, spec: Mapping[str, Any], kind: str, counts: Counter, filled: int) -> str:
    """A bar per value (the enum's order, or true/false, then the others by count; at most MAX_DISTINCT_SHOWN),
    each with its count linking to its rows."""
    order = [json.dumps(x, ensure_ascii=False) for x in spec.get("enum") or []] or (
        ["true", "false"] if kind == "boolean" else [])
    order += [v for v, _ in counts.most_common() if v not in order]
    cells = []
    for k, value in enumerate(order):
        c = counts.get(value, 0)
        if k >= MAX_DISTINCT_SHOWN:
            rest = sum(counts.get(v, 0) for v in order[k:])
            cells.append(f'<span class="mut">{len(order) - k} more values: {rest}</span>')
            break
        share = 100 * c / filled if filled else 0
        label = _e(json.loads(value) if value.startswith('"') else value)
        count = f'<a href="{_href(name, value)}">{c}</a>' if c else "0"
        cells.append(f'<div class="dist"><span class="dl">{label}</span><span class="db">'
                     f'<i style="width:{share:.1f}%"></i></span> {count} <span class="mut">'
                     f"({share:.0f}%)</span></div>")
    return "".join(cells)
