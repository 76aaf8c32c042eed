"""One ``$ref`` resolver and one recursion check for every JSON Schema the project reads: the extraction
job's (:func:`memagent.extraction.resolve.resolve`), the server's request guard
(:func:`memagent.serve.guard.check_schema`) and the engines' rendering
(:func:`memagent.engines.json_schema.render_schema`).

:func:`resolve_refs` makes every ``$ref`` a local JSON pointer (through ``$id`` and ``$anchor``; nothing
remote is fetched); :func:`local_refs` lists them (bounded in depth, iteratively: a hostile schema cannot
overflow the stack); :func:`ref_cycle` finds a recursive ``$ref`` (a definition that reaches itself
through references), which no constrained decoder and no column can hold.
"""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

from memagent.json_walk import JsonPath, json_pointer, walk_json


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


def local_refs(schema: Any, max_depth: int | None = None) -> list[tuple[str, str]]:
    """(where each local ``$ref`` stands, the pointer it names), as JSON pointers with ``~0``/``~1`` kept
    escaped; ``ValueError`` for nesting deeper than ``max_depth`` levels."""
    refs: list[tuple[str, str]] = []
    for path, node in walk_json(schema):
        if max_depth is not None and len(path) > max_depth:
            raise ValueError(f"nested deeper than {max_depth} levels")
        if isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
            refs.append((json_pointer(path), unquote(node["$ref"][1:])))
    return refs


def ref_cycle(schema: Any) -> list[str] | None:
    """A recursive ``$ref`` of ``schema`` (its refs local: :func:`resolve_refs`) as the pointers of the cycle
    ``[a, b, ..., a]`` (``/$defs/Node``), or None. Definition T leads to U when a ``$ref`` to U stands inside T."""
    refs = local_refs(schema)
    edges = {t: sorted({u for at, u in refs if at == t or at.startswith(t + "/")}) for _, t in refs}
    return _cycle(edges)


def _cycle(edges: dict[str, list[str]]) -> list[str] | None:
    """A cycle of the graph ``edges`` (node -> successors) as [a, b, ..., a], or None (iterative DFS)."""
    done: set[str] = set()
    for start in edges:
        if start in done:
            continue
        path, nexts = [start], [iter(edges[start])]
        while path:
            nxt = next(nexts[-1], None)
            if nxt is None:
                done.add(path.pop())
                nexts.pop()
            elif nxt in path:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in done:
                path.append(nxt)
                nexts.append(iter(edges.get(nxt, ())))
    return None
