"""Final answers valid by construction: each answer call's grammar bounded so its reply closes in its budget.

A free string has no end of its own: a model caught in a loop inside one runs until ``answer_tokens`` cuts
the reply, and a cut reply is no JSON object. So every final-answer call (one per field group, and each
half of a group asked again) is constrained to its decoding schema *bounded to the call's budget*
(:func:`memagent.engines.json_schema.bound_to_budget`): free strings get a ``maxLength`` and arrays a
``maxItems`` such that the longest text the grammar allows is at most ``answer_tokens`` bytes, hence
tokens. A value that reaches a bound the budget set (not one the user's schema sets) may have been
longer: it is kept and named in the row's ``values_cut`` (:func:`cut_values`), never a broken row.

:func:`answer_room_tokens` is the answer budget a schema is given when the user leaves it at its default:
room for every string of the final reply to hold 64 characters and every array 8 items under those worst-case
bounds (less, down to 24 and 3, where that is over :data:`ANSWER_ROOM_CAP`); a reply wider still is split into
groups of the memory's budget, each value with at least the least room a group leaves
(:func:`memagent.extraction.groups.reply_tokens`: 16 characters, 2 items).
"""

from __future__ import annotations

from typing import Any, Mapping

from memagent.engines.json_schema import bound_to_budget, longest_bytes, text_bounded
from memagent.json_refs import resolve_refs

# A derived answer budget lets each free string of the reply run the first of these lengths (and each array hold
# that many items) whose reply takes at most ANSWER_ROOM_CAP tokens.
ROOMS = ((64, 8), (48, 6), (32, 4), (24, 3))
ANSWER_ROOM_CAP = 4096


def budgeted_json(decoding: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """``decoding`` (a final call's schema) with the bounds under which every reply fits ``max_tokens``."""
    return bound_to_budget(decoding, max_tokens)


def answer_room_tokens(decoding: dict[str, Any]) -> int:
    """The answer budget that gives every string of ``decoding``'s reply the most room of :data:`ROOMS` within
    :data:`ANSWER_ROOM_CAP` (see the module docstring); 0 when none fits (the reply is split into groups)."""
    rendered = text_bounded(resolve_refs(decoding))
    return next((n for chars, items in ROOMS if (n := longest_bytes(rendered, chars, items)) <= ANSWER_ROOM_CAP), 0)


def cut_values(user: Any, bounded: Any, value: Any, path: str, budget: int) -> list[str]:
    """``path: what`` for each value of ``value`` (a reply under ``bounded``) that reached a bound the budget
    set and the user's schema ``user`` (the unbounded decoding schema) does not: a string at its
    ``maxLength``, an array at its ``maxItems``."""
    if not isinstance(bounded, dict):
        return []
    user = user if isinstance(user, dict) else {}
    for word in ("anyOf", "oneOf"):
        if isinstance(bounded.get(word), list):  # the branch whose type the value has
            pairs = zip(user.get(word) or [{}] * len(bounded[word]), bounded[word])
            return next((cut_values(u, b, value, path, budget) for u, b in pairs if _holds(b, value)), [])
    out = []
    if isinstance(value, str) and isinstance(bounded.get("maxLength"), int):
        own = user.get("maxLength")
        if len(value) >= bounded["maxLength"] and (own is None or bounded["maxLength"] < own):
            out.append(f"{path}: cut at {bounded['maxLength']} characters, the bound answer_tokens={budget} "
                       "leaves each string of its reply; kept")
    elif isinstance(value, list) and isinstance(bounded.get("maxItems"), int):
        own = user.get("maxItems")
        if len(value) >= bounded["maxItems"] and (own is None or bounded["maxItems"] < own):
            out.append(f"{path}: cut at {bounded['maxItems']} items, the bound answer_tokens={budget} "
                       "leaves each array of its reply; kept")
        for i, item in enumerate(value):
            out += cut_values(user.get("items"), bounded.get("items"), item, f"{path}[{i}]", budget)
    elif isinstance(value, Mapping):
        props, own_props = bounded.get("properties") or {}, user.get("properties") or {}
        for name, v in value.items():
            out += cut_values(own_props.get(name), props.get(name), v, f"{path}.{name}" if path else name, budget)
    return out


_JSON_TYPES = {"string": str, "array": list, "object": dict, "boolean": bool}


def _holds(node: Any, value: Any) -> bool:
    """Whether a union branch ``node`` is one ``value``'s JSON type could come from (numbers aside)."""
    if not isinstance(node, dict):
        return False
    types = node.get("type")
    types = [types] if isinstance(types, str) else list(types or (["object"] if "properties" in node else []))
    return any(isinstance(value, _JSON_TYPES[t]) for t in types if t in _JSON_TYPES)
