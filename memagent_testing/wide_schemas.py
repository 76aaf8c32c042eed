"""Wide extraction schemas (tens to hundreds of leaves) with a gold object each, and a perfect reader for them.

:func:`wide_schema` builds, from a seed, a JSON Schema shaped like a filing's: top-level sections (objects,
some required, with nested sub-objects up to 3 deep), a few top-level leaves, and optionally record types
(arrays of objects keyed by ``key``, one with a child record type inside its items), every leaf one of
the kinds the job knows (text, whole number, number, boolean, enum, date, list of texts). :func:`gold_for`
draws an object valid under it. :class:`WideReader` is a perfect model of that object: it answers each
final-answer call with exactly the fields the call's question lists (read from the prompt the job wrote),
each records call with the gold records of the type asked for, and a memory update with a fixed sentence.
The benchmark (benchmarks/wide_schema.py) and tests/test_wide_schemas.py share them.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from typing import Any

WORDS = ("alpha", "beta", "gamma", "delta", "north", "river", "stone", "cedar", "ember", "harbor")
KINDS = ("string", "integer", "number", "boolean", "enum", "date", "strings")
ENUM = ["open", "closed", "pending"]


def _leaf(kind: str) -> dict[str, Any]:
    return {"string": {"type": "string"}, "integer": {"type": "integer"}, "number": {"type": "number"},
            "boolean": {"type": "boolean"}, "enum": {"enum": ENUM}, "date": {"type": "string", "format": "date"},
            "strings": {"type": "array", "items": {"type": "string"}}}[kind]


def _object(rng: random.Random, prefix: str, leaves: int, depth: int) -> tuple[dict[str, Any], int]:
    """An object of about ``leaves`` leaves (a nested sub-object taking a share of them) and its leaf count."""
    props: dict[str, Any] = {}
    used = 0
    i = 0
    while used < leaves:
        name = f"{prefix}{i}"
        i += 1
        if depth < 3 and leaves - used >= 4 and rng.random() < 0.2:
            sub, n = _object(rng, f"{name}_", rng.randint(2, min(8, leaves - used)), depth + 1)
            props[name] = sub
            used += n
        else:
            props[name] = _leaf(rng.choice(KINDS))
            used += 1
    required = [k for k in props if rng.random() < 0.3]
    return {"type": "object", "properties": props, **({"required": required} if required else {})}, used


def _record_type(rng: random.Random, prefix: str, child: bool) -> tuple[dict[str, Any], int]:
    props: dict[str, Any] = {"key": {"type": "string"}}
    props.update({f"{prefix}{i}": _leaf(rng.choice(("string", "integer", "number", "date"))) for i in range(3)})
    n = 4
    if child:
        inner, m = _record_type(rng, f"{prefix}c", False)
        props["rows"] = inner
        n += m
    return {"type": "array", "x-key": ["key"], "items": {"type": "object", "required": ["key"],
                                                         "properties": props}}, n


def wide_schema(leaves: int, seed: int, record_types: int = 0) -> dict[str, Any]:
    """A JSON Schema of about ``leaves`` leaves (exactly ``leaves`` counting record fields) from ``seed``."""
    rng = random.Random(seed)
    props: dict[str, Any] = {}
    used = 0
    for r in range(record_types):
        props[f"items{r}"], n = _record_type(rng, f"r{r}_", child=r == 0)
        used += n
    s = 0
    while used < leaves:
        left = leaves - used
        if left <= 3 or rng.random() < 0.15:
            props[f"top{s}"] = _leaf(rng.choice(KINDS))
            used += 1
        else:
            props[f"sec{s}"], n = _object(rng, f"s{s}_", min(left, rng.randint(4, 40)), 1)
            used += n
        s += 1
    required = [k for k in props if k.startswith("sec") and rng.random() < 0.5]
    return {"type": "object", "properties": props, "required": required}


def count_leaves(node: Any) -> int:
    """The leaves of a schema node (every scalar or list of texts, record fields included)."""
    if node.get("type") == "object":
        return sum(count_leaves(p) for p in node["properties"].values())
    if node.get("type") == "array" and node["items"].get("type") == "object":
        return count_leaves(node["items"])
    return 1


def long_text(rng: random.Random, chars: int = 190) -> str:
    """Free text near the grammar's 200-character bound: far longer than a group's size estimate."""
    words: list[str] = []
    while len(" ".join(words)) < chars - 12:
        words.append(rng.choice(WORDS))
    return " ".join(words)


def _value(rng: random.Random, node: dict[str, Any], long: float = 0.0) -> Any:
    if "enum" in node:
        return rng.choice(node["enum"])
    kind = node.get("type")
    if kind == "string" and node.get("format") == "date":
        return (dt.date(2000, 1, 1) + dt.timedelta(days=rng.randint(0, 9000))).isoformat()
    if long and kind == "string" and node.get("format") is None and rng.random() < long:
        return long_text(rng)
    return {"string": lambda: " ".join(rng.sample(WORDS, rng.randint(1, 2))), "integer": lambda: rng.randint(0, 99999),
            "number": lambda: rng.randint(0, 99999) / 4, "boolean": lambda: rng.random() < 0.5,
            "array": lambda: rng.sample(WORDS, rng.randint(1, 2))}[kind]()


def gold_for(schema: dict[str, Any], seed: int, fill: float = 0.8, long: float = 0.0) -> dict[str, Any]:
    """A gold object valid under ``schema``: required values always, optional ones with probability ``fill``,
    every record type with 1 to 3 records; a free-text document value is :func:`long_text` with probability
    ``long``."""
    rng = random.Random(seed)

    def obj(node: dict[str, Any], in_records: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, prop in node["properties"].items():
            is_records = prop.get("type") == "array" and prop["items"].get("type") == "object"
            if name not in node.get("required", ()) and not is_records and rng.random() > fill:
                continue  # record types always listed: the job writes [] for a type without records
            if prop.get("type") == "object":
                out[name] = obj(prop, in_records)
            elif prop.get("type") == "array" and prop["items"].get("type") == "object":
                keys = rng.sample(range(100), rng.randint(1, 3))
                out[name] = [{**obj(prop["items"], True), "key": f"K{k}"} for k in keys]
            else:
                out[name] = _value(rng, prop, 0.0 if in_records else long)
        return out

    return obj(schema)


def compact(value: Any) -> str:
    """JSON as a constrained decoder writes it (no spaces)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def statement(gold: dict[str, Any]) -> str:
    """A document stating the gold object, one sentence per top-level property."""
    return "\n".join(f"The {k} is {json.dumps(v, ensure_ascii=False)}." for k, v in gold.items())


QUESTION_LINE = re.compile(r"^( *)- (\S+) \(")


def asked_tree(prompt: str) -> dict[str, Any]:
    """The fields a final-answer prompt's question lists, as a tree (``{name: subtree}``, leaves ``{}``)."""
    question = prompt.split("Extract these fields from the document:\n", 1)[1]
    root: dict[str, Any] = {}
    stack = [(-1, root)]
    for line in question.splitlines():
        m = QUESTION_LINE.match(line)
        if not m:
            break
        depth = len(m.group(1)) // 2
        while stack[-1][0] >= depth:
            stack.pop()
        node: dict[str, Any] = {}
        stack[-1][1][m.group(2)] = node
        stack.append((depth, node))
    return root


def prune(gold: dict[str, Any], tree: dict[str, Any]) -> dict[str, Any]:
    """The part of ``gold`` the tree asks for (an object it holds, even when none of the asked values is)."""
    out: dict[str, Any] = {}
    for name, sub in tree.items():
        if name in gold:
            out[name] = prune(gold[name], sub) if sub and isinstance(gold[name], dict) else gold[name]
    return out


LIST_KEY = re.compile(r"^  - (\S+?)(?::|$)", re.MULTILINE)


def group_keys(prompt: str) -> list[str]:
    """The reply keys a group records call lists (after "The lists (reply key: what it holds):"), in order."""
    request = prompt.rsplit("\n\n", 1)[-1]
    keys: list[str] = []
    for part in request.split("The lists (reply key: what it holds):\n")[1:]:  # one part per family
        for line in part.splitlines():
            if not line.startswith("  - "):
                break
            keys.append(LIST_KEY.match(line).group(1))
    return keys


class WideReader:
    """A perfect reader of one gold object (``doc``: its document-level values; ``records``: per type)."""

    def __init__(self, doc: dict[str, Any], records: dict[str, list[dict[str, Any]]]):
        self.doc, self.records = doc, records
        self.final_calls = 0

    def reply(self, prompt: str) -> str:
        asked = re.search(r"Reply with a JSON array of the (\S+) records", prompt)
        if asked:
            return compact(self.records.get(asked.group(1), []))
        if "Reply with a JSON object of record lists" in prompt:  # a group of record types: each list's records
            return compact({key: self._records_of(key) for key in group_keys(prompt)})
        if "Reply with one JSON object" in prompt:
            self.final_calls += 1
            return compact(prune(self.doc, asked_tree(prompt)))
        return "The memory holds every value the document states."

    def _records_of(self, key: str) -> list[dict[str, Any]]:
        """The gold records of the type a group reply key names (its name, or its name's last segment)."""
        names = [n for n in self.records if n == key or n.rsplit(".", 1)[-1] == key]
        return self.records[names[0]] if names else []


def reader_config(schema: dict[str, Any], answer_tokens: int) -> Any:
    """The agent config the perfect-reader tests read a wide schema with: one chunk for the whole statement,
    budgets wide enough for any generated schema, the answer budget given."""
    from memagent.config import AgentConfig

    return AgentConfig(chunk_tokens=12000, memory_tokens=1500, answer_tokens=answer_tokens, query_tokens=6000,
                       extraction=schema)
