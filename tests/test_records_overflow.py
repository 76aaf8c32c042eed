"""How a records call fails, against scripted replies (unit tests of the logic around the engine).

Invariant: a failing reply costs a bounded number of calls and never silently costs the records
beside it: a runaway reply is not split, an invalid item drops alone, splitting stops at its depth.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from memagent.agent import read_document
from memagent.config import AgentConfig
from memagent.extraction import schema_from
from memagent.extraction import reading
from memagent.extraction.reading import complete_items, repeats_itself
from memagent_testing.oracle.ledger import SCHEMA, LedgerSpec, gold, ledger
from memagent_testing.oracle.records_oracle import LedgerOracle
from memagent_testing.oracle.servers import OracleEngine

CFG = AgentConfig(chunk_tokens=8000, memory_tokens=4000, answer_tokens=16, query_tokens=400,
                  extraction=schema_from(SCHEMA), require_grounding=True)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def records_reply(make):
    """A model whose memory updates say little and whose records replies are ``make(prompt)``."""
    def reply(prompt: str) -> str:
        return make(prompt) if "Reply with a JSON array of the " in prompt else "noted"
    return reply


def test_complete_items_and_repeats():
    """A cut array yields the items it completed; a tail that repeats one unit is a loop, distinct items are not."""
    assert complete_items('[{"a": 1}, {"a": 2}, {"a": 3') == [{"a": 1}, {"a": 2}]
    assert complete_items("no array") == []
    assert repeats_itself('[' + '{"payer": "Acme", "amount": 1}, ' * 40)
    assert not repeats_itself(json.dumps([{"payer": f"P{i}", "amount": i * 7} for i in range(40)]))


def test_a_runaway_reply_is_not_split(tokenizer):
    """A reply overflowing with records the passage does not state is one failed, runaway piece: no split."""
    doc = ledger("r", LedgerSpec(prose=6), 2)
    fake = [{"payer": f"Invented {i} Ltd", "date": "2001-01-01", "amount": i} for i in range(60)]
    engine = OracleEngine(records_reply(lambda p: json.dumps(fake)), tokenizer)
    result = asyncio.run(read_document(engine, None, doc.text, CFG))
    t = result.records_tally
    assert (t.splits, t.failed, t.runaway) == (0, 1, 1) and engine.calls == 2 and result.records["payments"] == []


def test_an_invalid_item_drops_alone(tokenizer):
    """One record with an impossible date (the pattern allows it, the format does not) is dropped and
    counted; its neighbours are kept and nothing is split."""
    doc = ledger("v", LedgerSpec(prose=5, near_misses=0, filler=0), 4)
    oracle = LedgerOracle([doc])

    def bad_one(prompt: str) -> str:
        items = json.loads(oracle.reply(prompt))
        return json.dumps(items + [{"payer": "Acme Ltd", "date": "2021-02-31", "amount": 1}])
    result = asyncio.run(read_document(OracleEngine(records_reply(bad_one), tokenizer), None, doc.text, CFG))
    assert result.records_tally.invalid_items == 1 and result.records_tally.splits == 0
    assert len(result.records["payments"]) == len(gold(doc))


def test_splitting_stops_at_its_depth_and_keeps_full_replies(tokenizer, monkeypatch):
    """Past the split depth a full reply's records are kept and the piece is counted as failed."""
    monkeypatch.setattr(reading, "MAX_SPLIT_DEPTH", 1)
    doc = ledger("d", LedgerSpec(prose=0, table_rows=260, near_misses=0, filler=0), 3)
    result = asyncio.run(read_document(OracleEngine(LedgerOracle([doc]).reply, tokenizer), None, doc.text, CFG))
    t = result.records_tally
    assert (t.splits, t.failed) == (1, 2) and len(result.records["payments"]) == 100
