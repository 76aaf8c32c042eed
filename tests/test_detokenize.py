"""Incremental detokenization (issue 53, item 1): a streamed reply decodes a window of its last tokens per step.

Replies are generated: text of any Unicode (multi-byte characters split across byte-level tokens,
emoji, CJK, whitespace runs) encoded by the packaged SmolLM2 tokenizer with special tokens among the
ids, or arbitrary vocabulary ids (lone UTF-8 continuation bytes included), split into pieces as an
engine hands them over.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memagent.engines.detokenize import IncrementalText

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def _stream(tokenizer, ids: list[int], sizes: list[int]) -> tuple[IncrementalText, list[str], list[int]]:
    """The deltas of ``ids`` fed in pieces of ``sizes`` (cycled), and the length of every decoded window."""
    windows: list[int] = []

    def decode(window: list[int]) -> str:
        windows.append(len(window))
        return tokenizer.decode(window, skip_special_tokens=True)

    text, deltas, i, k = IncrementalText(decode), [], 0, 0
    while i < len(ids):
        n = sizes[k % len(sizes)]
        deltas.append(text.add(ids[i:i + n]))
        i, k = i + n, k + 1
    return text, deltas, windows


def _with_specials(tokenizer, ids: list[int], where: list[int]) -> list[int]:
    special = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|im_start|>"])
    out = list(ids)
    for j, w in enumerate(where):
        out.insert(w % (len(out) + 1), special[j % 2])
    return out


TEXT = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=300)
SIZES = st.lists(st.integers(1, 4), min_size=1, max_size=5)


@SETTINGS
@given(TEXT, SIZES, st.lists(st.integers(0, 400), max_size=3))
def test_the_deltas_join_into_the_whole_decode(tokenizer, text, sizes, where):
    """The deltas joined, then ``rest()``, equal the whole reply's decode, and what is emitted is a prefix of it.
    (No window bound here: byte-level BPE merges bytes across characters in runs of rare code points, so a
    window may span such a run; the bound on prose is below.)"""
    ids = _with_specials(tokenizer, tokenizer(text, add_special_tokens=False)["input_ids"], where)
    inc, deltas, _ = _stream(tokenizer, ids, sizes)
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    assert "".join(deltas) == inc.text and whole.startswith(inc.text)
    assert inc.text + inc.rest() == whole


@SETTINGS
@given(st.lists(st.integers(0, 49151), max_size=120), SIZES)
def test_arbitrary_ids_never_emit_what_the_whole_decode_lacks(tokenizer, ids, sizes):
    """Any vocabulary ids (broken UTF-8 byte runs included): the emitted text is a prefix of the whole decode,
    and with ``rest()`` equals it."""
    inc, deltas, _ = _stream(tokenizer, ids, sizes)
    whole = tokenizer.decode(ids, skip_special_tokens=True)
    assert whole.startswith(inc.text) and inc.text + inc.rest() == whole


WORDS = ["memory", "the", "Überweisung", "résumé", "façade", "naïve", "漢字", "東京都", "データ", "한국어", "Москва",
         "مرحبا", "שלום", "😀", "👩‍💻", "1,037.50", "2021-03-14", "€", "—", "\n", "  ", "\t"]


@SETTINGS
@given(st.lists(st.sampled_from(WORDS), max_size=200), SIZES)
@example(["résumé", "memory", "مرحبا", "한국어", "한국어", "漢字", "東京都"], [3, 4, 2, 4])  # every step ended mid-character
def test_prose_in_many_scripts_decodes_windows_of_a_few_tokens(tokenizer, words, sizes):
    """Prose of words in many scripts (emoji with joiners, CJK, Hangul, Arabic, numbers) streamed in steps of up
    to 4 tokens decodes windows bounded by the longest word (byte-level BPE may merge bytes across the
    characters of a word, so a word may end a character only at its end), never by the reply's length, even
    when every step ends inside a character; and the deltas join into its decode."""
    ids = tokenizer(" ".join(words), add_special_tokens=False)["input_ids"]
    inc, _, windows = _stream(tokenizer, ids, sizes)
    word = max((len(tokenizer(" " + w, add_special_tokens=False)["input_ids"]) for w in WORDS))
    assert max(windows, default=0) <= 2 * (word + 4), (max(windows), word)
    assert inc.text + inc.rest() == tokenizer.decode(ids, skip_special_tokens=True)


def test_a_long_reply_decodes_flat_windows(tokenizer):
    """A 16K-token reply fed one token at a time never decodes more than a few tokens at once (the old path
    decoded the whole reply at every step)."""
    ids = tokenizer("The memory holds every value the document states, ünïcödé and 漢字 included. " * 800,
                    add_special_tokens=False)["input_ids"][:16384]
    inc, _, windows = _stream(tokenizer, ids, [1])
    assert len(ids) == 16384 and max(windows) <= 8 and len(windows) <= 2 * len(ids)  # rest() not yet asked
    assert inc.text + inc.rest() == tokenizer.decode(ids, skip_special_tokens=True)
