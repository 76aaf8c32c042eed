"""The JSON Schema every engine constrains to: :func:`render_schema` of the user's schema.

One place, so the hf grammar, vLLM's structured outputs and an OpenAI ``response_format`` agree
(for an extraction's final object and for a record type's per-chunk array of records alike:
``ExtractionSchema.records_schema``, an array root with object items; OpenAI's own API wants an
object root, the vLLM and llama.cpp servers the openai engine targets take either);
pure (no torch, no grammar library), so the vllm and openai engines import it cheaply.
``additionalProperties: false`` on objects, every value bounded (a small model caught in a loop
inside a string or a number would otherwise spend the whole answer budget and leave unclosed
JSON: a random model's greedy decode wrote 3,000 sixes): free strings at ``MAX_STRING_CHARS``,
arrays at ``MAX_ARRAY_ITEMS``, numbers within ``±MAX_MAGNITUDE`` with at most 6 decimals
(``multipleOf`` 1e-6; plain decimals, no exponent), and ``format: date`` backed by a YYYY-MM-DD
``pattern`` for any grammar engine that ignores formats. Validate replies against the user's
schema, not this one: ``jsonschema`` checks a float ``multipleOf`` by float division (0.3 / 1e-6
is not an integer there).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from memagent.json_refs import resolve_refs

MAX_STRING_CHARS = 200  # a free-text value longer than this is a loop, not an extraction
MAX_ARRAY_ITEMS = 20
MAX_MAGNITUDE = 10**15  # numbers: at most 16 integer digits ...
NUMBER_STEP = 1e-6  # ... and 6 decimals, no exponent (a digit loop cannot run on)
DATE_PATTERN = r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$"
# Patterns the grammar enforces for formats it has no rule of its own for (checked again after decoding). Each
# allows printable ASCII only, without `"` or a backslash (a URI and an e-mail address are ASCII: non-ASCII ones are
# the `iri`/`idn-email` formats), so each character is one byte of JSON text (ASCII_PATTERNS).
FORMAT_PATTERNS = {
    "date-time": r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])[Tt ]([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?"
                 r"([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)$",
    "time": r"^([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d{1,6})?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)$",
    "email": r"^[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(\.[A-Za-z0-9-]{1,63})+$",
    "uri": r"^[A-Za-z][A-Za-z0-9+.-]*:[!#-\[\]-~]{1,180}$",
}
ASCII_PATTERNS = frozenset({DATE_PATTERN, *FORMAT_PATTERNS.values()})


def _types(node: dict[str, Any]) -> list[str]:
    t = node.get("type")
    return [t] if isinstance(t, str) else list(t or [])


def _bound(node: Any) -> None:
    """Add the size bounds and the date pattern to one (sub)schema, in place."""
    if not isinstance(node, dict):
        return
    types = _types(node)
    if "string" in types and "enum" not in node and "const" not in node:
        if node.get("format") == "date":
            node.setdefault("pattern", DATE_PATTERN)
        elif "pattern" not in node and "format" not in node:
            node.setdefault("maxLength", MAX_STRING_CHARS)
    if ("number" in types or "integer" in types) and "enum" not in node and "const" not in node:
        node.setdefault("minimum", -MAX_MAGNITUDE)
        node.setdefault("maximum", MAX_MAGNITUDE)
        if "integer" not in types:
            node.setdefault("multipleOf", NUMBER_STEP)
    if "array" in types:
        node.setdefault("maxItems", MAX_ARRAY_ITEMS)
        _bound(node.get("items"))
    if "object" in types or "properties" in node:
        node.setdefault("additionalProperties", False)
        for sub in (node.get("properties") or {}).values():
            _bound(sub)
        _bound(node["additionalProperties"])  # a map's values (a union held as JSON text may hold one)
    # Subschemas reached through $ref or a choice (a tool's parameters, a pydantic model's $defs).
    for sub in (node.get("$defs") or {}).values():
        _bound(sub)
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in node.get(key) or []:
            _bound(sub)


def render_schema(schema: str | dict[str, Any]) -> dict[str, Any]:
    """The JSON Schema the engines constrain to (see the module docstring); the input is not changed.

    Raises ``ValueError`` when ``schema`` is not a JSON object or a ``$ref`` points outside it.
    """
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise ValueError(f"json_schema is not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"json_schema must be a JSON object, got {type(schema).__name__}")
    out = resolve_refs(schema)
    _bound(out)
    return out


# Budgeted bounds: a reply that always closes inside ``max_tokens``. Every token is at least one byte, so a
# grammar whose longest text is at most ``max_tokens`` bytes cannot be cut. A free string is held to
# TEXT_PATTERN (no control characters: a loop of blank lines is no value), so each of its characters takes
# at most 4 bytes (UTF-8; ``\"`` and ``\\`` take 2); a string of another pattern up to 6 (``\u001f``), of one
# of ASCII_PATTERNS 1.
TEXT_PATTERN = r"^[^\x00-\x1f]*$"
KEY_PATTERN = r"^[^\x00-\x1f]{{1,{}}}$"  # a map's keys in a budgeted grammar (format: the bound) ...
KEY_BOUND = re.compile(r"\^\[\^\\x00-\\x1f\]\{1,(\d+)\}\$")  # ... and its bound read back
BYTES_PER_CHAR, BYTES_PER_PATTERN_CHAR = 4, 6
NUMBER_BYTES = len(f"-{MAX_MAGNITUDE}.000000")  # the widest number the bounds above allow
INTEGER_BYTES = len(f"-{MAX_MAGNITUDE}")
DATE_BYTES = len('"2021-03-14"')
MIN_BUDGET_CHARS = 16  # below this a string bound is raised back by giving arrays fewer items ...
MIN_BUDGET_ITEMS = 2  # ... down to this many (answer groups are packed to leave each value this room)
CHARS_PER_ITEM = 8  # an array keeps n items only where strings can hold 8n characters (20 items: 160)
PATTERN_MIN_CHARS = 64  # a string of a pattern (a format's: date-time, email, uri) keeps at least this room


def longest_bytes(node: Any, chars: int = MAX_STRING_CHARS, items: int = MAX_ARRAY_ITEMS) -> int:
    """The longest JSON text (UTF-8 bytes, compact separators) a rendered ``node`` allows when free strings
    hold at most ``chars`` characters and arrays at most ``items`` items (a node's own smaller bounds kept).
    A value with no bound (a map, a pattern string with no ``maxLength``) counts as ``chars`` characters; a
    string character 4 bytes under :data:`TEXT_PATTERN`, else 6."""
    if not isinstance(node, dict):
        return 4  # true / null
    if "enum" in node or "const" in node:
        values = node.get("enum", [node.get("const")])
        return max((len(json.dumps(v, ensure_ascii=False).encode()) for v in values), default=4)
    branches = node.get("anyOf") or node.get("oneOf")
    if branches:
        return max(longest_bytes(b, chars, items) for b in branches)
    types = _types(node) or ["object" if "properties" in node else "string"]
    if len(types) > 1:
        return max(longest_bytes({**node, "type": t}, chars, items) for t in types)
    kind = types[0]
    if kind == "string":
        if node.get("format") == "date":
            return DATE_BYTES
        if node.get("pattern", TEXT_PATTERN) == TEXT_PATTERN:
            per_char = BYTES_PER_CHAR if "pattern" in node else BYTES_PER_PATTERN_CHAR
            return 2 + per_char * min(node.get("maxLength", chars), chars)
        per_char = 1 if node["pattern"] in ASCII_PATTERNS else BYTES_PER_PATTERN_CHAR
        return 2 + per_char * _pattern_chars(node, chars)
    if kind in ("number", "integer"):
        return INTEGER_BYTES if kind == "integer" else NUMBER_BYTES
    if kind in ("boolean", "null"):
        return 5
    if kind == "array":
        n = min(node.get("maxItems", items), items)
        return 2 + n * (longest_bytes(node.get("items"), chars, items) + 1)
    props = node.get("properties") or {}
    fixed = 2 + sum(len(json.dumps(k, ensure_ascii=False).encode()) + 2 + longest_bytes(v, chars, items)
                    for k, v in props.items())
    value = _map_value(node)
    if value is None:
        return fixed
    n = min(node.get("maxProperties", items), items)  # a map: keys are strings of ``chars`` too
    patterns = list(node.get("patternProperties") or {})
    key = KEY_BOUND.fullmatch(patterns[0]) if patterns else None
    key_chars = min(int(key.group(1)), chars) if key else chars
    return fixed + n * (2 + BYTES_PER_CHAR * key_chars + 2 + longest_bytes(value, chars, items))


def _pattern_chars(node: dict[str, Any], chars: int) -> int:
    """A pattern string's bound under ``chars``: never below :data:`PATTERN_MIN_CHARS` (a date-time's pattern
    takes 20 characters at least: a shorter bound would leave no value the grammar can write)."""
    return min(node.get("maxLength", MAX_STRING_CHARS), max(chars, PATTERN_MIN_CHARS))


def _map_value(node: dict[str, Any]) -> Any:
    """The value schema of a map (an object with an ``additionalProperties`` or ``patternProperties`` schema)."""
    if isinstance(node.get("additionalProperties"), dict):
        return node["additionalProperties"]
    patterns = node.get("patternProperties")
    return next(iter(patterns.values()), None) if isinstance(patterns, dict) and patterns else None


def budget_bounds(schema: dict[str, Any], max_tokens: int) -> tuple[int, int]:
    """``(chars, items)``: the largest free-string bound (at most :data:`MAX_STRING_CHARS`) and array item bound
    (at most :data:`MAX_ARRAY_ITEMS`, lowered to keep strings at :data:`CHARS_PER_ITEM` characters an item and
    :data:`MIN_BUDGET_CHARS` at least) under which
    every reply of ``schema`` fits ``max_tokens`` tokens. Where none keeps strings that long: one item and the
    longest strings that fit, else no items; ``(0, 0)`` when even that does not fit (no bound can help)."""
    def longest_fitting(items: int) -> int:
        lo, hi = 0, MAX_STRING_CHARS
        while lo < hi:  # the largest bound that fits (longest_bytes grows with it)
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if longest_bytes(schema, mid, items) <= max_tokens else (lo, mid - 1)
        return lo

    for items in (MAX_ARRAY_ITEMS, 10, 8, 6, 5, 4, 3, MIN_BUDGET_ITEMS):  # items only where strings have room
        if (chars := longest_fitting(items)) >= max(MIN_BUDGET_CHARS, CHARS_PER_ITEM * items):
            return chars, items
    if (chars := longest_fitting(1)) > 0:
        return chars, 1
    return longest_fitting(0), 0


def bound_to_budget(schema: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """A copy of ``schema`` (no ``$ref``) whose every reply fits ``max_tokens`` tokens: strings (patterns
    included) get the ``maxLength``, arrays the ``maxItems`` and maps the ``maxProperties`` (and a key pattern)
    of :func:`budget_bounds` (smaller bounds of their own kept), free strings :data:`TEXT_PATTERN`. The engines
    render it as any schema; validate replies against the unbounded one."""
    out = text_bounded(schema)
    _cap(out, *budget_bounds(out, max_tokens))
    return out


def text_bounded(schema: dict[str, Any]) -> dict[str, Any]:
    """:func:`render_schema`'s bounds (a copy), free strings held to :data:`TEXT_PATTERN` and maps' keys bounded
    too: the grammar :func:`bound_to_budget` narrows, and :func:`longest_bytes` measures."""
    out = copy.deepcopy(schema)
    _bound(out)
    _cap(out, MAX_STRING_CHARS, MAX_ARRAY_ITEMS)
    return out


def _cap(node: Any, chars: int, items: int) -> None:
    """Lower the free strings' ``maxLength`` to ``chars`` and arrays' ``maxItems`` to ``items``, in place."""
    if not isinstance(node, dict) or "enum" in node or "const" in node:
        return
    types = _types(node)
    if "string" in types and node.get("format") != "date":
        own = node.get("pattern", TEXT_PATTERN) != TEXT_PATTERN
        node["maxLength"] = _pattern_chars(node, chars) if own else min(node.get("maxLength", chars), chars)
        node.setdefault("pattern", TEXT_PATTERN)
    if "array" in types:
        node["maxItems"] = min(node.get("maxItems", items), items)
        _cap(node.get("items"), chars, items)
    value = _map_value(node)
    if value is not None:  # a map's keys bounded too (JSON Schema has no key length but a key pattern)
        _cap(value, chars, items)
        node.pop("additionalProperties")
        node["patternProperties"] = {KEY_PATTERN.format(max(chars, 1)): value}
        node["additionalProperties"] = False
        node["maxProperties"] = min(node.get("maxProperties", items), items)
    for sub in (node.get("properties") or {}).values():
        _cap(sub, chars, items)
    for key in ("anyOf", "oneOf"):
        for sub in node.get(key) or []:
            _cap(sub, chars, items)
