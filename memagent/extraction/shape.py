"""A resolved schema's way back: the user's object assembled from what the job holds, and checked.

:class:`Resolved` (made by :func:`memagent.extraction.resolve.resolve`) holds the derived schema and,
per record type, where its records go in the user's object (:class:`Link`). :meth:`Resolved.assemble`
nests the records back (children under the parent their link properties name), :func:`conform` drops
each value that fails the user's schema, deepest first, and says which; :func:`validator` is the one
JSON Schema validator (formats checked) every check uses.
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from memagent.extraction.kinds import KINDS, kind_of
from memagent.json_walk import walk_json

NULLABLE = "x-nullable"  # a property the user's schema requires but lets be null (absent is filled as null)


@dataclass(frozen=True)
class Link:
    """Where a record type's records go in the user's object: under ``parent``'s records (None: the
    document) at ``path``, each tied to its parent record by ``links`` (link property -> parent key)."""

    parent: str | None
    path: tuple[str, ...]
    links: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Resolved:
    """A user's schema resolved: the derived schema the job reads, and the way back."""

    schema: dict[str, Any]  # the derived schema (memagent.extraction.parse's grammar)
    original: dict[str, Any]  # the user's schema, every $ref a local pointer
    types: Mapping[str, Link] = field(default_factory=dict)  # record type -> where its records go
    annotations: tuple[str, ...] = ()  # keywords ignored as annotations, sorted
    document: dict[str, Any] = field(default_factory=dict)  # the user's root, record types taken out
    items: Mapping[str, dict[str, Any]] = field(default_factory=dict)  # type -> the user's item, children out

    def children(self, name: str | None) -> list[str]:
        return [t for t, link in self.types.items() if link.parent == name]

    def assemble(self, doc: Mapping[str, Any], records: Mapping[str, list[Mapping[str, Any]]]) -> dict[str, Any]:
        """The user's object: the document-level values with every record type's records nested back
        where the user's schema has them (children under the parent whose key their links name; a
        child naming no parent is left out), nullable properties that are absent as null."""
        obj = _fill_nulls(self.schema, copy.deepcopy(dict(doc)))
        items = {t: [_fill_nulls(self.schema["properties"][t]["items"], dict(r)) for r in records.get(t, [])]
                 for t in self.types}
        for t in reversed(list(self.types)):  # children are listed after their parents
            link = self.types[t]
            if link.parent is None:
                _put(obj, link.path, [_strip(r, link) for r in items[t]])
                continue
            parent_key = [k for _, k in link.links]
            for parent in items[link.parent]:
                want = _normal(self.schema["properties"][link.parent]["items"], parent, parent_key)
                mine = [r for r in items[t] if _normal(self.schema["properties"][t]["items"], r,
                                                       [a for a, _ in link.links]) == want]
                _put(parent, link.path, [_strip(r, link) for r in mine])
        return obj

    def errors(self, obj: Any) -> list[str]:
        """``path: message`` for every way ``obj`` fails the user's schema (formats checked)."""
        return [_line(e) for e in _errors(self.original, obj)]

    def conform_document(self, obj: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """The document-level values (record types aside) with each value that fails the user's schema
        removed, and ``path: message`` of each removal; see :func:`conform`."""
        return conform(self.document, _fill_nulls(self.schema, copy.deepcopy(dict(obj))))

    def document_errors(self, obj: Any) -> list[str]:
        """``path: message`` for each way the document-level values fail the user's schema."""
        return [_line(e) for e in _errors(self.document, obj)]

    def record_errors(self, name: str, record: Mapping[str, Any]) -> list[str]:
        """``path: message`` for each way one record (links aside) fails its item in the user's schema."""
        item = self.schema["properties"][name]["items"]
        values = _strip(_fill_nulls(item, dict(record)), self.types[name])
        return [_line(e) for e in _errors(self.items[name], values)]


def without_nulls(obj: Any) -> Any:
    """``obj`` with every ``null`` property taken out, objects inside objects walked (not arrays): a null states
    nothing, as an absent key does (the grammar writes neither; a server's model may write null for an optional
    value). ``obj`` itself is left as it was (each object edited is a copy; arrays and values are shared)."""
    if not isinstance(obj, dict):
        return obj
    out = dict(obj)
    for path, node in walk_json(out):  # iterative: a model's reply may nest deeper than the recursion limit
        if not isinstance(node, dict) or any(isinstance(k, int) for k in path):
            continue  # an array's items are kept as they are
        for key in [k for k, v in node.items() if v is None]:
            del node[key]
        for key, value in node.items():
            if isinstance(value, dict):
                node[key] = dict(value)  # the walk takes the copy, edited when it comes
    return out


def _errors(schema: Mapping[str, Any], obj: Any) -> list[Any]:
    found = validator(json.dumps(schema, ensure_ascii=False, sort_keys=True)).iter_errors(obj)
    return sorted(found, key=lambda e: (-len(e.absolute_path), list(map(str, e.absolute_path))))


def _line(error: Any) -> str:
    return f"{'.'.join(map(str, error.absolute_path)) or '(root)'}: {error.message}"[:300]


def conform(schema: Mapping[str, Any], obj: Any, limit: int = 200) -> tuple[Any, list[str]]:
    """``obj`` with every value that fails ``schema`` taken out, deepest first (a property from its object,
    an item from its array; a required one then fails its parent, which goes next), and ``path: message``
    of each. What still fails at the root stays (the caller refuses it)."""
    dropped: list[str] = []
    for _ in range(limit):
        errors = [e for e in _errors(schema, obj) if e.absolute_path]
        if not errors:
            break
        path = list(errors[0].absolute_path)
        parent = obj
        for step in path[:-1]:
            parent = parent[step]
        dropped.append(_line(errors[0]))
        del parent[path[-1]]
    return obj, dropped


def _fill_nulls(node: Mapping[str, Any], obj: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` with each absent nullable property null, objects walked."""
    obj = dict(obj)
    for name, prop in (node.get("properties") or {}).items():
        if name not in obj and prop.get(NULLABLE):
            obj[name] = None
        elif isinstance(obj.get(name), dict) and prop.get("type") == "object":
            obj[name] = _fill_nulls(prop, obj[name])
    return obj


def _normal(item: Mapping[str, Any], values: Mapping[str, Any], names: list[str]) -> tuple[Any, ...]:
    props = item.get("properties") or {}
    out = []
    for n in names:
        kind = kind_of(props.get(n, {})) or "string"
        v = values.get(n)
        out.append(None if v is None else KINDS[kind].normalise(v))
    return tuple(out)


def _strip(record: Mapping[str, Any], link: Link) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k not in {a for a, _ in link.links}}


def _put(obj: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for name in path[:-1]:
        if not isinstance(obj.get(name), dict):
            obj[name] = {}
        obj = obj[name]
    obj[path[-1]] = value


@functools.lru_cache(maxsize=64)
def validator(schema_json: str) -> Any:
    """A JSON Schema validator whose format checker holds dates to RFC 3339's full-date (the date32 column)."""
    from jsonschema import Draft202012Validator

    return Draft202012Validator(json.loads(schema_json), format_checker=Draft202012Validator.FORMAT_CHECKER)
