"""Wide schemas: the document-level fields split into groups whose final answer fits ``answer_tokens``.

The memory is shared: one memory update per chunk reads the whole field list (the memory agent's
question), and the records calls stay one per record type per chunk. Only the constrained final
answer is split: one call per group, each reading the same final memory, asked for its own fields
and decoded under its own part of the schema; the replies are merged into one object.

Grouping (deterministic, schema order): fields whose whole reply fits by the load-time estimate
(:meth:`ExtractionSchema.answer_tokens_needed`) are one group. Otherwise they are packed by a size kept on the
high side (:func:`reply_tokens`: digits and dates counted one token a character): a top-level field is a unit
whose reply fits the budget; an object that does not fit is split into its properties' subtrees (objects first
kept whole, then split in turn), the pieces of one object packed together; the units are then packed greedily in
order into groups of at most ``answer_tokens`` each. A leaf that alone does not fit is the smallest group there
can be: the schema is refused, naming its path and the budget to raise.
A schema whose fields fit in one group is read exactly as before (one final call, the same prompt).
A group reply that breaks anyway is asked again in halves (:mod:`memagent.extraction.group_answers`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Iterable, Mapping

from memagent.engines.json_schema import MIN_BUDGET_CHARS, MIN_BUDGET_ITEMS, TEXT_PATTERN, longest_bytes
from memagent.extraction.parse import FieldSpec, ObjectSpec, iter_leaves

Spec = FieldSpec | ObjectSpec
BRACES_TOKENS = 2  # "{" and "}" of a reply
# A leaf's value in the grammar of the least room a group leaves it (answer_bounds bounds each call's strings
# and arrays to its budget): its longest text in bytes is the most tokens it can take.
_TEXT = {"type": "string", "pattern": TEXT_PATTERN}  # a free string as a budgeted grammar holds it
KIND_NODES: dict[str, dict[str, Any]] = {
    "string": _TEXT, "date": {"type": "string", "format": "date"}, "number": {"type": "number"},
    "integer": {"type": "integer"}, "boolean": {"type": "boolean"},
    "string_array": {"type": "array", "items": _TEXT},
    "json": {"type": "array", "items": _TEXT}}  # a union's room: as a list of texts


def name_tokens(name: str) -> int:
    """A property name's most tokens: its bytes as a JSON key (every token is at least one byte)."""
    return len(json.dumps(name, ensure_ascii=False).encode())


def reply_tokens(spec: Spec, chars: int = MIN_BUDGET_CHARS, items: int = MIN_BUDGET_ITEMS) -> int:
    """The most tokens ``"name":value,`` takes when each string holds ``chars`` characters and each array
    ``items`` items (an object: its name, braces and properties): by default the least room a group leaves."""
    if isinstance(spec, ObjectSpec):
        return name_tokens(spec.name) + 4 + sum(reply_tokens(f, chars, items) for f in spec.fields)
    node = {"enum": list(spec.enum)} if spec.kind == "enum" else KIND_NODES[spec.kind]
    return name_tokens(spec.name) + 2 + longest_bytes(node, chars, items)


@dataclass(frozen=True)
class FieldGroup:
    """The fields of one final-answer call: top-level specs, an object possibly pruned to some of its
    properties (the rest are in other groups)."""

    fields: tuple[Spec, ...]

    def answer_tokens(self) -> int:
        """A rough size of this group's reply (the budget the packing keeps under)."""
        return BRACES_TOKENS + sum(map(reply_tokens, self.fields))

    def leaves(self) -> tuple[str, ...]:
        """The dotted paths of the leaves this group asks for."""
        return tuple(path for path, _, _ in iter_leaves(self.fields, {}))

    def describe(self) -> str:
        """One line: the top-level names (a split object with the share it holds) and the reply estimate."""
        names = ", ".join(f.name for f in self.fields)
        return f"{len(self.leaves())} fields ({names}), ~{self.answer_tokens()} answer tokens"


class GroupTooLarge(ValueError):
    """A leaf (the smallest group there can be) whose reply cannot close within the answer budget even with
    its strings empty and its arrays without items."""

    def __init__(self, path: str, need: int, budget: int):
        super().__init__(f"answer_tokens={budget} cannot hold field {path!r} of the schema (about {need} tokens "
                         f"with the objects around it), the smallest group the fields can be split into; raise answer_tokens "
                         f"to {need} or more")
        self.path, self.need = path, need


@lru_cache(maxsize=64)  # asked once per document's final answer; the specs are frozen, hashable
def group_fields(fields: tuple[Spec, ...], budget: int) -> tuple[FieldGroup, ...]:
    """The fields in groups of at most ``budget`` answer tokens each (see the module docstring); one group
    when they all fit. A leaf that does not fit with the least room is a group of its own;
    :class:`GroupTooLarge` when it cannot fit at all."""
    if BRACES_TOKENS + sum(map(reply_tokens, fields)) <= budget:
        return (FieldGroup(fields),)  # fits whole (ExtractionSchema.answer_tokens_needed): one call
    units: list[Spec] = []
    for f in fields:
        units.extend(_pieces(f, budget - BRACES_TOKENS, "", budget))
    groups: list[list[Spec]] = []
    for unit in units:
        current = groups[-1] if groups else None
        fits = current is not None and BRACES_TOKENS + sum(map(reply_tokens, current)) + reply_tokens(unit) <= budget
        if fits and unit.name not in {u.name for u in current}:
            current.append(unit)
        else:
            groups.append([unit])
    return tuple(FieldGroup(tuple(g)) for g in groups)


def _pieces(spec: Spec, room: int, prefix: str, budget: int) -> list[Spec]:
    """``spec`` whole when it fits ``room`` tokens, else (an object) its properties' pieces packed into
    copies of the object holding a share of them each."""
    if reply_tokens(spec) <= room:
        return [spec]
    if not isinstance(spec, ObjectSpec):
        if reply_tokens(spec, 0, 0) <= room:
            return [spec]  # a group of its own: its strings and arrays bounded shorter (values_cut names a cut)
        raise GroupTooLarge(prefix + spec.name, budget - room + reply_tokens(spec), budget)  # with its objects
    wrapper = reply_tokens(spec) - sum(map(reply_tokens, spec.fields))  # the object's own name, braces
    inner: list[Spec] = []
    for f in spec.fields:
        inner.extend(_pieces(f, room - wrapper, f"{prefix}{spec.name}.", budget))
    shares: list[list[Spec]] = []
    for piece in inner:
        if shares and wrapper + sum(map(reply_tokens, shares[-1])) + reply_tokens(piece) <= room \
                and piece.name not in {p.name for p in shares[-1]}:
            shares[-1].append(piece)
        else:
            shares.append([piece])
    return [replace(spec, fields=tuple(share)) for share in shares]


def smallest_group_tokens(fields: tuple[Spec, ...]) -> int:
    """The least ``answer_tokens`` under which every leaf's group leaves it the least room (:func:`reply_tokens`):
    the widest leaf with the objects around it and the braces."""
    def need(spec: Spec) -> int:
        if not isinstance(spec, ObjectSpec):
            return reply_tokens(spec)
        wrapper = reply_tokens(spec) - sum(map(reply_tokens, spec.fields))
        return wrapper + max(need(f) for f in spec.fields)

    return BRACES_TOKENS + max(map(need, fields), default=0) if fields else 0


def group_schema(properties: Mapping[str, Any], group: FieldGroup) -> dict[str, Any]:
    """The decoding schema of one group's reply: the group's top-level properties (from the document's
    decoding schema ``properties``), each object pruned to the properties the group holds."""
    props = {f.name: _prune(properties[f.name], f) for f in group.fields}
    return {"type": "object", "properties": props, "required": [f.name for f in group.fields if f.required],
            "additionalProperties": False}


def _prune(node: Any, spec: Spec) -> Any:
    if not isinstance(spec, ObjectSpec) or not isinstance(node, dict):
        return node
    out = dict(node)
    for word in ("anyOf", "oneOf"):  # a union's object branches hold the same share
        if isinstance(node.get(word), list):
            out[word] = [_prune(b, spec) for b in node[word]]
    if isinstance(node.get("properties"), dict):
        keep = {f.name: f for f in spec.fields}
        out["properties"] = {k: _prune(v, keep[k]) for k, v in node["properties"].items() if k in keep}
        if "required" in node:
            out["required"] = [r for r in node["required"] if r in keep]
    return out


def merge_replies(objects: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The groups' reply objects as one object (a split object's shares joined, key order as they come)."""
    merged: dict[str, Any] = {}
    for obj in objects:
        _merge_into(merged, obj)
    return merged


def _merge_into(into: dict[str, Any], obj: Mapping[str, Any]) -> None:
    for k, v in obj.items():
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _merge_into(into[k], v)
        else:
            into[k] = dict(v) if isinstance(v, Mapping) else v


def grouping_report(groups: tuple[FieldGroup, ...], budget: int) -> str:
    """The grouping in words (logged by the job, kept by :meth:`ExtractionSchema.grouping`)."""
    leaves = sum(len(g.leaves()) for g in groups)
    head = (f"{leaves} document fields in {len(groups)} answer groups (answer_tokens={budget}): "
            "one constrained final call per group, the memory shared")
    return head + "".join(f"\n  group {i}: {g.describe()}" for i, g in enumerate(groups, 1))
