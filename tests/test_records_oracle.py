"""Records against a perfect model: generated ledgers with every case a user's documents hold, read by
the memory agent with a constrained oracle (memagent_testing/oracle) in place of the model.

The invariant: with a perfect model, every stated record comes out exactly once, with its values,
the amounts its key's other statements gave as conflicts, and each value's span inside a sentence
that states it (an alias's name inside its definition); and no record the model invents from
values stated only in other chunks survives ``require_grounding``.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from memagent.agent import read_document
from memagent.config import AgentConfig
from memagent.extraction import schema_from
from memagent_testing.oracle.ledger import SCHEMA, Ledger, LedgerSpec, gold, ledger
from memagent_testing.oracle.records_oracle import LedgerOracle
from memagent_testing.oracle.servers import OracleEngine

SPECS = st.builds(
    LedgerSpec, prose=st.integers(0, 12), table_rows=st.integers(0, 60), bullets=st.integers(0, 20),
    cjk=st.integers(0, 5), aliases=st.integers(0, 4), by_role=st.integers(0, 5), conflicts=st.integers(0, 5),
    near_misses=st.integers(0, 3), filler=st.integers(0, 8), long_lines=st.booleans())


def config(chunk_tokens: int, memory_tokens: int | None = None, require_grounding: bool = True,
           ground_elsewhere: bool = False) -> AgentConfig:
    return AgentConfig(chunk_tokens=chunk_tokens, memory_tokens=memory_tokens or min(384, 4 * chunk_tokens), answer_tokens=16, query_tokens=400,
                       extraction=schema_from(SCHEMA), require_grounding=require_grounding,
                       ground_elsewhere=ground_elsewhere)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def read(engine, doc: Ledger, cfg: AgentConfig):
    return asyncio.run(read_document(engine, None, doc.text, cfg))


def check_against_gold(doc: Ledger, result, invented: list[dict] = ()) -> None:
    """Every gold record once, its values, conflicts and spans; nothing else (the invariant above)."""
    expected = gold(doc)
    got = result.records["payments"]
    keys = [(r.values["payer"], r.values["date"]) for r in got]
    assert sorted(keys) == sorted(expected), "records lost, doubled or invented"
    for r in got:
        g = expected[(r.values["payer"], r.values["date"])]
        assert r.values["amount"] == g["amount"]
        assert [c.value for c in r.conflicts if c.field == "amount"] == g["conflicts"]
        for path, ev in r.evidence.items():
            check_span(doc, r.values["payer"], r.values["date"], path, ev.char_start, ev.char_end, ev.grounding)
    stated = {(s.payer, s.date, s.amount) for s in doc.statements}
    fakes = {(f["payer"], f["date"], f["amount"]) for f in invented} - stated  # a fake may happen to be true
    assert not fakes & {(r.values["payer"], r.values["date"], r.values["amount"]) for r in got}
    tally = result.records_tally
    assert (tally.failed, tally.invalid_items) == (0, 0)


def check_span(doc: Ledger, payer: str, date: str, path: str, start: int | None, end: int | None,
               grounding: str | None) -> None:
    """A value's span lies inside a sentence stating its record (a payer named by role: inside its alias's
    definition), found in the text its call read or through the memory."""
    assert start is not None and grounding in ("exact", "normalised", "fuzzy", "memory"), (path, grounding)
    by_role = [s for s in doc.statements if (s.payer, s.date) == (payer, date) and s.written_payer != s.payer]
    allowed = gold(doc)[(payer, date)]["spans"] + ([doc.alias_spans[f"the {by_role[0].written_payer}"]]
                                                   if path == "payer" and by_role else [])
    assert any(a <= start and end <= b for a, b in allowed), \
        f"{path} of {payer, date} grounded at {doc.text[start:end]!r}, outside every sentence stating it"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=SPECS, seed=st.integers(0, 2**16), chunk_tokens=st.sampled_from([48, 96, 256, 1024]),
       invent=st.booleans())
# A correction reverted in a sentence the chunk owns, its values also those of the cut sentence the chunk
# starts in (the call before's): grounded there first, it was taken for the call before's record.
@example(spec=LedgerSpec(prose=0, table_rows=0, bullets=0, cjk=3, aliases=2, by_role=1, conflicts=2, near_misses=0,
                         filler=0, long_lines=False), seed=4335, chunk_tokens=48, invent=False)
def test_perfect_model_records_come_out_exactly_once(tokenizer, spec, seed, chunk_tokens, invent):
    """Every record a perfect model reads comes out exactly once with spans in its own sentence, and no
    invented record survives require_grounding."""
    doc = ledger("d", spec, seed)
    oracle = LedgerOracle([doc], invent=invent, seed=seed)
    result = read(OracleEngine(oracle.reply, tokenizer), doc, config(chunk_tokens))
    check_against_gold(doc, result, oracle.invented)
    assert invent or result.records_tally.dropped_records == 0


def test_a_dense_page_past_the_call_limit_is_split_never_capped(tokenizer):
    """A chunk stating 260 payments (over the 50 a records call may return) yields all 260 records."""
    doc = ledger("dense", LedgerSpec(prose=0, table_rows=260, near_misses=0, filler=0), 3)
    engine = OracleEngine(LedgerOracle([doc]).reply, tokenizer)
    result = read(engine, doc, config(chunk_tokens=8000, memory_tokens=4000))
    assert result.n_chunks == 1 and len(result.records["payments"]) == 260
    assert result.records_tally.splits >= 5 and result.records_tally.failed == 0
    check_against_gold(doc, result)


def test_records_only_schema_makes_no_final_call(tokenizer):
    """A schema of record types only reads the chunks and makes no final-answer call."""
    doc = ledger("r", LedgerSpec(prose=3), 1)
    engine = OracleEngine(LedgerOracle([doc]).reply, tokenizer)
    result = read(engine, doc, config(chunk_tokens=4096))
    assert [s.kind for s in result.steps] == ["memory"] * result.n_chunks and result.response == "{}"
    assert engine.calls == 2 * result.n_chunks


def test_without_require_grounding_an_invented_value_is_labelled_elsewhere(tokenizer):
    """Without require_grounding an invented record is kept, but its values found only outside the window
    it was read from are labelled 'elsewhere' (with ground_elsewhere), never 'exact'; by default they have
    no span at all (the whole document is not searched)."""
    doc = ledger("e", LedgerSpec(prose=12, filler=4), 5)
    for ground_elsewhere, want in ((True, {"elsewhere"}), (False, {None})):
        oracle = LedgerOracle([doc], invent=True, seed=1)
        cfg = config(48, require_grounding=False, ground_elsewhere=ground_elsewhere)
        result = read(OracleEngine(oracle.reply, tokenizer), doc, cfg)
        assert oracle.invented
        fakes = {(f["payer"], f["date"]) for f in oracle.invented} - set(gold(doc))
        labels = [r.evidence["date"].grounding for r in result.records["payments"]
                  if (r.values["payer"], r.values["date"]) in fakes and r.values["date"]]
        assert labels and set(labels) <= want, ground_elsewhere
