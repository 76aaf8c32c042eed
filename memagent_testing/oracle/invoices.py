"""Records assembled across chunks: invoices issued in one place and settled chunks later (or the other
way round), and a perfect reader that carries the half it has seen in its memory.

:func:`invoices` writes a document of :class:`Invoice` s, each stated in two sentences (its issue: date
and amount; its settlement: date and amount paid) some filler lines apart, in either order, several
invoices interleaved; ``open`` invoices are issued and never settled (no record: it lacks required
values); an optional summary table at the end restates every settled invoice on one line (a restating
table: it must merge, never double or conflict). Numbers and dates are written by the ``spell``
functions (``tests/spellings.py``'s strategies in tests; a seeded choice of spellings by default).

:class:`MemoryOracle` is what an ideal model replies to each call of a read of such documents (it knows
the ground truth and reads the prompt as a model would, sharing no code with the reader under test):

- a **memory update** keeps one line per half-seen invoice (``INV-0042: issued 2021-03-14 amount
  1037.50``), the values written canonically or (``copy``) as the text spells them, drops an invoice
  once both halves are seen, and keeps the passage's unfinished last line (``Unfinished line: ...``);
- a **records call** gets, for every invoice with a sentence wholly inside the passage or finishing there
  the memory's unfinished line (in text order),
  one record with every value the passage and the memory give (the memory's half included: it emits
  records complete); with ``partial`` it also emits an invoice whose other half it has not seen (key and
  the passage's values), else it waits for the other half; with ``invent`` it adds a record of an invoice
  number the document never states, with values stated outside the passage;
- anything else gets ``{}`` (the schema has a record type only).

The reply is the unconstrained text; the servers (:mod:`memagent_testing.oracle.servers`) and the hf grammar cut it
at the request's ``maxItems`` and ``max_tokens``. Keys are written in the schema's order (a grammar's).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from memagent_testing.oracle.records_oracle import CUT_MARK, RECORDS_REQUEST, between

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"invoices": {
    "type": "array", "x-key": ["invoice"], "description": "Every invoice issued and settled, one record each",
    "items": {"type": "object", "required": ["invoice", "issued", "amount", "settled", "paid"], "properties": {
        "invoice": {"type": "string", "description": "The invoice number (INV-...)"},
        "issued": {"type": "string", "format": "date", "description": "When it was issued"},
        "amount": {"type": "number", "description": "The amount invoiced"},
        "settled": {"type": "string", "format": "date", "description": "When it was settled"},
        "paid": {"type": "number", "description": "The amount paid to settle it"}}}}}}
ISSUE, SETTLE = ("issued", "amount"), ("settled", "paid")  # the fields each sentence states
FILLER = ["The archive boxes were moved to the basement store.", "Nothing else of note happened in the office.",
          "The quarterly review meeting was postponed.", "Minutes of the previous meeting were approved.",
          "Staff training resumed after the holidays.", "The auditors asked for the filing plan."]
MEMORY_LINE = re.compile(r"^(INV-\d+): (issued|settled) ", re.MULTILINE)

Spelled = Any  # has .text, .start, .end (tests.spellings.Written)
Spell = Callable[[Any], Spelled]


@dataclass(frozen=True)
class Written:
    text: str
    start: int
    end: int


@dataclass
class Invoice:
    """One invoice: its values (dates ISO), the spans of the sentences stating each half (and its table
    row), and each value as the text spells it."""

    invoice: str
    issued: str
    amount: float
    settled: str | None  # None: open (never settled)
    paid: float | None
    spans: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: {"issue": [], "settle": [], "row": []})
    spelled: dict[str, str] = field(default_factory=dict)

    def values(self, halves: Iterable[str]) -> dict[str, Any]:
        """The record as a model writes it (keys in the schema's order) from the halves it knows."""
        names = {"invoice", *(f for h in halves for f in (ISSUE if h == "issue" else SETTLE))}
        return {k: getattr(self, k) for k in ("invoice", *ISSUE, *SETTLE) if k in names}


@dataclass
class InvoiceDoc:
    id: str
    text: str
    invoices: list[Invoice]

    def sentences(self) -> list[tuple[int, int, Invoice, tuple[str, ...]]]:
        """``(start, end, invoice, halves)`` of every sentence or row stating an invoice, in text order."""
        out = [(s, e, inv, ("issue", "settle") if kind == "row" else (kind,))
               for inv in self.invoices for kind, spans in inv.spans.items() for s, e in spans]
        return sorted(out, key=lambda t: t[0])


def gold(doc: InvoiceDoc) -> dict[str, dict[str, Any]]:
    """The records a perfect read writes: every settled invoice, whole; open ones never (incomplete)."""
    return {i.invoice: i.values(("issue", "settle")) for i in doc.invoices if i.settled is not None}


def allowed_spans(inv: Invoice, path: str) -> list[tuple[int, int]]:
    """The sentences that state ``path``'s value of ``inv``: its half's sentences and its table row."""
    half = "issue" if path in ISSUE else "settle" if path in SETTLE else None
    own = [*inv.spans["issue"], *inv.spans["settle"]] if half is None else inv.spans[half]
    return [*own, *inv.spans["row"]]


def _default_spell(rng: random.Random) -> tuple[Spell, Spell]:
    def number(v: float) -> Written:
        text = rng.choice([f"{v:,.2f}", f"{v:.2f}", f"{v:,.2f}".replace(",", " "),
                           f"{v:,.2f}".replace(",", "#").replace(".", ",").replace("#", ".")])
        code = rng.choice(["", "EUR ", "$"])
        return Written(code + text, len(code), len(code) + len(text))

    def date(d: dt.date) -> Written:
        text = rng.choice([d.isoformat(), f"{d.day} {d:%B} {d.year}", f"{d:%B} {d.day}, {d.year}", f"{d:%d.%m.%Y}"])
        return Written(text, 0, len(text))
    return number, date


@dataclass(frozen=True)
class InvoiceSpec:
    """``gaps[i]``: filler lines between invoice i's two sentences; ``settled_first[i]``: its settlement comes
    first; ``stagger``: filler lines between consecutive invoices' first sentences; ``open``: invoices never
    settled; ``table``: a summary table restating every settled invoice at the end."""

    gaps: tuple[int, ...] = (1, 4)
    settled_first: tuple[bool, ...] = (False, True)
    stagger: int = 1
    open: int = 0
    table: bool = True


def _new_values(rng: random.Random, used: set[dt.date]) -> tuple[dt.date, float]:
    while True:  # unique dates, days past 12 (no day/month reading of one date is another's)
        d = dt.date(rng.randint(2015, 2024), rng.randint(1, 12), rng.randint(13, 28))
        if d not in used:
            used.add(d)
            return d, rng.randint(10_000, 10**8) / 100


def invoices(doc_id: str, spec: InvoiceSpec, seed: int, spell_number: Spell | None = None,
             spell_date: Spell | None = None) -> InvoiceDoc:
    """A document of ``spec``'s invoices (module docstring), deterministic from ``seed`` and the spellers."""
    rng = random.Random(seed)
    default_number, default_date = _default_spell(rng)
    spell_number, spell_date = spell_number or default_number, spell_date or default_date
    used: set[dt.date] = set()
    numbers = rng.sample(range(1, 9999), len(spec.gaps) + spec.open)
    invs, events = [], {}
    for i, n in enumerate(numbers):
        (d1, a1), (d2, a2) = _new_values(rng, used), _new_values(rng, used)
        d1, d2 = min(d1, d2), max(d1, d2)
        settled = i < len(spec.gaps)
        inv = Invoice(f"INV-{n:04d}", d1.isoformat(), a1, d2.isoformat() if settled else None, a2 if settled else None)
        invs.append(inv)
        first = i * spec.stagger
        if not settled:
            events.setdefault(first, []).append((inv, "issue"))
            continue
        second = first + spec.gaps[i] + 1
        order = ("settle", "issue") if spec.settled_first[i % len(spec.settled_first)] else ("issue", "settle")
        events.setdefault(first, []).append((inv, order[0]))
        events.setdefault(second, []).append((inv, order[1]))
    parts: list[str] = []
    pos = 0

    def write(line: str) -> int:
        nonlocal pos
        start = pos
        parts.append(line + "\n")
        pos += len(line) + 1
        return start

    def spelled(inv: Invoice, name: str) -> str:
        value = getattr(inv, name)
        w = spell_date(dt.date.fromisoformat(value)) if name in ("issued", "settled") else spell_number(value)
        inv.spelled.setdefault(name, w.text)
        return w.text

    for slot in range(max(events, default=-1) + 1):
        for inv, kind in events.get(slot, []):
            if kind == "issue":
                line = f"Invoice {inv.invoice} was issued on {spelled(inv, 'issued')} for {spelled(inv, 'amount')}."
            else:
                line = (f"Invoice {inv.invoice} was settled on {spelled(inv, 'settled')} with a payment of "
                        f"{spelled(inv, 'paid')}.")
            start = write(line)
            inv.spans[kind].append((start, start + len(line)))
        write(rng.choice(FILLER))
    if spec.table:
        write("Summary of settled invoices:")
        write("| Invoice | Issued | Amount | Settled | Paid |")
        for inv in (i for i in invs if i.settled is not None):
            cells = [inv.invoice, *(spelled(inv, k) for k in ("issued", "amount", "settled", "paid"))]
            line = "| " + " | ".join(cells) + " |"
            start = write(line)
            inv.spans["row"].append((start, start + len(line)))
    return InvoiceDoc(doc_id, "".join(parts), invs)


class MemoryOracle:
    """Replies of a perfect memory-keeping model to a read of registered invoice documents (module docstring)."""

    def __init__(self, docs: Iterable[InvoiceDoc], partial: bool = False, copy: bool = False,
                 invent: bool = False, seed: int = 0):
        self.docs, self.partial, self.copy, self.invent = list(docs), partial, copy, invent
        self.rng = random.Random(seed)
        self.invented: list[str] = []  # invoice numbers fabricated

    def reply(self, prompt: str) -> str:
        if RECORDS_REQUEST in prompt:
            return json.dumps(self.records(prompt), ensure_ascii=False, separators=(",", ":"))
        if "Updated memory:" in prompt:
            return self.memory(prompt)
        return "{}"

    def _read(self, prompt: str) -> tuple[InvoiceDoc, int, str, dict[str, set[str]]] | None:
        """The document and offset of the prompt's passage, its text with the memory's unfinished line
        joined before it, and the halves the memory holds per invoice."""
        passage = between(prompt, "<section>\n", "\n</section>") or ""
        memory = between(prompt, "<memory>\n", "\n</memory>") or ""
        doc = next((d for d in self.docs if passage and passage in d.text), None)
        if doc is None:
            return None
        at = doc.text.find(passage)
        cut = next((ln[len(CUT_MARK):] for ln in memory.splitlines() if ln.startswith(CUT_MARK)), "")
        j = doc.text.rfind(cut, max(0, at - len(cut) - 8), at) if cut else -1
        # The prompt may drop the whitespace at a chunk's edge: the cut line ends where the passage starts.
        cut = doc.text[j:at] if j >= 0 and not doc.text[j + len(cut):at].strip() else ""
        held: dict[str, set[str]] = {}
        for number, verb in MEMORY_LINE.findall(memory):
            held.setdefault(number, set()).add("issue" if verb == "issued" else "settle")
        return doc, at - len(cut), cut + passage, held

    def records(self, prompt: str) -> list[dict[str, Any]]:
        read = self._read(prompt)
        if read is None:
            return []
        doc, at, text, held = read
        start = at + len(text) - len(between(prompt, "<section>\n", "\n</section>") or "")  # the passage's own
        known = {k: set(v) for k, v in held.items()}
        order: list[Any] = []
        for s, e, inv, halves in doc.sentences():
            if at <= s and e <= at + len(text):  # a sentence the memory's unfinished line starts is finished here
                known.setdefault(inv.invoice, set()).update(halves)
                if e > start and inv not in order:  # the reader leaves it to the call before when that one read it
                    order.append(inv)
        out = [inv.values(sorted(known[inv.invoice])) for inv in order
               if self.partial or known[inv.invoice] == {"issue", "settle"}]
        if self.invent and len(doc.invoices) >= 2:
            outside = [i for i in doc.invoices if i not in order and i.settled is not None]
            if outside:
                a, b = self.rng.choice(outside), self.rng.choice(outside)
                fake = {"invoice": f"INV-{self.rng.randint(10_000, 99_999)}", "issued": a.issued,
                        "amount": a.amount, "settled": b.settled, "paid": b.paid}
                self.invented.append(fake["invoice"])
                out.insert(self.rng.randrange(len(out) + 1), fake)
        return out

    def memory(self, prompt: str) -> str:
        read = self._read(prompt)
        if read is None:
            return "No invoices pending."
        doc, at, text, held = read
        seen = {k: set(v) for k, v in held.items()}
        for s, e, inv, halves in doc.sentences():
            if at <= s and e <= at + len(text):
                seen.setdefault(inv.invoice, set()).update(halves)
        by_number = {i.invoice: i for i in doc.invoices}
        lines = [self._line(by_number[n], half) for n, halves in seen.items() if halves != {"issue", "settle"}
                 for half in sorted(halves)]
        tail = text.rsplit("\n", 1)[-1] if not text.endswith("\n") else ""
        if tail:  # a line the boundary cut: the next passage finishes it
            lines.append(CUT_MARK + tail[-200:])
        return "\n".join(lines) or "No invoices pending."

    def _line(self, inv: Invoice, half: str) -> str:
        a, b = ISSUE if half == "issue" else SETTLE
        va, vb = getattr(inv, a), getattr(inv, b)
        if self.copy:
            va, vb = inv.spelled[a], inv.spelled[b]
        else:
            vb = f"{vb:.2f}"
        return f"{inv.invoice}: {a} {va} {b} {vb}"
