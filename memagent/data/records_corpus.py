"""A generated statement corpus for record extraction: payments planted among filler, deterministic from a seed.

Each document is a ledger narrative of about ``target_tokens`` tokens (estimated from characters:
``chars_per_token``; the reader reports the real count). Payment records (payer, date, amount,
optionally bank), keyed by ``(payer, date)`` (:data:`SCHEMA`, the same record type as
``memagent_testing/records_helpers.py``), are planted one sentence a line, with the cases that break
per-chunk tools:

- **alias**: a company introduced by name with a role (``Harlow Freight Ltd (hereinafter the
  Carrier) ...``) at the top of the document, and later payments stated by role only (``The Carrier
  paid 2210 on 2021-05-02.``); the gold payer is the full name;
- **amendment**: a payment stated, then at least ``gap_lines`` lines later corrected
  (``Amendment: the payment Harlow Freight Ltd made on 2021-05-02 is corrected to 2300.``); the
  gold amount is the corrected one;
- **triple**: the same payment stated three times, ``gap_lines`` apart (one record after merge);
- **near misses**: invoices, planned and disputed payments of the same shape (no record);
- **quiet stretches**: runs of filler with no records (``quiet_fraction`` of the regions).

:func:`statement` returns ``{"id", "text", "gold", "cases", "n_near_misses"}``; ``gold`` lists each
record once, with ``lines`` (the line numbers that state it) and ``kind``.
"""

from __future__ import annotations

import random
from typing import Any

SCHEMA: dict[str, Any] = {"type": "object", "properties": {
    "holder": {"type": "string", "description": "Who the statement is addressed to"},
    "payments": {"type": "array", "x-key": ["payer", "date"], "items": {"type": "object", "properties": {
        "payer": {"type": "string"}, "date": {"type": "string", "format": "date"}, "amount": {"type": "number"},
        "bank": {"type": "object", "properties": {"name": {"type": "string"}}}},
        "required": ["payer", "date"]}}}}

FIRST = ["Harlow", "Brent", "Calder", "Dunmore", "Elswick", "Fenwick", "Glenrock", "Hartley", "Ivers", "Jarrow",
         "Kestrel", "Langdon", "Marsden", "Norland", "Oakham", "Penrith", "Quarry", "Redmoor", "Selby", "Tamworth"]
SECOND = ["Freight", "Textiles", "Foods", "Metals", "Timber", "Print", "Marine", "Dairy", "Glass", "Tools"]
BANKS = ["Northbank", "Eastmere", "Westgate", "Coastal", "Unity", "Albion"]
ROLES = ["Supplier", "Carrier", "Lessee", "Agent"]
FILLER = [
    "The weather was mild that week and nothing else of note happened in the office.",
    "Staff moved the archive boxes from the second floor to the basement store.",
    "The quarterly review meeting was postponed because the chair was travelling.",
    "A new coffee machine was installed in the kitchen next to the meeting room.",
    "The auditors asked for copies of the lease and the insurance certificate.",
    "Several customers called to ask about the revised opening hours.",
    "The board noted the report and thanked the finance team for its work.",
    "Maintenance replaced two windows on the east side of the warehouse.",
    "The team discussed the move to the new accounting software at length.",
    "No complaints were received during the period covered by this section.",
    "The regional manager visited the depot and met the night shift.",
    "A fire drill took place on Tuesday morning and was completed in six minutes.",
    "The parking area was resurfaced over the bank holiday weekend.",
    "Minutes of the previous meeting were approved without amendment.",
    "The office closed early on Friday for the annual staff outing.",
    "Training on the new safety procedures continued for the warehouse staff.",
]
NEAR_MISS = [
    "{payer} was invoiced {amount} on {date}.",
    "{payer} expects to pay {amount} on {date}.",
    "{payer} disputed a charge of {amount} on {date}.",
    "{payer} asked for a quote of {amount} on {date}.",
]
REGION_LINES = 40  # a quiet stretch is a whole region of lines with no records


def company(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(SECOND)} Ltd"


def _date(rng: random.Random) -> str:
    return f"{rng.randint(2018, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def payment_sentence(payer: str, amount: int, date: str, bank: str | None = None, lead: str = "") -> str:
    return f"{lead}{payer} paid {amount} on {date}" + (f" via {bank}" if bank else "") + "."


class _Lines:
    """A statement's lines being planted: which are still free, drawn with the document's generator."""

    def __init__(self, rng: random.Random, n_lines: int, free: set[int]):
        self.rng, self.n_lines, self.free = rng, n_lines, free
        self.lines: list[str | None] = [None] * n_lines

    def take(self, lo: int = 4, hi: int | None = None) -> int | None:
        """A free active line in [lo, hi) (rejection sampling, then a scan), or None."""
        hi = self.n_lines if hi is None else min(hi, self.n_lines)
        lo = max(lo, 4)
        if lo >= hi:
            return None
        for _ in range(200):
            i = self.rng.randrange(lo, hi)
            if i in self.free:
                self.free.discard(i)
                return i
        cands = [i for i in range(lo, hi) if i in self.free]
        if not cands:
            return None
        i = self.rng.choice(cands)
        self.free.discard(i)
        return i


def _aliases(rng: random.Random, lines: _Lines, target_tokens: int) -> dict[str, str]:
    """Companies introduced in the first lines, by name with a role."""
    aliases: dict[str, str] = {}
    for k, role in enumerate(ROLES[: 2 if target_tokens < 20_000 else 4]):
        name = company(rng)
        while name in aliases.values():
            name = company(rng)
        aliases[role] = name
        lines.lines[k] = f"{name} (hereinafter the {role}) signed the framework agreement this year."
    return aliases


def _plant(rng: random.Random, lines: _Lines, kind: str, role: str | None, payer: str, date: str, amount: int,
           bank: str | None, gap_lines: int) -> tuple[str, list[int], int] | None:
    """Write one payment of ``kind`` (a plain or alias one falls back from a case that does not fit):
    ``(kind, the lines stating it, its final amount)``, or None when no line is free."""
    first = None
    if kind in ("amended", "triple"):
        first = lines.take(4, max(5, lines.n_lines - 2 * gap_lines)) if lines.n_lines > 3 * gap_lines else None
        if first is None:
            kind = "plain"
    if kind in ("plain", "alias"):
        i = lines.take()
        if i is None:
            return None
        lines.lines[i] = payment_sentence(f"The {role}" if role else payer, amount, date, bank)
        return kind, [i], amount
    assert first is not None
    if kind == "amended":
        second = lines.take(first + gap_lines)
        if second is None:
            lines.free.add(first)
            return kind, [], amount
        lines.lines[first] = payment_sentence(payer, amount, date, bank)
        amount = amount + rng.choice([-1, 1]) * rng.randint(1, 500)
        lines.lines[second] = f"Amendment: the payment {payer} made on {date} is corrected to {amount}."
        return kind, [first, second], amount
    second = lines.take(first + gap_lines, max(first + gap_lines + 1, lines.n_lines - gap_lines))
    third = lines.take(second + gap_lines) if second is not None else None
    if second is None or third is None:
        lines.free.update(i for i in (first, second) if i is not None)
        return kind, [], amount
    for i, lead in ((first, ""), (second, "As recorded earlier, "), (third, "For the avoidance of doubt, ")):
        lines.lines[i] = payment_sentence(payer, amount, date, bank, lead)
    return kind, [first, second, third], amount


def statement(doc_id: str, target_tokens: int, seed: int, *, records_per_1k: float = 3.0, chars_per_token: float = 4.6,
              gap_lines: int = 80, quiet_fraction: float = 0.3, near_miss_ratio: float = 0.5) -> dict[str, Any]:
    """One document: planted payments (alias, amendment, triple and plain cases), near misses, quiet stretches."""
    rng = random.Random(f"{seed}:{doc_id}")
    avg_line = sum(map(len, FILLER)) / len(FILLER) + 1
    n_lines = max(int(target_tokens * chars_per_token / avg_line), 12)
    n_regions = -(-n_lines // REGION_LINES)
    quiet = {r for r in range(1, n_regions) if rng.random() < quiet_fraction}  # region 0 holds the aliases
    if n_regions > 2 and not quiet:
        quiet.add(n_regions // 2)
    lines = _Lines(rng, n_lines, {i for i in range(4, n_lines) if i // REGION_LINES not in quiet})
    aliases = _aliases(rng, lines, target_tokens)
    keys: set[tuple[str, str]] = set()
    gold: list[dict[str, Any]] = []
    cases = {"plain": 0, "alias": 0, "amended": 0, "triple": 0}
    kinds = ["alias", "amended", "triple"] + ["plain"] * 7
    for r in range(max(int(target_tokens / 1000 * records_per_1k), 6)):
        kind = kinds[r % len(kinds)] if r < 3 else rng.choice(kinds)
        role = rng.choice(list(aliases)) if kind == "alias" else None
        payer = aliases[role] if role else company(rng)
        date = _date(rng)
        while (payer, date) in keys:
            date = _date(rng)
        amount = rng.randint(100, 99_999)
        bank = rng.choice(BANKS) if rng.random() < 0.5 else None
        planted = _plant(rng, lines, kind, role, payer, date, amount, bank, gap_lines)
        if planted is None:
            break
        kind, at, amount = planted
        if not at:
            continue
        keys.add((payer, date))
        rec: dict[str, Any] = {"payer": payer, "date": date, "amount": amount} | ({"bank": {"name": bank}} if bank else {})
        gold.append({**rec, "kind": kind, "lines": at})
        cases[kind] += 1
    n_near = int(len(gold) * near_miss_ratio)
    blank = [i for i in range(4, n_lines) if lines.lines[i] is None]
    for i in rng.sample(blank, min(n_near, len(blank))):
        payer = rng.choice(list(aliases.values())) if rng.random() < 0.3 else company(rng)
        lines.lines[i] = rng.choice(NEAR_MISS).format(payer=payer, amount=rng.randint(100, 99_999), date=_date(rng))
    text = "\n".join(line if line is not None else rng.choice(FILLER) for line in lines.lines)
    return {"id": doc_id, "text": text, "gold": gold, "cases": cases, "n_near_misses": min(n_near, len(blank)),
            "aliases": aliases, "n_lines": n_lines, "quiet_regions": len(quiet)}
