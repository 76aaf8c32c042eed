"""Numbers and dates however they are written (memagent/extraction/spellings.py, grounding.py): grounding
finds exactly the span that states a value, and never a different number, nor a number inside a date.
The spellings come from tests/spellings.py (Hypothesis strategies others may reuse)."""

from __future__ import annotations

import sys

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from memagent.extraction import locate
from memagent.extraction.kinds import parse_number
from memagent.extraction.record_grounding import ground_value
from memagent.extraction.spellings import ScanCache, date_readings, number_readings, scan
from tests.spellings import Written, amounts, dates, written_dates, written_numbers

LEADS = ("The invoice totals ", "Paid: ", "Balance carried forward ", "金额")
TAILS = (" net.", ".", "; thank you.", " 整。")


@st.composite
def sentences(draw: st.DrawFn, written: Written) -> Written:
    """``written`` in a sentence, sometimes after a date (a number must not be found inside it)."""
    lead = draw(st.sampled_from(LEADS))
    if draw(st.booleans()):
        lead = f"Signed {draw(written_dates(draw(dates()))).text}. {lead}"
    return written.within(lead, draw(st.sampled_from(TAILS)))


def span_of(kind: str, value, text: str) -> str | None:
    found = locate(kind, value, text, fuzzy=False)
    return None if found is None else text[found.start:found.end]


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_number_is_grounded_at_exactly_its_written_span_however_it_is_written(data):
    value = data.draw(amounts())
    w = data.draw(sentences(data.draw(written_numbers(value))))
    assert value in number_readings(w.span) or value == 0
    span = locate("number", value, w.text, fuzzy=False)
    assert span is not None and (span.start, span.end) == (w.start, w.end), (w.text, w.span)
    if value.is_integer():
        span = locate("integer", int(value), w.text, fuzzy=False)
        assert span is not None and (span.start, span.end) == (w.start, w.end), (w.text, w.span)
    # A record's value is grounded in the window its call read, without the whole-document search.
    in_window = ground_value("number", value, w.text, (0, len(w.text)), None)
    assert in_window is not None and in_window.where == "window"
    assert (in_window.start, in_window.end) == (w.start, w.end)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_different_number_is_never_grounded(data):
    """1037.5 is not in ``11 037,50`` (a digit before), ``10,375`` (ten times), nor is -1037.5 in ``1,037.50``."""
    value = data.draw(amounts(max_cents=10**9))
    assume(value != 0)
    whole = str(int(abs(value)))
    prefixed = data.draw(st.integers(1, 9)) * 10 ** len(whole) + abs(value)
    other = data.draw(st.sampled_from([prefixed, abs(value) * 10, -value if value < 0 else prefixed]))
    w = data.draw(sentences(data.draw(written_numbers(other))))
    # A regular space also separates two numbers (a table row: quantity 2, price 450.00), so a value
    # written as the groups after the first is read there too; U+00A0, U+202F and U+2009 only group.
    assume(not (" " in w.span and other == prefixed and len(whole) % 3 == 0))
    assert span_of("number", value, w.text) is None, (value, w.text)
    if value.is_integer():
        assert span_of("integer", int(value), w.text) is None, (value, w.text)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_number_is_never_grounded_inside_a_date(data):
    day = data.draw(dates())
    w = data.draw(written_dates(day)).within("Signed on ", " by both parties.")
    for value in (day.day, day.month, day.year, float(f"{day.day}.{day.month:02d}")):
        assert span_of("number", value, w.text) is None, (value, w.text)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_date_is_grounded_at_exactly_its_written_span_in_every_spelling_the_parser_reads(data):
    day = data.draw(dates())
    written = data.draw(written_dates(day))
    assert day in date_readings(written.text)
    w = written.within(data.draw(st.sampled_from(("Paid on ", "Fällig am ", "Due "))),
                       data.draw(st.sampled_from((".", " by EUR 1.037,50.", " (late)."))))
    span = locate("date", day.isoformat(), w.text, fuzzy=False)
    assert span is not None and (span.start, span.end) == (w.start, w.end), (w.text, w.span)


@pytest.mark.parametrize("written, value", [
    ("EUR 1.037,50", 1037.5), ("1\u00a0037,50\u00a0EUR", 1037.5), ("1 037,50 EUR", 1037.5), ("$1,037.50", 1037.5),
    ("1.037,50 €", 1037.5), ("CHF 1'037.50", 1037.5), ("1\u202f037,50", 1037.5), ("1\u2009037.50", 1037.5),
    ("₹1,00,000.50", 100000.5), ("(1,037.50)", -1037.5), ("$(1,037.50)", -1037.5), ("-$1,037.50", -1037.5),
    ("\u22121 037,50 €", -1037.5), ("1.037", 1037.0), ("1,5", 1.5),
])
def test_parse_number_reads_amounts_as_users_write_them(written, value):
    assert parse_number(written) == value or value in number_readings(written)
    assert parse_number("1,037") == 1037.0 and parse_number("1.037") == 1.037  # the likelier reading first
    assert number_readings("1,0,0") == () and parse_number("1e5") == 1e5 and parse_number("inf") is None


def test_non_breaking_space_grouping_is_grounded_and_regular_spaces_read_both_ways():
    text = "Invoice 7: total 1\u00a0037,50\u00a0EUR, paid 2021-03-14."
    assert span_of("number", 1037.5, text) == "1\u00a0037,50"
    assert span_of("integer", 1, text) is None and span_of("integer", 37, text) is None  # inside the amount
    row = "Qty Price\n2 450.00 EUR"  # a table row: quantity 2 and price 450.00, or 2,450.00
    assert span_of("integer", 2, row) == "2" and span_of("number", 450, row) == "450.00"
    assert span_of("number", 2450, row) == "2 450.00"


def test_the_scan_cache_holds_at_most_its_bytes_texts_included():
    texts = [f"Doc {i}: paid 1,037.50 on 2021-03-14. " * 400 for i in range(6)]
    one = sys.getsizeof(texts[0]) + scan(texts[0]).nbytes
    cache = ScanCache(max_bytes=3 * one + one // 2)
    for t in texts:
        assert 1037.5 in cache(t).numbers.first
    assert len(cache) == 3 and cache.held <= cache.max_bytes
    assert cache(texts[-1]) is cache(texts[-1])  # kept: the same scan
    small = ScanCache(max_bytes=one // 2)
    small(texts[0])
    assert len(small) == 0 and small.held == 0  # larger than the budget alone: never held
