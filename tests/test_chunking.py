"""Chunking: exact token boundaries, spans that tile the text, centre truncation."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from memagent.chunking import chunk_document, token_offsets


@pytest.fixture(scope="module")
def tok(smollm2_dir):
    return AutoTokenizer.from_pretrained(str(smollm2_dir))


TEXT = "  Leading spaces. " + " ".join(f"Sentence number {i} says ünïcödé → 東京 {i * 7}." for i in range(120)) + "\n"


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_chunks_have_exact_token_counts_and_tile_the_text(tok):
    n = len(ids(tok, TEXT))
    doc = chunk_document(tok, TEXT, chunk_tokens=100)
    assert doc.context_tokens == n and not doc.truncated
    assert len(doc.chunks) == -(-n // 100)
    assert [c.n_tokens for c in doc.chunks[:-1]] == [100] * (len(doc.chunks) - 1)
    assert 0 < doc.chunks[-1].n_tokens <= 100
    # Spans tile the document: no gap, no overlap, first at 0, last at len.
    assert doc.chunks[0].char_start == 0 and doc.chunks[-1].char_end == len(TEXT)
    for a, b in zip(doc.chunks, doc.chunks[1:]):
        assert a.char_end == b.char_start
    assert "".join(c.text for c in doc.chunks) == TEXT
    for c in doc.chunks:
        assert TEXT[c.char_start : c.char_end] == c.text


def test_chunk_boundaries_fall_on_token_starts(tok):
    offsets = token_offsets(tok, TEXT)
    doc = chunk_document(tok, TEXT, chunk_tokens=64)
    for c in doc.chunks[1:]:
        assert c.char_start == offsets[c.token_start][0]
    # Re-tokenising a chunk gives (about) its token count: boundaries may merge a token or two.
    for c in doc.chunks:
        assert abs(len(ids(tok, c.text)) - c.n_tokens) <= 2


def test_short_document_is_one_chunk(tok):
    doc = chunk_document(tok, "Just one line.", chunk_tokens=100)
    assert len(doc.chunks) == 1 and doc.chunks[0].text == "Just one line."


def test_centre_truncation_keeps_head_and_tail(tok):
    n = len(ids(tok, TEXT))
    doc = chunk_document(tok, TEXT, chunk_tokens=50, max_chunks=4)
    assert n > 200 and doc.truncated and len(doc.chunks) == 4
    head, tail = doc.chunks[:2], doc.chunks[2:]
    assert head[0].token_start == 0 and head[1].token_start == 50
    assert tail[-1].token_end == n and tail[0].token_start == n - 100
    assert all(c.n_tokens == 50 for c in doc.chunks)
    assert doc.chunks[0].char_start == 0 and doc.chunks[-1].char_end == len(TEXT)
    gap = doc.dropped_char_span
    assert gap == (head[1].char_end, tail[0].char_start) and gap[0] < gap[1]
    for c in doc.chunks:
        assert TEXT[c.char_start : c.char_end] == c.text
    assert tail[-1].index == (n - 50) // 50


def test_odd_max_chunks_keeps_more_head(tok):
    doc = chunk_document(tok, TEXT, chunk_tokens=50, max_chunks=3)
    assert [c.token_start for c in doc.chunks][:2] == [0, 50]
    assert doc.chunks[2].token_end == doc.context_tokens


def test_no_truncation_when_within_cap(tok):
    doc = chunk_document(tok, TEXT, chunk_tokens=10_000, max_chunks=2)
    assert not doc.truncated and doc.dropped_char_span is None


def test_rejects_non_positive_chunk(tok):
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunk_document(tok, TEXT, chunk_tokens=0)


def test_max_chunks_one_keeps_the_head_only(tok):
    doc = chunk_document(tok, TEXT, chunk_tokens=50, max_chunks=1)
    assert doc.truncated and len(doc.chunks) == 1
    (head,) = doc.chunks
    assert head.token_start == 0 and head.n_tokens == 50
    assert head.text == TEXT[head.char_start:head.char_end] and head.char_end < len(TEXT)
    assert doc.dropped_char_span == (head.char_end, len(TEXT))
