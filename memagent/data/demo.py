"""A small, self-contained demo corpus written by code (no data files, no downloads).

Two kinds of rows, both in the batch-input schema (id, question, context, answers, plus
``kind`` and ``target_tokens``):

- ``niah``: a needle sentence ("The special magic number for <key> is: <7 digits>.") hidden at
  a seeded depth inside filler text, at a few lengths;
- ``qa``: several short fictional documents (towns, people, companies) with one question
  about one of them; the rest are distractors built from the same templates.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Annotated, Callable

from pydantic import BaseModel, ConfigDict, Field

from memagent.models import DEFAULT_MODEL

FILLER = [
    "The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.", "There and back again.",
    "Rivers run toward the sea.", "The market opens at dawn.", "Old bridges creak in the wind.",
    "A clock ticks in the hall.", "Clouds gather over the hills.", "The library is quiet today.",
    "Bread is baked before sunrise.", "Trains leave on the hour.", "Snow melts slowly in spring.",
]
ADJECTIVES = ["amber", "brisk", "calm", "dusty", "eager", "fuzzy", "gentle", "hollow", "icy", "jolly",
              "keen", "lucky", "mellow", "noble", "proud", "quiet", "rapid", "silent", "tidy", "vivid"]
NOUNS = ["otter", "lantern", "meadow", "falcon", "harbor", "willow", "comet", "badger", "violin", "glacier",
         "pepper", "canyon", "maple", "beacon", "walnut", "raven", "orchid", "summit", "anchor", "ember"]
SYLLABLES = ["var", "nor", "hel", "mar", "tis", "dun", "bel", "kor", "ash", "wen", "lin", "gar", "rho", "sel"]
TRADES = ["clockmaker", "cartographer", "glassblower", "astronomer", "shipwright", "botanist", "luthier"]
GOODS = ["copper kettles", "wool blankets", "paper lanterns", "glass beads", "salted fish", "river maps"]

# Rough tokens per word of English filler for sizing without a tokenizer.
TOKENS_PER_WORD = 1.35

TokenCounter = Callable[[str], int]


def _approx_tokens(text: str) -> int:
    return int(len(text.split()) * TOKENS_PER_WORD)


def _name(rng: random.Random, parts: int = 3) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(parts)).capitalize()


def _filler(rng: random.Random, n_tokens: int, count: TokenCounter) -> str:
    sentences: list[str] = []
    # Grow in batches of sentences and measure, so sizing costs a few tokenizer calls only.
    while count(" ".join(sentences)) < n_tokens:
        sentences.extend(rng.choice(FILLER) for _ in range(max(8, (n_tokens - count(" ".join(sentences))) // 6)))
    # The longest prefix within n_tokens (counts grow with the prefix): a binary search, where
    # dropping one sentence at a time re-counted megabytes per sentence on long documents.
    lo, hi = 0, len(sentences)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(" ".join(sentences[:mid])) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(sentences[:lo])


def niah_row(idx: int, target_tokens: int, depth: float, seed: int, count: TokenCounter = _approx_tokens) -> dict:
    """One needle-in-a-haystack row of about ``target_tokens`` with the needle at ``depth`` (0..1)."""
    rng = random.Random(f"niah-{seed}-{idx}")
    key = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    value = str(rng.randint(1_000_000, 9_999_999))
    needle = f"The special magic number for {key} is: {value}."
    haystack = _filler(rng, max(target_tokens - count(needle), 8), count).split(". ")
    at = max(1, min(len(haystack) - 1, round(depth * len(haystack))))
    context = ". ".join(haystack[:at]) + ". " + needle + " " + ". ".join(haystack[at:])
    return {
        "id": f"niah-{target_tokens}-{idx}",
        "kind": "niah",
        "target_tokens": target_tokens,
        "question": f"What is the special magic number for {key}?",
        "context": context,
        "answers": [value],
    }


def _town_doc(rng: random.Random) -> tuple[str, str, str, str]:
    town, founder = _name(rng), f"{_name(rng, 2)} {_name(rng, 3)}"
    year, goods = str(rng.randint(1520, 1890)), rng.choice(GOODS)
    text = (
        f"{town} is a small town on the banks of a slow river. It was founded in {year} by {founder}, "
        f"a {rng.choice(TRADES)} who came from the coast. Today {town} is known for its {goods}, "
        f"which traders carry to markets across the region."
    )
    return town, text, f"In which year was the town of {town} founded?", year


def _person_doc(rng: random.Random) -> tuple[str, str, str, str]:
    person, trade, town = f"{_name(rng, 2)} {_name(rng, 3)}", rng.choice(TRADES), _name(rng)
    text = (
        f"{person} was a {trade} who spent most of her life in the town of {town}. She trained as an "
        f"apprentice for many years and later opened a workshop near the old square."
    )
    return person, text, f"What was the profession of {person}?", trade


def qa_row(idx: int, n_docs: int, seed: int, filler_tokens: int = 60, count: TokenCounter = _approx_tokens) -> dict:
    """One multi-document QA row: ``n_docs`` fictional documents, one of which answers the question."""
    rng = random.Random(f"qa-{seed}-{idx}")
    makers = [_town_doc, _person_doc]
    docs = []
    for _ in range(n_docs):
        title, text, question, answer = rng.choice(makers)(rng)
        docs.append((title, f"{text} {_filler(rng, filler_tokens, count)}", question, answer))
    gold = rng.randrange(n_docs)
    _, _, question, answer = docs[gold]
    context = "\n\n".join(f"Document {i + 1}:\n{title}\n{text}" for i, (title, text, _, _) in enumerate(docs))
    return {
        "id": f"qa-{n_docs}docs-{idx}",
        "kind": "qa",
        "target_tokens": count(context),
        "question": question,
        "context": context,
        "answers": [answer],
    }


class DemoCorpus(BaseModel):
    """The generated demo corpus: needle-in-a-haystack rows at a few lengths plus multi-document QA."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lengths: list[Annotated[int, Field(gt=0)]] = Field([1000, 2500, 5000], min_length=1,
                               description="Needle-in-a-haystack lengths in tokens of the model's tokenizer")
    qa_items: int = Field(3, ge=0, description="Multi-document QA items")
    seed: int = Field(0, description="Seed of the generated text")


def demo_corpus(
    lengths: tuple[int, ...] = (1000, 2500, 5000),
    qa_items: int = 3,
    qa_docs: int = 8,
    seed: int = 0,
    count: TokenCounter = _approx_tokens,
) -> list[dict]:
    """NIAH rows at each length (needle depths spread 0.2..0.8) plus ``qa_items`` QA rows."""
    rows = []
    for i, n in enumerate(lengths):
        depth = 0.2 + 0.6 * (i / max(1, len(lengths) - 1))
        rows.append(niah_row(i, n, depth, seed, count))
    rows += [qa_row(i, qa_docs, seed, count=count) for i in range(qa_items)]
    return rows


def write_demo_corpus(
    directory: str | Path,
    model: str = DEFAULT_MODEL,
    lengths: tuple[int, ...] = (1000, 2500, 5000),
    qa_items: int = 3,
    seed: int = 0,
) -> tuple[Path, int]:
    """Write :func:`demo_corpus`, sized in ``model``'s tokens, to ``directory/corpus.parquet``.

    The file appears atomically (written under a hidden name first: readers skip dot files).
    Returns the file and its row count.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memagent.data.hotpotqa import count_tokens
    from memagent.models import load_tokenizer

    count = functools.partial(count_tokens, load_tokenizer(model))
    rows = demo_corpus(lengths=tuple(lengths), qa_items=qa_items, seed=seed, count=count)
    target = Path(directory) / "corpus.parquet"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(".corpus.parquet.tmp")
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.replace(target)
    return target, len(rows)
