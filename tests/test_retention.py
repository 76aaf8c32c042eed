"""Capture and retention against scripted chains whose captures and losses are known."""

from __future__ import annotations

from memagent.data.records_corpus import statement
from memagent.retention import Evidence, hotpot_evidence, item_outcomes, records_evidence, retention_of, \
    ruler_evidence, summarise, timeline

TEXT = "aaaa NEEDLE-ONE bbbb 4821 cccc Paris dddd"
EV = [Evidence("one", "needle-one", 5, 15), Evidence("num", 4821, 21, 25, "number"), Evidence("city", "Paris", 31, 36)]


def test_known_capture_and_loss():
    # Step 0 reads the first item and keeps it; step 1 reads the number and keeps both; step 2 reads the
    # city, drops the first item and never writes the city.
    steps = [(16, "Needle-One"), (26, "NEEDLE-ONE and 4,821"), (len(TEXT), "the number: 4821.00")]
    out = item_outcomes(EV, steps)
    assert [o.read_at for o in out] == [0, 1, 2]
    assert [o.held_at for o in out] == [(0, 1), (1, 2), ()]
    assert [(o.captured, o.retained) for o in out] == [(True, False), (True, True), (False, False)]
    s = summarise(out)
    assert (s["n_read"], s["n_captured"], s["n_retained"]) == (3, 2, 1)
    assert s["capture"] == 2 / 3 and s["retention"] == 1 / 3 and s["kept"] == 1 / 2


def test_held_before_read_is_no_capture_and_matching_is_bounded():
    # The memory names the city before the chain reads it (a guess), then forgets; "48210" is not 4821.
    steps = [(10, "Paris? 48210"), (len(TEXT), "nothing")]
    out = item_outcomes(EV, steps)
    assert out[2].held_at == (0,) and not out[2].captured
    assert out[1].held_at == ()
    assert timeline(EV, steps)[0] == [(False, False), (False, False), (False, True)]


def test_unread_items_and_empty_chains():
    out = item_outcomes(EV, [(16, "needle-one")])  # centre truncation: the rest never read
    assert [o.read_at for o in out] == [0, None, None]
    assert summarise(out)["retention"] == 1.0
    assert summarise(item_outcomes(EV, []))["capture"] is None


def test_trace_dicts_and_answer_steps():
    steps = [{"kind": "memory", "char_end": 16, "memory": "needle-one"},
             {"kind": "memory", "char_end": len(TEXT), "memory": "Paris"},
             {"kind": "answer", "char_end": None, "memory": "Paris"}]
    r = retention_of(EV, steps)
    assert (r["n_captured"], r["n_retained"]) == (2, 1)
    assert r["items"][0] == {"label": "one", "read_at": 0, "held_at": [0], "captured": True, "retained": False}


def test_ruler_hotpot_and_records_evidence_point_at_their_values():
    row = {"context": "x One of the special magic numbers for a-b is: 1234567. y", "answers": ["1234567"]}
    (e,) = ruler_evidence(row)
    assert row["context"][e.start:e.end] == "1234567"
    ctx = "Document 1:\nFoo\nfoo text.\n\nDocument 2:\nBar Baz\nbar text."
    (h,) = hotpot_evidence({"context": ctx, "gold_positions": [2], "id": "q"})
    assert h.value == "Bar Baz" and ctx[h.start:h.end] == "Bar Baz\nbar text."
    doc = statement("d", 3000, 4)
    ev = records_evidence(doc)
    assert len(ev) == len(doc["gold"]) > 0
    for item in ev:
        assert f"{item.value}" in doc["text"][item.start:item.end]
