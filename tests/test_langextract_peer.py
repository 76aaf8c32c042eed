"""The LangExtract peer's oracle (benchmarks/langextract_peer.py): pure logic, no LangExtract import."""

from __future__ import annotations

import json

from benchmarks.langextract_peer import (
    PeerRecord,
    Span,
    oracle_reply,
    prompt_chunk,
    to_records,
)

# A prompt as LangExtract 1.7.1 renders it (description, the few-shot example, then the chunk).
EXAMPLE = (
    "Extract every payment that was actually made.\n\nExamples\n"
    "Q: Ashford Cables Ltd paid 1200 on 2020-01-05 via Northbank. The hall was repainted in May.\n"
    'A: {\n  "extractions": [\n    {\n      "payment": "Ashford Cables Ltd paid 1200 on 2020-01-05 via Northbank.",\n'
    '      "payment_attributes": {\n        "payer": "Ashford Cables Ltd",\n        "date": "2020-01-05",\n'
    '        "amount": "1200",\n        "bank": "Northbank"\n      }\n    }\n  ]\n}\n\n'
)


def prompt(chunk: str) -> str:
    return f"{EXAMPLE}Q: {chunk}\nA: "


def test_reply_reads_the_chunk_only_and_resolves_roles_introduced_in_it():
    chunk = ("Brent Tools Ltd (hereinafter the Carrier) signed the framework agreement this year.\n"
             "The Carrier paid 500 on 2020-01-02 via Unity.\n"
             "The Supplier paid 70 on 2021-03-04.\n"
             "Selby Glass Ltd was invoiced 30 on 2020-02-02.\n"
             "For the avoidance of doubt, Oakham Dairy Ltd paid 9 on 2019-09-09.\n"
             "Amendment: the payment Jarrow Print Ltd made on 2018-01-01 is corrected to 410.")
    assert prompt_chunk(prompt(chunk)) == chunk
    text, stats = oracle_reply(prompt(chunk))
    items = json.loads(text)["extractions"]
    assert [i["payment"] for i in items] == [
        "The Carrier paid 500 on 2020-01-02 via Unity.", "Oakham Dairy Ltd paid 9 on 2019-09-09.",
        "Amendment: the payment Jarrow Print Ltd made on 2018-01-01 is corrected to 410."]
    assert items[0]["payment_attributes"] == {"payer": "Brent Tools Ltd", "date": "2020-01-02", "amount": "500",
                                              "bank": "Unity"}
    assert items[2]["payment_attributes"]["amount"] == "410"
    assert stats["extractions"] == 3 and stats["unresolved_roles"] == 1  # the Supplier: no introduction here
    assert all(c in chunk for c in (i["payment"] for i in items))


def test_example_is_never_extracted_and_fences_follow_the_example():
    text, stats = oracle_reply(prompt("Nothing of note happened."))
    assert json.loads(text) == {"extractions": []} and stats["extractions"] == 0
    fenced = EXAMPLE.replace('A: {', 'A: ```json\n{').replace('}\n\n', '}\n```\n\n')
    text, _ = oracle_reply(f"{fenced}Q: Selby Glass Ltd paid 5 on 2020-01-01.\nA: ")
    assert text.startswith("```json\n") and text.endswith("\n```")
    assert json.loads(text[8:-4])["extractions"][0]["payment_attributes"]["payer"] == "Selby Glass Ltd"


def test_extractions_become_scoreable_records():
    recs = to_records([{"class": "payment", "text": "X", "char_interval": [3, 9], "alignment": "match_exact",
                        "attributes": {"payer": "Selby Glass Ltd", "date": "2020-01-01", "amount": "5", "bank": "Unity"}},
                       {"class": "payment", "text": "Y", "char_interval": None, "alignment": None,
                        "attributes": {"payer": "Oakham Dairy Ltd", "date": "2020-01-02", "amount": "7"}}])
    assert recs[0] == PeerRecord({"payer": "Selby Glass Ltd", "date": "2020-01-01", "amount": 5, "bank": {"name": "Unity"}},
                                 1, {"payment": Span(3, 9)}, "X")
    assert "bank" not in recs[1].values and recs[1].evidence["payment"].char_start is None
