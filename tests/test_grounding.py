"""Grounding: every value's span in the document (memagent/extraction/grounding.py): exact, then
case/space/number-format insensitive, then fuzzy above the threshold; CJK; require_grounding's counts."""

from __future__ import annotations

import pytest

from memagent.extraction import FUZZY_THRESHOLD, ExtractionSchema, ground_chunk, locate

DOC = ("Statement of account. On March 14, 2021 Harlow  Freight Ltd paid USD 1,250.00 for storage. "
       "The payer's reference is O’Brien-Smith. Total due: 25 units; 250 pallets. "
       "Then, on 02.04.2021, Kestrel Logistics paid 1.250,50 EUR.")


def found(kind, value, text=DOC, window=None, **kw):
    span = locate(kind, value, text, window, **kw)
    return None if span is None else (text[span.start:span.end], span.method)


def test_exact_first_then_case_space_and_number_format():
    assert found("string", "Kestrel Logistics") == ("Kestrel Logistics", "exact")
    assert found("string", "harlow freight ltd") == ("Harlow  Freight Ltd", "normalised")  # case and spaces
    assert found("string", "O'Brien-Smith") == ("O’Brien-Smith", "normalised")  # a curly apostrophe
    assert found("number", 1250) == ("1,250.00", "normalised")
    assert found("number", 1250.0) == ("1,250.00", "normalised")
    assert found("number", 1250.5) == ("1.250,50", "normalised")  # a European grouping, by value
    assert found("integer", 250) == ("250", "exact") and locate("integer", 250, DOC).start == DOC.index("250 p")
    assert found("integer", 25) == ("25", "exact") and locate("integer", 25, DOC).start == DOC.index("25 u")
    assert found("number", 12) is None
    assert found("date", "2021-03-14") == ("March 14, 2021", "normalised")
    assert found("date", "2021-04-02") == ("02.04.2021", "normalised")
    assert found("date", "2021-04-03") is None
    assert found("boolean", True) is None  # booleans have no span
    assert found("enum", "USD") == ("USD", "exact")


def test_date_forms_and_ordinals():
    for text in ("paid on 14 March 2021.", "paid on Mar. 14, 2021", "paid 14/03/2021", "paid 3/14/2021",
                 "paid 2021/03/14", "paid on March 14th, 2021", "paid 14-Mar-2021", "支付日期2021年3月14日。"):
        assert found("date", "2021-03-14", text) is not None, text


def test_fuzzy_above_the_threshold_only():
    text = "The supplier is Harlow Freight Limited, of Leeds; the buyer is Acme."
    got = locate("string", "Harlow Freight Ltd", text)
    assert got.method == "fuzzy" and text[got.start:got.end] == "Harlow Freight Limited"
    assert FUZZY_THRESHOLD <= got.score < 1
    assert locate("string", "Harlow Freight Ltd", text, threshold=0.95) is None  # the threshold holds
    assert locate("string", "Harlow Freight Ltd", text, fuzzy=False) is None
    assert locate("string", "Zephyr Maritime Group", text) is None  # nothing alike
    assert locate("string", "Acmo", text) is None  # short values are never fuzzy
    assert locate("number", 1251, "paid 1,250.00") is None  # numbers are never fuzzy


def test_cjk_without_word_boundaries():
    text = "甲方：東京都港区の株式会社山田商事は、乙方に金額1,250円を支払う。"
    assert found("string", "株式会社山田商事", text) == ("株式会社山田商事", "exact")
    assert found("string", "東京", text) == ("東京", "exact")  # inside 東京都: CJK has no word boundaries
    assert found("number", 1250, text) == ("1,250", "normalised")
    assert found("string", "株式会社山田商店", text)[1] == "fuzzy"  # one character differs


def test_the_chunk_is_searched_before_the_document():
    text = "Fee 250 (late). " + "x " * 30 + "Total fee 250."
    later = text.rindex("250")
    span = locate("integer", 250, text, (30, len(text)))
    assert (span.start, span.end) == (later, later + 3)
    assert locate("integer", 250, text).start == text.index("250")
    # Not in the chunk: the document.
    assert locate("string", "late", text, (30, len(text))).start == text.index("late")
    # A written form anywhere beats a fuzzy match in the chunk.
    text = "Harlow Freight Ltd signs. " + "y " * 30 + "Harlow Freight Ltda pays."
    assert locate("string", "Harlow Freight Ltd", text, (30, len(text))).start == 0


SCHEMA = ExtractionSchema({"type": "object", "properties": {"payments": {
    "type": "array", "x-key": ["payer"], "items": {"type": "object", "required": ["payer"], "properties": {
        "payer": {"type": "string"}, "amount": {"type": "number"}, "date": {"type": "string", "format": "date"},
        "currency": {"enum": ["USD", "GBP"]}, "paid": {"type": "boolean"},
        "refs": {"type": "array", "items": {"type": "string"}},
        "bank": {"type": "object", "properties": {"name": {"type": "string"}}}}}}}})
PAY = SCHEMA.record_type("payments")


def test_ground_chunk_spans_and_require_grounding_counts():
    records = [
        {"payer": "Harlow Freight Ltd", "amount": 1250, "date": "2021-03-14", "currency": "GBP", "paid": True,
         "refs": ["storage", "invented ref"], "bank": {"name": "Kestrel"}},
        {"payer": "Example Corp", "amount": 1250},  # the key is not in the document (copied from an example)
    ]
    window = (0, DOC.index("Then"))
    plain = ground_chunk(PAY, records, DOC, window, elsewhere=True)
    assert (plain.dropped_values, plain.dropped_records) == (0, 0) and plain.records == records
    spans = plain.spans[0]
    assert DOC[spans["payer"].start:spans["payer"].end] == "Harlow  Freight Ltd"
    assert DOC[spans["amount"].start:spans["amount"].end] == "1,250.00"
    assert DOC[spans["refs.0"].start:spans["refs.0"].end] == "storage" and spans["refs.1"] is None
    assert spans["currency"] is None and "paid" not in spans  # an enum label may be absent; booleans have no span
    # Outside the window its call read: found, but labelled "elsewhere" (it proves nothing there).
    assert DOC[spans["bank.name"].start:spans["bank.name"].end] == "Kestrel"
    assert spans["bank.name"].grounding == "elsewhere" and spans["payer"].grounding == "normalised"
    assert plain.spans[1]["payer"] is None
    # By default the whole document is not searched: what the window lacks has no span.
    cheap = ground_chunk(PAY, records, DOC, window)
    assert cheap.records == records and cheap.spans[0]["bank.name"] is None
    assert {k: v for k, v in cheap.spans[0].items() if k != "bank.name"} == \
        {k: v for k, v in spans.items() if k != "bank.name"}

    strict = ground_chunk(PAY, records, DOC, window, require_grounding=True)
    # the invented ref and the bank found only elsewhere; the Example Corp record
    assert (strict.dropped_values, strict.dropped_records) == (2, 1)
    [kept] = strict.records
    assert kept["refs"] == ["storage"] and kept["currency"] == "GBP" and kept["paid"] is True
    assert "name" not in kept["bank"]
    assert set(strict.spans[0]) == {"payer", "amount", "date", "currency", "refs.0"}
    assert records[0]["refs"] == ["storage", "invented ref"]  # the input is not changed

    values = ground_chunk(PAY, [{"payer": "Kestrel Logistics", "amount": 99, "date": "2020-01-01"}], DOC,
                          (0, len(DOC)), require_grounding=True)
    assert values.records == [{"payer": "Kestrel Logistics"}] and values.dropped_values == 2


@pytest.mark.parametrize("n", [0, 1])
def test_a_long_document_is_searched_whole(n):
    text = ("filler text without it. " * 20_000) + "Payer: Zephyr Maritime Group." + " tail" * n
    span = locate("string", "Zephyr Maritme Group", text, (0, 500))
    assert span is not None and span.method == "fuzzy" and text[span.start:span.end] == "Zephyr Maritime Group"


def test_a_number_is_not_grounded_inside_a_date_written_in_digits():
    # A small model's made-up amount of 2020 must not pass as grounded by every ISO date of a statement.
    text = "Paid on 2020-08-08 by Acme; also on 14/04/2021 and 02.04.21. Ref 4 of 1.250.000 units."
    assert found("number", 2020, text) is None and found("integer", 8, text) is None
    assert found("integer", 14, text) is None and found("integer", 21, text) is None
    assert found("integer", 4, text) == ("4", "exact") and locate("integer", 4, text).start == text.index("4 of")
    assert found("number", 1250000, text) == ("1.250.000", "normalised")  # a grouping, not a date
    assert found("date", "2020-08-08", text) == ("2020-08-08", "exact")  # the date itself still is
    assert found("number", 2020, "The 2020 accounts, filed 2021-01-31.") == ("2020", "exact")


def test_occurrences_of_a_value_stated_very_often_are_capped_in_text_order():
    """A value stated more than MAX_OCCURRENCES_NEAR times in the window yields the first that many of its
    spans, in text order, each a span of the value (the anchoring weighs a bounded number of candidates)."""
    from memagent.extraction.grounding import MAX_OCCURRENCES_NEAR, occurrences

    text = "".join(f"Line {i}: Acme Ltd paid.\n" for i in range(MAX_OCCURRENCES_NEAR + 50))
    spans = occurrences("string", "Acme Ltd", text, (0, len(text)))
    assert len(spans) == MAX_OCCURRENCES_NEAR
    assert [s.start for s in spans] == sorted(s.start for s in spans)
    assert all(text[s.start:s.end] == "Acme Ltd" for s in spans)
    assert spans[-1].start < text.index(f"Line {MAX_OCCURRENCES_NEAR}:")  # the first ones, not any
