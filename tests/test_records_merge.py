"""Merging per-chunk records by key (memagent/extraction/records.py): same key across chunks,
amendments, no key, duplicates within a chunk, determinism."""

from __future__ import annotations

import itertools

from memagent.extraction import ExtractionSchema, Mention, ground_chunk, merge_records, record_key
from memagent.extraction.grounding import Span

ITEM = {"type": "object", "required": ["payer", "date"], "properties": {
    "payer": {"type": "string"}, "date": {"type": "string", "format": "date"}, "amount": {"type": "number"},
    "status": {"enum": ["due", "paid"]}, "refs": {"type": "array", "items": {"type": "string"}},
    "bank": {"type": "object", "properties": {"name": {"type": "string"}, "iban": {"type": "string"}}}}}
SCHEMA = ExtractionSchema({"type": "object", "properties": {
    "payments": {"type": "array", "x-key": ["payer", "date"], "items": ITEM},
    "notes": {"type": "array", "items": {"type": "object", "properties": {"text": {"type": "string"}}}},
    "amounts": {"type": "array", "x-key": ["amount"], "items": {**ITEM, "required": ["payer", "date", "amount"]}}}})
PAY, NOTES, AMOUNTS = (SCHEMA.record_type(n) for n in ("payments", "notes", "amounts"))


def test_keys_normalise_case_space_numbers_and_dates():
    assert record_key(PAY, {"payer": "  Harlow   FREIGHT ltd", "date": "2021-03-14"}) == \
        record_key(PAY, {"payer": "harlow freight Ltd", "date": "March 14, 2021"})
    assert record_key(AMOUNTS, {"amount": 1250}) == record_key(AMOUNTS, {"amount": 1250.0}) == \
        record_key(AMOUNTS, {"amount": "1,250.00"})
    assert record_key(PAY, {"payer": "Harlow", "date": "2021-03-14"}) != record_key(PAY, {"payer": "Harlow",
                                                                                         "date": "2021-03-15"})
    assert record_key(PAY, {"payer": "", "date": "2021-03-14"}) is None  # cannot be identified
    assert record_key(NOTES, {"text": "x"}) is None  # no key


def test_the_same_record_in_three_chunks_is_one_with_its_evidence_and_mentions():
    mentions = [
        Mention(0, {"payer": "Harlow Freight Ltd", "date": "2021-03-14", "amount": 1250, "status": "due"},
                {"payer": (10, 28), "date": (40, 54), "amount": (60, 68), "status": None}),
        Mention(0, {"payer": "Kestrel", "date": "2021-03-14", "amount": 10}, {"payer": (80, 87)}),
        Mention(2, {"payer": "HARLOW FREIGHT LTD", "date": "2021-03-14", "amount": None, "bank": {"name": "NB"}},
                {"payer": Span(300, 318, "normalised"), "bank.name": (330, 332)}),
        Mention(5, {"payer": "harlow freight ltd", "date": "March 14, 2021", "status": "paid",
                    "refs": ["INV-1", "INV-2"]}, {"status": {"char_start": 900, "char_end": 904},
                                                   "refs.0": (910, 915), "refs.1": None}),
    ]
    harlow, kestrel = merge_records(PAY, mentions)
    assert harlow.values == {"payer": "Harlow Freight Ltd", "date": "2021-03-14", "amount": 1250,
                             "status": "paid", "bank": {"name": "NB"}, "refs": ["INV-1", "INV-2"]}
    assert (harlow.mentions, harlow.first_chunk, harlow.last_chunk) == (3, 0, 5)
    ev = {k: (e.step, e.char_start, e.char_end) for k, e in harlow.evidence.items()}
    assert ev == {"payer": (0, 10, 28), "date": (0, 40, 54), "amount": (0, 60, 68),  # null later: kept
                  "status": (5, 900, 904),  # the amendment replaces value and evidence
                  "bank.name": (2, 330, 332), "refs.0": (5, 910, 915), "refs.1": (5, None, None)}
    assert (kestrel.mentions, kestrel.first_chunk, kestrel.last_chunk) == (1, 0, 0)
    assert [r["field"] for r in harlow.evidence_rows()] == sorted(ev)


def test_an_amendment_replaces_only_what_it_states():
    mentions = [Mention(1, {"payer": "A", "date": "2021-01-01", "amount": 5, "refs": ["x"],
                            "bank": {"name": "NB", "iban": "GB1"}}, {"amount": (1, 2), "refs.0": (3, 4)}),
                Mention(3, {"payer": "a", "date": "2021-01-01", "amount": 7.5, "refs": [], "bank": {"iban": "GB2"}},
                        {"amount": (50, 53), "bank.iban": (60, 63)}),
                Mention(4, {"payer": "A", "date": "2021-01-01", "amount": 7.50}, {"amount": (90, 94)})]
    [rec] = merge_records(PAY, mentions)
    assert rec.values["amount"] == 7.5 and rec.evidence["amount"].step == 3  # 7.50 restated: first kept
    assert rec.evidence["amount"].char_start == 50
    assert rec.values["refs"] == ["x"] and rec.evidence["refs.0"].step == 1  # [] states nothing
    assert rec.values["bank"] == {"name": "NB", "iban": "GB2"} and rec.evidence["bank.iban"].step == 3
    assert rec.mentions == 3


def test_records_without_a_key_are_kept_as_emitted_less_duplicates_within_a_chunk():
    mentions = [Mention(0, {"text": "call back"}), Mention(0, {"text": "call back"}), Mention(0, {"text": "other"}),
                Mention(1, {"text": "call back"})]
    out = merge_records(NOTES, mentions)
    assert [(r.values["text"], r.first_chunk, r.mentions) for r in out] == [
        ("call back", 0, 2), ("other", 0, 1), ("call back", 1, 1)]
    # A keyed type's mention that lacks its key is kept on its own, not merged.
    out = merge_records(PAY, [Mention(0, {"payer": "A", "date": "2021-01-01"}), Mention(1, {"payer": "A"}),
                              Mention(2, {"payer": "A"})])
    assert [r.mentions for r in out] == [1, 1, 1]


def test_merge_is_deterministic_whatever_the_order_of_chunks():
    mentions = [Mention(s, {"payer": p, "date": "2021-01-0%d" % (1 + s % 2), "amount": s}, {"amount": (s, s + 1)})
                for s, p in [(0, "A"), (1, "B"), (2, "a"), (3, "b"), (4, "A")]]

    def shape(records):
        return [(r.values, r.mentions, r.first_chunk, r.last_chunk,
                 sorted((k, e.step, e.char_start) for k, e in r.evidence.items())) for r in records]

    first = shape(merge_records(PAY, mentions))
    assert len(first) == 2  # A on 01-01 (steps 0, 2, 4), B on 01-02 (steps 1, 3)
    assert first[0][0]["amount"] == 4 and first[0][1:4] == (3, 0, 4)
    for order in itertools.permutations(mentions):
        assert shape(merge_records(PAY, order)) == first


def test_grounded_chunks_feed_the_merge():
    doc = "Chunk one: Harlow paid 1,250.00 on 2021-03-14. Chunk two: Harlow's payment of 2021-03-14 is now paid."
    half = doc.index("Chunk two")
    one = ground_chunk(PAY, [{"payer": "Harlow", "date": "2021-03-14", "amount": 1250}], doc, (0, half))
    two = ground_chunk(PAY, [{"payer": "Harlow", "date": "2021-03-14", "status": "paid"}], doc, (half, len(doc)))
    mentions = [Mention(step, r, s) for step, g in ((0, one), (1, two)) for r, s in zip(g.records, g.spans)]
    [rec] = merge_records(PAY, mentions)
    assert doc[rec.evidence["amount"].char_start:rec.evidence["amount"].char_end] == "1,250.00"
    assert rec.evidence["status"].step == 1 and rec.evidence["status"].char_start == doc.rindex("paid")
    assert rec.evidence["payer"].char_start == doc.index("Harlow") and rec.mentions == 2


def test_a_default_key_never_merges_mentions_that_differ_in_a_stated_value():
    """With no x-key (the key chosen only to tie child types to the parent), seven citations sharing only their
    year stay seven records, and a later mention that agrees with one of them (adding a value) joins it."""
    from memagent.extraction import schema_from

    schema = schema_from({"type": "object", "properties": {"citations": {"type": "array", "items": {
        "type": "object", "required": ["year"], "properties": {
            "year": {"type": "integer"}, "title": {"type": "string"}, "venue": {"type": "string"},
            "authors": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}}}}}}})
    record = schema.record_type("citations")
    assert record.key == ("year",) and record.default_key
    mentions = [Mention(0, {"year": 2020, "title": f"Paper {i}"}) for i in range(7)]
    mentions.append(Mention(1, {"year": 2020, "title": "Paper 3", "venue": "ACL"}))
    merged = merge_records(record, mentions)
    assert [r.values["title"] for r in merged] == [f"Paper {i}" for i in range(7)]
    assert merged[3].values["venue"] == "ACL" and merged[3].mentions == 2 and not merged[3].conflicts
    keyed = schema_from({"type": "object", "properties": {"citations": {"type": "array", "x-key": ["year"], "items": {
        "type": "object", "required": ["year"], "properties": {"year": {"type": "integer"},
                                                                "title": {"type": "string"}}}}}})
    assert len(merge_records(keyed.record_type("citations"), mentions[:7])) == 1  # a named key is an identity
