"""A perfect reader of generated ledgers (memagent_testing/oracle/ledger.py): what an ideal model replies to each call.

It knows the ground truth (every statement's span, every alias) and reads the prompt as a model
would: the passage between ``<section>`` and ``</section>``, the memory between ``<memory>`` and
``</memory>``. It shares no code with the reader under test (no grounding, merging or splitting):

- a **records call** gets every payment whose statement lies wholly inside the passage, in text
  order, the payer named as a company (a role resolved through the memory or the passage's own
  definitions); with ``invent`` it adds one record made of values stated only outside the passage
  (a payer, a date and an amount of three other statements), the way a weak model fabricates;
- a **memory update** keeps the aliases defined so far (one line each) and the unfinished last line
  of the passage (a definition cut by the chunk boundary), nothing else;
- a **final answer** is ``{}`` (the ledger schema has record types only).

The reply is the whole text an unconstrained perfect model writes; honouring the request's schema
(``maxItems``) and ``max_tokens`` is the server's job (:func:`constrain`, the engines' grammar).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from typing import Any, Iterable

from memagent_testing.oracle.ledger import Ledger

RECORDS_REQUEST = "Reply with a JSON array of the "
ALIAS_LINE = re.compile(r"^(the \w+) = (.+)$", re.MULTILINE)
DEFINITION = re.compile(r"([^\n.。]+?) \(hereinafter (the \w+)\)")
CUT_MARK = "Unfinished line: "


def between(text: str, head: str, tail: str) -> str | None:
    i = text.rfind(head)
    if i < 0:
        return None
    j = text.find(tail, i + len(head))
    return text[i + len(head): j] if j >= 0 else None


class LedgerOracle:
    """Replies of a perfect model to the calls a read of registered ledgers makes (module docstring)."""

    def __init__(self, ledgers: Iterable[Ledger], names: tuple[str, str, str] = ("payer", "date", "amount"),
                 invent: bool = False, seed: int = 0):
        self.ledgers = list(ledgers)
        self.names = names
        self.invent = invent
        self.rng = random.Random(seed)
        self.invented: list[dict[str, Any]] = []  # every fabricated record, for the test to look for

    def reply(self, prompt: str) -> str:
        if RECORDS_REQUEST in prompt:
            return json.dumps(self.records(prompt), ensure_ascii=False, separators=(",", ":"))  # as a grammar writes it
        if "Updated memory:" in prompt:
            return self.memory(prompt)
        return "{}"

    def _find(self, passage: str) -> tuple[Ledger, int] | None:
        for ledger in self.ledgers:
            at = ledger.text.find(passage)
            if at >= 0:
                return ledger, at
        return None

    def records(self, prompt: str) -> list[dict[str, Any]]:
        passage = between(prompt, "<section>\n", "\n</section>") or ""
        memory = between(prompt, "<memory>\n", "\n</memory>") or ""
        found = self._find(passage) if passage else None
        if found is None:
            return []
        ledger, at = found
        aliases = dict((role, company) for role, company in ALIAS_LINE.findall(memory))
        aliases.update({role: company.strip() for company, role in
                        DEFINITION.findall(self._cut(memory, ledger.text[:at]) + passage)})
        payer, date, amount = self.names
        out = []
        for s in sorted(ledger.statements, key=lambda s: s.start):
            if at <= s.start and s.end <= at + len(passage):
                name = s.payer if s.written_payer == s.payer else aliases.get(f"the {s.written_payer}",
                                                                               f"the {s.written_payer}")
                out.append({payer: name, date: s.date, amount: s.amount})
        if self.invent and len(ledger.statements) >= 3:
            fake = self._fabricate(ledger, at, at + len(passage))
            if fake is not None:
                out.insert(self.rng.randrange(len(out) + 1), fake)
        return out

    def _fabricate(self, ledger: Ledger, lo: int, hi: int) -> dict[str, Any] | None:
        """A record whose date and amount are stated only outside ``[lo, hi)`` (and not in the memory)."""
        outside = [s for s in ledger.statements if s.end <= lo or s.start >= hi]
        inside = {(s.date, s.amount) for s in ledger.statements if lo <= s.start < hi or lo < s.end <= hi}
        dates = {s.date for s in ledger.statements if lo < s.end and s.start < hi}
        amounts = {s.amount for s in ledger.statements if lo < s.end and s.start < hi}
        pool = [s for s in outside if s.date not in dates and s.amount not in amounts and (s.date, s.amount)
                not in inside]
        if len(pool) < 2:
            return None
        a, b = self.rng.sample(pool, 2)
        payer, date, amount = self.names
        fake = {payer: self.rng.choice(outside).payer, date: a.date, amount: b.amount}
        self.invented.append({"payer": fake[payer], "date": a.date, "amount": b.amount})
        return fake

    @staticmethod
    def _cut(memory: str, before: str) -> str:
        """The memory's unfinished line, when the passage goes on from it (else nothing to join)."""
        cut = next((line[len(CUT_MARK):] for line in memory.splitlines() if line.startswith(CUT_MARK)), "")
        return cut if cut and before.endswith(cut) else ""

    def memory(self, prompt: str) -> str:
        passage = between(prompt, "<section>\n", "\n</section>") or ""
        memory = between(prompt, "<memory>\n", "\n</memory>") or ""
        aliases = dict(ALIAS_LINE.findall(memory))
        found = self._find(passage) if passage else None
        text = (self._cut(memory, found[0].text[:found[1]]) if found else "") + passage
        aliases.update({role: company.strip() for company, role in DEFINITION.findall(text)})
        lines = [f"{role} = {company}" for role, company in aliases.items()]
        tail = text.rsplit("\n", 1)[-1] if not text.endswith("\n") else ""
        if tail:  # a line the boundary cut: the next passage finishes it
            lines.append(CUT_MARK + tail[-200:])
        return "\n".join(lines) or "No aliases yet."


def constrain(value: Any, schema: dict[str, Any]) -> Any:
    """``value`` as a decoder constrained by ``schema`` would end it: strings closed at ``maxLength``, arrays at
    ``maxItems`` (items and properties constrained in turn); the perfect model's values are otherwise valid."""
    if isinstance(value, str) and isinstance(schema.get("maxLength"), int):
        return value[: schema["maxLength"]]
    if isinstance(value, list) and schema.get("type") == "array":
        items = value[: schema["maxItems"]] if "maxItems" in schema else value
        return [constrain(v, schema.get("items") or {}) for v in items]
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        return {k: constrain(v, schema["properties"].get(k) or {}) for k, v in value.items()}
    return value


class ChainTaggingOracle:
    """The ledger oracle whose memory updates also name the chain they extend (``chain <sha256(prompt)[:8]>``):
    a trace mixed from two chains differs from the fault-free one. ``updates`` counts memory updates (chunks
    read, re-reads included); thread-safe, as a server's handlers are."""

    def __init__(self, oracle: LedgerOracle):
        self.oracle, self.updates, self.lock = oracle, 0, threading.Lock()

    def reply(self, prompt: str) -> str:
        text = self.oracle.reply(prompt)
        if RECORDS_REQUEST not in prompt and "Updated memory:" in prompt:
            with self.lock:
                self.updates += 1
            text += f"\nchain {hashlib.sha256(prompt.encode()).hexdigest()[:8]}"
        return text
