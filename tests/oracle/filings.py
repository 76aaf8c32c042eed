"""A perfect reader of generated filings (memagent/data/filings.py), as an engine: what an ideal model replies.

It knows each filing's ground truth (every line's char span and the records it states) and reads the prompt as
a model would (the passage between ``<section>`` and ``</section>``). It shares no code with the reader under
test (no grouping, grounding or merging):

- a **records call of one type** (``Reply with a JSON array of the T records``) gets that type's records of
  every line wholly inside the passage;
- a **group records call** gets one object: per list key the request names (after "The lists (reply key: what
  it holds):"), the records of that list, a key naming a type by its name or its name's last segment;
- a **memory update** writes a fixed line; a **final answer** is the gold ``meta``.

As a constrained server does, a reply longer than ``max_tokens`` (counted with the tokenizer) is cut there
(``finish_reason`` "length"). ``calls`` logs ``(kind, prompt_tokens)`` per call.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams
from tests.wide_schemas import group_keys

SINGLE = re.compile(r"Reply with a JSON array of the (\S+) records")


def _section(prompt: str) -> str:
    return prompt.split("<section>\n", 1)[1].rsplit("\n</section>", 1)[0] if "<section>\n" in prompt else ""


class FilingOracle(Engine):
    """The perfect reader of the registered filings (module docstring)."""

    def __init__(self, tokenizer: Any, docs: Iterable[dict[str, Any]], context_window: int = 8192):
        self.name, self.tokenizer, self.context_window, self.stats = "filing-oracle", tokenizer, context_window, \
            EngineStats()
        self.docs = list(docs)
        self.calls: list[tuple[str, int]] = []

    def _records(self, passage: str) -> list[dict[str, Any]]:
        for doc in self.docs:
            at = doc["text"].find(passage)
            if passage and at >= 0:
                return [r for s in doc["statements"] if at <= s["start"] and s["end"] <= at + len(passage)
                        for r in s["records"]]
        return []

    def _meta(self) -> dict[str, Any]:
        return self.docs[0]["gold"]["meta"] if self.docs else {}

    async def chat(self, messages: list[dict[str, str]], params: SamplingParams) -> Completion:
        prompt = messages[-1]["content"]
        n_prompt = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        found = self._records(_section(prompt))
        single = SINGLE.search(prompt)
        if single:
            kind, text = "records", json.dumps([r["record"] for r in found if r["type"] == single.group(1)])
        elif "Reply with a JSON object of record lists" in prompt:
            def of(key: str) -> list[dict[str, Any]]:
                return [r["record"] for r in found if r["type"] == key or r["type"].rsplit(".", 1)[-1] == key]
            kind, text = "records", json.dumps({key: of(key) for key in group_keys(prompt)})
        elif "Updated memory:" in prompt:
            kind, text = "memory", "The filing's figures are read per chunk."
        else:
            kind, text = "answer", json.dumps({"meta": self._meta()})
        self.calls.append((kind, n_prompt))
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > params.max_tokens:
            cut = self.tokenizer.decode(ids[: params.max_tokens])
            return Completion(text=cut, prompt_tokens=n_prompt, completion_tokens=params.max_tokens,
                              finish_reason="length")
        return Completion(text=text, prompt_tokens=n_prompt, completion_tokens=len(ids), finish_reason="stop")
