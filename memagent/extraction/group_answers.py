"""A wide schema's final answer: one constrained call per field group, a reply that breaks asked again in halves.

Groups are packed by an estimate of each value's size (:mod:`memagent.extraction.groups`). A value longer
than its estimate (free text runs up to the grammar's 200 characters) can run a group's reply past
``answer_tokens``, where the engine cuts it and it is no JSON object. Such a group, or one whose reply is
no JSON object for any other reason, is asked again as two halves (:func:`halves`), each at the full
budget, until every reply is whole or the broken group is a single leaf. A leaf whose reply still breaks
is left out and named (``path: why``, the row's ``schema_errors``); the other groups' values are kept. A
required leaf left out fails the user's schema as any missing required value does (an error row).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable

from memagent.engines.base import Completion
from memagent.extraction.groups import FieldGroup, Spec, merge_replies
from memagent.extraction.parse import ObjectSpec
from memagent.prompts import parse_json_answer


@dataclass(frozen=True)
class GroupAnswers:
    """What the group calls gave: every reply in call order (first the groups, then each half after the
    group it halves), the whole replies merged, one ``path: why`` per leaf left out, and the replies of the
    leaves left out."""

    replies: tuple[Completion, ...]
    merged: dict[str, Any]
    unanswered: tuple[str, ...]
    broken: tuple[Completion, ...] = ()


def reply_object(reply: Completion) -> dict[str, Any] | None:
    """The reply's JSON object, or None when it is none (cut, or not JSON)."""
    try:
        obj = parse_json_answer(reply.text)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _split(spec: Spec) -> tuple[Spec, Spec] | None:
    """``spec`` in two shares of its leaves (an object: copies holding a half of its properties each, or
    its one property split); None for a leaf."""
    if not isinstance(spec, ObjectSpec):
        return None
    if len(spec.fields) > 1:
        mid = len(spec.fields) // 2
        return replace(spec, fields=spec.fields[:mid]), replace(spec, fields=spec.fields[mid:])
    inner = _split(spec.fields[0]) if spec.fields else None
    return None if inner is None else (replace(spec, fields=(inner[0],)), replace(spec, fields=(inner[1],)))


def halves(group: FieldGroup) -> tuple[FieldGroup, FieldGroup] | None:
    """The group's leaves in two groups (its fields halved, or its one object split); None for one leaf."""
    if len(group.fields) > 1:
        mid = len(group.fields) // 2
        return FieldGroup(group.fields[:mid]), FieldGroup(group.fields[mid:])
    pair = _split(group.fields[0]) if group.fields else None
    return None if pair is None else (FieldGroup((pair[0],)), FieldGroup((pair[1],)))


def _why(reply: Completion, budget: int) -> str:
    if reply.finish_reason == "length":
        return f"no value: its reply ran past answer_tokens={budget} alone and was cut"
    return "no value: its reply was no JSON object"


async def answer_groups(ask: Callable[[FieldGroup], Awaitable[Completion]], groups: tuple[FieldGroup, ...],
                        budget: int) -> GroupAnswers:
    """Each group asked (concurrently) with ``ask``; a broken reply's group asked again in halves, down to
    single leaves (see the module docstring). ``budget``: the answer_tokens each call had (named in the
    reasons)."""
    async def one(group: FieldGroup) -> GroupAnswers:
        reply = await ask(group)
        obj = reply_object(reply)
        if obj is not None:
            return GroupAnswers((reply,), obj, ())
        pair = halves(group)
        if pair is None:
            return GroupAnswers((reply,), {}, tuple(f"{path}: {_why(reply, budget)}" for path in group.leaves()),
                                (reply,))
        parts = await asyncio.gather(*(one(g) for g in pair))
        return _joined(parts, first=(reply,))

    return _joined(await asyncio.gather(*(one(g) for g in groups)))


def _joined(parts: list[GroupAnswers], first: tuple[Completion, ...] = ()) -> GroupAnswers:
    """``parts`` as one: ``first``, then each part's own reply (the groups, as the steps were before any
    halving), then every part's retries; the objects merged."""
    replies = first + tuple(p.replies[0] for p in parts) + tuple(r for p in parts for r in p.replies[1:])
    return GroupAnswers(replies, merge_replies(p.merged for p in parts),
                        tuple(u for p in parts for u in p.unanswered), tuple(b for p in parts for b in p.broken))
