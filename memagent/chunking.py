"""Cut a document into chunks of the policy's tokens, keeping each chunk's span in the text.

The document is tokenised once (no special tokens, as the paper). Chunk ``k`` holds tokens
``[k*C, (k+1)*C)``; its text is the slice of the original string from the first character of
its first token to the first character of the next chunk, so the chunks tile the document
exactly and every memory in a trace points back to the text it was written from.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from memagent.bpe_offsets import tiktoken_bpe_for, tiktoken_offsets

# Long texts are tokenised in pieces of about this many characters, in parallel (encode_batch),
# when cutting there provably gives the same tokens (see _safe_to_split): BPE on one huge string
# is slower per token than on many small ones, and needs several bytes of alignment per character.
PIECE_CHARS = 64_000


class OffsetTokenizer(Protocol):
    """The part of a Hugging Face fast tokenizer that chunking needs."""

    def __call__(self, text: str, **kwargs: object) -> object: ...


@dataclass(frozen=True)
class Chunk:
    """One chunk: its index among all chunks of the full document and its span in the text."""

    index: int
    token_start: int
    token_end: int
    char_start: int
    char_end: int
    text: str

    @property
    def n_tokens(self) -> int:
        return self.token_end - self.token_start


@dataclass(frozen=True)
class ChunkedDocument:
    """The chunks an agent reads, plus what centre truncation dropped (if anything)."""

    chunks: list[Chunk]
    context_tokens: int
    truncated: bool
    dropped_char_span: tuple[int, int] | None = None


def token_offsets(tokenizer: OffsetTokenizer, text: str) -> list[tuple[int, int]]:
    """Character ``(start, end)`` of every token of ``text`` (no special tokens added).

    Shape: one pair per token, ``len == n_tokens``.
    """
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]  # type: ignore[index]
    return [(int(a), int(b)) for a, b in offsets]


class LazyOffsets(Sequence):
    """Character ``(start, end)`` of every token, read from tokenizer encodings on demand.

    Chunking needs the offsets of a few tokens only (chunk starts), so the per-token Python
    list of :func:`token_offsets` (about 150 bytes a token) is never built. Holds one encoding
    per piece of the text; ``char_bases[i]`` is where piece ``i`` starts in the text.
    """

    def __init__(self, encodings: list[Any], char_bases: list[int]):
        self._encodings = encodings
        self._bases = char_bases
        self._token_bases = [0]
        for e in encodings:
            self._token_bases.append(self._token_bases[-1] + len(e))

    def __len__(self) -> int:
        return self._token_bases[-1]

    def __getitem__(self, t: int) -> tuple[int, int]:  # type: ignore[override]
        if t < 0:
            t += len(self)
        if not 0 <= t < len(self):
            raise IndexError(t)
        piece = bisect_right(self._token_bases, t) - 1
        a, b = self._encodings[piece].token_to_chars(t - self._token_bases[piece])
        base = self._bases[piece]
        return (a + base, b + base)


def _safe_to_split(backend: Any) -> bool:
    """True for byte-level BPE with the GPT-2 split regex and no normaliser (SmolLM2, GPT-2, Qwen...).

    Its pre-tokeniser never lets a piece span a space that follows a non-space character, so
    cutting the text right before such a space yields exactly the tokens (and offsets) of the
    whole text. Anything else (normalisers, Metaspace/SentencePiece prefixes) is encoded whole.
    """
    pre = getattr(backend, "pre_tokenizer", None)
    return (backend.normalizer is None and type(pre).__name__ == "ByteLevel"
            and bool(getattr(pre, "use_regex", False)) and not getattr(pre, "add_prefix_space", True))


def _split_points(text: str, piece_chars: int) -> list[int]:
    """Piece starts: 0, then a space preceded by a non-space, about every ``piece_chars`` characters."""
    starts = [0]
    i = piece_chars
    while i < len(text):
        j = text.find(" ", i)
        while j > 0 and text[j - 1].isspace():
            j = text.find(" ", j + 1)
        if j <= 0:
            break
        starts.append(j)
        i = j + piece_chars
    return starts


def document_offsets(tokenizer: OffsetTokenizer, text: str, piece_chars: int = PIECE_CHARS) -> Sequence[tuple[int, int]]:
    """Token offsets of ``text`` (no special tokens) as a sequence; same values as :func:`token_offsets`.

    A long text under plain byte-level BPE goes through tiktoken (:mod:`memagent.bpe_offsets`,
    about 20x faster). Otherwise, with a fast (Rust) tokenizer, the offsets stay in its
    encodings (:class:`LazyOffsets`) and a long text is encoded in pieces in parallel where
    that cannot change the tokens.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return token_offsets(tokenizer, text)
    if len(text) > piece_chars and (bpe := tiktoken_bpe_for(tokenizer)) is not None:
        fast = tiktoken_offsets(bpe, text)
        if fast is not None:
            return fast
    starts = _split_points(text, piece_chars) if len(text) > piece_chars and _safe_to_split(backend) else [0]
    if len(starts) == 1:
        return LazyOffsets([backend.encode(text, add_special_tokens=False)], [0])
    pieces = [text[a:b] for a, b in zip(starts, starts[1:] + [len(text)])]
    return LazyOffsets(backend.encode_batch(pieces, add_special_tokens=False), starts)


def chunk_boundaries(offsets: Sequence[tuple[int, int]], text_len: int, token_starts: Sequence[int]) -> list[int]:
    """Character position where each chunk starts; chunk k ends where chunk k+1 starts.

    A chunk starts at its first token's first character, except the first chunk, which starts
    at 0 so that leading whitespace is not lost.
    """
    return [0 if t == 0 else offsets[t][0] for t in token_starts] + [text_len]


def chunk_document(
    tokenizer: OffsetTokenizer, text: str, chunk_tokens: int, max_chunks: int | None = None
) -> ChunkedDocument:
    """Split ``text`` into chunks of ``chunk_tokens`` tokens (the last may be shorter).

    With ``max_chunks`` and a longer document, keep the first ``ceil(max_chunks/2)`` chunks and
    the last ``floor(max_chunks/2)`` full chunks' worth of tokens and drop the middle (centre
    truncation, as the paper's training did); ``truncated`` is then True. Chunk indices stay
    those of the untruncated document.
    """
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    offsets = document_offsets(tokenizer, text)
    n = len(offsets)
    n_chunks = -(-n // chunk_tokens)
    starts = list(range(0, n, chunk_tokens))
    ends = [min(s + chunk_tokens, n) for s in starts]
    indices = list(range(n_chunks))
    truncated = max_chunks is not None and n_chunks > max_chunks
    dropped: tuple[int, int] | None = None
    if truncated:
        assert max_chunks is not None
        head = -(-max_chunks // 2)
        tail = max_chunks - head
        tail_start = n - tail * chunk_tokens
        tail_starts = [tail_start + i * chunk_tokens for i in range(tail)]
        starts = starts[:head] + tail_starts
        ends = [min(s + chunk_tokens, n) for s in starts]
        # Indices name the chunk's position in the untruncated grid (by its first token).
        indices = list(range(head)) + [s // chunk_tokens for s in tail_starts]
    bounds = chunk_boundaries(offsets, len(text), starts)
    chunks: list[Chunk] = []
    for i, (s, e, idx) in enumerate(zip(starts, ends, indices)):
        c0 = bounds[i]
        # Next kept chunk's start, unless the middle was dropped right after this chunk.
        c1 = bounds[i + 1] if (e == n if i + 1 == len(starts) else starts[i + 1] == e) else offsets[e][0]
        chunks.append(Chunk(idx, s, e, c0, c1, text[c0:c1]))
    if truncated:
        gap = next((i for i in range(len(chunks) - 1) if chunks[i].char_end != chunks[i + 1].char_start), None)
        # max_chunks=1 keeps no tail: the middle dropped is everything after the head.
        dropped = (chunks[gap].char_end, chunks[gap + 1].char_start) if gap is not None \
            else (chunks[-1].char_end, len(text))
    return ChunkedDocument(chunks=chunks, context_tokens=n, truncated=truncated, dropped_char_span=dropped)
