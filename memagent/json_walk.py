"""One walk over a JSON value (dicts, lists, scalars), iterative: a value nested deeper than
Python's recursion limit (a hostile request body or schema) cannot overflow the stack.

Every walk of a JSON tree in the project goes through :func:`walk_json`; a caller formats the path
its way (:func:`json_pointer` for schemas, dotted for request bodies) and may raise at any node to
stop the walk there (a depth or size limit). Nodes come depth first, a dict's last key first.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

JsonPath = tuple[str | int, ...]  # the keys and list indices from the root to a node; () for the root


def walk_json(value: Any) -> Iterator[tuple[JsonPath, Any]]:
    """Every (path, node) of ``value``, the root first. A container's children are taken after the
    caller has seen it, so a caller may edit a node in place (drop a key, rewrite a ``$ref``) and the
    walk follows the edited node."""
    stack: list[tuple[JsonPath, Any]] = [((), value)]
    while stack:
        path, node = stack.pop()
        yield path, node
        if isinstance(node, dict):
            stack.extend(((*path, k), v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend(((*path, i), v) for i, v in enumerate(node))


def pointer_token(key: Any) -> str:
    """``key`` as one JSON-pointer reference token (``~`` -> ``~0``, ``/`` -> ``~1``)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def json_pointer(path: JsonPath) -> str:
    """``path`` as a JSON pointer without its ``#`` (``""`` for the root, ``/properties/a~1b`` below it)."""
    return "".join("/" + pointer_token(k) for k in path)


def dotted(path: JsonPath, root: str = "") -> str:
    """``path`` as ``root.key.0.key`` (how request fields are named in error messages)."""
    return root + "".join(f".{k}" for k in path)
