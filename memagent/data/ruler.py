"""RULER out-of-distribution tasks (the paper's OOD suite): NIAH ×8, variable tracking, common/frequent words, QA.

Each sample is ``(question, context, answers)`` with the context kept apart from the question
(as MemAgent's edited templates do) and sized so that question + context + the task's answer
budget fit ``length`` tokens of the given tokenizer. Haystacks: the repeated noise line, an
essay text (RULER's Paul Graham essays, repeated when a length needs more), or distractor
needles. Needle depths come from 40 evenly spaced percentages; the first needle's depth runs
through a seeded permutation of them across a task's samples, so depths are spread, not
clustered. Every sample is a function of ``(seed, task, length, index)`` alone.

Departures from RULER, on purpose: cwe uses pronounceable synthetic words (no word-list
download) and word keys come from the small adjective/noun lists below (no ``wonderwords``).
"""

from __future__ import annotations

import logging
import math
import random
import re
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, field_validator

from memagent.data.hotpotqa import (
    SAMPLE_COLUMNS,
    DocPool,
    DocSelection,
    HotpotRecord,
    count_tokens,
    count_tokens_batch,
    derive_seed,
    make_sample,
)
from memagent.data.ruler_text import ADJECTIVES, CWE_QUESTION, FWE_QUESTION, NOISE, NOUNS, QA_TEMPLATE, VT_TEMPLATE
from memagent.data.squad import parse_squad
from memagent.data.token_fit import Fit, fit_to_budget

log = logging.getLogger(__name__)

DEPTHS: list[int] = [round(100 * i / 39) for i in range(40)]  # RULER: 40 evenly spaced percentages
RULER_LENGTHS = (8192, 16384, 32768, 65536, 131072, 262144, 524288)


@dataclass(frozen=True)
class NiahSpec:
    """One NIAH variant: haystack kind, key/value types, needles per key, keys, keys queried."""

    haystack: str  # "noise" | "essay" | "needle"
    key_type: str  # "words" | "uuids"
    value_type: str  # "numbers" | "uuids"
    num_keys: int = 1
    num_values: int = 1
    num_queries: int = 1


NIAH: dict[str, NiahSpec] = {
    "niah_single_1": NiahSpec("noise", "words", "numbers"),
    "niah_single_2": NiahSpec("essay", "words", "numbers"),
    "niah_single_3": NiahSpec("essay", "words", "uuids"),
    "niah_multikey_1": NiahSpec("essay", "words", "numbers", num_keys=4),
    "niah_multikey_2": NiahSpec("needle", "words", "numbers"),
    "niah_multikey_3": NiahSpec("needle", "uuids", "uuids"),
    "niah_multivalue": NiahSpec("essay", "words", "numbers", num_values=4),
    "niah_multiquery": NiahSpec("essay", "words", "numbers", num_keys=4, num_queries=4),
}
TASKS: tuple[str, ...] = (*NIAH, "vt", "cwe", "fwe", "qa_1", "qa_2")
ALIASES = {"qa": "qa_1", "qa_squad": "qa_1", "squad": "qa_1", "qa_hotpotqa": "qa_2", "hotpotqa": "qa_2"}
# RULER's answer budgets (its synthetic.yaml); ``length`` counts them.
TOKENS_TO_GENERATE = {**{t: 128 for t in NIAH}, "vt": 30, "cwe": 120, "fwe": 50, "qa_1": 32, "qa_2": 32}

RULER_SCHEMA = pa.schema([*SAMPLE_COLUMNS, ("task", pa.string()), ("length", pa.int64()), ("metric", pa.string()),
                          ("needle_depths", pa.list_(pa.float64()))])


def resolve_task(name: str) -> str:
    """Canonical task name (``qa`` is ``qa_1``); unknown names list the known ones."""
    task = ALIASES.get(name.strip(), name.strip())
    if task not in TASKS:
        raise ValueError(f"unknown RULER task {name!r}; choose from {', '.join(TASKS)} (or qa = qa_1)")
    return task


def metric_for(task: str) -> str:
    return "sub_em" if task.startswith("qa") else "string_match_all"


# -- helpers ---------------------------------------------------------------------------------


def _insert(units: list[str], needles: Sequence[str], depths: Sequence[float]) -> list[str]:
    """``units`` with each needle inserted at its depth (percent of units); ties keep needle order."""
    out = list(units)
    places = sorted(((round(d / 100 * len(units)), i) for i, d in enumerate(depths)), reverse=True)
    for pos, i in places:
        out.insert(pos, needles[i])
    return out


_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]


def _pseudo_word(i: int) -> str:
    """The i-th three-syllable pronounceable word (70**3 of them)."""
    n = len(_SYLLABLES)
    return _SYLLABLES[i // (n * n)] + _SYLLABLES[(i // n) % n] + _SYLLABLES[i % n]


def _essay_sentences(essay: str) -> list[str]:
    text = " ".join(essay.split())
    sentences = [s for s in re.split(r"(?<=[.!?])\s+", text) if s]
    if not sentences:
        raise ValueError("the essay haystack is empty")
    return sentences


class RulerGenerator:
    """Makes RULER samples for one tokenizer.

    Args:
        tokenizer: HF tokenizer that ``length`` is measured in.
        essay: haystack text for the essay tasks (RULER: the Paul Graham essays).
        squad: an official SQuAD JSON object (qa_1).
        hotpotqa: validated HotpotQA records (qa_2); their documents form the pool.
        seed: global seed (RULER used 42).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        essay: str | None = None,
        squad: Any = None,
        hotpotqa: Sequence[HotpotRecord] | None = None,
        seed: int = 42,
    ):
        self.tokenizer, self.seed = tokenizer, seed
        self._sentences = _essay_sentences(essay) if essay is not None else None
        self._sentence_prefix: list[int] | None = None
        self._squad = parse_squad(squad) if squad is not None else None
        self._squad_pool = DocPool((d for qa in self._squad for d in qa.article), titled=False) if self._squad else None
        self._hotpot = list(hotpotqa) if hotpotqa is not None else None
        self._hotpot_pool = DocPool.from_records(self._hotpot) if self._hotpot else None
        self._depth_perm: dict[tuple[str, int], list[int]] = {}

    # -- public ------------------------------------------------------------------------------

    def generate(self, tasks: Sequence[str], lengths: Sequence[int], samples: int) -> Iterator[dict]:
        """``samples`` rows per (task, length), task-major."""
        for task in tasks:
            for length in lengths:
                for index in range(samples):
                    yield self.sample(task, length, index)

    def sample(self, task: str, length: int, index: int) -> dict:
        """One row of :data:`RULER_SCHEMA` (``context_tokens`` + question + answer budget ≤ length)."""
        task = resolve_task(task)
        if length <= 0 or index < 0:
            raise ValueError(f"length must be positive and index non-negative, got {length}, {index}")
        seed = derive_seed(self.seed, "ruler", task, length, index)
        rng = random.Random(seed)
        if task in NIAH:
            row = self._niah(task, length, index, rng)
        elif task == "qa_1":
            row = self._qa_squad(length, index, seed)
        elif task == "qa_2":
            row = self._qa_hotpot(length, index, seed)
        else:
            row = {"vt": self._vt, "cwe": self._cwe, "fwe": self._fwe}[task](task, length, index, rng, seed)
        row.update(id=f"{task}-{length}-{index}", task=task, length=length, metric=metric_for(task), source="ruler", seed=seed)
        for name in ("num_docs", "question_id"):
            row.setdefault(name, None)
        for name in ("gold_positions", "needle_depths"):
            row.setdefault(name, [])
        return row

    # -- sizing ------------------------------------------------------------------------------

    def _budget(self, task: str, length: int, question: str) -> int:
        budget = length - TOKENS_TO_GENERATE[task] - count_tokens(self.tokenizer, question)
        if budget <= 0:
            raise ValueError(f"{task}: length {length} leaves no room for a context")
        return budget

    def _fit(self, task: str, length: int, question: str, build: Callable[[int], str], lo: int,
             estimate: Callable[[int], float] | None = None) -> Fit:
        budget = self._budget(task, length, question)
        try:
            return fit_to_budget(build, lambda t: count_tokens(self.tokenizer, t), budget, lo=lo, estimate=estimate)
        except ValueError as exc:
            raise ValueError(f"{task}: length {length} is too short for this task: {exc}") from None

    def _depths(self, task: str, length: int, index: int, k: int, rng: random.Random) -> list[float]:
        """k distinct depths; the first walks a seeded permutation of :data:`DEPTHS` over samples."""
        perm = self._depth_perm.get((task, length))
        if perm is None:
            perm = random.Random(derive_seed(self.seed, "depths", task, length)).sample(range(len(DEPTHS)), len(DEPTHS))
            self._depth_perm[(task, length)] = perm
        first = perm[index % len(DEPTHS)]
        rest = rng.sample([j for j in range(len(DEPTHS)) if j != first], k - 1)
        return [float(DEPTHS[j]) for j in [first, *rest]]

    # -- NIAH --------------------------------------------------------------------------------

    @staticmethod
    def _key(kind: str, rng: random.Random) -> str:
        if kind == "uuids":
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"

    @staticmethod
    def _value(kind: str, rng: random.Random) -> str:
        if kind == "uuids":
            return str(uuid.UUID(int=rng.getrandbits(128), version=4))
        return str(rng.randint(1_000_000, 9_999_999))

    def _niah(self, task: str, length: int, index: int, rng: random.Random) -> dict:
        spec = NIAH[task]
        keys: list[str] = []
        while len(keys) < spec.num_keys:
            key = self._key(spec.key_type, rng)
            if key not in keys:
                keys.append(key)
        values: dict[str, list[str]] = {}
        used: set[str] = set()
        for key in keys:
            values[key] = []
            while len(values[key]) < spec.num_values:
                v = self._value(spec.value_type, rng)
                if v not in used:
                    used.add(v)
                    values[key].append(v)
        vtype = spec.value_type  # "numbers" / "uuids" (RULER's needle wording is plural)
        needles = [f"One of the special magic {vtype} for {k} is: {v}." for k in keys for v in values[k]]
        depths = self._depths(task, length, index, len(needles), rng)
        queried = keys[: spec.num_queries]
        answers = [v for k in queried for v in values[k]]
        query = queried[0] if len(queried) == 1 else ", ".join(queried[:-1]) + ", and " + queried[-1]
        ask = (
            f"What is the special magic {vtype[:-1]} for {query} mentioned in the provided text?"
            if len(answers) == 1
            else f"What are all the special magic {vtype} for {query} mentioned in the provided text?"
        )
        question = (
            f"Some special magic {vtype} are hidden within the following text. Make sure to memorize it. "
            f"I will quiz you about the {vtype} afterwards.\n{ask}"
        )
        if spec.haystack == "essay":
            sentences = self._need_essay(task)
            n_sent = len(sentences)
            build = lambda n: " ".join(_insert([sentences[i % n_sent] for i in range(n)], needles, depths))  # noqa: E731
            fit = self._fit(task, length, question, build, lo=1, estimate=self._essay_estimate)
        elif spec.haystack == "noise":
            build = lambda n: "\n".join(_insert([NOISE] * n, needles, depths))  # noqa: E731
            fit = self._fit(task, length, question, build, lo=1)
        else:
            lines = self._distractor_needles(spec, rng, set(keys), used, vtype)
            build = lambda n: "\n".join(_insert(lines(n), needles, depths))  # noqa: E731
            fit = self._fit(task, length, question, build, lo=1)
        return {"question": question, "context": fit.text, "answers": answers,
                "context_tokens": fit.tokens, "needle_depths": depths}

    def _distractor_needles(self, spec: NiahSpec, rng: random.Random, keys: set[str], values: set[str],
                            vtype: str) -> Callable[[int], list[str]]:
        """A prefix-stable stream of needles with other random keys and values."""
        stream = random.Random(rng.getrandbits(63))
        made: list[str] = []

        def first(n: int) -> list[str]:
            while len(made) < n:
                k, v = self._key(spec.key_type, stream), self._value(spec.value_type, stream)
                if k not in keys and v not in values:
                    made.append(f"One of the special magic {vtype} for {k} is: {v}.")
            return made[:n]

        return first

    def _need_essay(self, task: str) -> list[str]:
        if self._sentences is None:
            raise ValueError(f"task {task} needs an essay haystack: pass essay text (CLI: --haystack FILE)")
        return self._sentences

    def _essay_estimate(self, n: int) -> float:
        """Tokens of n essay sentences (cycled), from per-sentence counts computed once."""
        assert self._sentences is not None
        if self._sentence_prefix is None:
            counts = count_tokens_batch(self.tokenizer, [" " + s for s in self._sentences])
            prefix = [0]
            for c in counts:
                prefix.append(prefix[-1] + c)
            self._sentence_prefix = prefix
        total, size = self._sentence_prefix[-1], len(self._sentences)
        return (n // size) * total + self._sentence_prefix[n % size]

    # -- vt / cwe / fwe ----------------------------------------------------------------------

    def _vt(self, task: str, length: int, index: int, rng: random.Random, seed: int) -> dict:
        names: list[str] = []
        while len(names) < 5:  # one value, 4 hops
            name = "".join(rng.choices("ABCDEFGHIJKLMNOPQRSTUVWXYZ", k=5))
            if name not in names:
                names.append(name)
        value = str(rng.randint(10000, 99999))
        hops = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]}" for j in range(4)]
        depths = sorted(self._depths(task, length, index, len(hops), rng))
        build = lambda n: "\n".join(_insert([NOISE] * n, hops, depths))  # noqa: E731
        question = VT_TEMPLATE.format(value=value)
        fit = self._fit(task, length, question, build, lo=1)
        return {"question": question, "context": fit.text, "answers": names, "context_tokens": fit.tokens,
                "needle_depths": depths}

    @staticmethod
    def _cwe_list(seed: int, num_words: int) -> tuple[list[str], list[str]]:
        """(10 common words, the shuffled list: common ×30, the others ×3)."""
        r = random.Random(derive_seed(seed, "cwe", num_words))
        words = [_pseudo_word(i) for i in r.sample(range(len(_SYLLABLES) ** 3), num_words)]
        common, uncommon = words[:10], words[10:]
        listing = common * 30 + uncommon * 3
        r.shuffle(listing)
        return common, listing

    def _cwe(self, task: str, length: int, index: int, rng: random.Random, seed: int) -> dict:
        build = lambda n: " ".join(f"{i}. {w}" for i, w in enumerate(self._cwe_list(seed, n)[1], start=1))  # noqa: E731
        fit = self._fit(task, length, CWE_QUESTION, build, lo=10)
        common, _ = self._cwe_list(seed, fit.n)
        return {"question": CWE_QUESTION, "context": fit.text, "answers": common, "context_tokens": fit.tokens}

    def _fwe(self, task: str, length: int, index: int, rng: random.Random, seed: int) -> dict:
        vocab_size = max(length // 50, 10)
        vocab: set[str] = set()
        while len(vocab) < vocab_size:
            vocab.add("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=6)))
        words = sorted(vocab)
        rng.shuffle(words)
        words[0] = "..."  # the top-ranked word is noise, as in RULER's fwe
        zeta2 = math.pi**2 / 6

        def build(n: int) -> str:
            text = [w for k, w in enumerate(words, start=1) for _ in range(int(n * k**-2 / zeta2))]
            random.Random(derive_seed(seed, "fwe", n)).shuffle(text)
            return " ".join(text)

        fit = self._fit(task, length, FWE_QUESTION, build, lo=200)
        return {"question": FWE_QUESTION, "context": fit.text, "answers": words[1:4], "context_tokens": fit.tokens}

    # -- QA ----------------------------------------------------------------------------------

    def _question_order(self, task: str, count: int) -> list[int]:
        # Same order at every length, so a question is read at 8K, 16K, … alike.
        return random.Random(derive_seed(self.seed, "questions", task)).sample(range(count), count)

    def _qa_squad(self, length: int, index: int, seed: int) -> dict:
        if self._squad is None or self._squad_pool is None:
            raise ValueError("task qa_1 needs SQuAD data: pass squad=<official JSON> (CLI: --squad FILE)")
        qas, pool = self._squad, self._squad_pool
        qa = qas[self._question_order("qa_1", len(qas))[index % len(qas)]]
        question = QA_TEMPLATE.format(question=qa.question)
        own = pool.id_of(qa.paragraph, f"question {qa.id}")
        sel = DocSelection(pool, [own], [own], [pool.index[d] for d in qa.article], seed)
        fit = sel.fit(self._budget("qa_1", length, question), self.tokenizer, lo=1)
        ids = sel.layout(fit.n)
        self._warn_short("qa_1", length, fit.tokens, fit.n, sel.available)
        return {"question": question, "context": fit.text, "answers": list(qa.answers), "context_tokens": fit.tokens,
                "num_docs": fit.n, "gold_positions": [ids.index(own) + 1], "question_id": qa.id}

    def _qa_hotpot(self, length: int, index: int, seed: int) -> dict:
        if self._hotpot is None or self._hotpot_pool is None:
            raise ValueError("task qa_2 needs HotpotQA records: pass hotpotqa=... (CLI: --hotpotqa FILE)")
        record = self._hotpot[self._question_order("qa_2", len(self._hotpot))[index % len(self._hotpot)]]
        question = QA_TEMPLATE.format(question=record.question)
        budget = self._budget("qa_2", length, question)
        row = make_sample(record, self._hotpot_pool, ("tokens", budget), seed=seed, tokenizer=self.tokenizer)
        self._warn_short("qa_2", length, row["context_tokens"], row["num_docs"], len(self._hotpot_pool))
        return {"question": question, "context": row["context"], "answers": row["answers"],
                "context_tokens": row["context_tokens"], "num_docs": row["num_docs"],
                "gold_positions": row["gold_positions"], "question_id": record.id}

    @staticmethod
    def _warn_short(task: str, length: int, tokens: int, n: int, available: int) -> None:
        if n >= available:
            log.warning("%s at length %d: the document pool ran out (%d documents, %d tokens); "
                        "the sample is shorter than asked", task, length, n, tokens)


class RulerItems(BaseModel):
    """Which RULER items to make and from which sources: ``synth ruler`` and ``eval`` share it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tasks: list[str] = Field(default_factory=list, description="RULER tasks, e.g. niah_single_1,vt,hotpotqa "
                             "(qa = qa_1 SQuAD; hotpotqa = qa_2)")
    lengths: list[int] = Field(default_factory=list, description="Item lengths in tokens of the model's tokenizer, "
                               "e.g. 4K,8K,32K")
    samples: int = Field(4, gt=0, description="Items per (task, length)")
    haystack: str | None = Field(None, description="Essay text file for the essay-haystack NIAH tasks "
                                 "(RULER: pg_essays.txt)")
    squad: str | None = Field(None, description="SQuAD v2.0 JSON for qa_1 (default: the one-article dev "
                              "sample shipped in memagent/data/samples)")
    hotpotqa: str | None = Field(None, description="HotpotQA JSON for qa_2 (default: the 24-record dev sample "
                                 "shipped in memagent/data/samples)")
    seed: int = Field(42, description="Global seed; every item depends only on (seed, task, length, index)")

    @field_validator("tasks")
    @classmethod
    def _known_tasks(cls, tasks: list[str]) -> list[str]:
        return list(dict.fromkeys(resolve_task(t) for t in tasks))

    @field_validator("lengths")
    @classmethod
    def _positive(cls, lengths: list[int]) -> list[int]:
        if any(x <= 0 for x in lengths):
            raise ValueError(f"lengths must be positive token counts, got {lengths}")
        return lengths

    def generator(self, tokenizer: Any) -> RulerGenerator:
        """The one RULER generator set-up: sources read from local paths or s3:// URIs."""
        from memagent.data.hotpotqa import load_hotpotqa
        from memagent.data.io import read_json, read_text
        from memagent.data.samples import HOTPOTQA_DEV, SQUAD_DEV

        return RulerGenerator(
            tokenizer,
            essay=read_text(self.haystack) if self.haystack else None,
            squad=read_json(self.squad or str(SQUAD_DEV)),
            hotpotqa=load_hotpotqa(self.hotpotqa or str(HOTPOTQA_DEV)),
            seed=self.seed,
        )

    def rows(self, tokenizer: Any) -> Iterator[dict]:
        """Every selected item, task-major."""
        if not (self.tasks and self.lengths):
            raise ValueError("give tasks and lengths to generate RULER items")
        return self.generator(tokenizer).generate(self.tasks, sorted(self.lengths), self.samples)
