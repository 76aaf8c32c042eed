"""Numbers and dates as people write them: what a written one may mean, and where a text writes them.

A **written number** is an optional sign, digits in groups, and a decimal part:

- groups marked by ``,`` ``.`` ``'`` (or ``’``), a space, U+00A0, U+202F or U+2009, one mark throughout,
  three digits a group (``1,037``; ``1 037``) or Indian (``1,00,000``: threes, then twos);
- a decimal mark ``.`` or ``,`` that differs from the grouping mark (``1.037,50``, ``1'037.50``);
- negative as ``-`` or U+2212 (``−3``), or in accounting parentheses (``(1,037.50)``); a currency
  symbol may stand between the sign and the digits (``-$1,037.50``, ``($1,037.50)``), and any currency,
  symbol or code (``EUR 1.037,50``, ``1 037,50 €``), before or after the number, is no part of it.

Where a mark may group or end the integer part (``1,037``; ``1.037``), both readings stand
(:func:`number_readings`), the likelier first: a comma before three digits groups, a dot there is
a decimal point. A regular space is also a word space: ``2 450.00`` may be a quantity and a price
(a table row), so a number grouped by regular spaces is read both ways (:func:`scan_numbers`),
while U+00A0, U+202F and U+2009 only ever group.

A **written date** is one the parser accepts (:data:`DATE_FORMATS`, an ordinal suffix anywhere,
``2021年3月14日``); an ambiguous one (``03/04/2021``) has both readings, day first.

:func:`scan` finds every number and date of a text once: the number tokens (not inside a date: an
amount of 2020 is not in ``2020-08-08``) and the date tokens, each with its readings, held compactly
(:class:`Tokens`); :class:`ScanCache` keeps the scans of long texts within a budget of bytes.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
import re
import sys
import threading
import unicodedata
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator

# -- numbers -----------------------------------------------------------------------------------------

GROUP_MARKS = ",.'\u2019 \u00a0\u202f\u2009"
CURRENCY_SYMBOLS = "$€£¥₹₩₽₺₴₪฿¢"  # glued to an amount; a code (EUR) is a word, spaced from it
_FOLD = str.maketrans({"\u2212": "-", "\u2019": "'", "\u00a0": " ", "\u202f": " ", "\u2009": " "})
_SYM = "[" + re.escape(CURRENCY_SYMBOLS) + "]"
_SIGNED = re.compile(rf"([-+]?) ?{_SYM}? ?([-+]?)(\d(?:[\d,.' ]*\d)?)")
_MARK = re.compile(r"[,.' ]")


def _grouped(parts: list[str]) -> bool:
    """Digit groups of an integer part: one group, or no leading zero and threes (``1,037,500``) or
    Indian (``1,00,000``: one or two digits, twos, then three)."""
    if len(parts) == 1:
        return True
    if parts[0].startswith("0"):
        return False
    if len(parts[0]) <= 3 and all(len(p) == 3 for p in parts[1:]):
        return True
    return len(parts) >= 3 and len(parts[0]) <= 2 and all(len(p) == 2 for p in parts[1:-1]) and len(parts[-1]) == 3


def _unsigned_readings(body: str) -> list[float]:
    """The values of digits and marks (spaces folded to ``' '``), the likelier first (module docstring)."""
    marks = _MARK.findall(body)
    parts = _MARK.split(body)
    if not marks:
        return [float(body)]
    if "" in parts:  # two marks in a row
        return []
    decimal = grouping = None
    last = marks[-1]
    if last in ".," and marks.count(last) == 1 and len(set(marks[:-1])) <= 1 and _grouped(parts[:-1]):
        decimal = float(f"{''.join(parts[:-1])}.{parts[-1]}")
    if len(set(marks)) == 1 and _grouped(parts):
        grouping = float("".join(parts))
    found = [grouping, decimal] if last == "," else [decimal, grouping]
    return [v for v in found if v is not None and math.isfinite(v)]


def number_readings(text: str) -> tuple[float, ...]:
    """Every value written number ``text`` may mean, the likelier first; ``()`` when it is no written number
    (module docstring: ``(1,037.50)`` is (-1037.5,); ``1.037`` is (1.037, 1037.0); ``1,0,0`` is ())."""
    s = unicodedata.normalize("NFKC", text).translate(_FOLD).strip()
    negative = s.startswith("(") and s.endswith(")")
    if negative:
        s = s[1:-1].strip()
    m = _SIGNED.fullmatch(s)
    if m is None or (m[1] and m[2]):
        return ()
    sign = -1.0 if negative or "-" in (m[1], m[2]) else 1.0
    return tuple(dict.fromkeys(sign * v for v in _unsigned_readings(m[3])))


# Tokens: a hard one is grouped by anything but a regular space; a spaced one by regular spaces. A token
# never starts inside a number (after a digit and a mark) nor runs on into letters or more digits.
_BODY = r"\d(?:[\d,.'\u2019\u00a0\u202f\u2009]*\d)?"
_SPACED_BODY = r"\d{1,3}(?: \d{3})+(?:[.,]\d+)?"
_EDGES = (r"(?<![A-Za-z0-9.,])(?<!\d[,.'\u2019\u00a0\u202f\u2009])(?:\({sym}?{body}\)|[-\u2212]{sym}?{body}|{body})"
          r"(?![A-Za-z0-9]|[.,]\d)")
_HARD_NUMBER = re.compile(_EDGES.format(sym=_SYM, body=_BODY))
_SPACED_NUMBER = re.compile(_EDGES.format(sym=_SYM, body=_SPACED_BODY))
_LEADING_ZERO = re.compile(r"\D*0\d")  # 037 is a code or a group's tail, not an amount


# -- dates -------------------------------------------------------------------------------------------

# The written date forms the parser accepts (strptime also reads them without zero padding).
DATE_FORMATS = ("%Y-%m-%d", "%B %d, %Y", "%B %d %Y", "%d %B %Y", "%b %d, %Y", "%b. %d, %Y", "%b %d %Y", "%d %b %Y",
                "%d/%m/%Y", "%m/%d/%Y", "%Y/%m/%d", "%d.%m.%Y", "%d-%b-%Y", "%Y.%m.%d")


def _shape(s: str) -> tuple[bool, ...]:
    """What tells the date formats apart: a leading digit, a letter, and which of ``,.-/`` it has."""
    return (s[:1].isdigit(), any(c.isalpha() for c in s), *(c in s for c in ",.-/"))


def _formats_by_shape() -> dict[tuple[bool, ...], tuple[str, ...]]:
    """The formats per shape of what they write: a format is tried only on texts of its shape (strptime is
    slow, and only the literals of a format give a text commas, dots, dashes, slashes or a leading digit)."""
    out: dict[tuple[bool, ...], tuple[str, ...]] = {}
    for fmt in DATE_FORMATS:
        key = _shape(dt.date(2021, 3, 14).strftime(fmt))
        out[key] = (*out.get(key, ()), fmt)
    return out


_BY_SHAPE = _formats_by_shape()
_ORDINAL = re.compile(r"(?<=\d)(st|nd|rd|th)\b", re.IGNORECASE)
_CJK_DATE = re.compile(r"(\d{4})\s*年\s*(\d{1,2})\s*月\s*(\d{1,2})\s*日")
# Each starts with a lookahead for its first character: a failed match then costs one test per position.
_DIGIT_DATE = re.compile(r"(?=\d)(?<!\d)(?:\d{4}([-/.])\d{1,2}\1\d{1,2}|\d{1,2}([-/.])\d{1,2}\2\d{2,4})(?!\d)")
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_DAY = r"\d{1,2}(?:st|nd|rd|th)?"
_WRITTEN_DATE = re.compile(rf"(?=[\dJFMASOND])(?:\b(?:{_MONTH}\s+{_DAY},?\s+\d{{4}}|{_DAY}\s+{_MONTH}\s+\d{{4}}|"
                           rf"\d{{1,2}}-{_MONTH}-\d{{4}})(?!\d)|\d{{4}}\s*年\s*\d{{1,2}}\s*月\s*\d{{1,2}}\s*日)",
                           re.IGNORECASE)
_DATE_PATTERNS = ((_DIGIT_DATE, 10), (_WRITTEN_DATE, 24))  # and the most characters a match spans


@functools.lru_cache(maxsize=8192)
def date_readings(text: str) -> tuple[dt.date, ...]:
    """Every date written date ``text`` may mean, in :data:`DATE_FORMATS` order (``03/04/2021``: 3 April,
    then 4 March); ``()`` when the parser does not read it."""
    s = " ".join(_ORDINAL.sub("", unicodedata.normalize("NFKC", text)).split())
    if m := _CJK_DATE.fullmatch(s):
        try:
            return (dt.date(*map(int, m.groups())),)
        except ValueError:
            return ()
    out: list[dt.date] = []
    for fmt in _BY_SHAPE.get(_shape(s), ()):
        try:
            d = dt.datetime.strptime(s, fmt).date()
        except ValueError:
            continue
        if d not in out:
            out.append(d)
    return tuple(out)


def in_date(text: str, start: int, end: int) -> bool:
    """``text[start:end]`` lies inside a date (``2020-08-08``, ``14/04/2021``, ``02.04.21``, ``March 14, 2021``,
    ``14 March 2021``, ``14-Mar-2021``, ``2021年3月14日``): a number there is part of the date, not an amount."""
    for pattern, reach in _DATE_PATTERNS:
        for m in pattern.finditer(text, max(0, start - reach), min(len(text), end + reach)):
            if m.start() <= start and end <= m.end():
                return True
    return False


# -- scans -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tokens:
    """Tokens of a text by start (then end): ``text[starts[i]:ends[i]]`` reads ``first[i]`` or ``second[i]``
    (NaN: no second reading); dates as ordinals. Four flat arrays: 32 bytes a token."""

    starts: array
    ends: array
    first: array
    second: array

    @staticmethod
    def of(rows: list[tuple[int, int, tuple[float, ...]]]) -> Tokens:
        rows.sort(key=lambda r: (r[0], r[1]))
        return Tokens(array("q", (r[0] for r in rows)), array("q", (r[1] for r in rows)),
                      array("d", (r[2][0] for r in rows)), array("d", (r[2][1] if len(r[2]) > 1 else math.nan
                                                                       for r in rows)))

    @property
    def nbytes(self) -> int:
        return sum(a.itemsize * len(a) for a in (self.starts, self.ends, self.first, self.second))

    def matches(self, value: float, lo: int, hi: int) -> Iterator[tuple[int, int]]:
        """Spans of the tokens inside ``[lo, hi)`` reading ``value`` (to 1e-9 relative), by start."""
        tolerance = 1e-9 * max(1.0, abs(value))
        for i in range(bisect_left(self.starts, lo), bisect_left(self.starts, hi)):
            if self.ends[i] <= hi and (abs(self.first[i] - value) <= tolerance
                                       or abs(self.second[i] - value) <= tolerance):
                yield self.starts[i], self.ends[i]


@dataclass(frozen=True)
class Scan:
    """A text's numbers (not inside a date) and dates (:func:`scan`)."""

    numbers: Tokens
    dates: Tokens

    @property
    def nbytes(self) -> int:
        return self.numbers.nbytes + self.dates.nbytes


def _date_spans(text: str) -> tuple[list[tuple[int, int]], list[tuple[int, int, tuple[float, ...]]]]:
    """Every date pattern's match in ``text`` merged into disjoint spans, and the matches the parser reads."""
    matches, dates = [], []
    for pattern, _ in _DATE_PATTERNS:
        for m in pattern.finditer(text):
            matches.append((m.start(), m.end()))
            if found := date_readings(m.group()):
                dates.append((m.start(), m.end(), tuple(float(d.toordinal()) for d in found[:2])))
    merged: list[tuple[int, int]] = []
    for s, e in sorted(matches):
        if merged and s < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
        else:
            merged.append((s, e))
    return merged, dates


def scan(text: str) -> Scan:
    """Every number token of ``text`` (hard and spaced, not inside a date, no leading zero) and every date
    token, with their readings (module docstring)."""
    spans, dates = _date_spans(text)
    span_starts = [s for s, _ in spans]
    numbers = []
    for pattern in (_HARD_NUMBER, _SPACED_NUMBER):
        for m in pattern.finditer(text):
            s, e = m.span()
            i = bisect_right(span_starts, s) - 1
            if (i >= 0 and e <= spans[i][1]) or _LEADING_ZERO.match(m.group()):
                continue
            if found := number_readings(m.group()):
                numbers.append((s, e, found[:2]))
    return Scan(Tokens.of(numbers), Tokens.of(dates))


class ScanCache:
    """The scans of long texts, the least recently used dropped first so that the texts and their scans
    together hold at most ``max_bytes`` (a text counts: the cache keeps it alive); thread-safe (grounding
    runs in worker threads). A text larger than the budget alone is scanned every time."""

    def __init__(self, max_bytes: int, scanner: Callable[[str], Scan] = scan) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self._scanner = scanner
        self._entries: OrderedDict[str, tuple[Scan, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, text: str) -> Scan:
        with self._lock:
            if (entry := self._entries.get(text)) is not None:
                self._entries.move_to_end(text)
                return entry[0]
        found = self._scanner(text)  # outside the lock: another text's scan need not wait
        size = sys.getsizeof(text) + found.nbytes
        with self._lock:
            if size <= self.max_bytes and text not in self._entries:
                self._entries[text] = (found, size)
                self.held += size
                while self.held > self.max_bytes:
                    _, (_, freed) = self._entries.popitem(last=False)
                    self.held -= freed
        return found

    def __len__(self) -> int:
        return len(self._entries)
