"""RULER generators: lengths, needles at their depths, answers recomputed from the text."""

from __future__ import annotations

import random
import re
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memagent.data.hotpotqa import count_tokens, parse_hotpotqa
from memagent.data.ruler import (
    DEPTHS,
    NIAH,
    RULER_SCHEMA,
    TASKS,
    TOKENS_TO_GENERATE,
    RulerGenerator,
    RulerItems,
    resolve_task,
)
from memagent.data.squad import parse_squad

WORDS = ("people startup founders money users product growth idea investors company work time "
         "problem software market value school city writing essay question answer reason").split()


def make_essay(n_sentences: int = 400, seed: int = 0) -> str:
    rng = random.Random(seed)
    sentences = []
    for _ in range(n_sentences):
        s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 18))).capitalize()
        sentences.append(s + rng.choice([".", ".", "?", "!"]))
    return "\n".join(" ".join(sentences[i : i + 6]) for i in range(0, len(sentences), 6))


def make_squad(articles: int = 3, paragraphs: int = 30, seed: int = 0) -> dict:
    rng = random.Random(seed)
    data = []
    for a in range(articles):
        paras = []
        for p in range(paragraphs):
            answer = f"Zanthor{a}x{p}"
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 120)))
            context = f"In article {a}, {text}. The keeper of paragraph {p} was {answer}."
            qas = [
                {"question": f"Who kept paragraph {p} of article {a}?", "id": f"a{a}p{p}",
                 "answers": [{"text": answer, "answer_start": context.index(answer)}], "is_impossible": False},
                {"question": "What is unknowable?", "id": f"a{a}p{p}x", "answers": [], "is_impossible": True,
                 "plausible_answers": [{"text": "x", "answer_start": 0}]},
            ]
            paras.append({"qas": qas, "context": context})
        data.append({"title": f"Article_{a}", "paragraphs": paras})
    return {"version": "v2.0", "data": data}


def make_hotpot(n: int = 20, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for q in range(n):
        context = [[f"Page {q}-{p}", [" ".join(rng.choice(WORDS) for _ in range(40)) + "."]] for p in range(10)]
        out.append({"_id": f"h{q}", "question": f"Question {q}?", "answer": f"ans{q}",
                    "supporting_facts": [[context[1][0], 0], [context[7][0], 0]], "context": context})
    return out


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture(scope="module")
def gen(tok):
    return RulerGenerator(tok, essay=make_essay(), squad=make_squad(), hotpotqa=parse_hotpotqa(make_hotpot()), seed=42)


def _total(tok, row) -> int:
    return row["context_tokens"] + count_tokens(tok, row["question"]) + TOKENS_TO_GENERATE[row["task"]]


@pytest.mark.parametrize("task", TASKS)
def test_every_task_fills_its_length(gen, tok, task):
    length = 4096
    row = gen.sample(task, length, 0)
    assert set(row) == set(RULER_SCHEMA.names)
    assert row["context_tokens"] == count_tokens(tok, row["context"])
    assert 0.97 * length <= _total(tok, row) <= length, (task, _total(tok, row))
    assert row["metric"] == ("sub_em" if task.startswith("qa") else "string_match_all")
    assert row["id"] == f"{task}-{length}-0" and row["answers"] and row["task"] == task
    assert gen.sample(task, length, 0) == row  # deterministic


def test_longer_lengths_and_essay_repetition(gen, tok):
    # The essay holds ~5K tokens: 16K needs it three times over.
    row = gen.sample("niah_single_2", 16384, 3)
    assert 0.98 * 16384 <= _total(tok, row) <= 16384
    assert row["context"].count(row["answers"][0]) == 1


@pytest.mark.parametrize("task", list(NIAH))
def test_needles_are_at_their_recorded_depths(gen, task):
    spec = NIAH[task]
    for index in range(3):
        row = gen.sample(task, 4096, index)
        ctx = row["context"]
        needles = re.findall(r"One of the special magic (?:numbers|uuids) for (\S+) is: (\S+)\.", ctx)
        assert len(row["needle_depths"]) == spec.num_keys * spec.num_values
        assert len(row["answers"]) == spec.num_queries * spec.num_values
        # answers[i] is the value of needle i; each sits at its recorded depth (percent of the text).
        for value, depth in zip(row["answers"], row["needle_depths"]):
            assert ctx.count(value) == 1
            where = ctx.index(f"is: {value}.") / len(ctx) * 100
            assert abs(depth - where) < 4, (task, depth, where)
        asked = set(re.split(r", and |, ", re.search(r"for (.+) mentioned", row["question"]).group(1)))
        assert len(asked) == spec.num_queries
        # The values of the asked keys are exactly the answers.
        assert sorted(v for k, v in needles if k in asked) == sorted(row["answers"])
        answer_keys = {k for k, v in needles if v in row["answers"]}
        assert answer_keys == asked
        if spec.haystack == "needle":
            assert len(needles) > 20  # distractor needles fill the haystack
        if spec.num_keys > 1 and spec.num_queries == 1:
            assert len({k for k, _ in needles}) == 4  # three distractor keys, one asked
            assert len(answer_keys) == 1


def test_first_needle_depths_are_spread(gen):
    depths = [gen.sample("niah_single_1", 1024, i)["needle_depths"][0] for i in range(40)]
    assert sorted(depths) == sorted(float(d) for d in DEPTHS)


def _vt_answer(context: str, value: str) -> list[str]:
    assigned: dict[str, str] = {}
    for name, rhs in re.findall(r"VAR (\w+) = (VAR \w+|\d+)", context):
        assigned[name] = rhs
    found = {n for n, r in assigned.items() if r == value}
    grew = True
    while grew:
        new = {n for n, r in assigned.items() if r.startswith("VAR ") and r[4:] in found} - found
        found |= new
        grew = bool(new)
    return sorted(found)


def test_vt_answers_recomputed(gen):
    for i in range(3):
        row = gen.sample("vt", 4096, i)
        value = re.search(r"assigned the value (\d+)", row["question"]).group(1)
        assert sorted(row["answers"]) == _vt_answer(row["context"], value)
        assert len(row["answers"]) == 5


def test_cwe_answers_recomputed(gen):
    row = gen.sample("cwe", 4096, 1)
    entries = re.findall(r"(\d+)\. (\w+)", row["context"])
    assert [int(n) for n, _ in entries] == list(range(1, len(entries) + 1))
    counts = Counter(w for _, w in entries)
    top = [w for w, _ in counts.most_common(10)]
    assert sorted(top) == sorted(row["answers"])
    assert min(counts[w] for w in top) > max(c for w, c in counts.items() if w not in top)


def test_fwe_answers_recomputed(gen):
    for i in range(2):
        row = gen.sample("fwe", 4096, i)
        counts = Counter(w for w in row["context"].split() if w != "...")
        ranked = counts.most_common()
        assert sorted(w for w, _ in ranked[:3]) == sorted(row["answers"])
        assert ranked[2][1] > ranked[3][1]


def test_qa_gold_documents(gen):
    squad = parse_squad(make_squad())
    for task in ("qa_1", "qa_2"):
        row = gen.sample(task, 4096, 2)
        docs = re.split(r"(?:^|\n\n)Document \d+:\n", row["context"])[1:]
        assert len(docs) == row["num_docs"] and len(set(docs)) == len(docs)
        gold = [docs[p - 1] for p in row["gold_positions"]]
        assert row["question"].startswith("Answer the question based on the given documents.")
        if task == "qa_1":
            qa = next(q for q in squad if q.id == row["question_id"])
            assert gold == [qa.paragraph] and row["answers"][0] in gold[0]
            # Same-article paragraphs come first as distractors.
            assert sum(d in qa.article for d in docs) >= min(len(qa.article), row["num_docs"]) - 1
        else:
            assert len(gold) == 2 and all(g.startswith("Page ") for g in gold)
    # The same question is asked at every length.
    assert gen.sample("qa_1", 2048, 5)["question"] == gen.sample("qa_1", 4096, 5)["question"]


def test_squad_pool_runs_out_gracefully(tok, caplog):
    small = RulerGenerator(tok, squad=make_squad(articles=1, paragraphs=4))
    row = small.sample("qa", 8192, 0)
    assert row["task"] == "qa_1" and row["num_docs"] == 4 and row["context_tokens"] < 4000
    assert "ran out" in caplog.text


def test_errors_name_the_problem(tok, gen):
    bare = RulerGenerator(tok)
    with pytest.raises(ValueError, match="unknown RULER task 'niah_single_9'"):
        bare.sample("niah_single_9", 4096, 0)
    with pytest.raises(ValueError, match="needs an essay haystack"):
        bare.sample("niah_multikey_1", 4096, 0)
    with pytest.raises(ValueError, match="needs SQuAD"):
        bare.sample("qa_1", 4096, 0)
    with pytest.raises(ValueError, match="needs HotpotQA"):
        bare.sample("qa_2", 4096, 0)
    with pytest.raises(ValueError, match="too short|no room"):
        gen.sample("cwe", 600, 0)
    with pytest.raises(ValueError, match="essay haystack is empty"):
        RulerGenerator(tok, essay="   ")
    with pytest.raises(ValueError, match=r"paragraphs\[0\]: field 'context'"):
        parse_squad({"data": [{"title": "t", "paragraphs": [{"qas": []}]}]}, source="s.json")
    with pytest.raises(ValueError, match="no answerable"):
        parse_squad({"data": [{"title": "t", "paragraphs": [{"context": "c", "qas": []}]}]})
    assert resolve_task("qa") == "qa_1"


def test_cli_writes_parquet(tmp_path, smollm2_dir):
    from memagent_cli.main import main

    essay = tmp_path / "essay.txt"
    essay.write_text(make_essay())
    out = tmp_path / "ruler"
    assert main(["synth", "ruler", "--tasks", "vt,niah_single_2", "--lengths", "2k,3000", "--samples", "2",
                 "--haystack", str(essay), "--out", str(out), "--tokenizer", str(smollm2_dir)]) == 0
    table = pq.read_table(out / "part-00000.parquet")
    assert table.schema.equals(RULER_SCHEMA) and table.num_rows == 8
    assert sorted({(r["task"], r["length"]) for r in table.to_pylist()}) == [
        ("niah_single_2", 2048), ("niah_single_2", 3000), ("vt", 2048), ("vt", 3000)]


def test_shipped_samples_are_the_default_sources(tok):
    """qa_1 / qa_2 read the SQuAD and HotpotQA dev samples shipped in the package by default."""
    gen = RulerItems(tasks=["qa_1", "qa_2"], lengths=[4096]).generator(tok)
    for task, length in (("qa_1", 4096), ("qa_2", 8192)):
        row = gen.sample(task, length, 0)
        assert 0.97 * length <= _total(tok, row) <= length
