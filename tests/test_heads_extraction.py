"""Extraction with a memory of K heads: records assembled across chunks come out as with one memory.

The perfect memory-keeping reader (:class:`memagent_testing.oracle.invoices.MemoryOracle`) is shown every head and
writes its whole state (the half-seen invoices, the cut line) into the head the step rewrites. A records
call reads the heads without their labels, so a label's digits can ground no value.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from memagent.agent import read_document
from memagent.config import AgentConfig
from memagent.extraction.record_grounding import MemoryTrail, ground_value
from memagent.heads import labelled, split_heads, unlabelled
from memagent_testing.oracle.invoices import InvoiceDoc, InvoiceSpec, MemoryOracle, invoices
from memagent_testing.oracle.records_oracle import CUT_MARK, RECORDS_REQUEST, between
from memagent_testing.oracle.servers import OracleEngine
from tests.test_records_across_chunks import INVOICES, check_invoices, documents

HEAD_PROMPT = re.compile(r"New text of head (\d+):\s*$")
LABEL_LINE = re.compile(r"^## Memory head \d+ of \d+ .*$", re.M)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


class HeadsReader:
    """The oracle behind a K-head read: it reads all heads as one memory, keeps the one cut line that ends
    right before the passage (stale heads hold older ones), and answers a head's rewrite as a memory update."""

    def __init__(self, doc: InvoiceDoc, oracle: MemoryOracle):
        self.doc, self.oracle = doc, oracle
        self.records_prompts: list[str] = []

    def _memory(self, prompt: str) -> tuple[str, str]:
        memory = between(prompt, "<memory>\n", "\n</memory>") or ""
        passage = between(prompt, "<section>\n", "\n</section>") or ""
        at = self.doc.text.find(passage) if passage else -1
        cuts = [ln for ln in memory.splitlines() if ln.startswith(CUT_MARK)]
        fresh = [c for c in cuts if at > 0 and c[len(CUT_MARK):] in self.doc.text[max(0, at - len(c) - 8):at]]
        kept = [ln for ln in LABEL_LINE.sub("", memory).splitlines() if ln.strip() and not ln.startswith(CUT_MARK)]
        return memory, "\n".join(kept + fresh[-1:])

    def reply(self, prompt: str) -> str:
        memory, merged = self._memory(prompt)
        if RECORDS_REQUEST in prompt:
            self.records_prompts.append(memory)
            i = prompt.rfind("<memory>\n") + len("<memory>\n")
            return self.oracle.reply(prompt[:i] + merged + prompt[i + len(memory):])
        if HEAD_PROMPT.search(prompt):
            passage = between(prompt, "<section>\n", "\n</section>") or ""
            return self.oracle.memory(f"<memory>\n{merged}\n</memory>\n\n<section>\n{passage}\n</section>\n\n"
                                      "Updated memory:")
        return self.oracle.reply(prompt)


def heads_config(heads: int, chunk_tokens: int = 256) -> AgentConfig:
    return AgentConfig(chunk_tokens=chunk_tokens, memory_tokens=4 * chunk_tokens, memory_heads=heads,
                       answer_tokens=16, query_tokens=400, extraction=INVOICES, require_grounding=True)


def check_heads_trace(result, heads: int) -> None:
    """Each memory step rewrote exactly one head (least recently updated: step t writes head t % K)."""
    before = split_heads(labelled(["No previous memory"] * heads, [-1] * heads), heads)[0]
    mem_steps = [s for s in result.steps if s.kind == "memory"]
    for t, step in enumerate(mem_steps):
        texts, written = split_heads(step.memory, heads)
        assert written[t % heads] == t
        assert [x for h, x in enumerate(texts) if h != t % heads] == [x for h, x in enumerate(before) if h != t % heads]
        before = texts


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=documents(3), heads=st.sampled_from([2, 4]), partial=st.booleans())
def test_records_across_chunks_come_out_right_with_k_heads(tokenizer, doc, heads, partial):
    """With K = 2 or 4 heads every settled invoice comes out once, whole and grounded in its own sentences
    (window or memory), unless a head's budget (memory_tokens / K) cut the reader's state, and then the cut
    shows in the trace (a memory step ending with ``length``) and no invoice is invented; no records call
    sees a head label."""
    oracle = MemoryOracle([doc], partial=partial)
    reader = HeadsReader(doc, oracle)
    chunk = {2: 72, 4: 136}[heads]  # a head of ~136 tokens holds the state of most documents, not every one
    result = asyncio.run(read_document(OracleEngine(reader.reply, tokenizer), None, doc.text,
                                       heads_config(heads, chunk)))
    event(f"K={heads}: {result.n_chunks} chunks")
    if any(s.kind == "memory" and s.finish_reason == "length" for s in result.steps):
        event("a head's budget cut the reader's state")  # three half-read invoices and a cut line: ~136 tokens
        assert {r.values["invoice"] for r in result.records["invoices"]} <= {i.invoice for i in doc.invoices}
    else:
        check_invoices(doc, result, oracle)
    check_heads_trace(result, heads)
    assert reader.records_prompts and not any(LABEL_LINE.search(m) for m in reader.records_prompts)


@pytest.mark.parametrize("heads", [2, 4])
def test_far_apart_halves_come_through_the_heads(tokenizer, heads):
    """Halves many chunks apart (more than K steps): the records come out right, some values grounded
    through the memory (the carried half survived K rewrites of other heads)."""
    doc = invoices("far", InvoiceSpec(gaps=(1, 60, 120), settled_first=(True, False, True), stagger=2, open=1), 7)
    oracle = MemoryOracle([doc])
    reader = HeadsReader(doc, oracle)
    result = asyncio.run(read_document(OracleEngine(reader.reply, tokenizer), None, doc.text,
                                       heads_config(heads, 64)))
    assert result.n_chunks > 4 * heads
    check_invoices(doc, result, oracle)
    check_heads_trace(result, heads)
    assert any(ev.grounding == "memory" for r in result.records["invoices"] for ev in r.evidence.values())


def test_a_label_grounds_nothing():
    """A number only a head label states (here the step 7) is not grounded through the unlabelled memory
    the records calls read, though through the labelled memory text it would be."""
    memory = labelled(["INV-0042: issued 2021-03-14", "No previous memory"], [7, 1])
    text = "Boxes: 7 of them.\nInvoice INV-0042 was issued on 2021-03-14.\n"
    window = (text.index("Invoice"), len(text))  # the call's own text: no 7 there
    steps = ((memory, 0, len(text)),)
    assert ground_value("number", 7, text, window, MemoryTrail(memory, steps)) is not None  # the hazard
    shown = unlabelled(memory, 2)
    chain = MemoryTrail(shown, ((shown, 0, len(text)),))
    assert ground_value("number", 7, text, window, chain) is None
    assert ground_value("string", "INV-0042", text, (0, text.index("Invoice")), chain) is not None


def test_heads_budget_is_checked_per_head():
    """An extraction schema must fit one head (memory_tokens // K): refused with the memory_tokens to raise to."""
    need = INVOICES.memory_tokens_needed()
    AgentConfig(chunk_tokens=256, memory_tokens=need * 2, memory_heads=2, extraction=INVOICES, query_tokens=400)
    with pytest.raises(ValueError, match=rf"memory_heads=4 leaves {need // 2} tokens a head.*{need * 4}"):
        AgentConfig(chunk_tokens=256, memory_tokens=need * 2, memory_heads=4, extraction=INVOICES, query_tokens=400)


def test_a_split_piece_reads_every_head_the_step_wrote(tokenizer, monkeypatch):
    """A records reply cut at its budget is split; each piece reads the memory its step wrote, all heads
    (the rewritten one and the carried one) without labels, not the rewritten head's text alone."""
    from memagent.extraction import reading, schema_from
    from memagent_testing.oracle.ledger import SCHEMA as LEDGER, LedgerSpec, ledger
    from memagent_testing.oracle.records_oracle import LedgerOracle

    monkeypatch.setattr(reading, "MAX_SPLIT_DEPTH", 1)
    doc = ledger("d", LedgerSpec(prose=0, table_rows=260, near_misses=0, filler=0), 3)
    oracle, seen = LedgerOracle([doc]), []

    def reply(prompt: str) -> str:
        if RECORDS_REQUEST in prompt:
            seen.append(between(prompt, "<memory>\n", "\n</memory>"))
            return oracle.reply(prompt)
        return "head text" if HEAD_PROMPT.search(prompt) else oracle.reply(prompt)

    cfg = AgentConfig(chunk_tokens=8000, memory_tokens=4000, memory_heads=2, answer_tokens=16, query_tokens=400,
                      extraction=schema_from(LEDGER), require_grounding=True)
    result = asyncio.run(read_document(OracleEngine(reply, tokenizer), None, doc.text, cfg))
    assert result.n_chunks == 1 and result.records_tally.splits == 1
    first, *pieces = seen
    assert first == "No previous memory\n\nNo previous memory"  # the two unwritten heads, unlabelled
    assert pieces and set(pieces) == {"head text\n\nNo previous memory"}


@pytest.mark.slow
def test_the_batch_extraction_job_reads_with_heads(tiny_llama_dir, tmp_path):
    """The Ray batch extraction job with K = 2 (tiny random Llama, constrained answers): every row valid, every
    memory step's memory two labelled heads with one rewritten, decoding at most memory_tokens / 2 tokens."""
    import ray
    import pyarrow.dataset as pads

    from tests.test_extraction_e2e import BOUNDED, job
    from memagent.data.contracts import contract_row
    from tests.pipeline_helpers import write_rows

    agent = AgentConfig(chunk_tokens=64, memory_tokens=144, memory_heads=2, answer_tokens=64, query_tokens=200,
                        extraction=BOUNDED)
    write_rows(tmp_path / "in" / "contracts.parquet", [contract_row(i, 250, seed=5) for i in range(2)])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        from pipelines.batch_qa import run_batch_qa

        summary = run_batch_qa(job(tmp_path, tiny_llama_dir, agent))
    finally:
        ray.shutdown()
    assert summary.rows_out == 2 and summary.error_rows == 0
    for row in pads.dataset(str(tmp_path / "out"), exclude_invalid_files=True).to_table().to_pylist():
        assert row["error"] is None and set(json.loads(row["extraction"])) == set(BOUNDED["properties"])
        memory = [s for s in row["steps"] if s["kind"] == "memory"]
        assert len(memory) > 2
        for t, s in enumerate(memory):
            assert split_heads(s["memory"], 2)[1][t % 2] == t and s["completion_tokens"] <= 72
