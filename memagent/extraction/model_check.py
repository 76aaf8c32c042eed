"""The user's Pydantic model as the last check of every row (``--schema module:Model``).

A JSON Schema cannot say what a model's own validators (``field_validator``, ``model_validator``,
``AfterValidator``) check, so a row valid under the schema may still be one ``Model.model_validate``
rejects. The schema of a model records where the model lives (``x-pydantic-model``: ``module:Model``,
set by :func:`memagent.extraction.schema.schema_from` when the class is importable by that name), so
every worker imports it again from the recorded config. :func:`model_checked` validates each assembled
object with it: a value the model rejects is dropped (a required value: the record holding it; a
record-level validator: that record) and named with the validator's message and path in
``schema_errors``, until the object passes (:func:`load_model` imports ``module:Model``). A rejection
that names the whole object (a top-level ``model_validator``) drops nothing and is named.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

MAX_ROUNDS = 8  # drops that expose further rejections (a record whose required value went) settle fast


@lru_cache(maxsize=16)
def model_named(spec: str) -> Any:
    """The Pydantic model class ``module:Model`` names (imported once per process)."""
    return load_model(spec)


def load_model(spec: str) -> Any:
    """The Pydantic model ``module:Model`` names (the module imported as ``python -m`` would, from the
    working directory too); ``ValueError`` saying what is missing."""
    import importlib
    import sys

    from pydantic import BaseModel

    module_name, _, attr = spec.partition(":")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - a module that raises or does not parse: one line, not its traceback
        where = f" (line {e.lineno})" if isinstance(e, SyntaxError) and e.lineno else ""
        raise ValueError(f"schema {spec}: module {module_name!r} cannot be imported: {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''}{where}"[:300]) from None
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ValueError(f"schema {spec}: module {module_name!r} has no {attr!r}")
    if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
        raise ValueError(f"schema {spec}: {attr!r} is not a Pydantic model class")
    return obj


def model_checked(model: Any, obj: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``(obj with every value ``model`` rejects dropped, one "path: message" per rejection)``."""
    from pydantic import ValidationError

    named: list[str] = []
    for _ in range(MAX_ROUNDS):
        try:
            model.model_validate(obj)
            return obj, named
        except ValidationError as e:
            dropped = False
            # Deepest and last first: dropping list item 2 leaves item 0 where the error found it.
            for err in sorted(e.errors(include_url=False), key=lambda x: _order(x["loc"]), reverse=True):
                loc = tuple(err["loc"])
                gone = _drop(obj, loc[:-1] if err["type"] == "missing" else loc)
                dropped |= gone
                named.append(f"{_path(loc)}: {err['msg']} (the Pydantic model's validation); "
                             + ("dropped" if gone else "kept: it names the whole object"))
            if not dropped:
                return obj, named
    return obj, named


def _order(loc: Any) -> list[tuple[int, Any]]:
    return [(0, k) if isinstance(k, int) else (1, str(k)) for k in loc]


def _path(loc: tuple[Any, ...]) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in loc).lstrip(".") or "(root)"


def _drop(obj: Any, loc: tuple[Any, ...]) -> bool:
    """Remove the value at ``loc`` (an object's key or a list's item), or at the deepest part of ``loc`` that
    names a value (past it, Pydantic names a union's branch: ``int``, ``function-after[...]``); False when
    not even the first step names one (the root itself)."""
    trail: list[tuple[Any, Any]] = []
    node = obj
    for step in loc:
        child = _child(node, step)
        if child is _NONE:
            break
        trail.append((node, step))
        node = child
    if not trail:
        return False
    parent, key = trail[-1]
    if isinstance(parent, list):
        parent.pop(key)
    else:
        del parent[key]
    return True


_NONE = object()


def _child(node: Any, step: Any) -> Any:
    if isinstance(node, dict) and step in node:
        return node[step]
    if isinstance(node, list) and isinstance(step, int) and not isinstance(step, bool) and step < len(node):
        return node[step]
    return _NONE
