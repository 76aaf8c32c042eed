"""Hypothesis strategies: numbers and dates spelled as people write them, with the span grounding must find.

    @given(st.data())
    def test(data):
        value = data.draw(amounts())                     # cents / 100, sign included
        w = data.draw(written_numbers(value))            # Written("EUR\u00a01.037,50", 4, 12)
        d = data.draw(written_dates(data.draw(dates())))     # Written("14th Mar 2021", 0, 13)
        s = w.within("The invoice totals ", " net.")     # the same span, moved

A :class:`Written` is a text and the span in it that states the value: for a number its digits with
their sign (``−1 037,50``, ``(1,037.50)``, ``-$1,037.50``) and never a currency code or a symbol
that stands after the sign (``EUR``, ``$1,037.50``, ``1.037,50 €``); for a date, all of it.

Numbers: groups marked by ``,`` ``.`` ``'`` ``’`` a space, U+00A0, U+202F, U+2009 or nothing, three
digits a group or Indian (``1,00,000.50``), a decimal mark ``.`` or ``,`` unlike the grouping one,
0 to 2 decimals as the value allows, negatives as ``-``, U+2212 or parentheses, a currency code or
symbol before or after. Dates: every form of :data:`memagent.extraction.spellings.DATE_FORMATS`,
with or without zero padding, ordinal days beside month names, any case, ``2021年3月14日`` with or
without spaces.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from hypothesis import strategies as st

from memagent.extraction.spellings import DATE_FORMATS

GROUPS = ("", ",", ".", "'", "\u2019", " ", "\u00a0", "\u202f", "\u2009")
CODES = ("EUR", "USD", "CHF", "GBP", "INR", "JPY")
SYMBOLS = ("$", "€", "£", "¥", "₹")
SPACES = (" ", "\u00a0")


@dataclass(frozen=True)
class Written:
    """``text[start:end]`` states the value (the module docstring says which part)."""

    text: str
    start: int
    end: int

    @property
    def span(self) -> str:
        return self.text[self.start:self.end]

    def within(self, before: str, after: str) -> Written:
        """The same spelling inside a sentence: ``before + text + after``, the span moved with it."""
        return Written(before + self.text + after, self.start + len(before), self.end + len(before))


def amounts(max_cents: int = 10**11, negative: bool = True) -> st.SearchStrategy[float]:
    """Values with at most two decimals (cents), below ``max_cents / 100`` in size."""
    cents = st.integers(-max_cents if negative else 0, max_cents)
    return cents.map(lambda c: c / 100)


def _grouped(digits: str, mark: str, indian: bool) -> str:
    if not mark or len(digits) <= 3:
        return digits
    head, tail = digits[:-3], digits[-3:]
    size = 2 if indian else 3
    groups = []
    while head:
        groups.insert(0, head[-size:])
        head = head[:-size]
    return mark.join([*groups, tail])


@st.composite
def unsigned_numbers(draw: st.DrawFn, value: float) -> str:
    """``abs(value)`` in digits, grouped and with a decimal part (module docstring)."""
    cents = round(abs(value) * 100)
    whole, frac = divmod(cents, 100)
    fewest = 0 if frac == 0 else 1 if frac % 10 == 0 else 2
    decimals = draw(st.integers(fewest, 2))
    group = draw(st.sampled_from(GROUPS))
    point = draw(st.sampled_from([p for p in ".," if p != group]))
    indian = group == "," and draw(st.booleans())
    text = _grouped(str(whole), group, indian)
    if decimals:
        text += point + f"{frac:02d}"[:decimals]
    return text


@st.composite
def written_numbers(draw: st.DrawFn, value: float) -> Written:
    """``value`` as a written amount: sign, grouping, decimals and currency (module docstring)."""
    digits = draw(unsigned_numbers(value))
    sign = draw(st.sampled_from(["-", "\u2212", "()"])) if value < 0 else ""
    core = f"({digits})" if sign == "()" else sign + digits
    where = draw(st.sampled_from(["none", "code before", "code after", "symbol before", "symbol after"]))
    if where == "none":
        return Written(core, 0, len(core))
    if where.startswith("code"):
        code, space = draw(st.sampled_from(CODES)), draw(st.sampled_from(SPACES))
        if where == "code after":
            return Written(core + space + code, 0, len(core))
        return Written(code + space + core, len(code + space), len(code + space + core))
    symbol, space = draw(st.sampled_from(SYMBOLS)), draw(st.sampled_from(("", *SPACES)))
    if where == "symbol after":
        return Written(core + space + symbol, 0, len(core))
    if sign and draw(st.booleans()):  # the sign before the symbol: -$1,037.50, ($1,037.50)
        text = f"({symbol}{digits})" if sign == "()" else sign + symbol + digits
        return Written(text, 0, len(text))
    return Written(symbol + space + core, len(symbol + space), len(symbol + space + core))


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


@st.composite
def written_dates(draw: st.DrawFn, date: dt.date) -> Written:
    """``date`` in a spelling the parser reads (module docstring); all of the text is its span."""
    if draw(st.integers(0, len(DATE_FORMATS))) == len(DATE_FORMATS):
        pad = draw(st.booleans())
        space = draw(st.sampled_from(["", " "]))
        m, d = (f"{date.month:02d}", f"{date.day:02d}") if pad else (str(date.month), str(date.day))
        text = space.join([str(date.year), "年", m, "月", d, "日"])
        return Written(text, 0, len(text))
    fmt = draw(st.sampled_from(DATE_FORMATS))
    named = "%b" in fmt or "%B" in fmt
    pad = draw(st.booleans())  # strptime reads days and months without their zero too
    day = f"{date.day:02d}" if pad else str(date.day)
    if named and "-" not in fmt and draw(st.booleans()):
        day = _ordinal(date.day)
    text = date.strftime(fmt.replace("%d", day).replace("%m", f"{date.month:02d}" if pad else str(date.month)))
    text = draw(st.sampled_from([text, text.upper(), text.lower()])) if named else text
    return Written(text, 0, len(text))


def dates() -> st.SearchStrategy[dt.date]:
    """Dates whose year strptime writes and reads as four digits."""
    return st.dates(dt.date(1900, 1, 1), dt.date(2099, 12, 31))
