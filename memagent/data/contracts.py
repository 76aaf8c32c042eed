"""A generated contract corpus for extraction: typed fields planted among distractors (no downloads).

Each document is a services agreement of about ``target_tokens`` tokens: plausible boilerplate
clauses with the five fields of :data:`CONTRACT_SCHEMA` planted at seeded random depths. To
make reading matter, every field also has

- a **near miss**: a value of the same type elsewhere in the text for another purpose (the
  provider's name, the signing date, a late-payment fee, a notice period, the provider's state of
  incorporation);
- for some documents, an **amendment** later in the text that overrides the first value; the
  gold value is then the amended one.

Each row records the gold values (``gold``: JSON text), the char span of each gold value in the
text (``gold_spans``), and the near misses and superseded values (``distractors``), in the batch
input format (``id``, ``question``, ``context`` + those columns, which pass through a job):

    memagent synth contracts --out runs/contracts --docs 20 --min-tokens 1000 --max-tokens 4000

writes ``runs/contracts/contracts.parquet`` and the schema beside it (``contract.schema.json``,
also shipped as ``docs/schemas/contract.json``); the extraction flow writes the same corpus
(:class:`ContractCorpus`) when its input is empty.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import random
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, model_validator

TokenCounter = Callable[[str], int]

FIELDS = ("party", "effective_date", "amount", "term_months", "governing_law")
LAWS = ["New York", "Delaware", "California", "Texas", "England and Wales"]
CONTRACT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "party": {"type": "string", "description": "Company name of the Client (the customer), not the Provider"},
        "effective_date": {"type": "string", "format": "date",
                           "description": "Date the agreement takes effect (an amendment's date wins)"},
        "amount": {"type": "number", "description": "Total fee payable by the Client in USD (amended fee wins)"},
        "term_months": {"type": "integer", "description": "Initial term of the agreement in months"},
        "governing_law": {"type": "string", "enum": LAWS, "description": "Law that governs the agreement"},
    },
    "required": list(FIELDS),
}
# An answer budget that holds CONTRACT_SCHEMA's JSON object (about 79 tokens).
ANSWER_TOKENS = 96
QUESTION = "Extract the contract's fields: the client, effective date, total fee, term in months and governing law."
AMEND_PROBABILITY = 0.4  # share of documents with an amendment (one or two fields overridden)

_SYLLABLES = ["har", "low", "ven", "tor", "mar", "bel", "dun", "kes", "ash", "brin", "cal", "dor", "fen", "gal",
              "lin", "mor", "nor", "pel", "quin", "ros", "sel", "tam", "vel", "wyn"]
_TRADES = ["Freight", "Analytics", "Logistics", "Foods", "Robotics", "Textiles", "Energy", "Media", "Pharma",
           "Systems", "Metals", "Shipping", "Software", "Ceramics"]
_SUFFIXES = ["Ltd", "LLC", "Inc", "GmbH", "Corp", "PLC"]

# Boilerplate without digits, so a planted number or date is the only one of its kind in the text.
_SUBJECTS = ["Each party", "The Provider", "The Client", "Each affiliate", "Either party", "The receiving party",
             "Any subcontractor", "The disclosing party"]
_VERBS = ["shall keep confidential", "shall promptly notify the other party of", "may not assign",
          "shall use reasonable efforts to protect", "shall maintain accurate records of",
          "shall comply with all applicable laws regarding", "shall not disclose", "may audit",
          "shall indemnify the other party against claims arising from", "shall cooperate in good faith on"]
_OBJECTS = ["its Confidential Information", "the Services", "any Deliverables", "all personal data processed",
            "the intellectual property of the other party", "its obligations under this Agreement",
            "the work product", "any third-party materials", "the security of the systems used",
            "the invoices and supporting documents"]
_TAILS = ["without the prior written consent of the other party", "in accordance with this Agreement",
          "to the extent permitted by law", "during and after the term of this Agreement",
          "as set out in the applicable Statement of Work", "with the standard of care of a prudent operator",
          "unless required by a court or regulator", "at its own cost and expense"]
_STANDALONE = [
    "Headings are for convenience only and do not affect interpretation.",
    "This Agreement constitutes the entire agreement between the parties on its subject matter.",
    "No waiver of any breach shall be deemed a waiver of any other breach.",
    "If any provision is held invalid, the remaining provisions remain in full force and effect.",
    "Notices shall be given in writing and delivered by hand, courier or email.",
    "Nothing in this Agreement creates a partnership, agency or joint venture between the parties.",
    "Neither party is liable for delay caused by events beyond its reasonable control.",
    "Amendments are valid only if made in writing and signed by both parties.",
    "The Provider shall perform the Services with due skill, care and diligence.",
    "The Client shall provide timely access to the premises, systems and personnel reasonably required.",
    "Words in the singular include the plural and the other way round.",
    "The recitals form part of this Agreement.",
]
_HEADINGS = ["Definitions", "Services", "Fees and Payment", "Confidentiality", "Data Protection",
             "Intellectual Property", "Warranties", "Liability", "Termination", "General", "Notices",
             "Insurance", "Subcontracting", "Audit"]


def _company(rng: random.Random) -> str:
    name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice([2, 3]))).capitalize()
    return f"{name} {rng.choice(_TRADES)} {rng.choice(_SUFFIXES)}"


def _date(rng: random.Random) -> str:
    return (dt.date(2019, 1, 1) + dt.timedelta(days=rng.randrange(7 * 365))).isoformat()


def _clause(rng: random.Random) -> str:
    if rng.random() < 0.25:
        return rng.choice(_STANDALONE)
    return f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}."


def _values(rng: random.Random, provider: str) -> dict[str, Any]:
    party = _company(rng)
    while party.split()[0] == provider.split()[0]:
        party = _company(rng)
    return {"party": party, "effective_date": _date(rng), "amount": rng.randrange(5_000, 950_000, 50),
            "term_months": rng.choice([6, 9, 15, 18, 24, 30, 36, 42, 48, 60]), "governing_law": rng.choice(LAWS)}


def _text(field: str, value: Any) -> str:
    """The value as written in the document (JSON's rendering: dates ISO, numbers plain digits)."""
    return str(value)


# Sentences with one "{v}" slot for the value; the rest of each sentence names its purpose.
_PLANT = {
    "party": "This Services Agreement is made between {provider} (the \"Provider\") and {v} (the \"Client\").",
    "effective_date": "This Agreement takes effect on {v} (the \"Effective Date\").",
    "amount": "In consideration of the Services, the Client shall pay the Provider a total fee of USD {v}.",
    "term_months": "The initial term of this Agreement is {v} months from the Effective Date.",
    "governing_law": "This Agreement is governed by and construed in accordance with the laws of {v}.",
}
_NEAR_MISS = {
    "party": "{v} acts as the Provider's subcontractor for hosting and is not a party to this Agreement.",
    "effective_date": "The parties signed this document on {v}, before the Effective Date.",
    "amount": "Late payments bear an administrative charge of USD {v} per overdue invoice.",
    "term_months": "Either party may end this Agreement for convenience on {v} months' written notice.",
    "governing_law": "The Provider is a company incorporated under the laws of {v}.",
}
_AMEND = {
    "party": "Amendment: with the consent of the Provider, the Agreement is assigned and the Client is now {v}.",
    "effective_date": "Amendment: the parties agree that the Effective Date is changed to {v}.",
    "amount": "Amendment: the total fee payable by the Client is revised to USD {v}.",
    "term_months": "Amendment: the initial term of this Agreement is extended to {v} months.",
    "governing_law": "Amendment: from now on this Agreement is governed by the laws of {v}.",
}


def _near_miss_value(rng: random.Random, field: str, gold: dict[str, Any], provider: str) -> Any:
    if field == "party":
        return _company(rng)
    if field == "effective_date":
        return _date(rng)
    if field == "amount":
        return rng.randrange(100, 4_900, 10)
    if field == "term_months":
        return rng.choice([1, 2, 3, 4])
    return rng.choice([law for law in LAWS if law != gold["governing_law"]])


def _amended_value(rng: random.Random, field: str, first: Any) -> Any:
    while True:
        v = _values(rng, "Zz")[field]
        if v != first:
            return v


def _sentences_to_text(parts: list[tuple[str, str | None]]) -> tuple[str, dict[int, int]]:
    """Join sentences (paragraph break before a heading); the char start of each sentence by index."""
    out, starts, at = [], {}, 0
    for i, (sentence, kind) in enumerate(parts):
        sep = "" if i == 0 or parts[i - 1][1] == "heading" else ("\n\n" if kind == "heading" else " ")
        if kind == "heading":
            sentence += "\n"
        at += len(sep)
        starts[i] = at
        out.append(sep + sentence)
        at += len(sentence)
    return "".join(out), starts


def contract_row(idx: int, target_tokens: int, seed: int = 0, count: TokenCounter | None = None,
                 amend: bool | None = None) -> dict[str, Any]:
    """One contract of at most ``target_tokens`` tokens (as ``count`` measures; default ~1.3 per word).

    ``amend`` forces an amendment (True), none (False) or draws one with :data:`AMEND_PROBABILITY`.
    """
    count = count or (lambda text: int(len(text.split()) * 1.3))
    rng = random.Random(f"contract-{seed}-{idx}")
    provider, first, gold, near, amended = _draw_values(rng, idx, amend)
    planted = _plant(rng, provider, first, gold, near, amended)
    filler_seed = f"contract-filler-{seed}-{idx}"
    n_filler = _most_filler(lambda n: count(_assemble(planted, n, filler_seed)[0]), target_tokens)
    context, spans = _assemble(planted, n_filler, filler_seed)
    for f in FIELDS:  # the planted text is the only one of its kind (filler has no digits or names)
        if context.count(_text(f, gold[f])) != 1:  # pragma: no cover - a generator bug
            raise AssertionError(f"contract {idx}: gold {f} {gold[f]!r} occurs {context.count(_text(f, gold[f]))} times")
    gold_spans = [{k: s[k] for k in ("field", "char_start", "char_end")} for s in spans if s["role"] == "gold"]
    distractors = [{"field": s["field"], "kind": s["role"], "value": json.dumps(s["value"]),
                    "char_start": s["char_start"], "char_end": s["char_end"]} for s in spans if s["role"] != "gold"]
    return {
        "id": f"contract-{idx:04d}",
        "kind": "contract",
        "target_tokens": target_tokens,
        "question": QUESTION,
        "context": context,
        "gold": json.dumps(gold),
        "gold_spans": sorted(gold_spans, key=lambda s: FIELDS.index(s["field"])),
        "amended": amended,
        "distractors": distractors,
    }


Planted = list[tuple[float, str, str, Any, str]]  # depth (0..1), role, field, value, sentence


def _draw_values(rng: random.Random, idx: int, amend: bool | None) -> tuple[str, dict, dict, dict, list[str]]:
    """``(provider, first values, gold values, near misses, amended fields)``, redrawn until every
    planted value's text occurs exactly once (a text search then finds each gold value's one span)."""
    for _ in range(100):
        provider = _company(rng)
        gold = _values(rng, provider)
        first = dict(gold)
        amended = []
        if amend or (amend is None and rng.random() < AMEND_PROBABILITY):
            amended = sorted(rng.sample(FIELDS, rng.choice([1, 2])), key=FIELDS.index)
            for f in amended:
                gold[f] = _amended_value(rng, f, first[f])
        near = {f: _near_miss_value(rng, f, gold, provider) for f in FIELDS}
        others = [_text(f, v) for f, v in [*near.items(), *((f, first[f]) for f in amended)]] + [provider]
        golds = [_text(f, v) for f, v in gold.items()]
        if all(sum(t.count(g) for t in golds + others) == 1 for g in golds) and \
                all(near[f] != gold[f] and near[f] != first[f] for f in FIELDS):
            return provider, first, gold, near, amended
    raise RuntimeError(f"contract {idx}: could not draw distinct values")  # pragma: no cover - vanishingly unlikely


def _plant(rng: random.Random, provider: str, first: dict, gold: dict, near: dict, amended: list[str]) -> Planted:
    """Planted sentences at random depths, sorted; an amendment always comes after the value it overrides."""
    planted: Planted = []
    for f in FIELDS:
        d = rng.uniform(0.02, 0.6 if f in amended else 0.95)
        planted.append((d, "gold" if f not in amended else "superseded", f, first[f],
                        _PLANT[f].format(v=_text(f, first[f]), provider=provider)))
        if f in amended:
            planted.append((rng.uniform(d + 0.15, 0.98), "gold", f, gold[f], _AMEND[f].format(v=_text(f, gold[f]))))
        planted.append((rng.uniform(0.02, 0.98), "near_miss", f, near[f], _NEAR_MISS[f].format(v=_text(f, near[f]))))
    return sorted(planted, key=lambda p: p[0])


def _assemble(planted: Planted, n_filler: int, filler_seed: str) -> tuple[str, list[dict[str, Any]]]:
    """The contract's text with ``n_filler`` boilerplate clauses around the planted sentences, and the
    char span of each planted value."""
    filler_rng = random.Random(filler_seed)
    filler: list[tuple[str, str | None]] = [("SERVICES AGREEMENT", "heading")]
    headings = iter(filler_rng.sample(_HEADINGS, len(_HEADINGS)))
    for k in range(n_filler):
        if k % 9 == 8:
            filler.append((f"{next(headings, 'Miscellaneous')}.", "heading"))
        filler.append((_clause(filler_rng), None))
    parts, spans, p = [], [], 0
    for j in range(len(filler) + 1):  # planted sentences go before filler sentence j
        while p < len(planted) and (planted[p][0] * len(filler) <= j or j == len(filler)):
            parts.append((planted[p][4], f"p{p}"))
            p += 1
        if j < len(filler):
            parts.append(filler[j])
    text, starts = _sentences_to_text(parts)
    for i, (sentence, kind) in enumerate(parts):
        if kind and kind.startswith("p"):
            _, role, f, v, _ = planted[int(kind[1:])]
            at = starts[i] + sentence.index(_text(f, v))
            spans.append({"field": f, "role": role, "value": v, "char_start": at, "char_end": at + len(_text(f, v))})
    return text, spans


def _most_filler(tokens_with: Callable[[int], int], target_tokens: int) -> int:
    """The most filler clauses that keep the text within ``target_tokens``: grow an upper bound, then bisect."""
    lo, hi = 0, max(8, target_tokens // 4)
    while tokens_with(hi) <= target_tokens:
        lo, hi = hi, hi * 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if tokens_with(mid) <= target_tokens:
            lo = mid
        else:
            hi = mid - 1
    return lo


def draw_lengths(n: int, min_tokens: int, max_tokens: int, seed: int = 0) -> list[int]:
    """``n`` document lengths, log-uniform in ``[min_tokens, max_tokens]`` (as many short as long ones per octave)."""
    if not 0 < min_tokens <= max_tokens:
        raise ValueError(f"need 0 < min_tokens <= max_tokens, got {min_tokens} and {max_tokens}")
    rng = random.Random(f"contract-lengths-{seed}")
    return [round(math.exp(rng.uniform(math.log(min_tokens), math.log(max_tokens)))) for _ in range(n)]


class ContractCorpus(BaseModel):
    """A generated contract corpus: how many contracts, how long, which seed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    docs: int = Field(6, gt=0, description="Contracts to generate.")
    min_tokens: int = Field(600, gt=0, description="Shortest contract, in the reading model's tokens.")
    max_tokens: int = Field(1500, gt=0, description="Longest contract, in the reading model's tokens "
                            "(lengths are log-uniform between the two).")
    seed: int = Field(0, description="Seed of the values, depths and lengths: the corpus is a function of it.")

    @model_validator(mode="after")
    def _lengths(self) -> ContractCorpus:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens} is over max_tokens={self.max_tokens}")
        return self


def contract_corpus(corpus: ContractCorpus, count: TokenCounter | None = None) -> list[dict[str, Any]]:
    """``corpus.docs`` contracts with lengths drawn by :func:`draw_lengths`."""
    lengths = draw_lengths(corpus.docs, corpus.min_tokens, corpus.max_tokens, corpus.seed)
    return [contract_row(i, t, corpus.seed, count) for i, t in enumerate(lengths)]


def write_contracts(directory: str | Path, corpus: ContractCorpus, model: str | None = None) -> tuple[Path, Path]:
    """Write ``directory/contracts.parquet`` (sized in ``model``'s tokens, default the packaged one) and
    ``directory/contract.schema.json``; returns both paths."""
    import functools

    import pyarrow as pa
    import pyarrow.parquet as pq

    from memagent.data.hotpotqa import count_tokens
    from memagent.models import DEFAULT_MODEL, load_tokenizer

    count = functools.partial(count_tokens, load_tokenizer(model or DEFAULT_MODEL))
    rows = contract_corpus(corpus, count)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / ".contracts.parquet.tmp"  # readers skip dot files: the file appears whole
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(out / "contracts.parquet")
    schema = out / "contract.schema.json"
    schema.write_text(json.dumps(CONTRACT_SCHEMA, indent=2) + "\n")
    return out / "contracts.parquet", schema
