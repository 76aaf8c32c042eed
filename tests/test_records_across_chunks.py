"""Records assembled across chunks (issue 51): values carried by the memory, mentions merged in any order,
and no record written that breaks its schema.

The invariant against a perfect memory-keeping reader (memagent_testing/oracle/invoices.py), in process, over HTTP
through the OpenAI engine and through the hf engine's grammar: every settled invoice comes out exactly
once with every required value, each value grounded (window or memory) inside a sentence that states it,
under ``require_grounding`` too; open invoices are counted incomplete (when mentioned), never written;
an invented record does not survive; a restating summary table merges without conflicts.
"""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent.agent import read_document
from memagent.config import AgentConfig
from memagent.extraction import schema_from
from memagent.extraction.reading import ChunkRecords, Emitted, finish_records
from memagent.extraction.record_grounding import MemoryTrail, ground_chunk, ground_value
from memagent.extraction.records import Mention, merge_records
from memagent_testing.oracle.invoices import SCHEMA, InvoiceSpec, MemoryOracle, allowed_spans, gold, invoices
from memagent_testing.oracle.servers import OracleEngine
from tests.spellings import Written, amounts, dates, written_dates, written_numbers

INVOICES = schema_from(SCHEMA)
FILLER = "Nothing else of note happened in the office.\n"


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


# -- 1. grounding through the memory, every kind ------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(data=st.data(), value=amounts(negative=False).filter(lambda v: v >= 100), date=dates(),
       canonical=st.booleans())
def test_a_carried_number_or_date_is_grounded_where_the_chain_read_it(data, value, date, canonical):
    """A number or date the memory holds (as written, or canonically) is grounded in the chunk of the first
    memory step holding it, labelled memory, whatever the spelling; a memory without it grounds nothing."""
    w_num, w_date = data.draw(written_numbers(value)), data.draw(written_dates(date))
    line = w_num.within("Invoice INV-0042 was issued for ", " on ")
    line = Written(line.text + w_date.text + ".\n", line.start, line.end)
    date_at = len(line.text) - len(w_date.text) - 2
    text = FILLER + line.text + FILLER * 3 + "Invoice INV-0042 was settled.\n"
    first = (0, len(FILLER) + len(line.text))  # chunk 0 states the issue; chunk 1 the settlement
    window = (first[1], len(text))
    held = f"INV-0042: issued {date.isoformat()} amount {value:.2f}" if canonical else line.text
    chain = MemoryTrail(held, (("", 0, 0), (held, *first)))
    span = ground_value("number", value, text, window, chain)
    assert span is not None and span.where == "memory"
    assert (span.start, span.end) == (len(FILLER) + line.start, len(FILLER) + line.end)
    dspan = ground_value("date", date.isoformat(), text, window, chain)
    assert dspan is not None and dspan.where == "memory"
    assert (dspan.start, dspan.end) == (len(FILLER) + date_at, len(FILLER) + date_at + len(w_date.text))
    assert ground_value("number", value, text, window, MemoryTrail("nothing held", chain.steps)) is None


def test_a_carried_date_never_identifies_a_record():
    """A key that is a date the memory carries does not identify a record (a made-up record would pass);
    a text key may come through the memory (an alias), and carried non-key values are kept."""
    schema = schema_from({"type": "object", "properties": {"payments": {
        "type": "array", "x-key": ["payer", "date"], "items": {"type": "object", "required": ["payer", "date"],
                                                              "properties": {"payer": {"type": "string"},
                                                                             "date": {"type": "string", "format": "date"},
                                                                             "amount": {"type": "number"}}}}}})
    text = "Ann Ltd paid 1,250.00 on 2021-03-14.\nBo Ltd paid later.\n"
    chain = MemoryTrail("Ann Ltd 2021-03-14 1250", (("Ann Ltd 2021-03-14 1250", 0, 37),))
    rec = schema.record_type("payments")
    by_date = ground_chunk(rec, [{"payer": "Bo Ltd", "date": "2021-03-14"}], text, (37, len(text)), trail=chain,
                           require_grounding=True)
    assert (by_date.records, by_date.dropped_records) == ([], 1)
    carried = ground_chunk(rec, [{"payer": "Bo Ltd", "date": "2021-03-14", "amount": 1250}], text, (37, len(text)),
                           trail=chain)
    assert carried.spans[0]["amount"].where == "memory" and carried.spans[0]["date"].where == "memory"


# -- 2. a record never breaks its schema --------------------------------------------------------------


def test_the_per_chunk_grammar_requires_only_the_key_and_the_end_requires_everything():
    """A mention may state only its chunk's half (the grammar requires the key alone); the merged record must
    be whole: a record lacking a required value is dropped at the end, counted, its missing fields named."""
    assert INVOICES.records_schema("invoices")["items"]["required"] == ["invoice"]
    half = {"invoice": "INV-0001", "issued": "2021-03-14", "amount": 10.5}
    assert INVOICES.valid_records("invoices", [half, {"issued": "2021-03-14"}]) == ([half], 1)
    rest = {"invoice": "INV-0001", "settled": "2021-04-14", "paid": 10.0}
    found = ChunkRecords([Emitted("invoices", Mention(3, rest)), Emitted("invoices", Mention(1, half)),
                          Emitted("invoices", Mention(2, {"invoice": "INV-0002", "issued": "2021-05-14"}))])
    records, tally, notes = finish_records(INVOICES, found)
    assert [r.values for r in records["invoices"]] == [{**half, **rest}]
    assert tally.incomplete == 1 and found.tally.incomplete == 0  # the read's own tally is untouched
    assert notes == ["invoices[1]: incomplete record dropped, lacks amount, settled, paid"]
    assert all(not INVOICES.resolved.record_errors("invoices", r.values) for r in records["invoices"])


# -- 3. one record from many mentions, in any order ---------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(order=st.permutations(range(4)), restate=st.booleans())
def test_halves_merge_into_one_record_each_value_with_its_own_evidence(order, restate):
    """An issue, a settlement and (restating) a whole row of one key merge into one record in any order of
    chunks: each value keeps the evidence of the first chunk stating it, equal restatements never conflict."""
    issue = {"invoice": "INV-7", "issued": "2021-03-14", "amount": 1250.0}
    settle = {"invoice": "inv-7", "settled": "2021-04-20", "paid": 1200.0}
    row = {**issue, "amount": "1,250.00", **{k: v for k, v in settle.items() if k != "invoice"}} if restate else issue
    mentions = [Mention(step, values, {k: (10 * step, 10 * step + 1) for k in values})
                for step, values in zip(order, (issue, settle, row, settle))]
    [record] = merge_records(INVOICES.record_type("invoices"), mentions)
    assert record.conflicts == [] and record.mentions == 4
    assert record.values["issued"] == "2021-03-14" and record.values["paid"] == 1200.0
    first = {k: min(m.step for m in mentions if k in m.values) for k in ("issued", "amount", "settled", "paid")}
    assert {k: record.evidence[k].step for k in first} == first


# -- 5. the perfect memory-keeping reader -------------------------------------------------------------


def config(chunk_tokens: int, require_grounding: bool = True) -> AgentConfig:
    return AgentConfig(chunk_tokens=chunk_tokens, memory_tokens=min(384, 4 * chunk_tokens), answer_tokens=16,
                       query_tokens=400, extraction=INVOICES, require_grounding=require_grounding)


@st.composite
def documents(draw: st.DrawFn, max_invoices: int = 5):
    """An invoice document (gaps of 0 to 40 filler lines, both orders, a restating table or not) spelled by
    the spellings strategies."""
    n = draw(st.integers(1, max_invoices))
    spec = InvoiceSpec(gaps=tuple(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))),
                       settled_first=tuple(draw(st.lists(st.booleans(), min_size=n, max_size=n))),
                       stagger=draw(st.integers(0, 6)), open=draw(st.integers(0, 2)), table=draw(st.booleans()))
    spell_number = lambda v: draw(written_numbers(v))  # noqa: E731
    spell_date = lambda d: draw(written_dates(d))  # noqa: E731
    return invoices("d", spec, draw(st.integers(0, 2**16)), spell_number, spell_date)


def check_invoices(doc, result, oracle: MemoryOracle) -> None:
    """The invariant of the module docstring."""
    expected = gold(doc)
    got = result.records["invoices"]
    assert sorted(r.values["invoice"] for r in got) == sorted(expected), "records lost, doubled or invented"
    by_number = {i.invoice: i for i in doc.invoices}
    for r in got:
        assert r.values == expected[r.values["invoice"]] and r.conflicts == []
        assert not INVOICES.resolved.record_errors("invoices", r.values)  # what _records/ gets passes the schema
        for path, ev in r.evidence.items():
            assert ev.char_start is not None and ev.grounding in ("exact", "normalised", "fuzzy", "memory"), path
            assert any(a <= ev.char_start and ev.char_end <= b for a, b in allowed_spans(by_number[r.values["invoice"]],
                                                                                          path)), \
                f"{path} of {r.values['invoice']} grounded at {doc.text[ev.char_start:ev.char_end]!r}"
    tally = result.records_tally
    opened = sum(1 for i in doc.invoices if i.settled is None)
    assert (tally.failed, tally.invalid_items) == (0, 0) and tally.incomplete == len(result.records_incomplete)
    # An invented number may fuzzily match a real one (INV-12345 ~ INV-1234): its values are then removed and
    # the record, left with its key only, is dropped as incomplete, never written.
    if not oracle.invented:
        assert tally.dropped_values == 0 and tally.incomplete == (opened if oracle.partial else 0)
    assert not set(oracle.invented) & {r.values["invoice"] for r in got}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents(), chunk_tokens=st.sampled_from([64, 128, 512]), partial=st.booleans(), copy=st.booleans(),
       invent=st.booleans())
def test_a_perfect_memory_keeping_reader_assembles_every_record_once(tokenizer, doc, chunk_tokens, partial, copy,
                                                                      invent):
    """In process: every settled invoice once, whole, grounded in its own sentences (window or memory)."""
    oracle = MemoryOracle([doc], partial=partial, copy=copy, invent=invent)
    result = asyncio.run(read_document(OracleEngine(oracle.reply, tokenizer), None, doc.text, config(chunk_tokens)))
    check_invoices(doc, result, oracle)


def test_far_apart_halves_and_a_restating_table(tokenizer):
    """Halves 64 chunks apart in both orders, a summary table restating all: one record each, no conflict."""
    doc = invoices("far", InvoiceSpec(gaps=(1, 200, 400), settled_first=(True, False, True), stagger=2, open=1), 7)
    for partial in (False, True):
        oracle = MemoryOracle([doc], partial=partial, invent=True)
        result = asyncio.run(read_document(OracleEngine(oracle.reply, tokenizer), None, doc.text, config(64)))
        assert result.n_chunks > 64
        check_invoices(doc, result, oracle)
        memory = [ev for r in result.records["invoices"] for ev in r.evidence.values() if ev.grounding == "memory"]
        assert partial or memory  # without half mentions, the first half comes through the memory


@pytest.mark.parametrize("stagger", [0, 1])
def test_a_split_chunk_still_joins_the_halves_its_memory_held(tokenizer, stagger):
    """A chunk whose records reply overflows (two records past a 96-token budget) is read again in pieces; each
    piece still joins the settlements it states to the issues the memory held before the chunk (which a
    memory-keeping reader drops from the memory it writes there), and a cut never splits the one sentence a
    piece holds: every invoice once, whole."""
    cfg = AgentConfig(chunk_tokens=128, memory_tokens=96, answer_tokens=16, query_tokens=400, extraction=INVOICES,
                      require_grounding=True)
    splits = 0
    for gap in (4, 6, 8, 10, 12, 16):
        doc = invoices(f"split-{gap}", InvoiceSpec(gaps=(gap,) * 3, settled_first=(False,) * 3, stagger=stagger,
                                                   open=0, table=False), 5)
        oracle = MemoryOracle([doc])
        result = asyncio.run(read_document(OracleEngine(oracle.reply, tokenizer), None, doc.text, cfg))
        check_invoices(doc, result, oracle)
        splits += result.records_tally.splits
    assert splits > 0  # the budget did force pieces


class Swappable:
    def __init__(self):
        self.oracle = MemoryOracle([])

    def reply(self, prompt: str) -> str:
        return self.oracle.reply(prompt)


@pytest.fixture(scope="module")
def server(tokenizer):
    from memagent_testing.oracle.servers import oracle_app
    from tests.reliability_helpers import free_port, serving

    swap = Swappable()
    with serving(oracle_app(swap.reply, tokenizer), free_port()) as url:
        yield swap, url


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(doc=documents(4), chunk_tokens=st.sampled_from([64, 256]), partial=st.booleans(), invent=st.booleans())
def test_openai_engine_against_a_perfect_memory_keeping_server(server, tokenizer, doc, chunk_tokens, partial, invent):
    """Over HTTP through the OpenAI engine (response_format, max_tokens), the same invariant."""
    from memagent.engines.openai import OpenAIEngine

    swap, url = server
    swap.oracle = MemoryOracle([doc], partial=partial, invent=invent)
    engine = OpenAIEngine(url, "oracle", tokenizer, 65536)
    check_invoices(doc, asyncio.run(read_document(engine, None, doc.text, config(chunk_tokens))), swap.oracle)


@pytest.fixture(scope="module")
def hf_engine():
    from memagent_testing.oracle.scripted_lm import scripted_engine

    swap = Swappable()
    return swap, scripted_engine(swap.reply)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(doc=documents(3), partial=st.booleans(), invent=st.booleans())
def test_hf_engine_grammar_over_a_perfect_memory_keeping_model(hf_engine, doc, partial, invent):
    """Through the hf engine's decoding under the records grammar (only the key required per chunk), the same
    invariant: a half mention is written as the model means it, never padded with invented values."""
    swap, engine = hf_engine
    swap.oracle = MemoryOracle([doc], partial=partial, invent=invent)
    check_invoices(doc, asyncio.run(read_document(engine, None, doc.text, config(128))), swap.oracle)


def test_dates_past_the_twelfth_keep_spellings_unambiguous():
    """The generator's dates are unique and past the 12th (no day/month reading of one is another)."""
    doc = invoices("u", InvoiceSpec(gaps=(0,) * 30, settled_first=(False,), open=5), 1)
    days = [dt.date.fromisoformat(d) for i in doc.invoices for d in (i.issued, i.settled) if d]
    assert len(days) == len(set(days)) and min(d.day for d in days) > 12
