"""Records read per chunk (memagent/extraction/reading.py through memagent.agent.read_document): emitted
per step, grounded, merged across chunks, split and re-read when a reply overflows, kept through a
chain checkpoint; and one document's records as the records output's typed rows."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import pyarrow as pa
import pytest
from transformers import AutoTokenizer

from memagent.agent import read_document
from memagent.checkpoint import new_segment, parse_segment, replay
from memagent.chunking import Chunk
from memagent.engines.base import Completion, SamplingParams
from memagent.extraction import record_items, records_arrow_schema, schema_from
from memagent.extraction.record_grounding import MemoryTrail
from memagent.extraction.reading import ChunkRead, RecordsCall, read_chunk_records, records_reach, sentence_end, \
    split_point
from memagent_testing.records_helpers import CONFIG, FILLER, SCHEMA, RecordsEngine, document, payment, planted, section


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    return AutoTokenizer.from_pretrained(str(tiny_llama_dir))


def three_chunk_document() -> str:
    # The same payment in chunks 0 and 2 (amended amount, a bank named later), another only in chunk 1.
    return document([payment("Acme Ltd", 1250, "2021-03-14")],
                    [payment("Birch Ltd", 300, "2021-04-01", "Northbank")],
                    [payment("Acme Ltd", 1300, "2021-03-14", "Southbank")])


def read(engine, text, **kw):
    return asyncio.run(read_document(engine, None, text, CONFIG, **kw))


def test_records_are_emitted_per_chunk_and_merged_across_chunks(tokenizer):
    engine = RecordsEngine(tokenizer)
    text = three_chunk_document()
    r = read(engine, text)
    assert r.n_chunks >= 3
    memory_steps = [s for s in r.steps if s.kind == "memory"]
    # Each chunk got one records call (one record type): the chunk, then the rest of the sentence its end cuts.
    records_calls = [c for c in engine.calls if c[0] == "records"]
    assert len(records_calls) == len(memory_steps)
    for c, s in zip(records_calls, memory_steps):
        read_to = s.char_start + len(section(c[1]))
        assert section(c[1]) == text[s.char_start:read_to] and read_to >= s.char_end
        assert read_to == len(text) or text[read_to - 1] in ".\n"
    payments = r.records["payments"]
    assert [(p.values["payer"], p.values["amount"], p.mentions) for p in payments] == [
        ("Acme Ltd", 1300, 2), ("Birch Ltd", 300, 1)]
    acme = payments[0]
    assert acme.values["bank"] == {"name": "Southbank"} and acme.first_chunk == 0 and acme.last_chunk >= 2
    # Evidence: the amended amount cites the later chunk's span, the date the first statement.
    amount, date = acme.evidence["amount"], acme.evidence["date"]
    assert text[amount.char_start:amount.char_end] == "1300" and amount.step == acme.last_chunk
    assert date.step == 0 and text[date.char_start:date.char_end] == "2021-03-14"
    assert date.char_start < memory_steps[0].char_end
    # Never carried in the memory; the records call is constrained to the array schema.
    assert all(s.memory == "mem" for s in memory_steps)
    assert all('"type": "array"' in c[2].json_schema for c in records_calls)
    assert r.records_tally.splits == 0 and r.records_tally.failed == 0


def test_the_records_call_shares_the_memory_updates_prefix(tokenizer):
    engine = RecordsEngine(tokenizer)
    read(engine, three_chunk_document())
    memory = [c[1] for c in engine.calls if c[0] == "memory"]
    records = [c[1] for c in engine.calls if c[0] == "records"]
    for m, rec in zip(memory, records):
        shared = m[: m.index("\n</section>")]  # then the records call reads on to the end of a cut sentence
        assert rec.startswith(shared) and len(shared) > 0.9 * len(m)  # instruction, question, memory, chunk


def test_a_reply_cut_at_its_budget_is_split_and_reread_never_truncated(tokenizer):
    names = ["Alpha Ltd", "Bravo Ltd", "Charlie Ltd", "Delta Ltd"]
    text = document([payment(n, 100 + i, f"2021-05-{i + 1:02d}") for i, n in enumerate(names)], filler=1)
    engine = RecordsEngine(tokenizer, max_records=1)  # any reply listing 2+ records is cut
    r = read(engine, text)
    # Each chunk's whole call is the one right after its memory update; its halves follow it.
    chunks = [section(c[1]) for prev, c in zip(engine.calls, engine.calls[1:]) if prev[0] == "memory"]
    stated = sorted(p["payer"] for p in planted(text))  # a sentence cut by a chunk edge is read whole once
    assert len(stated) == 4 and sorted(p.values["payer"] for p in r.records["payments"]) == stated
    crowded = sum(len(planted(c)) - 1 for c in chunks if len(planted(c)) > 1)  # halvings needed at least
    assert crowded >= 1 and r.records_tally.splits >= crowded and r.records_tally.failed == 0
    cut = [c for c in engine.calls if c[0] == "records" and len(planted(section(c[1]))) > 1]
    assert cut  # the full chunk was asked for first, and its reply was cut
    for p in r.records["payments"]:  # grounded inside the piece that stated it
        e = p.evidence["payer"]
        assert text[e.char_start:e.char_end] == p.values["payer"]


def test_a_piece_too_short_to_split_is_counted_not_guessed(tokenizer):
    engine = RecordsEngine(tokenizer, max_records=0)  # every reply with a record is cut
    r = read(engine, document([payment("Acme Ltd", 5, "2021-01-01")], filler=1))
    assert r.records["payments"] == [] and r.records_tally.failed >= 1 and r.records_tally.splits >= 1


def test_a_sentence_cut_by_a_chunk_boundary_is_read_whole_once(tokenizer):
    # Every line a payment, no key (so a sentence read by two calls would be two records): each
    # boundary cuts a sentence, which the call before reads to its end and the call after leaves.
    keyless = {**SCHEMA, "properties": {**SCHEMA["properties"], "payments": {
        k: v for k, v in SCHEMA["properties"]["payments"].items() if k != "x-key"}}}
    config = CONFIG.model_copy(update={"extraction": schema_from(keyless)})
    text = "\n".join(payment(f"Firm{chr(65 + i)} Ltd", 100 + i, f"2021-06-{i % 28 + 1:02d}") for i in range(24))
    r = asyncio.run(read_document(RecordsEngine(tokenizer), None, text, config))
    steps = [s for s in r.steps if s.kind == "memory"]
    cut = [s for s in steps[:-1] if text[s.char_end - 1] != "\n"]
    assert len(steps) >= 3 and len(cut) >= 2  # boundaries inside sentences
    assert [p.values["payer"] for p in r.records["payments"]] == [f"Firm{chr(65 + i)} Ltd" for i in range(24)]


class FixedReply(RecordsEngine):
    async def chat(self, messages, params):
        reply = [{"payer": "Acme Ltd", "date": "2021-01-01", "amount": 5, "bank": {"name": "Northbank"}}]
        return Completion(text=json.dumps(reply), prompt_tokens=50, completion_tokens=20, finish_reason="stop")


def test_ownership_counts_only_the_spans_in_the_window(tokenizer):
    # The payer is named only by its role here, resolved through the memory: its span is the
    # introduction far before the window. And the window opens on the end of another payment's
    # sentence naming the same bank. Neither hands the record to the call before.
    text = ("Acme Ltd (hereinafter the Carrier) signs.\nBirch Ltd paid 9 on 2020-02-02 via Northbank.\n" + FILLER
            + "\nThe Carrier paid 5 on 2021-01-01 via Northbank.\n" + FILLER)
    start, owned_from, sentence = text.index("2020-02-02"), text.index(FILLER), text.index("The Carrier")
    call = RecordsCall(FixedReply(tokenizer), CONFIG.extraction, "q", SamplingParams(64))

    def payers(owned):
        memory = "the Carrier = Acme Ltd"
        chain = MemoryTrail(memory, ((memory, 0, start),))
        found = asyncio.run(read_chunk_records(ChunkRead(call, chain, text, 1), start, len(text), owned_from=owned))
        return [e.mention.values["payer"] for e in found.emitted]

    assert payers(start) == payers(owned_from) == payers(sentence) == ["Acme Ltd"]
    assert payers(len(text) - 1) == []  # every value found in the window lies before: the call before's


def test_records_reach_tiles_the_text_at_sentence_ends():
    text = "Alpha paid 1. Beta paid 2.\nGamma paid 3. Delta"
    chunks = [Chunk(0, 0, 0, 0, 8, text[:8]), Chunk(1, 0, 0, 8, 30, text[8:30]), Chunk(2, 0, 0, 30, 46, text[30:])]
    reach = [records_reach(text, chunks, k) for k in range(3)]
    assert reach == [(0, 0, 13), (8, 13, 40), (30, 40, 46)]
    assert [text[o:e] for _, o, e in reach] == ["Alpha paid 1.", " Beta paid 2.\nGamma paid 3.", " Delta"]
    assert sentence_end("x" * 1000, 10, 1000) == 10  # no sentence end within TAIL_CHARS: the cut stays
    gap = [chunks[0], Chunk(2, 0, 0, 30, 46, text[30:])]  # the middle dropped (max_chunks): never crossed
    assert [records_reach(text, gap, k) for k in range(2)] == [(0, 0, 8), (30, 30, 46)]


def test_split_point_prefers_line_breaks_near_the_middle():
    text = "one two\nthree four five. six\nseven eight"
    i = split_point(text)
    assert text[i - 1] == "\n" and 0 < i < len(text)
    assert split_point("x" * 10) == 5


def test_a_resumed_read_keeps_the_records_of_the_chunks_before(tokenizer):
    text = three_chunk_document()
    states = []

    async def keep(state):
        states.append(state)

    full = read(RecordsEngine(tokenizer), text, on_state=keep)
    mid = states[1]  # after two chunks: Acme's first mention and Birch are in the state
    assert {e.mention.values["payer"] for e in mid.records} == {"Acme Ltd", "Birch Ltd"}
    # Through the stored log (two segments), as an actor would read it back.
    log = [parse_segment(json.dumps(new_segment("d", "k", states[0], 0))),
           parse_segment(json.dumps(new_segment("d", "k", mid, 1)))]
    state, why = replay(log, "d", "k")
    assert why is None and state.records == mid.records
    engine = RecordsEngine(tokenizer)
    resumed = read(engine, text, resume=state)
    assert [c for c in engine.calls if c[0] == "records"] and resumed.resumed_at_chunk == 2
    assert resumed.records == full.records  # evidence and mentions included


def test_records_dataset_rows_have_typed_columns_and_evidence(tokenizer):
    r = read(RecordsEngine(tokenizer), three_chunk_document())
    record = CONFIG.extraction.record_type("payments")
    rows = [{"id": "doc-1", "record_type": "payments", **item} for item in record_items(record, r.records["payments"])]
    t = pa.Table.from_pylist(rows, schema=records_arrow_schema(record))
    assert t.schema.field("date").type == pa.date32() and t.schema.field("amount").type == pa.float64()
    assert t.schema.field("bank").type == pa.struct([("name", pa.string())])
    assert t.column_names[:3] == ["id", "record_type", "record_index"]
    assert t.column_names[-5:] == ["record_evidence", "record_conflicts", "first_chunk", "last_chunk", "mentions"]
    rows = t.to_pylist()
    assert rows[0]["date"] == dt.date(2021, 3, 14) and rows[0]["mentions"] == 2 and rows[1]["record_index"] == 1
    assert {e["field"] for e in rows[0]["record_evidence"]} == {"payer", "date", "amount", "bank.name"}


def test_a_field_named_like_a_record_count_column_is_refused():
    clash = {**SCHEMA, "properties": {**SCHEMA["properties"], "n_records_payments": {"type": "integer"}}}
    with pytest.raises(ValueError, match="n_records_payments.*clashes with the record count column"):
        schema_from(clash)
