"""The JSON Schema that generators write, resolved into the kinds the extraction job knows.

Pydantic's ``model_json_schema()``, OpenAPI tooling and hand-written domain schemas use
``$defs``/``$ref``, ``anyOf`` with ``null``, nested objects, arrays of objects inside arrays of
objects and keywords of their own. :func:`resolve` turns such a schema into the *derived* schema
:mod:`memagent.extraction.parse` reads, and keeps what is needed to put every value back where the
user's schema has it (:meth:`Resolved.assemble`) and to check it there (:meth:`Resolved.errors`):

- ``$ref`` to ``$defs``/``definitions`` (any local JSON pointer) is inlined, its siblings kept over
  the target; ``allOf`` members are merged. A recursive reference is refused, naming the cycle.
- ``anyOf``/``oneOf``/a type list/``nullable`` with ``null``: the value is optional (absent when not stated;
  written as ``null`` where the user's schema requires the key). Other unions: scalars as the widest kind
  (integer|number -> number; with a string -> string; with a list of scalars -> string holding the JSON text),
  the branches kept for the grammar and validation, objects merged (properties of every branch, those all
  branches require required), arrays by their items' union. A union no one column type holds (an array or an
  object, an object or a string, ...) is a ``json`` column (``x-kind``): its JSON text, the branches kept
  whole for the grammar and checked against the user's union.
- ``const`` is a one-value ``enum``; an enum of integers, numbers or booleans keeps its type.
- ``format`` ``date`` is the date kind; ``date-time``, ``time``, ``email``, ``uri`` become a
  ``pattern`` the grammar enforces, and every format is checked after decoding.
- An object property is a struct (its leaves dotted in the report); an array of objects is a
  *record type*, named by its dotted path (``parties.borrowers``). One inside a record type's items
  is a *child* type (``groups.rows``): each child record carries its parent's key in *link*
  properties (``groups_name``), and :meth:`Resolved.assemble` nests it back under that parent.
  A parent's key is its ``x-key`` (on the array or on the items), else its first required scalar
  property, else its first scalar property (then required).
- Keywords outside :data:`~memagent.extraction.keywords.KNOWN` are annotations: ignored, listed in
  :attr:`Resolved.annotations`. Constructs that cannot be read as columns are refused with their path:
  :data:`~memagent.extraction.keywords.REFUSED`, an open ``additionalProperties`` schema, arrays of arrays,
  tuples.

The vocabulary (which keyword means what, and what the derived schema holds at each node) is
:mod:`memagent.extraction.keywords`, this module's; :mod:`memagent.extraction.parse` reads it from there.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from memagent.json_refs import ref_cycle, resolve_refs
from memagent.engines.json_schema import FORMAT_PATTERNS
from memagent.extraction.keywords import KIND, KNOWN, MAP_KEYWORDS, REFUSED, SCALARS, TEXT, UNLISTED
from memagent.extraction.parse import MAX_NAME_CHARS, join
from memagent.extraction.shape import NULLABLE, Link, Resolved, conform, validator, without_nulls

__all__ = ["Link", "Resolved", "conform", "inline", "resolve", "validator", "without_nulls"]

MAX_INLINED_NODES = 20_000  # $refs used many times multiply; past this the schema is no field list


def _without_records(node: Any) -> Any:
    """An (inlined) object node with the properties that are record types taken out, objects walked."""
    if not isinstance(node, dict) or not isinstance(node.get("properties"), dict):
        return node
    keep = {}
    for name, prop in node["properties"].items():
        try:
            value, _ = _value(prop, "", set())
        except ValueError:
            value = {}
        if _is_records(value):
            continue
        kept = _without_records(prop)
        if isinstance(kept, dict) and prop.get("properties") and not kept.get("properties"):
            continue  # an object of record types only: the document holds none of it
        keep[name] = kept
    required = [r for r in node.get("required") or [] if r in keep]
    return {**node, "properties": keep, "required": required}


def _where(path: str) -> str:
    return path or "the schema"


def inline(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` (every ``$ref`` local) with no ``$ref``, ``allOf``, ``$defs`` or ``definitions``;
    ``ValueError`` naming a recursive ``$ref`` (the check the server's guard makes too: memagent.json_refs)."""
    cycle = ref_cycle(schema)
    if cycle:  # a value that contains itself has no end
        ref, names = "#" + cycle[0], " -> ".join(c.rsplit("/", 1)[-1] for c in cycle)
        raise ValueError(f"{_where(_dotted_ref(cycle[0]))}: recursive $ref {ref!r} ({names}): a value that contains "
                         "itself has no end to extract; cut the recursion (e.g. list the children as records)")
    count = [0]

    def walk(node: Any, path: str) -> Any:
        count[0] += 1
        if count[0] > MAX_INLINED_NODES:
            raise ValueError(f"{_where(path)}: the schema's $refs expand to more than {MAX_INLINED_NODES} nodes; "
                             "every field goes into every prompt: extract fewer fields")
        if isinstance(node, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(node)]
        if not isinstance(node, dict):
            return node
        node = {k: v for k, v in node.items() if k not in ("$defs", "definitions")}
        if isinstance(node.get("$ref"), str):
            ref = node.pop("$ref")
            target = walk(_pointer(schema, ref, path), path)
            node = {**(target if isinstance(target, dict) else {}), **walk(node, path)}
        for key in ("allOf",):
            if key in node:
                members = walk(node.pop(key), path)
                for m in members:
                    node = _merge_all(node, m, path)
        return {k: walk(v, f"{path}.{k}" if path else k) if k != "enum" and k != "const" else v
                for k, v in node.items()}

    return walk(resolve_refs(schema), "")


def _dotted_ref(pointer: str) -> str:
    """A JSON pointer (``/$defs/Node``) as the dotted path errors name (``$defs.Node``)."""
    return ".".join(t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:])


def _pointer(schema: Mapping[str, Any], ref: str, path: str) -> Any:
    node: Any = schema
    for token in ref.lstrip("#").split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise ValueError(f"{_where(path)}: $ref {ref!r} names nothing in this schema")
    return node


def _merge_all(a: dict[str, Any], b: Any, path: str) -> dict[str, Any]:
    """``allOf``'s two members as one node: properties merged, requirements joined."""
    if not isinstance(b, dict):
        raise ValueError(f"{_where(path)}.allOf: a member must be an object schema, got {json.dumps(b)[:60]}")
    out = dict(a)
    for k, v in b.items():
        if k == "properties":
            out[k] = {**out.get(k, {}), **v}
        elif k == "required":
            out[k] = list(dict.fromkeys([*out.get(k, []), *v]))
        elif k in out and out[k] != v and k not in TEXT:
            raise ValueError(f"{_where(path)}.allOf: members disagree on {k!r} ({json.dumps(out[k])[:40]} vs "
                             f"{json.dumps(v)[:40]}); one value has one {k}")
        else:
            out.setdefault(k, v)
    return out


def _value(node: Any, path: str, notes: set[str]) -> tuple[dict[str, Any], bool]:
    """``(node, nullable)``: one value's schema with null taken out, unions resolved, annotations dropped."""
    if node is True or node == {}:
        raise ValueError(f"{_where(path)}: a value of any type has no column; give it a type")
    if not isinstance(node, dict):
        raise ValueError(f"{_where(path)}: must be a schema object, got {json.dumps(node)[:60]}")
    for word, what in REFUSED.items():
        if word in node:
            raise ValueError(f"{_where(path)}: {word!r} ({what}) cannot be extracted as typed columns; "
                             "remove it (the value is checked against the rest)")
    notes.update(k for k in node if k not in KNOWN and k not in REFUSED)
    out = {k: v for k, v in node.items() if k in KNOWN}
    nullable = out.pop("nullable", False) is True
    types = out.get("type")
    if isinstance(types, list):
        rest = [t for t in types if t != "null"]
        nullable |= len(rest) < len(types)
        out["type"] = rest[0] if len(rest) == 1 else rest
        if len(rest) > 1:
            alts = [{**{k: v for k, v in out.items() if k != "type"}, "type": t} for t in rest]
            out = {k: v for k, v in out.items() if k in TEXT}
            out["anyOf"] = alts
        elif not rest:
            raise ValueError(f"{_where(path)}: a value that can only be null has no column")
    for word in ("anyOf", "oneOf"):
        if word in out:
            raw = out.pop(word)
            if not isinstance(raw, list) or not raw:
                raise ValueError(f"{_where(path)}.{word}: must list at least one schema")
            alts = [a for a in raw if not (isinstance(a, dict) and a.get("type") == "null")]
            nullable |= len(alts) < len(raw)
            if not alts:
                raise ValueError(f"{_where(path)}: a value that can only be null has no column")
            resolved = [_value(a, f"{path}.{word}[{i}]", notes) for i, a in enumerate(alts)]
            nullable |= any(n for _, n in resolved)
            merged = _union([r for r, _ in resolved], f"{path}.{word}")
            out = {**merged, **{k: v for k, v in out.items() if k in TEXT}}
    if "const" in out:
        out["enum"] = [out.pop("const")]
    if "enum" in out:
        out, null_in_enum = _enum(out, path)
        nullable |= null_in_enum
    if "type" not in out and "properties" in out:
        out["type"] = "object"
    return out, nullable


def _enum(node: dict[str, Any], path: str) -> tuple[dict[str, Any], bool]:
    values = node["enum"] if isinstance(node["enum"], list) else []
    rest = [v for v in values if v is not None]
    kinds = {"boolean" if isinstance(v, bool) else "integer" if isinstance(v, int) else
             "number" if isinstance(v, float) else "string" if isinstance(v, str) else "other" for v in rest}
    if not rest or "other" in kinds:
        raise ValueError(f"{_where(path)}.enum: must list scalar values (strings, numbers, booleans), got "
                         f"{json.dumps(values)[:80]}")
    if kinds == {"integer", "number"}:
        kinds = {"number"}
    if len(kinds) > 1:
        raise ValueError(f"{_where(path)}.enum: mixes {' and '.join(sorted(kinds))} values; one column has one type")
    out = {**node, "enum": rest, "type": kinds.pop()}
    out.pop("format", None)
    return out, len(rest) < len(values)


def _union(alts: list[dict[str, Any]], path: str) -> dict[str, Any]:
    """One node for the branches of a union (null already out): see the module docstring."""
    if len(alts) == 1:
        return alts[0]
    types = {a.get("type") if isinstance(a.get("type"), str) else "object" if "properties" in a else None
             for a in alts}
    if types <= set(SCALARS):
        if all("enum" in a for a in alts) and types == {"string"}:
            return {"type": "string", "enum": list(dict.fromkeys(v for a in alts for v in a["enum"]))}
        wide = "string" if "string" in types or "boolean" in types else "number" if "number" in types else "integer"
        # The branches stay for the grammar and validation; the column is the widest kind.
        return {"anyOf": [_leaf(a) for a in alts], KIND: wide}
    if types <= {*SCALARS, "array"} and all(a.get("type") != "array" or _is_scalar_array(a) for a in alts):
        # A value or a list of values (LangExtract's attributes): the branches stay, the column holds JSON text.
        return {"anyOf": [_leaf(a) for a in alts], KIND: "string"}
    if types == {"object"}:
        props: dict[str, Any] = {}
        for a in alts:
            for name, prop in (a.get("properties") or {}).items():
                props[name] = prop if name not in props or props[name] == prop else \
                    {"anyOf": [props[name], prop]}
        required = set.intersection(*(set(a.get("required") or []) for a in alts))
        return {"type": "object", "properties": props, "required": [n for n in props if n in required]}
    if types == {"array"} and all(isinstance(a.get("items"), dict) for a in alts):
        items = [a.get("items") for a in alts]
        return {"type": "array", "items": items[0] if all(i == items[0] for i in items) else {"anyOf": items}}
    # No one column type (a list or an object of lists, an object or a text): the column holds the value's
    # JSON text; the branches stay whole for the grammar and the check against the user's union.
    return {"anyOf": [_json_branch(a, f"{path}[{i}]") for i, a in enumerate(alts)], KIND: "json"}


def _json_branch(node: Any, path: str) -> Any:
    """A union branch kept whole (objects, maps and arrays inside it too), annotations dropped; a refused
    construct inside it refused as anywhere (:data:`~memagent.extraction.keywords.REFUSED`)."""
    if not isinstance(node, dict):
        return node
    for word, what in REFUSED.items():
        if word in node:
            raise ValueError(f"{path}: {word!r} ({what}) cannot be extracted; remove it")
    out = {k: v for k, v in node.items() if k in KNOWN or k in MAP_KEYWORDS}
    if isinstance(out.get("properties"), dict):
        where = join(path, "properties")
        out["properties"] = {k: _json_branch(v, join(where, k)) for k, v in out["properties"].items()}
    for word in ("items", "additionalProperties"):
        if isinstance(out.get(word), dict):
            out[word] = _json_branch(out[word], join(path, word))
    for word in ("anyOf", "oneOf"):
        if isinstance(out.get(word), list):
            out[word] = [_json_branch(b, f"{join(path, word)}[{i}]") for i, b in enumerate(out[word])]
    return _leaf(out) if out.get("type") in SCALARS else out


def _is_scalar_array(node: Mapping[str, Any]) -> bool:
    items = node.get("items")
    return isinstance(items, dict) and items.get("type") in SCALARS


def _is_records(node: Mapping[str, Any]) -> bool:
    items = node.get("items")
    return node.get("type") == "array" and isinstance(items, dict) and \
        (items.get("type") == "object" or "properties" in items or "anyOf" in items or "oneOf" in items)


def _key_of(array: Mapping[str, Any], item: Mapping[str, Any]) -> list[str]:
    """The parent key: ``x-key``, else the first required scalar property, else the first scalar."""
    given = array.get("x-key") or item.get("x-key")
    if given:
        return list(given)
    props = item.get("properties") or {}
    scalars = [n for n, p in props.items() if p.get("type") in ("string", "number", "integer") and "x-link" not in p]
    required = [n for n in scalars if n in (item.get("required") or [])]
    return (required or scalars)[:1]


def _leaf(node: dict[str, Any]) -> dict[str, Any]:
    """A scalar's node for the grammar: formats the grammar lacks as patterns (all checked after decoding)."""
    out = {k: v for k, v in node.items() if k not in ("x-key", "additionalProperties", "required", "properties")}
    fmt = out.get("format")
    if fmt is not None and fmt != "date":
        out.pop("format")
        if fmt in FORMAT_PATTERNS and "pattern" not in out and out.get("type") == "string":
            out["pattern"] = FORMAT_PATTERNS[fmt]
    return out


class _Builder:
    """One walk over an inlined schema: the derived document object, record types in parent-first order."""

    def __init__(self) -> None:
        self.notes: set[str] = set()
        self.types: dict[str, dict[str, Any]] = {}
        self.links: dict[str, Link] = {}
        self.items: dict[str, dict[str, Any]] = {}

    def object(self, node: Mapping[str, Any], path: str, names: tuple[str, ...],
               pending: list[tuple[Any, str, tuple[str, ...]]] | None) -> dict[str, Any]:
        """The derived object at ``path``; arrays of objects become record types (inside a record's
        items, ``pending``: tied to it once its key is known)."""
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) or (extra is True and not node.get("properties")):
            raise ValueError(f"{join(path, 'additionalProperties')}: an object with open keys (a map) has no fixed "
                             "columns; declare its properties")
        props, required = {}, []
        wanted = set(node.get("required") or [])
        missing = sorted(wanted - set(node.get("properties") or {}))
        if missing:
            raise ValueError(f"{join(path, 'required')}: required names property {missing[0]!r}, which is not under "
                             "properties")
        for name, prop in (node.get("properties") or {}).items():
            where = join(join(path, "properties"), name)
            value, nullable = _value(prop, where, self.notes)
            if _is_records(value):
                if pending is None:
                    self.records(value, where, (*names, name), None)
                else:
                    pending.append((value, where, (*names, name)))
                continue
            if value.get("type") == "object":
                value = {**self.object(value, where, (*names, name), pending),
                         **({"description": value["description"]} if "description" in value else {})}
                if not value["properties"] and (prop.get("properties") or _value(prop, where, set())[0].get(
                        "properties")):
                    continue  # it held record types only (they are columns of their own)
            elif value.get("type") == "array":
                if not isinstance(value.get("items"), dict):
                    props[name] = value  # parse_leaf names what an array needs
                    continue
                items, _ = _value(value["items"], join(where, "items"), self.notes)
                if items.get("type") in ("array", "object") or "anyOf" in items:
                    raise ValueError(f"{join(where, 'items')}: an array of arrays or of mixed items has no "
                                     "column type; use an array of strings, or of objects (records)")
                value = {**value, "items": _leaf(items)}
            else:
                value = _leaf(value)
            if nullable and name in wanted:  # required but may be null: absent is written as null
                value[NULLABLE] = True
            props[name] = value
            if name in wanted and not nullable:
                required.append(name)
        return {"type": "object", "properties": props, "required": required}

    def records(self, array: Mapping[str, Any], path: str, names: tuple[str, ...], parent: str | None) -> None:
        """Record type ``names`` (under ``parent``'s items, or the document) and, after it, its children."""
        item_node, _ = _value(array["items"], join(path, "items"), self.notes)
        if item_node.get("type") != "object":
            raise ValueError(f"{join(path, 'items')}: items mixing objects and other values have no columns")
        name = ".".join(names) if parent is None else f"{parent}.{'.'.join(names)}"
        if name in self.types:
            raise ValueError(f"{path}: a second record type named {name!r}; rename one")
        self.types[name] = {}  # parents before children
        self.items[name] = _without_records(array["items"])
        pending: list[tuple[Any, str, tuple[str, ...]]] = []
        item = self.object(item_node, join(path, "items"), (), pending)
        links = self._link(item, parent) if parent is not None else ()
        own: Any = array.get("x-key", item_node.get("x-key"))
        if pending and not own:
            own = _key_of({}, item)
            if not own:
                raise ValueError(f"{path}: record type {name!r} holds record types but no scalar property to tie "
                                 "them to it; add one, or name its key with x-key")
            for k in own:  # a default key must be stated to tie children to it
                if k not in item["required"]:
                    item["required"].append(k)
                    item["properties"][k].pop(NULLABLE, None)
        key = [*(a for a, _ in links), *own] if isinstance(own, list) and own else own
        # A key the user did not name ties children to their parent only: never an identity that merges
        # mentions differing in a stated value (records.merge_records).
        defaulted = bool(pending) and not (array.get("x-key") or item_node.get("x-key"))
        self.types[name] = {"type": "array", "items": item, **({"x-key": key} if key else {}),
                            **({"x-key-default": True} if defaulted else {}),
                            **({"description": array["description"]} if "description" in array else {})}
        self.links[name] = Link(parent, names, links)
        for child, where, child_names in pending:
            self.records(child, where, child_names, name)

    def _link(self, item: dict[str, Any], parent: str) -> tuple[tuple[str, str], ...]:
        """Add the parent's key to ``item`` as required link properties (first); ``(link, parent key)`` pairs."""
        parent_items = self.types[parent]["items"]
        segment = parent.rsplit(".", 1)[-1]
        links, front = [], {}
        for k in self.types[parent].get("x-key", []):
            link = f"{segment}_{k}" if len(segment) + len(k) < MAX_NAME_CHARS else f"{segment[:20]}_{k}"[:MAX_NAME_CHARS]
            while link in item["properties"] or link in front:
                link = link[:MAX_NAME_CHARS - 1] + "_"
            node = {k2: v for k2, v in parent_items["properties"][k].items() if k2 not in (NULLABLE, "description")}
            node["description"] = f"the {k} of the {parent} record this record belongs to"
            front[link] = {**node, "x-link": True}
            links.append((link, k))
        item["properties"] = {**front, **item["properties"]}
        item["required"] = [*front, *item["required"]]
        return tuple(links)


def resolve(schema: Any) -> Resolved:
    """The derived schema of a user's JSON Schema (see the module docstring); ``ValueError`` naming the
    path of a construct that cannot be extracted."""
    if not isinstance(schema, dict):
        raise ValueError(f"the schema must be a JSON object, got {type(schema).__name__}")
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        where = ".".join(map(str, e.absolute_path)) or "the schema"
        raise ValueError(f"{where}: not a valid JSON Schema: {e.message}"[:300]) from None
    original = resolve_refs(schema)
    try:
        root = inline(original)
    except RecursionError:
        raise ValueError("the schema's $refs nest too deeply to read") from None
    builder = _Builder()
    top, _ = _value(root, "", builder.notes)
    if top.get("type") != "object":
        raise ValueError(f"the schema must have \"type\": \"object\" (one object per document), got type "
                         f"{json.dumps(top.get('type'))}")
    doc = builder.object(top, "", (), None)
    for name in sorted(set(doc["properties"]) & set(builder.types)):
        raise ValueError(f"properties: field {name!r} and record type {name!r} (an array of objects at that path) "
                         f"have one dotted name {name!r} (in field_evidence, the report and the records' folders); "
                         "rename one")
    derived = {"type": "object", "properties": {**doc["properties"], **builder.types}, "required": doc["required"]}
    for word in ("description", "title"):
        if isinstance(schema.get(word), str):
            derived[word] = schema[word]
    notes = builder.notes - UNLISTED
    return Resolved(derived, original, dict(builder.links), tuple(sorted(notes)), _without_records(root),
                    builder.items)
