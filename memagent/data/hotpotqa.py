"""HotpotQA long-context synthesis: a question's own paragraphs hidden among distractor documents.

As in MemAgent's data pipeline, every paragraph of a split becomes a document ``"{title}\\n{sentences joined}"``;
the split's documents are deduplicated and sorted into a pool. A sample holds the question's
own paragraphs (gold first, so they survive any size) plus distractors drawn from the pool,
laid out in a **per-sample** random order (the original code's fixed ``Random(4)`` shuffle put
the gold paragraphs at the same slots for every question), formatted ``Document i:\\n…`` and
joined by blank lines. Size by document count (the paper's 50 … 25,600) or by a token target
for a given tokenizer (the largest set of documents that fits).

Everything is a function of ``(seed, question id, size)``, so samples come out identical
whether made in one loop or spread over Ray workers.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Literal, Sequence

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from memagent.data.token_fit import Fit, fit_to_budget

SOURCE = "hotpotqa"

# The columns of every generated row, training and evaluation (id, question, context, answers,
# num_docs, context_tokens, source) plus the synthesis record (gold positions, seed).
SAMPLE_COLUMNS = [
    ("id", pa.string()),
    ("question_id", pa.string()),
    ("question", pa.string()),
    ("context", pa.large_string()),
    ("answers", pa.list_(pa.string())),
    ("num_docs", pa.int64()),
    ("context_tokens", pa.int64()),
    ("source", pa.string()),
    ("gold_positions", pa.list_(pa.int64())),
    ("seed", pa.int64()),
]
TRAINING_SCHEMA = pa.schema([*SAMPLE_COLUMNS, ("target_tokens", pa.int64())])

SizeKind = Literal["docs", "tokens"]
Size = tuple[SizeKind, int]


# -- seeds and tokens ------------------------------------------------------------------------


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any parts: stable across processes and Python versions (no ``hash()``)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def count_tokens(tokenizer: Any, text: str) -> int:
    """Tokens of ``text`` without special tokens (the fast backend: no length warnings)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return len(backend.encode(text, add_special_tokens=False).ids)
    return len(tokenizer.encode(text, add_special_tokens=False))


def count_tokens_batch(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """:func:`count_tokens` of each text, batched on the fast backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return [len(e.ids) for e in backend.encode_batch(list(texts), add_special_tokens=False)]
    return [count_tokens(tokenizer, t) for t in texts]


# -- source records --------------------------------------------------------------------------


@dataclass(frozen=True)
class HotpotRecord:
    """One question of the official JSON: its paragraphs as documents, and its gold titles."""

    id: str
    question: str
    answer: str
    documents: tuple[str, ...]  # "title\ntext", the record's context order, deduplicated
    gold_titles: tuple[str, ...]  # titles of the supporting paragraphs (all, if none are given)


def doc_text(title: str, sentences: Sequence[str]) -> str:
    """A document as the paper builds it: title, newline, sentences concatenated as given."""
    return f"{title}\n{''.join(sentences)}"


def parse_hotpotqa(data: Any, source: str = "<records>") -> list[HotpotRecord]:
    """Validate official HotpotQA records (``_id``, ``question``, ``answer``, ``context`` =
    ``[[title, [sentence, …]], …]``, optional ``supporting_facts`` = ``[[title, idx], …]``).

    Raises ``ValueError`` naming the file, record and field on anything malformed.
    """
    if not isinstance(data, list):
        raise ValueError(f"{source}: expected a JSON list of HotpotQA records, got {type(data).__name__}")
    if not data:
        raise ValueError(f"{source}: no records")
    records: list[HotpotRecord] = []
    seen: set[str] = set()
    for i, rec in enumerate(data):
        where = f"{source}: record {i}"
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: expected an object, got {type(rec).__name__}")
        rid = rec.get("_id", rec.get("id"))
        if isinstance(rid, str) and rid:
            where += f" (_id={rid!r})"
        for name, value in (("_id", rid), ("question", rec.get("question")), ("answer", rec.get("answer"))):
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{where}: field {name!r} is missing or not a non-empty string")
        if rid in seen:
            raise ValueError(f"{where}: duplicate _id")
        seen.add(rid)
        docs = _documents(rec.get("context"), where)
        gold = _gold_titles(rec.get("supporting_facts") or [], docs, where)
        records.append(
            HotpotRecord(rid, rec["question"].strip(), rec["answer"].strip(), tuple(docs.values()), tuple(gold or docs))
        )
    return records


def _documents(context: Any, where: str) -> dict[str, str]:
    """A record's ``context`` as documents by title (the first paragraph of a title kept)."""
    if not isinstance(context, list) or not context:
        raise ValueError(f"{where}: field 'context' is missing or empty (need [[title, [sentences]], ...])")
    docs: dict[str, str] = {}
    for j, para in enumerate(context):
        ok = (
            isinstance(para, (list, tuple)) and len(para) == 2 and isinstance(para[0], str)
            and isinstance(para[1], list) and all(isinstance(s, str) for s in para[1])
        )
        if not ok:
            raise ValueError(f"{where}: context[{j}] is not [title, [sentence, ...]]")
        if not "".join(para[1]).strip():
            raise ValueError(f"{where}: context[{j}] ({para[0]!r}) has no text")
        docs.setdefault(para[0], doc_text(para[0], para[1]))
    return docs


def _gold_titles(facts: Any, docs: dict[str, str], where: str) -> list[str]:
    """The titles of a record's ``supporting_facts``, in order, once each; every one must be a document."""
    if not isinstance(facts, list):
        raise ValueError(f"{where}: field 'supporting_facts' is not a list")
    gold: list[str] = []
    for fact in facts:
        if not (isinstance(fact, (list, tuple)) and fact and isinstance(fact[0], str)):
            raise ValueError(f"{where}: supporting fact {fact!r} is not [title, sentence_index]")
        if fact[0] not in docs:
            raise ValueError(f"{where}: supporting fact title {fact[0]!r} is not in its context")
        if fact[0] not in gold:
            gold.append(fact[0])
    return gold


def load_hotpotqa(path: str) -> list[HotpotRecord]:
    """Read and validate an official HotpotQA JSON (or JSONL) file, local or ``s3://``."""
    from memagent.data.io import read_json

    return parse_hotpotqa(read_json(path), source=path)


# -- the document pool and one sample's selection ---------------------------------------------


class DocPool:
    """A split's unique documents, sorted; token counts cached per document (one tokenizer)."""

    def __init__(self, docs: Iterable[str], titled: bool = True):
        self.docs: list[str] = sorted(set(docs))
        self.index: dict[str, int] = {d: i for i, d in enumerate(self.docs)}
        self.by_title: dict[str, list[int]] = {}
        if titled:
            for i, d in enumerate(self.docs):
                self.by_title.setdefault(d.split("\n", 1)[0], []).append(i)
        self._tokens: dict[int, int] = {}
        self._tokenizer_id: int | None = None

    @classmethod
    def from_records(cls, records: Iterable[HotpotRecord]) -> DocPool:
        return cls(d for r in records for d in r.documents)

    def __len__(self) -> int:
        return len(self.docs)

    def id_of(self, doc: str, owner: str = "") -> int:
        try:
            return self.index[doc]
        except KeyError:
            raise ValueError(f"document {doc[:60]!r} of {owner or 'the record'} is not in the pool") from None

    def token_counts(self, ids: Sequence[int], tokenizer: Any) -> list[int]:
        if self._tokenizer_id != id(tokenizer):
            self._tokens, self._tokenizer_id = {}, id(tokenizer)
        missing = [i for i in dict.fromkeys(ids) if i not in self._tokens]
        if missing:
            self._tokens.update(zip(missing, count_tokens_batch(tokenizer, [self.docs[i] for i in missing])))
        return [self._tokens[i] for i in ids]


def format_documents(docs: Sequence[str]) -> str:
    """``Document 1:\\n…`` blocks joined by blank lines (MemAgent's layout, as RULER's qa tasks)."""
    return "\n\n".join(f"Document {i}:\n{d}" for i, d in enumerate(docs, start=1))


class DocSelection:
    """One sample's documents in selection order: gold, the other own paragraphs, ``preferred``
    (e.g. same-article paragraphs), then uniformly random pool documents; the first ``n`` form
    the sample. Pool documents sharing a title with an own paragraph are never drawn.

    Random draws are a lazy Fisher-Yates permutation and the layout sorts by a per-document
    hash key, so growing ``n`` only adds documents: sizing by tokens can search over ``n``.
    """

    def __init__(self, pool: DocPool, gold: Sequence[int], own: Sequence[int], preferred: Sequence[int], seed: int):
        rng = random.Random(seed)
        others = [i for i in dict.fromkeys(own) if i not in set(gold)]
        rng.shuffle(others)
        first = list(dict.fromkeys(gold)) + others
        pref = [i for i in dict.fromkeys(preferred) if i not in set(first)]
        rng.shuffle(pref)
        self.pool, self.seed, self._rng = pool, seed, rng
        self.order: list[int] = first + pref
        titles = {pool.docs[i].split("\n", 1)[0] for i in first} if pool.by_title else set()
        self._excluded = set(self.order) | {j for t in titles for j in pool.by_title.get(t, ())}
        self.available = len(pool) - len(self._excluded) + len(self.order)
        self._swaps: dict[int, int] = {}
        self._drawn = 0
        self._prefix = [0]

    def take(self, n: int) -> list[int]:
        """The first ``n`` documents in selection order (fewer if the pool runs out)."""
        size = len(self.pool)
        while len(self.order) < n and self._drawn < size:
            i = self._drawn
            j = self._rng.randrange(i, size)
            pick = self._swaps.get(j, j)
            self._swaps[j] = self._swaps.get(i, i)
            self._drawn += 1
            if pick not in self._excluded:
                self.order.append(pick)
        return self.order[:n]

    def key(self, doc_id: int) -> int:
        return derive_seed(self.seed, "layout", doc_id)

    def layout(self, n: int) -> list[int]:
        """The first ``n`` documents in their sample order."""
        return sorted(self.take(n), key=self.key)

    def text(self, n: int) -> str:
        return format_documents([self.pool.docs[i] for i in self.layout(n)])

    def estimate_tokens(self, n: int, tokenizer: Any, per_doc_overhead: int = 7) -> int:
        """Sum of the first ``n`` documents' tokens plus a per-document header allowance."""
        ids = self.take(n)
        if len(self._prefix) <= len(ids):
            counts = self.pool.token_counts(ids[len(self._prefix) - 1 :], tokenizer)
            for c in counts:
                self._prefix.append(self._prefix[-1] + c + per_doc_overhead)
        return self._prefix[len(ids)]

    def fit(self, budget: int, tokenizer: Any, lo: int) -> Fit:
        """The most documents (at least ``lo``) whose formatted text fits ``budget`` tokens."""
        return fit_to_budget(
            self.text, lambda t: count_tokens(tokenizer, t), budget, lo=lo, hi=self.available,
            estimate=lambda m: self.estimate_tokens(m, tokenizer),
        )


# -- samples ---------------------------------------------------------------------------------


def sample_seed(seed: int, question_id: str, size: Size) -> int:
    """The seed of one (question, size) sample, independent of how the work is partitioned."""
    return derive_seed(seed, SOURCE, question_id, *size)


def make_sample(record: HotpotRecord, pool: DocPool, size: Size, *, seed: int, tokenizer: Any = None) -> dict:
    """One training/evaluation row (fields of :data:`TRAINING_SCHEMA`).

    ``size`` is ``("docs", N)`` (N documents; the whole pool if N exceeds it) or
    ``("tokens", T)`` (most documents whose context has at most T tokens; needs ``tokenizer``).
    ``seed`` is the global seed; the row records the derived per-sample seed.
    ``context_tokens`` is null when no tokenizer is given.
    """
    kind, value = size
    if value <= 0:
        raise ValueError(f"size must be positive, got {kind}={value}")
    s = sample_seed(seed, record.id, size)
    own = [pool.id_of(d, f"record {record.id!r}") for d in record.documents]
    gold = [own[i] for i, d in enumerate(record.documents) if d.split("\n", 1)[0] in record.gold_titles]
    sel = DocSelection(pool, gold, own, [], s)
    if kind == "docs":
        if value < len(gold):
            raise ValueError(f"record {record.id!r}: num_docs={value} is fewer than its {len(gold)} gold documents")
        n = min(value, sel.available)
        context = sel.text(n)
        tokens = count_tokens(tokenizer, context) if tokenizer is not None else None
    elif kind == "tokens":
        if tokenizer is None:
            raise ValueError("sizing by tokens needs a tokenizer")
        try:
            fit = sel.fit(value, tokenizer, lo=len(gold))
        except ValueError as exc:
            raise ValueError(f"record {record.id!r}: target of {value} tokens is too small: {exc}") from None
        n, context, tokens = fit.n, fit.text, fit.tokens
    else:
        raise ValueError(f"unknown size kind {kind!r}; use 'docs' or 'tokens'")
    ids = sel.layout(n)
    where = {doc_id: pos for pos, doc_id in enumerate(ids, start=1)}
    return {
        "id": f"{record.id}-{'d' if kind == 'docs' else 't'}{value}",
        "question_id": record.id,
        "question": record.question,
        "context": context,
        "answers": [record.answer],
        "num_docs": len(ids),
        "context_tokens": tokens,
        "target_tokens": value if kind == "tokens" else None,
        "source": SOURCE,
        "gold_positions": sorted(where[g] for g in gold),
        "seed": s,
    }


def sizes_from(num_docs: Sequence[int] = (), tokens: Sequence[int] = ()) -> list[Size]:
    """Sizes from the two CLI forms; at least one size is required."""
    sizes: list[Size] = [("docs", int(n)) for n in num_docs] + [("tokens", int(t)) for t in tokens]
    if not sizes:
        raise ValueError("give at least one size: a number of documents or a token target")
    for kind, value in sizes:
        if value <= 0:
            raise ValueError(f"sizes must be positive, got {kind}={value}")
    return sizes


def synthesize(
    records: Sequence[HotpotRecord],
    sizes: Sequence[Size],
    *,
    seed: int = 42,
    samples: int | None = None,
    tokenizer: Any = None,
    pool: DocPool | None = None,
) -> Iterator[dict]:
    """Rows for the first ``samples`` questions (all if None) at every size, size-major.

    The pool defaults to all documents of ``records`` (pass the split's pool when ``records``
    is a subset of it).
    """
    pool = pool if pool is not None else DocPool.from_records(records)
    chosen = records if samples is None else records[:samples]
    for size in sizes:
        for record in chosen:
            yield make_sample(record, pool, size, seed=seed, tokenizer=tokenizer)


class HotpotSynthConfig(BaseModel):
    """HotpotQA long-context synthesis: questions hidden among distractor documents."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str = Field(..., description="Official HotpotQA JSON/JSONL (local or s3://)")
    samples: int | None = Field(None, gt=0, description="First N questions (default: all)")
    num_docs: list[int] = Field(default_factory=list, description="Documents per sample, e.g. 50,100,200")
    tokens: list[int] = Field(default_factory=list, description="Target context tokens per sample, e.g. 8K,32K")
    seed: int = Field(42, description="Global seed; each sample depends only on (seed, question, size)")

    @field_validator("source")
    @classmethod
    def _source(cls, source: str) -> str:
        from memagent.data.io import check_uri

        return check_uri(source, "source")

    @model_validator(mode="after")
    def _sizes(self) -> HotpotSynthConfig:
        sizes_from(self.num_docs, self.tokens)  # at least one size, all positive
        return self

    def sizes(self) -> list[Size]:
        return sizes_from(self.num_docs, self.tokens)

    def rows(self, tokenizer: Any, records: Sequence[HotpotRecord] | None = None) -> list[dict]:
        """Every sample, in this process (``records``: the source, already read)."""
        records = load_hotpotqa(self.source) if records is None else records
        return list(synthesize(records, self.sizes(), seed=self.seed, samples=self.samples, tokenizer=tokenizer))
