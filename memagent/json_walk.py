"""One walk over a JSON value (dicts, lists, scalars), iterative: a value nested deeper than
Python's recursion limit (a hostile request body or schema) cannot overflow the stack.

Every walk of a JSON tree whose depth nothing has bounded yet goes through :func:`walk_json`: request
bodies and tool parameters (``serve.guard``, ``serve.tools``), a schema's size and depth check
(``extraction.parse.check_size``, run before anything else reads a user's schema), its ``$ref`` s
(``json_refs``), the engines' special literals, a model's reply losing its nulls
(``extraction.shape.without_nulls``), the records tagged in an object the model check pruned
(``extraction.model_check._tagged_nodes``). A caller formats the path its way (:func:`json_pointer` for schemas,
dotted for request bodies) and may raise at any node to stop the walk there (a depth or size limit).
Nodes come depth first, a dict's last key first.

The recursive walks left elsewhere read trees already bounded, and each does what a flat visit of
nodes cannot:

- **two trees in step** (a schema and a value, a user's schema and its bounded copy; the walk is the
  pairing): ``extraction.answer_bounds.cut_values``, ``extraction.shape._fill_nulls``,
  ``extraction.output._typed_object``, ``extraction.groups._prune`` and ``_merge_into``,
  ``extraction.model_check._pruned`` (a record's values against its assembled node, before and after);
- **specs, not JSON** (``FieldSpec``/``ObjectSpec`` trees, at most ``MAX_OBJECT_DEPTH`` objects deep):
  ``extraction.parse.iter_leaves`` and ``parse_object``, ``extraction.groups.reply_tokens`` and ``_pieces``;
- **schemas rebuilt** from a schema ``check_size`` bounded to ``MAX_DEPTH`` levels (a new tree per node,
  keys kept or dropped by the node's role): ``extraction.resolve`` (``inline``, which follows ``$ref`` s
  through the graph with a node budget and turns a ``RecursionError`` into one line; ``_value``,
  ``_json_branch``, ``_without_records``, ``_Builder``), ``extraction.parse.clean``,
  ``engines.json_schema._bound``, ``_cap`` and ``longest_bytes`` (schemas the guard or the parser bounded);
- **small values of the project's own**: ``redact.redact`` (configs),
  ``extraction.record_grounding._copy`` (one record's values), ``report.records._leaves`` and
  ``report.fields._paths`` (an extraction object the schema shaped), ``documents.evidence_pages._spans``
  (a row's evidence columns).
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
