"""Literals of a JSON Schema that hold a tokenizer's special-token text, for engines whose grammar
cannot keep special tokens out of them.

A grammar forces a literal (an ``enum`` or ``const`` string, a property name, a pattern's fixed
text) token by token; where the literal holds ``<|im_end|>`` the grammar library may offer the special
token itself, which ends the reply or vanishes from its text, and the reply no longer parses. The hf
engine masks special tokens inside values (:mod:`memagent.engines.grammar`); an engine that cannot
(vLLM's structured outputs, an upstream server) refuses such a schema with the literal's JSON path
(:meth:`memagent.engines.base.Engine.check_literals`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

from memagent.json_walk import JsonPath, walk_json


def special_texts(tokenizer: Any) -> list[str]:
    """The texts of the tokenizer's special tokens and added vocabulary (``<|im_end|>``, ``<tool_call>``)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts = {getattr(t, "content", t) for t in added.values()} | set(getattr(tokenizer, "all_special_tokens", []))
    return sorted(t for t in texts if isinstance(t, str) and t.strip())


def _pattern_text(pattern: str) -> str:
    """A pattern's literal characters, escapes undone (``<\\|im_end\\|>`` -> ``<|im_end|>``)."""
    return re.sub(r"\\(.)", r"\1", pattern)


def _forced(node: dict[str, Any], path: JsonPath) -> Iterator[tuple[JsonPath, str]]:
    """(where, text) of each string a grammar writes verbatim or by pattern at ``node``."""
    if isinstance(node.get("enum"), list):
        yield from (((*path, "enum", i), v) for i, v in enumerate(node["enum"]) if isinstance(v, str))
    if isinstance(node.get("const"), str):
        yield (*path, "const"), node["const"]
    if isinstance(node.get("pattern"), str):
        yield (*path, "pattern"), _pattern_text(node["pattern"])
    for key in ("properties", "patternProperties"):
        if isinstance(node.get(key), dict):
            for name in node[key]:
                yield (*path, key, name), name if key == "properties" else _pattern_text(name)


def special_literal(schema: Any, specials: Sequence[str]) -> tuple[JsonPath, str, str] | None:
    """(its path in ``schema``, the literal, the special token it holds) of a literal of ``schema``
    that holds one of ``specials``; None when none does."""
    if not specials:
        return None
    for path, node in walk_json(schema):
        if not isinstance(node, dict):
            continue
        for where, text in _forced(node, path):
            hit = next((t for t in specials if t in text), None)
            if hit is not None:
                return where, text, hit
    return None
