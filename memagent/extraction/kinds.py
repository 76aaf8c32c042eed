"""The one table of value kinds: what each kind of extracted value is, everywhere it matters.

A property of the schema (document-level, or a field of a record type's items) is a *leaf* of
one kind. :data:`KINDS` holds one :class:`Kind` record per kind, and every part of extraction
reads it instead of keeping its own table:

============  ==========================================  ============  ==================
kind          JSON Schema test (:func:`kind_of`)          Arrow type    prompt words
============  ==========================================  ============  ==================
enum          ``{"enum": [strings]}``                     string        one of: a, b, ...
date          ``{"type": "string", "format": "date"}``    date32        date, YYYY-MM-DD
string        ``{"type": "string"}``                      string        text
number        ``{"type": "number"}``                      float64       number
integer       ``{"type": "integer"}``                     int64         whole number
boolean       ``{"type": "boolean"}``                     bool          true or false
string_array  ``{"type": "array", "items": string}``      list<string>  list of texts
json          ``"x-kind": "json"`` (a union of an array,  string (JSON  a JSON value
              an object or a scalar: resolve.py)          text)
============  ==========================================  ============  ==================

plus, per kind: how a JSON value converts to its Arrow value (:meth:`Kind.to_arrow`), the
surface forms evidence searches for (:meth:`Kind.forms`: ``48250`` is also ``48,250`` and
``48,250.00``; ``2021-03-14`` is also ``March 14, 2021``, ``14/03/2021``, ``2021年3月14日``), how a
value compares by value (:meth:`Kind.normalise`, the merge key) and whether grounding looks for it
(booleans have no span) and may drop it (``require_grounding`` drops free values, never an enum
label or a boolean, which the schema already bounds). Replies are validated by ``jsonschema``
against the schema's own nodes and the grammar is those nodes bounded per JSON type by
:func:`memagent.engines.json_schema.render_schema` (one rendering for every engine). A ``json`` value (a
union no one column type holds: a list or an object of lists, say) is its JSON text in the column
(:data:`JSON_TEXT_METADATA` on the Arrow field says so), the value itself in the ``extraction`` object; it is
validated against the user's union and has no span.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

import pyarrow as pa

from memagent.extraction.spellings import CURRENCY_SYMBOLS, date_readings, number_readings

FieldKind = Literal["string", "date", "number", "integer", "boolean", "enum", "string_array", "json"]


def parse_date(text: Any) -> dt.date | None:
    """A date from its ISO or a common written form (``March 14th, 2021``, ``14.03.2021``, ``2021年3月14日``);
    an ambiguous one (``03/04/2021``) day first (:func:`memagent.extraction.spellings.date_readings`)."""
    if isinstance(text, dt.date):
        return text
    found = date_readings(text) if isinstance(text, str) else ()
    return found[0] if found else None


def parse_number(text: Any) -> float | None:
    """A number from a JSON number or written text: ``1,250.00``, ``1 250``, ``1.250,00``, ``−3``, ``(1,037.50)``,
    ``EUR 1'037.50``; an ambiguous one (``1,037``) its likelier reading
    (:func:`memagent.extraction.spellings.number_readings`); else what ``float`` reads (``1e5``), if finite."""
    if isinstance(text, bool):
        return None
    if isinstance(text, (int, float)):
        return float(text) if math.isfinite(text) else None
    if not isinstance(text, str):
        return None
    if found := number_readings(_without_currency(text)):
        return found[0]
    try:
        v = float(unicodedata.normalize("NFKC", text).strip().replace("\u2212", "-"))
    except ValueError:
        return None
    return v if math.isfinite(v) else None


_CURRENCY = rf"(?:[A-Z]{{3}}|[{re.escape(CURRENCY_SYMBOLS)}])"
_AROUND = re.compile(rf"^\s*{_CURRENCY}\s*(?=[\d(])|(?<=[\d)])\s*{_CURRENCY}\s*$")


def _without_currency(text: str) -> str:
    """``text`` less a currency code or symbol before or after the number (``EUR 1.037,50``, ``1 037,50 €``)."""
    return _AROUND.sub("", unicodedata.normalize("NFKC", text))


def normalise_text(text: Any) -> str:
    """Compatibility forms folded, case folded, runs of whitespace as one space, trimmed."""
    return " ".join(unicodedata.normalize("NFKC", str(text)).casefold().split())


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _date_forms(value: Any) -> list[str]:
    """How a date is most often written; the date scan (:mod:`memagent.extraction.spellings`) finds the rest."""
    d = parse_date(value)
    if d is None:
        return []
    m, dd, y, nth = d.month, d.day, d.year, _ordinal(d.day)
    return list(dict.fromkeys([
        d.isoformat(), f"{d:%B} {dd}, {y}", f"{d:%B} {dd} {y}", f"{dd} {d:%B} {y}", f"{d:%b} {dd}, {y}",
        f"{d:%b}. {dd}, {y}", f"{dd} {d:%b} {y}", f"{d:%d/%m/%Y}", f"{d:%m/%d/%Y}", f"{d:%Y/%m/%d}", f"{dd}/{m}/{y}",
        f"{m}/{dd}/{y}", f"{d:%d.%m.%Y}", f"{dd}.{m}.{y}", f"{dd}-{d:%b}-{y}", f"{y}年{m}月{dd}日",
        f"{y}年{m:02d}月{dd:02d}日", f"{d:%B} {nth}, {y}", f"{nth} {d:%B} {y}"]))


def _number_forms(value: Any) -> list[str]:
    v = parse_number(value)
    if v is None:
        return []
    if v.is_integer():
        n = int(v)
        return list(dict.fromkeys([str(n), f"{n:,}", f"{v:.2f}", f"{v:,.2f}"]))
    return list(dict.fromkeys([repr(v), f"{v:,}", f"{v:.2f}", f"{v:,.2f}"]))


def _text_forms(value: Any) -> list[str]:
    text = str(value).strip() if value is not None else ""
    return [text] if text else []


def _number_key(value: Any) -> Any:
    v = parse_number(value)
    return v if v is not None else normalise_text(value)


def _date_key(value: Any) -> Any:
    d = parse_date(value)
    return d.isoformat() if d is not None else normalise_text(value)


@dataclass(frozen=True)
class Kind:
    """One kind of value (a row of the module docstring's table)."""

    name: FieldKind
    test: Callable[[Mapping[str, Any]], bool]  # does a property node declare this kind
    arrow: pa.DataType
    words: str  # what the prompt calls it ("one of: ..." for enums, from the values)
    to_arrow: Callable[[Any], Any]  # JSON value -> Arrow value (not None)
    forms: Callable[[Any], list[str]]  # how a value may be written; the first is its exact form
    normalise: Callable[[Any], Any]  # a value compared by value: merge keys
    by_value: str | None = None  # "number" / "date": the normalised search compares values, not text
    grounded: bool = True  # grounding looks for its span
    droppable: bool = True  # require_grounding drops it when ungrounded
    fuzzy: bool = False  # fuzzy alignment applies (free text)

    def describe(self, enum: tuple[str, ...] = ()) -> str:
        return f"one of: {', '.join(enum)}" if self.name == "enum" else self.words


def _types(node: Mapping[str, Any]) -> Any:
    return node.get("type")


def _is_array_of_strings(node: Mapping[str, Any]) -> bool:
    items = node.get("items")
    return _types(node) == "array" and isinstance(items, dict) and items.get("type") == "string" \
        and items.get("format") is None


_SAME = (lambda v: v)  # noqa: E731 - identity conversion


def _json_text(value: Any) -> str:
    """A ``json`` column's value (and merge key): the value's JSON text, keys in the order written."""
    return json.dumps(value, ensure_ascii=False)


def _as_text(value: Any) -> str:
    """A string column's value: a union widened to string holds numbers and booleans as their JSON text."""
    return value if isinstance(value, str) else json.dumps(value)
KINDS: dict[FieldKind, Kind] = {k.name: k for k in [
    Kind("enum", lambda n: "enum" in n and _types(n) in (None, "string"), pa.string(), "one of", _SAME,
         _text_forms, normalise_text,
         droppable=False, fuzzy=True),
    Kind("date", lambda n: _types(n) == "string" and n.get("format") == "date", pa.date32(), "date, YYYY-MM-DD",
         lambda v: dt.date.fromisoformat(v), _date_forms, _date_key, by_value="date"),
    Kind("string", lambda n: _types(n) == "string" and "format" not in n, pa.string(), "text", _as_text,
         _text_forms, normalise_text, fuzzy=True),
    Kind("number", lambda n: _types(n) == "number", pa.float64(), "number", float, _number_forms, _number_key,
         by_value="number"),
    Kind("integer", lambda n: _types(n) == "integer", pa.int64(), "whole number", int, _number_forms,
         _number_key, by_value="number"),
    Kind("boolean", lambda n: _types(n) == "boolean", pa.bool_(), "true or false", bool, lambda v: [],
         bool, grounded=False, droppable=False),
    Kind("string_array", _is_array_of_strings, pa.list_(pa.string()), "list of texts", list, _text_forms,
         lambda v: tuple(normalise_text(x) for x in v), fuzzy=True),
    Kind("json", lambda n: False, pa.string(), "a JSON value", _json_text, lambda v: [], _json_text,
         grounded=False, droppable=False),
]}
# The Arrow field metadata of a ``json`` column: its strings are JSON text (of the user's union).
JSON_TEXT_METADATA = {b"content": b"application/json"}
ITEM_KIND: dict[FieldKind, FieldKind] = {"string_array": "string"}  # what each item of an array kind is
SCALAR_KINDS = ("string", "date", "number", "integer", "boolean", "enum")  # may be record keys


def kind_of(node: Mapping[str, Any]) -> FieldKind | None:
    """The kind a property node declares (the first whose test passes, in table order), or None; a union
    of scalars (:mod:`memagent.extraction.resolve`) names its column kind in ``x-kind``."""
    if node.get("x-kind") in KINDS:
        return node["x-kind"]
    return next((k.name for k in KINDS.values() if k.test(node)), None)


def to_arrow(kind: FieldKind, value: Any) -> Any:
    """The Arrow (Python) value of a JSON value of ``kind``; None stays None."""
    return None if value is None else KINDS[kind].to_arrow(value)
