"""A ledger corpus for record extraction with the cases that break per-chunk readers, and its ground truth
(a test fixture: the perfect reader of memagent_testing/oracle/records_oracle.py reads it; its words are those of
:mod:`memagent.data.records_corpus`, the product's generator of statements).

Every payment a document states is a :class:`Statement`: the record it states (payer, date,
amount) and the char span of the sentence or line that states it. The ground truth is what a
perfect reader returns (:func:`gold`): one record per key (payer, date) with the amount the last
statement gives, and the other amounts stated for that key as its conflicts. Deterministic from a
seed; :class:`LedgerSpec` says which cases a document holds:

- **dense pages**: tables and bullet lists of many payments on consecutive lines (hundreds in one
  chunk at the paper's 5,000-token chunks);
- **prose** in several date and amount spellings (``March 14, 2021``, ``14.03.2021``, ``1,250.00``),
  amounts equal to a number of their own date (``paid 2021 on 2021-03-14``);
- **CJK** sentences (``東京物産株式会社は2021年3月14日に12500を支払った。``), no word boundaries;
- **aliases**: a company introduced with a role (``Harlow Freight Ltd (hereinafter the Carrier)``)
  and payments stated by role only; the record names the company;
- **conflicts**: one key stated again with another amount (an amendment, or a second payment the
  key cannot tell apart), near or far;
- **near misses**: invoices and planned payments of the same shape (no record), and filler.

Long lines and small chunks put statements across chunk boundaries. The schema is
:data:`SCHEMA` (a record type only, keyed by payer and date).
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field
from typing import Any

from memagent.data import records_corpus as corpus

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"payments": {
    "type": "array", "x-key": ["payer", "date"], "description": "Every payment stated, one record per payment",
    "items": {"type": "object", "required": ["payer", "date", "amount"], "properties": {
        "payer": {"type": "string", "description": "The company that paid (its name, not a role)"},
        "date": {"type": "string", "format": "date"},
        "amount": {"type": "number"}}}}}}

# The vocabulary of the product's statement generator (memagent.data.records_corpus), one source for both.
LATIN = corpus.FIRST
TRADES = corpus.SECOND
CJK = ["東京物産株式会社", "大阪精機株式会社", "名古屋製紙株式会社", "札幌海運株式会社", "福岡電機株式会社"]
ROLES = ["Carrier", "Supplier", "Lessee", "Agent", "Guarantor"]
FILLER = [*corpus.FILLER[:3], corpus.FILLER[13], "倉庫の棚卸しは予定どおり金曜日に終わった。"]
NEAR_MISS = corpus.NEAR_MISS[:2]  # invoiced, expects to pay
DATE_FORMS = ("iso", "long", "day_month", "dotted")
AMOUNT_FORMS = ("plain", "grouped", "decimals")


@dataclass(frozen=True)
class LedgerSpec:
    """Which cases one document holds (counts of lines of each form)."""

    prose: int = 10
    table_rows: int = 0  # consecutive table lines (a dense page)
    bullets: int = 0
    cjk: int = 0
    aliases: int = 0  # companies introduced with a role, each paying by role once or more
    by_role: int = 0  # payments stated by role
    conflicts: int = 0  # keys stated again with another amount
    near_misses: int = 2
    filler: int = 6
    long_lines: bool = False  # several statements on one line (a paragraph without line breaks)


@dataclass(frozen=True)
class Statement:
    """One payment as the text states it: the record (the payer named as a company even when the text
    says a role) and the span ``[start, end)`` of the sentence or line stating it."""

    payer: str
    date: str  # ISO
    amount: float
    start: int
    end: int
    written_payer: str  # as the text writes it: a role for an alias


@dataclass
class Ledger:
    """One generated document: its text, every payment statement, and the aliases it defines
    (``role phrase -> company`` and the span of each definition)."""

    id: str
    text: str
    statements: list[Statement] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)
    alias_spans: dict[str, tuple[int, int]] = field(default_factory=dict)


def gold(ledger: Ledger) -> dict[tuple[str, str], dict[str, Any]]:
    """What a perfect reader returns, by key (payer, date): the last statement's amount, the statements'
    spans, and the other amounts stated for the key (``conflicts``, in text order)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for s in sorted(ledger.statements, key=lambda s: s.start):
        rec = out.setdefault((s.payer, s.date), {"payer": s.payer, "date": s.date, "amount": s.amount,
                                                 "spans": [], "conflicts": []})
        if rec["spans"] and rec["amount"] != s.amount:
            rec["conflicts"].append(rec["amount"])
        rec["amount"] = s.amount
        rec["spans"].append((s.start, s.end))
    return out


def _date_text(d: dt.date, form: str) -> str:
    return {"iso": d.isoformat(), "long": f"{d:%B} {d.day}, {d.year}", "day_month": f"{d.day} {d:%B} {d.year}",
            "dotted": f"{d:%d.%m.%Y}"}[form]


def _amount_text(a: int, form: str) -> str:
    return {"plain": str(a), "grouped": f"{a:,}", "decimals": f"{a:,.2f}"}[form]


class _Writer:
    """Lines appended to the text, each statement's span recorded as it is written."""

    def __init__(self, rng: random.Random, doc_id: str):
        self.rng, self.ledger, self.parts, self.pos = rng, Ledger(doc_id, ""), [], 0
        self.used_dates: set[dt.date] = set()

    def new_date(self) -> dt.date:
        while True:
            d = dt.date(self.rng.randint(2015, 2024), self.rng.randint(1, 12), self.rng.randint(1, 28))
            if d not in self.used_dates:
                self.used_dates.add(d)
                return d

    def write(self, text: str, end_line: bool = True) -> tuple[int, int]:
        start = self.pos
        self.parts.append(text + ("\n" if end_line else " "))
        self.pos += len(self.parts[-1])
        return start, start + len(text)

    def state(self, template: str, payer: str, d: dt.date, amount: int, written: str | None = None,
              date_text: str | None = None, end_line: bool = True) -> None:
        written = written or payer
        text = template.format(payer=written, date=date_text or _date_text(d, self.rng.choice(DATE_FORMS)),
                               amount=_amount_text(amount, self.rng.choice(AMOUNT_FORMS)))
        start, end = self.write(text, end_line)
        self.ledger.statements.append(Statement(payer, d.isoformat(), float(amount), start, end, written))


def ledger(doc_id: str, spec: LedgerSpec, seed: int) -> Ledger:
    """One document of ``spec``'s cases, in a seeded random order (aliases defined before their use)."""
    rng = random.Random(seed)
    w = _Writer(rng, doc_id)
    companies = [f"{a} {b} Ltd" for a, b in zip(rng.sample(LATIN, 8), rng.sample(TRADES, 8))]
    roles = rng.sample(ROLES, min(spec.aliases, len(ROLES)))
    for role, company in zip(roles, companies):
        phrase = f"the {role}"
        w.ledger.alias_spans[phrase] = w.write(f"{company} (hereinafter {phrase}) signed the framework agreement.")
        w.ledger.aliases[phrase] = company
    events: list[str] = (["prose"] * spec.prose + ["cjk"] * spec.cjk + ["role"] * (spec.by_role if roles else 0)
                         + ["near"] * spec.near_misses + ["filler"] * spec.filler + ["conflict"] * spec.conflicts)
    rng.shuffle(events)
    dense = rng.randrange(len(events) + 1)  # where the dense page goes
    for i, kind in enumerate(events + ["end"]):
        if i == dense:
            _dense_page(w, spec, companies)
        if kind != "end":
            _event(w, kind, spec, companies, roles)
    if not w.parts:  # a document is never empty
        w.write(rng.choice(FILLER))
    w.ledger.text = "".join(w.parts)
    return w.ledger


def _dense_page(w: _Writer, spec: LedgerSpec, companies: list[str]) -> None:
    if (spec.table_rows or spec.bullets) and w.parts and not w.parts[-1].endswith("\n"):
        w.parts[-1] = w.parts[-1][:-1] + "\n"  # a page starts on a line of its own
    if spec.table_rows:
        w.write("| Date | Payer | Amount |")
        for _ in range(spec.table_rows):
            w.state("| {date} | {payer} | {amount} |", w.rng.choice(companies), w.new_date(), w.rng.randint(1, 99999))
    for _ in range(spec.bullets):
        w.state("- {payer}: {amount} on {date}", w.rng.choice(companies), w.new_date(), w.rng.randint(1, 99999))


def _event(w: _Writer, kind: str, spec: LedgerSpec, companies: list[str], roles: list[str]) -> None:
    rng = w.rng
    glue = not (spec.long_lines and rng.random() < 0.7)
    if kind == "prose":
        d = w.new_date()
        amount = rng.choice([d.year, d.day, rng.randint(1, 99999)])  # a number of its own date, at times
        w.state("{payer} paid {amount} on {date}.", rng.choice(companies), d, amount, end_line=glue)
    elif kind == "cjk":
        d = w.new_date()
        w.state("{payer}は{date}に{amount}を支払った。", rng.choice(CJK), d, rng.randint(100, 99999),
                date_text=f"{d.year}年{d.month}月{d.day}日", end_line=glue)
    elif kind == "role":
        role = rng.choice(roles)
        company = w.ledger.aliases[f"the {role}"]
        w.state("The {payer} paid {amount} on {date}.", company, w.new_date(), rng.randint(1, 99999),
                written=role, end_line=glue)
    elif kind == "conflict" and w.ledger.statements:
        s = rng.choice(w.ledger.statements)  # the key again: another amount, or (at times) the same restated
        d = dt.date.fromisoformat(s.date)
        amount = int(s.amount) + (0 if rng.random() < 0.25 else rng.randint(1, 500))
        if s.payer in CJK:
            w.state("{payer}は{date}に{amount}を支払った。", s.payer, d, amount,
                    date_text=f"{d.year}年{d.month}月{d.day}日", end_line=glue)
        else:
            template = "The {payer} paid {amount} on {date}." if s.written_payer != s.payer else \
                "{payer} paid {amount} on {date}."
            w.state(template, s.payer, d, amount, written=s.written_payer, end_line=glue)
    elif kind == "near":
        w.write(rng.choice(NEAR_MISS).format(payer=rng.choice(companies), amount=rng.randint(1, 99999),
                                             date=w.new_date().isoformat()), glue)
    elif kind == "filler":
        w.write(rng.choice(FILLER), glue)
