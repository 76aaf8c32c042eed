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
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

from memagent.json_walk import JsonPath, json_pointer, walk_json

MAX_STRING_CHARS = 200  # a free-text value longer than this is a loop, not an extraction
MAX_ARRAY_ITEMS = 20
MAX_MAGNITUDE = 10**15  # numbers: at most 16 integer digits ...
NUMBER_STEP = 1e-6  # ... and 6 decimals, no exponent (a digit loop cannot run on)
DATE_PATTERN = r"^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$"


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
    # Subschemas reached through $ref or a choice (a tool's parameters, a pydantic model's $defs).
    for sub in (node.get("$defs") or {}).values():
        _bound(sub)
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in node.get(key) or []:
            _bound(sub)


def _resources(schema: Any) -> tuple[dict[str, str], list[tuple[dict, str, str]]]:
    """The schema's resources (``$id`` and ``$anchor`` URIs -> JSON pointer) and its ``$ref`` s
    (the node, its base URI, its location)."""
    ids: dict[str, str] = {}
    refs: list[tuple[dict, str, str]] = []
    bases: dict[JsonPath, str] = {(): ""}  # a container's base URI, inherited from its parent's
    for path, node in walk_json(schema):
        if not isinstance(node, (dict, list)):
            continue
        base = bases[path] = bases[path[:-1]] if path else ""
        if isinstance(node, list):
            continue
        at = json_pointer(path)
        if isinstance(node.get("$id"), str):
            base = bases[path] = urldefrag(urljoin(base, node["$id"]))[0]
            ids[base] = at
        if isinstance(node.get("$anchor"), str):
            ids[f"{base}#{node['$anchor']}"] = at
        if isinstance(node.get("$ref"), str):
            refs.append((node, base, at))
    return ids, refs


def resolve_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` whose every ``$ref`` is a local JSON pointer (``#/...``): references
    through an ``$id`` (absolute or relative) or an ``$anchor`` are resolved, and the ``$id`` s
    dropped, so that a grammar compiler and a cycle check see one document.

    Raises ``ValueError`` naming a ``$ref`` that points outside the schema (nothing is fetched).
    """
    out = copy.deepcopy(schema)
    ids, refs = _resources(out)
    for node, base, at in refs:
        uri, fragment = urldefrag(urljoin(base, node["$ref"]))
        fragment = unquote(fragment)
        if uri == "" or uri in ids:
            root = ids.get(uri, "")
            if fragment == "" or fragment.startswith("/"):
                node["$ref"] = "#" + root + fragment
                continue
            if f"{uri}#{fragment}" in ids:
                node["$ref"] = "#" + ids[f"{uri}#{fragment}"]
                continue
        raise ValueError(f"$ref {node['$ref']!r} at #{at}: not found in this schema (no $id or $anchor names it; "
                         "remote schemas are not fetched)")
    _drop_ids(out)
    return out


def _drop_ids(schema: Any) -> None:
    for _, node in walk_json(schema):
        if isinstance(node, dict):
            node.pop("$id", None)
            node.pop("$anchor", None)


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
