"""Token offsets of long texts through tiktoken: the Hugging Face tokenizer's tokens, ~20x faster.

Chunking a multi-million-token document needs only the token count and where every C-th token
starts. The Hugging Face Rust tokenizer encodes 40-300K tokens/s per core on the target CPU;
tiktoken runs the same byte-level BPE at 1.4-3.8M. For a byte-level BPE tokenizer with the
GPT-2 split regex (SmolLM2, GPT-2, ...), the merge list becomes tiktoken ranks: merged byte
string -> 256 + the index of the first merge producing it. tiktoken merges the adjacent pair
whose merged bytes rank lowest, the merge list the listed pair with the lowest index; the two
agree when every token is built by one merge, which is what BPE training produces (as with
tiktoken's own GPT-2 ranks). The tests compare every offset with the Hugging Face tokenizer's.
Offsets follow from each token's byte length and the text's UTF-8 layout.

Only the token boundaries are used, never the tiktoken ids. A text holding an added token
(which the Hugging Face tokenizer splits out whole) or a byte without a token in the vocabulary
returns None, and the caller encodes it with the Hugging Face tokenizer instead.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# The GPT-2 pre-tokeniser regex that ByteLevel(use_regex=True) applies, in tiktoken's spelling.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@dataclass(frozen=True)
class TiktokenBPE:
    """A tokenizer's BPE as a tiktoken encoding, plus what mapping its tokens back needs.

    ``byte_len[r]`` is the byte length of rank ``r``; ``missing[r]`` is True when that byte
    string has no token in the Hugging Face vocabulary (some single bytes), which the Hugging
    Face tokenizer would not emit.
    """

    encoding: Any  # tiktoken.Encoding
    byte_len: np.ndarray  # [n_ranks] int64
    missing: np.ndarray  # [n_ranks] bool
    added_tokens: tuple[str, ...]


_CACHE: weakref.WeakKeyDictionary[Any, TiktokenBPE | None] = weakref.WeakKeyDictionary()


def _is_plain_byte_level_bpe(spec: dict) -> bool:
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    return (
        spec.get("normalizer") is None
        and model.get("type") == "BPE"
        and not model.get("dropout")
        and not model.get("byte_fallback")
        and not model.get("continuing_subword_prefix")
        and not model.get("end_of_word_suffix")
        and pre.get("type") == "ByteLevel"
        and bool(pre.get("use_regex"))
        and not pre.get("add_prefix_space")
    )


def build_tiktoken_bpe(backend: Any) -> TiktokenBPE | None:
    """The tiktoken twin of a ``tokenizers.Tokenizer``, or None when it is not plain byte-level BPE."""
    try:
        import tiktoken
        from transformers.convert_slow_tokenizer import bytes_to_unicode
    except ImportError:  # pragma: no cover - tiktoken is a dependency; stay correct without it
        return None
    spec = json.loads(backend.to_str())
    if not _is_plain_byte_level_bpe(spec):
        return None
    to_byte = {ch: b for b, ch in bytes_to_unicode().items()}
    vocab_bytes = {bytes(to_byte[c] for c in tok) for tok in spec["model"]["vocab"] if all(c in to_byte for c in tok)}
    ranks = {bytes([b]): b for b in range(256)}
    for i, merge in enumerate(spec["model"]["merges"]):
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        merged = bytes(to_byte[c] for c in left + right)
        ranks.setdefault(merged, 256 + i)
    n_ranks = max(ranks.values()) + 1
    byte_len = np.zeros(n_ranks, dtype=np.int64)
    missing = np.ones(n_ranks, dtype=bool)
    for token, rank in ranks.items():
        byte_len[rank] = len(token)
        missing[rank] = token not in vocab_bytes
    encoding = tiktoken.Encoding("hf-byte-level-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
    added = tuple(t["content"] for t in spec.get("added_tokens", []))
    return TiktokenBPE(encoding, byte_len, missing, added)


def tiktoken_bpe_for(tokenizer: Any) -> TiktokenBPE | None:
    """:func:`build_tiktoken_bpe` of a Hugging Face fast tokenizer, built once per tokenizer object."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        return _CACHE[tokenizer]
    except KeyError:
        pass
    except TypeError:  # not weak-referenceable: build every time
        return build_tiktoken_bpe(backend)
    bpe = _CACHE[tokenizer] = build_tiktoken_bpe(backend)
    return bpe


class ByteOffsets(Sequence):
    """Character ``(start, end)`` of every token, from token byte boundaries, on demand.

    ``token_bytes[t]`` is where token ``t`` starts in the UTF-8 text (``token_bytes[-1]`` is its
    length), shape ``[n_tokens + 1]``. ``char_starts`` holds the byte where each character
    starts, or None for ASCII (byte == character). Like the Hugging Face offsets, a token that
    starts or ends inside a multi-byte character covers that whole character.
    """

    def __init__(self, token_bytes: np.ndarray, char_starts: np.ndarray | None):
        self._bytes = token_bytes
        self._chars = char_starts

    def _char_of(self, byte: int) -> int:
        if self._chars is None:
            return byte
        return int(np.searchsorted(self._chars, byte, side="right")) - 1

    def __len__(self) -> int:
        return len(self._bytes) - 1

    def __getitem__(self, t: int) -> tuple[int, int]:  # type: ignore[override]
        if t < 0:
            t += len(self)
        if not 0 <= t < len(self):
            raise IndexError(t)
        start, end = int(self._bytes[t]), int(self._bytes[t + 1])
        return (self._char_of(start), self._char_of(end - 1) + 1)


def tiktoken_offsets(bpe: TiktokenBPE, text: str) -> ByteOffsets | None:
    """Offsets of ``text``'s tokens (see :class:`ByteOffsets`), or None if it needs the HF tokenizer."""
    if any(token in text for token in bpe.added_tokens):
        return None
    ranks = bpe.encoding.encode_to_numpy(text, disallowed_special=())
    if bpe.missing[ranks].any():
        return None
    token_bytes = np.zeros(len(ranks) + 1, dtype=np.int64)
    np.cumsum(bpe.byte_len[ranks], out=token_bytes[1:])
    char_starts = None
    if not text.isascii():
        raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
        char_starts = np.flatnonzero((raw & 0xC0) != 0x80)
    return ByteOffsets(token_bytes, char_starts)


__all__ = ["ByteOffsets", "TiktokenBPE", "build_tiktoken_bpe", "tiktoken_bpe_for", "tiktoken_offsets"]
