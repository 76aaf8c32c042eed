"""The user's Pydantic model as the last check of every row (``--schema module:Model``).

A JSON Schema cannot say what a model's own validators (``field_validator``, ``model_validator``,
``AfterValidator``) check, so a row valid under the schema may still be one ``Model.model_validate``
rejects. The schema of a model records where the model lives (``x-pydantic-model``: ``module:Model``,
set by :func:`memagent.extraction.schema.schema_from` when the class is importable by that name), so
every worker imports it again from the recorded config. :func:`model_checked` validates each assembled
object with it: a value the model rejects is dropped (a required value: the record holding it; a
record-level validator: that record) and named with the validator's message and path in
``schema_errors``, until the object passes (:func:`load_model` imports ``module:Model``). A rejection
that names the whole object (a top-level ``model_validator``) drops nothing and is named. The row's records
columns then hold what is left of each record (:func:`records_kept`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from memagent.json_walk import walk_json

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


@dataclass
class ModelCheck:
    """What :func:`model_checked` did to an object: the object left, each rejection as "path: message", and
    the paths it removed, in the order removed (replayed on the records by :func:`records_kept`)."""

    obj: dict[str, Any]
    rejected: list[str] = field(default_factory=list)
    removed: list[tuple[Any, ...]] = field(default_factory=list)


def model_checked(model: Any, obj: dict[str, Any]) -> ModelCheck:
    """``obj`` with every value ``model`` rejects dropped (see the module docstring)."""
    from pydantic import ValidationError

    check = ModelCheck(obj)
    for _ in range(MAX_ROUNDS):
        try:
            model.model_validate(obj)
            return check
        except ValidationError as e:
            dropped = False
            # Deepest and last first: dropping list item 2 leaves item 0 where the error found it.
            for err in sorted(e.errors(include_url=False), key=lambda x: _order(x["loc"]), reverse=True):
                loc = tuple(err["loc"])
                gone = _drop(obj, loc[:-1] if err["type"] == "missing" else loc)
                if gone is not None:
                    check.removed.append(gone)
                dropped |= gone is not None
                check.rejected.append(f"{_path(loc)}: {err['msg']} (the Pydantic model's validation); "
                                      + ("dropped" if gone is not None else "kept: it names the whole object"))
            if not dropped:
                return check
    return check


def records_kept(resolved: Any, doc: Mapping[str, Any], records: Mapping[str, Sequence[Any]],
                 removed: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """Each type's records (:class:`memagent.extraction.records.Record`) as the model check left them: the
    object assembled again with every record tagged, the check's removals replayed on it in order, then each
    record kept whose tag is still there, less the values removed inside it (and their evidence)."""
    tagged = {t: [{**r.values, _TAG: (t, i)} for i, r in enumerate(rs)] for t, rs in records.items()}
    before = resolved.assemble(doc, tagged)
    after = copy.deepcopy(before)
    for path in removed:
        _drop(after, path)
    was, left = dict(_tagged_nodes(before)), dict(_tagged_nodes(after))
    kept: dict[str, list[Any]] = {t: [] for t in records}
    for (t, i), node in sorted(left.items()):
        record = records[t][i]
        values = _pruned(record.values, was[(t, i)], node)
        evidence = {k: e for k, e in record.evidence.items() if _holds(values, k.split("."))}
        kept[t].append(dataclasses.replace(record, values=values, evidence=evidence))
    return kept


_TAG = "\x00record"  # never a property name a model or schema states


def _tagged_nodes(tree: Any) -> Iterator[tuple[tuple[str, int], dict[str, Any]]]:
    """(tag, node) of each tagged record in ``tree``."""
    return ((node[_TAG], node) for _, node in walk_json(tree) if isinstance(node, dict) and _TAG in node)


def _pruned(values: Mapping[str, Any], before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` less what went between ``before`` and ``after`` (the record as assembled: its link
    properties are not there, so they stay)."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        if k in before and k not in after:
            continue
        if isinstance(v, dict) and isinstance(before.get(k), dict) and isinstance(after.get(k), dict):
            v = _pruned(v, before[k], after[k])
        elif k in after and after[k] != before.get(k) and not isinstance(after[k], dict):
            v = after[k]  # a list that lost an item
        out[k] = v
    return out


def _holds(values: Any, path: list[str]) -> bool:
    for step in path:
        if not isinstance(values, dict) or step not in values:
            return False
        values = values[step]
    return True


def _order(loc: Any) -> list[tuple[int, Any]]:
    return [(0, k) if isinstance(k, int) else (1, str(k)) for k in loc]


def _path(loc: tuple[Any, ...]) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in loc).lstrip(".") or "(root)"


def _drop(obj: Any, loc: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Remove the value at ``loc`` (an object's key or a list's item), or at the deepest part of ``loc`` that
    names a value (past it, Pydantic names a union's branch: ``int``, ``function-after[...]``); the path
    removed, None when not even the first step names one (the root itself)."""
    trail: list[tuple[Any, Any]] = []
    node = obj
    for step in loc:
        child = _child(node, step)
        if child is _NONE:
            break
        trail.append((node, step))
        node = child
    if not trail:
        return None
    parent, key = trail[-1]
    if isinstance(parent, list):
        parent.pop(key)
    else:
        del parent[key]
    return tuple(step for _, step in trail)


_NONE = object()


def _child(node: Any, step: Any) -> Any:
    if isinstance(node, dict) and step in node:
        return node[step]
    if isinstance(node, list) and isinstance(step, int) and not isinstance(step, bool) and step < len(node):
        return node[step]
    return _NONE
