"""Grounding: the char span of the document each extracted value came from.

:func:`locate` finds one value of a kind (:mod:`memagent.extraction.kinds`) in the text, in
three stages, inside a window (the text a call read) and, for document-level fields only, then in
the whole document; stage 3 only when stages 1 and 2 found nothing. The first match wins:

1. **exact**: the value as the JSON writes it (``Harlow Freight Ltd``, ``48250``, ``2021-03-14``);
2. **normalised**: case-, whitespace- and punctuation-insensitive (curly quotes, dashes) in every
   surface form of the kind (``48,250.00``; ``March 14, 2021``, ``14.03.2021``, ``2021年3月14日``),
   numbers and dates also by value: any number or date the text writes, however it is spelled
   (:mod:`memagent.extraction.spellings`: ``1,250.00``, ``1.250,00``, ``1 250,00 EUR`` with U+00A0,
   ``1'250``, ``(1,250.00)`` for -1250; ``Mar 14th, 2021``, ``2021.3.14``), its span the number with
   its sign and without the currency;
3. **fuzzy** (free text only: strings, enum labels, array items of at least
   :data:`FUZZY_MIN_CHARS`): the best alignment (``difflib``'s ratio, case-folded) of the value
   against windows of the text seeded by its rarest character n-grams, kept at or above
   :data:`FUZZY_THRESHOLD`.

Matches may not cut a word (``25`` is not found inside ``250``), except next to CJK text, which
has no word boundaries (``東京`` is found in ``東京都``), nor a number (1037.5 is not in ``11,037.50``);
a number is not found inside a date (an amount of 2020 is not in ``2020-08-08`` nor in ``March 8,
2020``, 4 not in ``14.04.2021``: a small model's made-up amounts would otherwise pass as grounded by
every date). Booleans have no span. A document's numbers and dates are scanned once and kept in a
cache bounded in bytes (:data:`SCAN_CACHE_BYTES`, the texts included).

Records are grounded where they were read: :mod:`memagent.extraction.record_grounding`.
:func:`value_evidence` is the
document-level fields' evidence (``field_evidence``): exact and normalised stages only, as the
output documents it.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Literal

from memagent.attribution import _get, memory_steps
from memagent.extraction.kinds import ITEM_KIND, KINDS, FieldKind, parse_date, parse_number
from memagent.extraction.spellings import Scan, ScanCache, in_date, scan

FUZZY_THRESHOLD = 0.85  # difflib ratio 2*matches/(len a + len b) of value and span, case-folded
FUZZY_MIN_CHARS = 5  # shorter values are found exactly or not at all (a fuzzy 4-letter match is noise)
MAX_SEEDS = 4  # rarest n-grams of a value whose occurrences seed fuzzy candidates
MAX_CANDIDATES = 24  # candidate windows scored per value and window
MAX_OCCURRENCES = 5000  # occurrences of one n-gram looked at

Method = Literal["exact", "normalised", "fuzzy"]
Where = Literal["window", "memory", "elsewhere"]
_CJK = re.compile(r"[\u2e80-\u2fff\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
                  r"\uff66-\uff9f]")
_NUMBER_EDGE_BEFORE = re.compile(r"\d[.,'\u2019\u00a0\u202f\u2009]$")
_NUMBER_EDGE_AFTER = re.compile(r"[.,'\u2019\u00a0\u202f\u2009]\d")
_PUNCT = {"'": "['\u2018\u2019]", '"': "[\"\u201c\u201d]", "-": "[-\u2010-\u2015]", ",": ",?"}


@dataclass(frozen=True)
class Span:
    """Where a value is written: ``text[start:end]``, the stage that found it, its similarity, and where
    the match lies relative to the call that read it (records; see the module docstring)."""

    start: int
    end: int
    method: Method
    score: float = 1.0
    where: Where = "window"

    @property
    def grounding(self) -> str:
        """The label the output carries: the method inside the window, else ``memory`` or ``elsewhere``."""
        return self.method if self.where == "window" else self.where


def _word(c: str) -> bool:
    return c.isalnum() and not _CJK.match(c)


def bounded(text: str, start: int, end: int, numeric: bool = False) -> bool:
    """The span does not cut a word (CJK characters are no word characters: no boundaries there), nor,
    when ``numeric``, a number (``250`` is not in ``1,250.00``)."""
    if start > 0 and _word(text[start - 1]) and _word(text[start]) \
            or end < len(text) and end > start and _word(text[end]) and _word(text[end - 1]):
        return False
    return not numeric or not (_NUMBER_EDGE_BEFORE.search(text, max(0, start - 2), start)
                               or _NUMBER_EDGE_AFTER.match(text, end) or in_date(text, start, end))


def _pattern(form: str) -> str:
    """A case-insensitive regex of a surface form: any whitespace run, quote and dash variants, optional commas."""
    out = []
    for part in re.split(r"(\s+)", form.strip()):
        if part.isspace():
            out.append(r"\s+")
        else:
            out.append("".join(_PUNCT.get(c, re.escape(c)) for c in part))
    return "".join(out)


@functools.lru_cache(maxsize=4096)
def _regex(forms: tuple[str, ...]) -> re.Pattern[str]:
    alternatives = sorted({_pattern(f) for f in forms if f.strip()}, key=len, reverse=True)
    return re.compile("|".join(f"(?:{a})" for a in alternatives), re.IGNORECASE)


_SCAN_CACHED_FROM = 2_000  # characters: a text this long (a document, a long memory) keeps its scan
SCAN_CACHE_BYTES = 64 << 20  # texts and scans held; a 1M-token ledger holds ~7 MiB (benchmarks/grounding_cost.py)
_scans = ScanCache(SCAN_CACHE_BYTES)


def _scan(text: str) -> Scan:
    """Every number and date of ``text`` with their readings (:func:`memagent.extraction.spellings.scan`): one
    scan per document (short texts, cheap to scan and many, are scanned each time and never push one out)."""
    return _scans(text) if len(text) >= _SCAN_CACHED_FROM else scan(text)


def _first_exact(text: str, needle: str, lo: int, hi: int, numeric: bool) -> tuple[int, int] | None:
    i = text.find(needle, lo, hi)
    while i != -1:
        if bounded(text, i, i + len(needle), numeric):
            return i, i + len(needle)
        i = text.find(needle, i + 1, hi)
    return None


def _normalised(kind: FieldKind, value: Any, forms: tuple[str, ...], text: str, lo: int,
                hi: int) -> Iterator[tuple[int, int, Method]]:
    """The normalised stage's matches in ``text[lo:hi]``: the forms' regex (``exact`` where the first form is
    written as is), then, for a number or a date, every token of the text that reads as its value (``normalised``)."""
    by_value = KINDS[kind].by_value
    if forms:
        for m in _regex(forms).finditer(text, lo, hi):
            if m.end() > m.start() and bounded(text, m.start(), m.end(), by_value == "number"):
                yield m.start(), m.end(), "exact" if m.group() == forms[0] else "normalised"
    if by_value == "number" and (v := parse_number(value)) is not None:
        yield from ((s, e, "normalised") for s, e in _scan(text).numbers.matches(v, lo, hi))
    elif by_value == "date" and (d := parse_date(value)) is not None:
        yield from ((s, e, "normalised") for s, e in _scan(text).dates.matches(float(d.toordinal()), lo, hi))


def _first_normalised(kind: FieldKind, value: Any, forms: tuple[str, ...], text: str, lo: int,
                      hi: int) -> tuple[int, int] | None:
    return next(((s, e) for s, e, _ in _normalised(kind, value, forms, text, lo, hi)), None)


def _fuzzy(value: str, text: str, lo: int, hi: int, threshold: float) -> Span | None:
    """The best alignment of ``value`` in ``text[lo:hi]`` at or above ``threshold`` (see the module docstring)."""
    window = text[lo:hi]
    low = window.lower()
    if len(low) != len(window):  # a case mapping that changes lengths: compare as written
        low = window
    v = " ".join(value.lower().split())
    n = 3 if len(v) >= 8 else 2
    grams = {v[i:i + n]: i for i in range(len(v) - n + 1) if v[i:i + n].strip()}
    counts = sorted(((low.count(g), i, g) for g, i in grams.items()), key=lambda t: (t[0], t[1]))
    votes: dict[int, int] = {}
    for count, i, g in [c for c in counts if c[0]][:MAX_SEEDS]:
        at = low.find(g)
        for _ in range(min(count, MAX_OCCURRENCES)):
            votes[at - i] = votes.get(at - i, 0) + 1
            at = low.find(g, at + 1)
    best: tuple[float, int, int] | None = None
    slack = max(2, len(v) // 4)
    for start, _ in sorted(votes.items(), key=lambda kv: (-kv[1], kv[0]))[:MAX_CANDIDATES]:
        a, b = max(0, start - slack), min(len(low), start + len(v) + slack)
        blocks = [m for m in difflib.SequenceMatcher(None, v, low[a:b], autojunk=False).get_matching_blocks()
                  if m.size]
        if not blocks:
            continue
        s, e = a + blocks[0].b, a + blocks[-1].b + blocks[-1].size
        while s > 0 and _word(low[s - 1]) and _word(low[s]):  # whole words only (none in CJK text)
            s -= 1
        while e < len(low) and _word(low[e]) and _word(low[e - 1]):
            e += 1
        if not bounded(text, lo + s, lo + e):  # a word the window's edge cuts is no match
            continue
        score = difflib.SequenceMatcher(None, v, " ".join(low[s:e].split()), autojunk=False).ratio()
        if score >= threshold and (best is None or score > best[0]):
            best = (score, s, e)
    return Span(lo + best[1], lo + best[2], "fuzzy", round(best[0], 4)) if best else None


def locate(kind: FieldKind, value: Any, text: str | None, window: tuple[int, int] | None = None, *,
           fuzzy: bool = True, threshold: float = FUZZY_THRESHOLD, document: bool = True) -> Span | None:
    """The span of one value of ``kind`` in ``text``, searched in ``window`` (the chunk) first, then (with
    ``document``) in the whole text; None when not found. For an array kind, ``value`` is one item.
    """
    kind = ITEM_KIND.get(kind, kind)
    k = KINDS[kind]
    if not text or value is None or not k.grounded:
        return None
    areas = [(0, len(text))]
    if window is not None and window[0] is not None and window[1] is not None:
        lo, hi = max(0, int(window[0])), min(len(text), int(window[1]))
        if not document:
            areas = [(lo, hi)] if lo < hi else []
        elif (lo, hi) != (0, len(text)) and lo < hi:
            areas.insert(0, (lo, hi))
    forms = tuple(k.forms(value))
    for lo, hi in areas:  # the chunk, then the document; a written form anywhere beats a fuzzy match
        if forms and (found := _first_exact(text, forms[0], lo, hi, k.by_value == "number")):
            return Span(*found, "exact")
        if found := _first_normalised(kind, value, forms, text, lo, hi):
            return Span(*found, "normalised")
    if fuzzy and k.fuzzy and isinstance(value, str) and len(value.strip()) >= FUZZY_MIN_CHARS:
        for lo, hi in areas:
            if found_fuzzy := _fuzzy(value.strip(), text, lo, hi, threshold):
                return found_fuzzy
    return None


MAX_OCCURRENCES_NEAR = 256  # occurrences of one value weighed when a record's values are re-anchored


def occurrences(kind: FieldKind, value: Any, text: str, window: tuple[int, int]) -> list[Span]:
    """Every exact or normalised match of one value in ``text[window[0]:window[1]]``, in text order."""
    kind = ITEM_KIND.get(kind, kind)
    out: dict[int, Span] = {}
    for s, e, method in _normalised(kind, value, tuple(KINDS[kind].forms(value)), text, *window):
        out.setdefault(s, Span(s, e, method))
        if len(out) >= MAX_OCCURRENCES_NEAR:
            break
    return [out[i] for i in sorted(out)]


# -- document-level fields' evidence -----------------------------------------------------------------


def value_evidence(kind: FieldKind, value: Any, steps: Iterable[Any] | None,
                   context: str | None) -> tuple[Any, Any, Any]:
    """(step, char_start, char_end) of one value: the first memory holding it, its span in the document
    (inside the chunk that memory step read when it is there; exact and normalised stages)."""
    step = chunk = None
    for s in memory_steps(steps):
        memory = _get(s, "memory")
        if memory and locate(kind, value, memory, fuzzy=False):
            step, chunk = _get(s, "step"), (_get(s, "char_start"), _get(s, "char_end"))
            break
    span = locate(kind, value, context, chunk, fuzzy=False)
    return (step, span.start, span.end) if span else (step, None, None)
