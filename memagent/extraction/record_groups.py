"""Record types read together: a chunk's records asked for in as few constrained calls as the budgets allow.

A schema may hold many record types (a quarterly filing: 52 lists, each an array of one shared ``metric``
definition). One records call per type per chunk would cost 52 calls a chunk, each repeating the shared
definition. Instead the types are packed into **groups** (:func:`group_record_types`, schema order, each
family's types kept together): one call per group per chunk, its reply one JSON object holding each type's
array under a short key (:meth:`RecordGroup.keys`: the type's last name segment when that is unique in the
group), every key required so that a reply says ``[]`` for a type the passage does not state.

A group is packed so that the reply's keys and brackets take at most half of the call's reply budget
(:data:`GROUP_REPLY_SHARE`; the rest holds records) and its request (the types' descriptions and each
family's fields) stays under :data:`GROUP_REQUEST_TOKENS`. A group of one type is read exactly as before
(one JSON array, :meth:`ExtractionSchema.records_schema`).

**Families.** Record types whose items have one schema (a shared ``$defs`` entry) form a family, described
once, named after the definition (``metric``) when the user's schema names one: "Each of these lists holds
metric records, with the fields: …" then each list's key and description (:func:`group_instruction`). The
memory update's question lists the families with their fields and the names of their lists only
(:func:`compact_record_lines`); descriptions are in the records calls that decode those fields. A group
call's reply budget (:func:`group_reply_tokens`) is up to three chunks' worth where the window has room.

**A reply read** (:func:`read_group_reply`): the types whose arrays closed are complete (a cut reply keeps
them); the type being written when the reply was cut, or whose array filled its limit, overflowed and is
read again alone as before (split by piece); the types after it are asked again as a group.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from memagent.extraction.groups import name_tokens
from memagent.extraction.parse import FieldSpec, ObjectSpec, RecordType

GROUP_REPLY_SHARE = 2  # a group's keys and brackets take at most 1/2 of the reply budget
GROUP_REPLY_CHUNKS = 3  # a group call's reply may be up to 3x its chunk (a dense table: ~45 tokens a figure)
GROUP_REQUEST_TOKENS = 1024  # what a group's request (descriptions, fields) may add to its records call (estimate):
# an eighth of an 8K window, so that the request, the compact question and the budgets fit such a model's window
# The memory question is written in full (kinds, descriptions) while its estimate (3 bytes a token) is at most
# this; past it, compact (names only; the descriptions go to the calls that decode those fields): its share.
MEMORY_QUESTION_TOKENS = 1024
TEMPLATE_TOKENS = 256  # the prompt template's own tokens, on the high side
KEY_TOKENS = 4  # ``"key":[],`` beside the name itself
DESCRIPTION_CHARS = 80  # a list's description in a group request, cut here (one line each)
FIELD_DESCRIPTION_CHARS = 120  # a shared field's description in a group request, cut here


def group_reply_tokens(memory_tokens: int, chunk_tokens: int, context_window: int, question_tokens: int) -> int:
    """The reply budget of a group's records call: up to :data:`GROUP_REPLY_CHUNKS` chunks' worth (what a dense
    table's records take as JSON) where the window has room for it beside the chunk, the memory, the question
    (``question_tokens``, counted), the request's share and the template; never below the memory's budget (a
    single type's call has it)."""
    room = context_window - chunk_tokens - memory_tokens - question_tokens - GROUP_REQUEST_TOKENS - TEMPLATE_TOKENS
    return max(memory_tokens, min(GROUP_REPLY_CHUNKS * chunk_tokens, room))


@dataclass(frozen=True)
class RecordFamily:
    """Record types whose items share one schema: ``label`` names it (the user's ``$defs`` entry, else the
    first type's name), ``types`` in schema order."""

    label: str
    types: tuple[RecordType, ...]

    @property
    def fields(self) -> str:
        """The family's fields in one line: ``unit, scale, value``; an object's fields in braces."""
        return ", ".join(map(compact_name, self.types[0].fields))

    @property
    def key(self) -> tuple[str, ...]:
        return self.types[0].key


def compact_name(spec: FieldSpec | ObjectSpec) -> str:
    """A field in a compact list: its name, an object's fields in braces (``costs {cogs, opex}``)."""
    if isinstance(spec, ObjectSpec):
        return f"{spec.name} {{{', '.join(map(compact_name, spec.fields))}}}"
    return spec.name


def _item_identity(record: RecordType) -> str:
    return json.dumps([record.item_schema, list(record.key)], sort_keys=True, ensure_ascii=False, default=str)


def def_name(root: Mapping[str, Any], name: str) -> str | None:
    """The ``$defs`` (or ``definitions``) entry the items of top-level record type ``name`` (``a.b``) refer to
    in the user's schema, or None (inline items, a child type)."""
    node: Any = root
    for seg in name.split("."):
        node = _deref(root, node)
        props = node.get("properties") if isinstance(node, Mapping) else None
        if not isinstance(props, Mapping) or seg not in props:
            return None
        node = props[seg]
    items = _deref(root, node).get("items") if isinstance(_deref(root, node), Mapping) else None
    ref = items.get("$ref") if isinstance(items, Mapping) else None
    if isinstance(ref, str) and ref.startswith("#/") and ref.split("/")[1] in ("$defs", "definitions"):
        return ref.rsplit("/", 1)[-1]
    return None


def _deref(root: Mapping[str, Any], node: Any) -> Any:
    """A node with its local ``$ref`` followed (once per hop, at most 32 hops)."""
    for _ in range(32):
        ref = node.get("$ref") if isinstance(node, Mapping) else None
        if not (isinstance(ref, str) and ref.startswith("#/")):
            return node
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, Mapping) else None
        node = target
    return node


def record_families(root: Mapping[str, Any], records: Sequence[RecordType]) -> tuple[RecordFamily, ...]:
    """The record types in families (same item schema and key), in order of each family's first type."""
    by_identity: dict[str, list[RecordType]] = {}
    for r in records:
        by_identity.setdefault(_item_identity(r), []).append(r)
    out = []
    for types in by_identity.values():
        label = def_name(root, types[0].name) or types[0].name.rsplit(".", 1)[-1]
        out.append(RecordFamily(label, tuple(types)))
    return tuple(out)


def compact_record_lines(families: Iterable[RecordFamily]) -> str:
    """The record types in the memory question: one line per family, its fields once, its lists' names with a
    common dotted prefix written once (``balance_sheet.{cash, goodwill}``)."""
    lines = []
    for fam in families:
        ident = f" identified by {', '.join(fam.key)}" if fam.key else ""
        names = _prefixed([t.name for t in fam.types])
        many = len(fam.types) > 1
        lines.append(f"- {'each of these lists holds ' if many else ''}{fam.label} records{ident} "
                     f"({fam.fields}): {names}")
    return "\n".join(lines)


def _prefixed(names: Sequence[str]) -> str:
    groups: dict[str, list[str]] = {}
    for n in names:
        head, _, tail = n.rpartition(".")
        groups.setdefault(head, []).append(tail)
    return "; ".join(", ".join(tails) if not head else f"{head}.{{{', '.join(tails)}}}"
                     for head, tails in groups.items())


@dataclass(frozen=True)
class RecordGroup:
    """The record types one records call asks for (one: an array reply, as a single type is read)."""

    names: tuple[str, ...]

    def keys(self) -> dict[str, str]:
        """``reply key -> record type``: a type's last name segment when unique in the group, else its name."""
        tails = [n.rsplit(".", 1)[-1] for n in self.names]
        return {(t if tails.count(t) == 1 else n): n for n, t in zip(self.names, tails)}


def reply_overhead(names: Iterable[str]) -> int:
    """The tokens of a group reply's keys and brackets on the high side (every array empty)."""
    return 2 + sum(name_tokens(k) + KEY_TOKENS for k in RecordGroup(tuple(names)).keys())


def request_tokens(records: Sequence[RecordType], families: Sequence[RecordFamily]) -> int:
    """The tokens a group request adds, on the high side (about 3 characters a token)."""
    return -(-len(group_request_text(records, families)) // 3)


def group_record_types(families: Sequence[RecordFamily], reply_budget: int,
                       request_budget: int = GROUP_REQUEST_TOKENS) -> tuple[RecordGroup, ...]:
    """The record types packed (families in order, a family's types in order) into as few groups as fit: each
    group's reply overhead within ``reply_budget // GROUP_REPLY_SHARE`` and its request within ``request_budget``;
    then evened out (as many types in each as the fewest groups allow). A type that alone exceeds either is a
    group of its own (read as a single type)."""
    greedy = _pack(families, reply_budget, request_budget, None)
    if not greedy:
        return ()
    even = _pack(families, reply_budget, request_budget, -(-sum(len(f.types) for f in families) // len(greedy)))
    return even if len(even) <= len(greedy) else greedy


def _pack(families: Sequence[RecordFamily], reply_budget: int, request_budget: int,
          most: int | None) -> tuple[RecordGroup, ...]:
    groups: list[list[RecordType]] = []
    for fam in families:
        for r in fam.types:
            current = groups[-1] if groups else None
            if current is not None and (most is None or len(current) < most):
                trial = [*current, r]
                if reply_overhead(t.name for t in trial) <= reply_budget // GROUP_REPLY_SHARE \
                        and request_tokens(trial, _families_of(trial, families)) <= request_budget:
                    current.append(r)
                    continue
            groups.append([r])
    return tuple(RecordGroup(tuple(r.name for r in g)) for g in groups)


def _families_of(records: Sequence[RecordType], families: Sequence[RecordFamily]) -> list[RecordFamily]:
    names = {r.name for r in records}
    return [RecordFamily(f.label, tuple(t for t in f.types if t.name in names)) for f in families
            if any(t.name in names for t in f.types)]


def group_request_text(records: Sequence[RecordType], families: Sequence[RecordFamily]) -> str:
    """The part of a group request that describes its lists: per family its fields with their descriptions,
    once, and each list's key and description."""
    keys = {v: k for k, v in RecordGroup(tuple(r.name for r in records)).keys().items()}
    lines = []
    for fam in _families_of(records, families):
        ident = f", identified by {', '.join(fam.key)}" if fam.key else ""
        lines.append(f"Each of these lists holds {fam.label} records{ident}, with the fields:")
        lines += [_cut(f.question_line("  "), FIELD_DESCRIPTION_CHARS + len(f.name) + 40)
                  for f in fam.types[0].fields]
        lines.append("The lists (reply key: what it holds):")
        for t in fam.types:
            desc = " ".join((t.description or "").split())
            lines.append(f"  - {keys[t.name]}" + (f": {_cut(desc, DESCRIPTION_CHARS)}" if desc else ""))
    return "\n".join(lines)


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars - 1].rstrip() + "…"


def group_instruction(records: Sequence[RecordType], families: Sequence[RecordFamily]) -> str:
    """The request of one group's records call (the format sentence after the lists)."""
    return (group_request_text(records, families)
            + "\nReply with a JSON object of record lists: one key per list above, in that order, each a JSON array "
            "of the records of that list this passage states ([] when it states none; each record an object, dates "
            "as YYYY-MM-DD; leave out a field the passage does not state), and nothing else.")


def group_schema(group: RecordGroup, arrays: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The decoding schema of a group's reply: an object holding each type's records array (``arrays``: the
    type's :meth:`ExtractionSchema.records_schema`) under its key, every key required, in order."""
    keys = group.keys()
    return {"type": "object", "properties": {k: dict(arrays[name]) for k, name in keys.items()},
            "required": list(keys), "additionalProperties": False}


@dataclass(frozen=True)
class GroupReply:
    """A group reply read: ``arrays`` maps each type whose array closed to its items (as written); ``cut`` is
    the first type without one (the reply was cut there, or broke); ``missing`` the types after it."""

    arrays: dict[str, list[Any]]
    cut: str | None
    missing: tuple[str, ...]


def read_group_reply(group: RecordGroup, text: str) -> GroupReply:
    """The arrays a group reply completed, in key order, up to where it stops being JSON (see the module
    docstring): a reply cut anywhere keeps every array it closed."""
    keys = group.keys()
    decoder, done = json.JSONDecoder(), {}
    pos = text.find("{") + 1
    while 0 < pos < len(text):
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        try:
            key, pos = decoder.raw_decode(text, pos)
            while pos < len(text) and text[pos] in " \t\r\n:":
                pos += 1
            value, pos = decoder.raw_decode(text, pos)
        except ValueError:
            break
        if isinstance(key, str) and key in keys and isinstance(value, list):
            done[keys[key]] = value
    rest = [n for n in group.names if n not in done]
    return GroupReply(done, rest[0] if rest else None, tuple(rest[1:]))
