"""JSON-Schema constrained decoding for the hf engine: a :class:`TokenConstraint` per reply, over llguidance.

The grammar is compiled from :func:`~memagent.engines.json_schema.render_schema` of the user's
schema (the bounded schema every engine constrains to). The reply is compact (``,`` and ``:``,
no whitespace: tokens go to values, not indentation) and its keys come in the schema's order
(optional ones may be left out). A record type's per-chunk reply is an array of such objects
(``tests/test_grammar.py`` decodes both with a random model).

**Library: llguidance**, chosen by measurement against xgrammar and outlines-core (the figures
and the method, ``benchmarks/grammar.py``, are in benchmarks/README.md, "Constrained decoding"):
as fast as xgrammar, 1 GB lighter to install, and vLLM's ``guidance`` structured-outputs backend,
which the vllm engine selects, so hf and vLLM decode under the same grammar library. A matcher
for a new reply is a ``deep_copy`` of a cached, warmed one. Works with llguidance 1.7 (vLLM 0.29
pins ``<1.8``) as with 1.9. Schemas reach it with every ``$ref`` a local pointer
(:func:`~memagent.json_refs.resolve_refs`: references through an ``$id`` resolved).

**Special tokens never spell a literal.** Where the grammar forces a literal (an ``enum`` or ``const``
value, a property name, a pattern's fixed text) llguidance's mask offers the literal's canonical
tokenization, which for text such as ``<|im_end|>`` is the special token itself: decoded, it would end
the reply (EOS) or vanish from it (skipped in the text). So the tokenizer's special tokens and added
vocabulary are masked everywhere but the end of a complete value (EOS), and where the mask offered only
such a token, the plain-text tokens that begin its text are offered instead (the grammar accepts them:
the literal is bytes, whichever tokens spell it).

Caches: the llguidance tokenizer per (tokenizer, vocabulary size), the compiled matcher per
(schema text, tokenizer); both are small and bounded.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import torch

from memagent.engines.constraint import TokenConstraint
from memagent.engines.json_schema import render_schema

_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
_MAX_CACHED = 64


class _LRU:
    """A small thread-safe LRU map (the engine decodes on its own thread; tests call from others)."""

    def __init__(self, size: int):
        self.size, self.items, self.lock = size, OrderedDict(), threading.Lock()

    def get_or_make(self, key: Any, make: Any) -> Any:
        with self.lock:
            if key in self.items:
                self.items.move_to_end(key)
                return self.items[key]
        value = make()  # outside the lock: a tokenizer takes seconds; a duplicate is harmless
        with self.lock:
            self.items[key] = value
            while len(self.items) > self.size:
                self.items.popitem(last=False)
        return value


_TOKENIZERS = _LRU(8)
_MATCHERS = _LRU(_MAX_CACHED)
_SPELLINGS = _LRU(8)


def _tokenizer_vocab(tokenizer: Any) -> int:
    """Ids the tokenizer can produce (added tokens included)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    n = backend.get_vocab_size(with_added_tokens=True) if backend is not None else 0
    return max(n, len(tokenizer))


def added_token_ids(tokenizer: Any) -> list[int]:
    """Ids of the tokenizer's special tokens and added vocabulary (``<|im_end|>``, ``<tool_call>``, ...)."""
    ids = set(getattr(tokenizer, "added_tokens_decoder", {}) or {}) | set(getattr(tokenizer, "all_special_ids", []))
    return sorted(i for i in ids if isinstance(i, int) and i >= 0)


class _TextSpellings:
    """For each special or added token: the plain tokens that begin its text (``<``, ``<|``, ...)."""

    def __init__(self, tokenizer: Any, ll_tok: Any, n: int):
        self.ids = torch.tensor([i for i in added_token_ids(tokenizer) if i < n], dtype=torch.long)
        special = set(self.ids.tolist())
        self.starts: dict[int, list[int]] = {}
        for i in self.ids.tolist():
            text = tokenizer.convert_ids_to_tokens(i)
            text = tokenizer.convert_tokens_to_string([text]) if isinstance(text, str) else ""
            firsts = {ll_tok.greedy_tokenize(text[:k])[0] for k in range(1, len(text) + 1)
                      if len(ll_tok.greedy_tokenize(text[:k])) == 1}
            self.starts[i] = sorted(t for t in firsts if t not in special and t < n)


def _ll_tokenizer(tokenizer: Any) -> tuple[Any, int]:
    """llguidance's view of ``tokenizer`` (built once per tokenizer: it takes seconds) and its size."""
    import llguidance.hf

    n = _tokenizer_vocab(tokenizer)

    def make() -> Any:
        if tokenizer.eos_token_id is None:
            raise ValueError("constrained decoding needs a tokenizer with an EOS token")
        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=n, eos_token=tokenizer.eos_token_id)

    # id(): tokenizers are not hashable by content; the entry keeps the object alive, so the id
    # cannot be reused by another tokenizer while cached.
    return _TOKENIZERS.get_or_make((id(tokenizer), n), lambda: (tokenizer, make()))[1], n


def _spellings(tokenizer: Any) -> _TextSpellings:
    ll_tok, n = _ll_tokenizer(tokenizer)
    return _SPELLINGS.get_or_make((id(tokenizer), n), lambda: (tokenizer, _TextSpellings(tokenizer, ll_tok, n)))[1]


def _template_matcher(schema_json: str, tokenizer: Any) -> Any:
    """A warmed matcher for ``schema_json`` (compiled once); each reply decodes with a deep copy."""
    import llguidance

    ll_tok, _ = _ll_tokenizer(tokenizer)

    def make() -> Any:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(render_schema(schema_json)), defaults=_JSON_OPTIONS)
        matcher = llguidance.LLMatcher(ll_tok, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"json_schema cannot be compiled to a grammar: {matcher.get_error()}")
        matcher.compute_bitmask()  # builds the lexer states the first mask needs, once for all copies
        return matcher

    # The entry holds the tokenizer too, so its id stays unique while the entry lives.
    return _MATCHERS.get_or_make((schema_json, id(tokenizer)), lambda: (tokenizer, make()))[1]


class JsonSchemaConstraint:
    """One reply's grammar state (implements :class:`~memagent.engines.constraint.TokenConstraint`).

    ``vocab_size`` is the model's logits width; ids at or past the tokenizer's vocabulary
    (embedding padding) are always masked.
    """

    def __init__(self, matcher: Any, tokenizer_vocab: int, vocab_size: int, eos_token_id: int,
                 spellings: _TextSpellings):
        self._m = matcher
        self._n = tokenizer_vocab
        self.vocab_size = vocab_size
        self._eos = eos_token_id
        self._bits = torch.zeros((self._n + 31) // 32, dtype=torch.int32)
        self._spellings = spellings

    def allowed(self) -> torch.Tensor:
        """Bool ``[tokenizer vocab]``: the tokens the grammar allows next, never a special or added token
        but EOS at the end of a complete value (the module's docstring says why)."""
        self._m.unsafe_compute_mask_ptr(self._bits.data_ptr(), self._bits.numel() * 4)
        bits = np.unpackbits(self._bits.numpy().view(np.uint8), bitorder="little")[: self._n]
        allowed = torch.from_numpy(bits.view(np.bool_))
        specials = self._spellings.ids
        offered = specials[allowed[specials]].tolist()
        if not offered:
            return allowed
        allowed[specials] = False
        for token in offered:
            if token == self._eos and self._m.is_accepting():
                allowed[token] = True  # the end of the value
                continue
            for start in self._spellings.starts.get(token, []):  # the literal's text in plain tokens
                allowed[start] = allowed[start] or self._m.validate_tokens([start]) == 1
        return allowed

    def mask_logits(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.shape[-1] != self.vocab_size:
            raise ValueError(f"logits have {logits.shape[-1]} entries, the constraint expects {self.vocab_size}")
        allowed = self.allowed().to(logits.device, non_blocking=True)
        n = min(self._n, self.vocab_size)
        logits[..., :n].masked_fill_(~allowed[:n], float("-inf"))
        logits[..., n:] = float("-inf")
        return logits

    def accept(self, token: int) -> bool:
        token = int(token)
        if not 0 <= token < self._n or self._m.is_error():
            return False
        if token != self._eos and token in self._spellings.starts:  # special: never inside a value
            return False
        if token == self._eos:  # validate_tokens never counts EOS; it ends a complete value only
            if not self._m.is_accepting():
                return False
        elif self._m.validate_tokens([token]) != 1:
            return False
        if not self._m.consume_token(token):  # pragma: no cover - validated just above
            raise RuntimeError(f"grammar refused token {token} it had allowed: {self._m.get_error()}")
        return True

    def is_finished(self) -> bool:
        return self._m.is_stopped() and not self._m.is_error()


def make_constraint(schema_json: str, tokenizer: Any, vocab_size: int) -> TokenConstraint:
    """A fresh constraint that holds one reply to ``schema_json`` (JSON Schema text), for a model
    whose logits have ``vocab_size`` entries and whose tokenizer is ``tokenizer`` (a fast HF one).

    Raises ``ValueError`` for a schema that is not a JSON object or cannot be compiled.
    """
    template = _template_matcher(schema_json, tokenizer)
    _, n = _ll_tokenizer(tokenizer)
    return JsonSchemaConstraint(template.deep_copy(), n, vocab_size, tokenizer.eos_token_id, _spellings(tokenizer))
