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
from memagent_testing.wide_schemas import group_keys

def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))  # as a grammar writes it


SINGLE = re.compile(r"Reply with a JSON array of the (\S+) records")


def _section(prompt: str) -> str:
    return prompt.split("<section>\n", 1)[1].rsplit("\n</section>", 1)[0] if "<section>\n" in prompt else ""


class FilingReader:
    """The perfect reader's replies to prompts (module docstring), as a scripted model's ``reply`` function too;
    ``calls`` logs each call's kind."""

    def __init__(self, docs: Iterable[dict[str, Any]]):
        self.docs = list(docs)
        self.calls: list[str] = []

    def _records(self, passage: str) -> list[dict[str, Any]]:
        for doc in self.docs:
            at = doc["text"].find(passage)
            if passage and at >= 0:
                return [r for s in doc["statements"] if at <= s["start"] and s["end"] <= at + len(passage)
                        for r in s["records"]]
        return []

    def reply(self, prompt: str) -> str:
        found = self._records(_section(prompt))
        single = SINGLE.search(prompt)
        if single:
            self.calls.append("records")
            return _compact([r["record"] for r in found if r["type"] == single.group(1)])
        if "Reply with a JSON object of record lists" in prompt:
            def of(key: str) -> list[dict[str, Any]]:
                return [r["record"] for r in found if r["type"] == key or r["type"].rsplit(".", 1)[-1] == key]
            self.calls.append("records")
            return _compact({key: of(key) for key in group_keys(prompt)})
        if "Updated memory:" in prompt:
            self.calls.append("memory")
            return "The filing's figures are read per chunk."
        self.calls.append("answer")
        return _compact({"meta": self.docs[0]["gold"]["meta"] if self.docs else {}})


class FilingOracle(Engine):
    """The perfect reader as an in-process engine: replies cut at ``max_tokens`` as a server's are; ``calls``
    logs ``(kind, prompt_tokens)``."""

    def __init__(self, tokenizer: Any, docs: Iterable[dict[str, Any]], context_window: int = 8192):
        self.name, self.tokenizer, self.context_window, self.stats = "filing-oracle", tokenizer, context_window, \
            EngineStats()
        self.reader = FilingReader(docs)
        self.calls: list[tuple[str, int]] = []

    async def chat(self, messages: list[dict[str, str]], params: SamplingParams) -> Completion:
        prompt = messages[-1]["content"]
        n_prompt = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        text = self.reader.reply(prompt)
        self.calls.append((self.reader.calls[-1], n_prompt))
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) > params.max_tokens:
            cut = self.tokenizer.decode(ids[: params.max_tokens])
            return Completion(text=cut, prompt_tokens=n_prompt, completion_tokens=params.max_tokens,
                              finish_reason="length")
        return Completion(text=text, prompt_tokens=n_prompt, completion_tokens=len(ids), finish_reason="stop")
