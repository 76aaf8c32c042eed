"""Templates, answer extraction and every verifier on edge cases."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from memagent.config import PRESETS
from memagent.prompts import (
    NO_MEMORY,
    extract_answer,
    extract_boxed_answer,
    extract_phrase_answer,
    final_answer_messages,
    last_boxed,
    memory_update_messages,
    parse_json_answer,
)
from memagent.verify import boxed_em, contains_any, em, f1, normalize_answer, score, string_match_all, sub_em


def test_memory_prompt_orders_static_text_first():
    content = memory_update_messages("Q?", "MEM", "CHUNK")[0]["content"]
    assert content.index("Q?") < content.index("MEM") < content.index("CHUNK")
    assert content.rstrip().endswith("Updated memory:")
    assert "<section>" in content and "<memory>" in content and "<problem>" in content


@pytest.mark.parametrize("style", ["boxed", "phrase", "json"])
def test_final_prompt_has_no_section(style):
    content = final_answer_messages("Q?", "MEM", style)[0]["content"]
    assert "<section>" not in content and "MEM" in content and "Q?" in content
    if style == "boxed":
        assert "\\boxed{}" in content


@pytest.mark.parametrize("name", ["paper", "small", "tiny"])
def test_templates_fit_the_budgets(smollm2_dir, name):
    """A prompt filled to every budget stays within the config's worst-case estimate."""
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    cfg = PRESETS[name]
    overhead = len(tok.apply_chat_template(memory_update_messages("", "", ""), add_generation_prompt=True,
                                           tokenize=True)["input_ids"])
    word = " alpha"  # one token per repeat in this tokenizer
    filled = memory_update_messages(word * cfg.query_tokens, word * cfg.memory_tokens, word * cfg.chunk_tokens)
    n = len(tok.apply_chat_template(filled, add_generation_prompt=True, tokenize=True)["input_ids"])
    assert n <= cfg.max_prompt_tokens(overhead) + 8
    final = final_answer_messages(word * cfg.query_tokens, word * cfg.memory_tokens, "boxed")
    assert len(tok.apply_chat_template(final, add_generation_prompt=True, tokenize=True)["input_ids"]) < n


def test_no_memory_text():
    assert NO_MEMORY == "No previous memory"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"x \boxed{42}", "42"),
        (r"\boxed{a} then \boxed{b}", "b"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\fbox{Paris}", "Paris"),
        (r"\boxed 7$", "7"),
        (r"\boxed{unbalanced", None),
        ("no box", None),
    ],
)
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


def test_boxed_only_in_last_300_chars():
    assert extract_boxed_answer(r"\boxed{early}" + "x" * 400) is None
    assert extract_boxed_answer("<think>\\boxed{draft}</think> \\boxed{final}") == "final"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Therefore, the answer is Paris.", "Paris"),
        ("The answer is 1. Wait, the answer is **2**.", "2"),
        ("THE ANSWER IS: yes\nmore text", "yes"),
        ("<think>the answer is A</think>So the answer is B", "B"),
        ("I do not know", None),
        ("the answer is .", None),
    ],
)
def test_phrase_extraction(text, expected):
    assert extract_phrase_answer(text) == expected


def test_extract_answer_strict_and_fallback():
    assert extract_answer("Paris.", "phrase", strict=True) is None
    assert extract_answer("Paris.", "phrase") == "Paris"
    assert extract_answer("so the answer is Rome", "boxed") == "Rome"
    assert extract_answer("", "phrase") is None


def test_parse_json_answer():
    assert parse_json_answer('{"a": 1}') == {"a": 1}
    assert parse_json_answer('```json\n[1, 2]\n```') == [1, 2]
    assert parse_json_answer('Here you go: {"k": "v"} done') == {"k": "v"}
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_json_answer("no json here")


def test_normalize_answer():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("An apple a day") == "apple day"


def test_sub_em():
    assert sub_em("It is the Roman Empire.", ["Roman Empire"]) == 1.0
    assert sub_em("Roman", ["the Roman Empire"]) == 1.0  # prediction inside gold
    assert sub_em("Greek", ["Roman"]) == 0.0
    assert sub_em(None, ["Roman"]) == 0.0
    assert sub_em("", ["Roman"]) == 0.0
    assert sub_em("Roman", ["Greek", "Roman"]) == 0.0  # only the first reference counts
    assert sub_em("the", ["Roman"]) == 1.0  # paper quirk: normalises to "" -> contained


def test_em_and_f1():
    assert em("the Roman Empire", ["Roman empire"]) == 1.0
    assert em("Roman", ["Roman Empire"]) == 0.0
    assert f1("Roman Empire", ["Roman Empire"]) == 1.0
    assert f1("Roman", ["Roman Empire"]) == pytest.approx(2 / 3)
    assert f1("yes", ["no"]) == 0.0
    assert f1("no answer", ["yes"]) == 0.0
    assert f1(None, ["x"]) == 0.0


def test_string_match_all():
    assert string_match_all("numbers 123 and 456", ["123", "456"]) == 1.0
    assert string_match_all("only 123", ["123", "456"]) == 0.5
    assert string_match_all(None, ["1"]) == 0.0
    assert string_match_all("ABC", ["abc"]) == 1.0
    with pytest.raises(ValueError):
        string_match_all("x", [])


def test_boxed_em_is_strict():
    assert boxed_em(r"... \boxed{Roman Empire}", ["roman empire"]) == 1.0
    assert boxed_em(r"\boxed{ROMAN  EMPIRE}", ["Roman Empire"]) == 1.0  # case and spaces folded
    assert boxed_em(r"\boxed{The Roman Empire}", ["Roman Empire"]) == 0.0  # articles count
    assert boxed_em(r"\boxed{Roman Empire.}", ["Roman Empire"]) == 0.0  # punctuation counts
    assert boxed_em("Roman Empire", ["Roman Empire"]) == 0.0  # no box
    assert boxed_em(r"\boxed{\dfrac{1}{2}}", [r"\frac{1}{2}"]) == 1.0
    assert boxed_em(r"\boxed{x}", ["y", "x"]) == 1.0  # best over references
    assert boxed_em(None, ["x"]) == 0.0


def test_contains_any_and_score_by_name():
    assert contains_any("I think it is PARIS", ["paris"]) == 1.0
    assert contains_any(None, ["paris"]) == 0.0
    assert score("sub_em", "Paris", ["paris"]) == 1.0
    with pytest.raises(ValueError, match="unknown metric"):
        score("bleu", "a", ["a"])
