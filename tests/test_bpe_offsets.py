"""tiktoken offsets: the same token boundaries as the Hugging Face tokenizer, or a clean fallback."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import memagent.chunking as chunking
from memagent.bpe_offsets import build_tiktoken_bpe, tiktoken_bpe_for, tiktoken_offsets
from memagent.chunking import chunk_document, document_offsets, token_offsets
from memagent.data.demo import FILLER


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture(scope="module")
def bpe(tok):
    built = tiktoken_bpe_for(tok)
    assert built is not None, "SmolLM2's byte-level BPE should have a tiktoken twin"
    return built


def random_text(seed: int, n: int = 6000) -> str:
    """Words, digits, contractions, whitespace runs, punctuation, accents, CJK and emoji."""
    rng = random.Random(seed)
    atoms = ["the", "The", "memory", "agent", "'s", "'ll", "'re", "don't", "  ", "   ", "\n", "\n\n", "\t",
             " \n ", "12345", "3.14", "1,000", "!!", "?!", "...", "—", "–", "«»", "ünïcödé", "café", "naïve",
             "東京", "日本語の文", "한국어", "Ελληνικά", "Русский", "😀", "👩‍💻", "🇫🇷", "∑x²", "→", "€100",
             "<", ">", "|", "{}", "[]", "#", "@user", "http://x.y/z?a=1", "\u00a0", "\u2003", "Z̤͔ͅ"]
    return "".join(rng.choice(atoms) + rng.choice(["", " ", " ", "  "]) for _ in range(n))


TEXTS = {
    "filler": " ".join(FILLER * 40) + " The special magic number for calm-otter is: 4829113.",
    "random-1": random_text(1),
    "random-2": random_text(2),
    "leading and trailing space": "   starts with spaces and ends with them   \n\n",
}


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_same_offsets_as_the_hugging_face_tokenizer(tok, bpe, name):
    text = TEXTS[name]
    fast = tiktoken_offsets(bpe, text)
    assert fast is not None
    assert list(fast) == token_offsets(tok, text)


def test_negative_and_out_of_range_indices(bpe):
    fast = tiktoken_offsets(bpe, "one two three")
    assert fast[-1] == fast[len(fast) - 1]
    with pytest.raises(IndexError):
        fast[len(fast)]


@pytest.mark.parametrize("text", ["a chat marker <|im_start|> inside the text", "a control byte \x04 here"])
def test_texts_the_twin_cannot_reproduce_fall_back_to_the_hf_tokenizer(tok, bpe, text):
    # An added token is split out whole by HF; a byte without a vocabulary token is dropped by HF.
    assert tiktoken_offsets(bpe, text) is None
    long_text = (text + " ") * 50
    assert list(document_offsets(tok, long_text, piece_chars=64)) == token_offsets(tok, long_text)


def test_document_offsets_takes_the_fast_path_for_long_texts(tok, monkeypatch):
    text = TEXTS["random-1"]
    calls = []
    original = chunking.tiktoken_offsets
    monkeypatch.setattr(chunking, "tiktoken_offsets", lambda b, t: calls.append(len(t)) or original(b, t))
    assert list(document_offsets(tok, text, piece_chars=1000)) == token_offsets(tok, text)
    assert calls == [len(text)]


def test_without_the_twin_the_pieces_path_gives_the_same_offsets(tok, monkeypatch):
    monkeypatch.setattr(chunking, "tiktoken_bpe_for", lambda t: None)
    text = TEXTS["random-2"]
    assert list(document_offsets(tok, text, piece_chars=500)) == token_offsets(tok, text)


def test_chunks_are_the_same_on_either_path(tok, monkeypatch):
    text = TEXTS["random-1"] * 4
    fast = chunk_document(tok, text, chunk_tokens=333)
    monkeypatch.setattr(chunking, "tiktoken_bpe_for", lambda t: None)
    assert chunk_document(tok, text, chunk_tokens=333) == fast


def test_tokenizers_that_are_not_plain_byte_level_bpe_have_no_twin():
    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    assert build_tiktoken_bpe(backend) is None
    fast_tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    assert tiktoken_bpe_for(fast_tok) is None
    assert list(document_offsets(fast_tok, "a a " * 40, piece_chars=8)) == token_offsets(fast_tok, "a a " * 40)
