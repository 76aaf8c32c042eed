"""The perfect-model invariant on the other engine paths: the real OpenAI-compatible engine over HTTP to a
server that replies as a constrained perfect model; the real hf engine (chat template, batching, KV
cache, speculation, the JSON-Schema grammar, ``max_tokens``) over a scripted perfect causal LM
(memagent_testing/oracle/scripted_lm.py); and the batch job end to end (``memagent batch --engine openai
--schema ... --require-grounding``) writing the records output.

Invariant (as tests/test_records_oracle.py): every stated record comes out exactly once with its
values, conflicts and spans inside a sentence that states it, and no invented record survives
``require_grounding``.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent.agent import read_document
from memagent.engines.openai import OpenAIEngine
from memagent_testing.oracle.ledger import SCHEMA, LedgerSpec, gold, ledger
from memagent_testing.oracle.records_oracle import LedgerOracle
from memagent_testing.oracle.servers import oracle_app
from tests.reliability_helpers import free_port, serving
from tests.test_records_oracle import SPECS, check_against_gold, check_span, config


class Swappable:
    """One server for the module; each example points it at its own oracle."""

    def __init__(self):
        self.oracle = LedgerOracle([])

    def reply(self, prompt: str) -> str:
        return self.oracle.reply(prompt)


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture(scope="module")
def server(tokenizer):
    swap = Swappable()
    with serving(oracle_app(swap.reply, tokenizer), free_port()) as url:
        yield swap, url


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(spec=SPECS, seed=st.integers(0, 2**16), chunk_tokens=st.sampled_from([64, 256, 1024]), invent=st.booleans())
def test_openai_engine_against_a_perfect_server(server, tokenizer, spec, seed, chunk_tokens, invent):
    """Over HTTP through the OpenAI engine, a perfect server's records come out exactly once and invented
    ones never survive require_grounding."""
    swap, url = server
    doc = ledger("d", spec, seed)
    swap.oracle = LedgerOracle([doc], invent=invent, seed=seed)
    engine = OpenAIEngine(url, "oracle", tokenizer, 65536)
    result = asyncio.run(read_document(engine, None, doc.text, config(chunk_tokens)))
    check_against_gold(doc, result, swap.oracle.invented)


@pytest.fixture(scope="module")
def hf_engine():
    from memagent_testing.oracle.scripted_lm import scripted_engine

    swap = Swappable()
    return swap, scripted_engine(swap.reply)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(spec=st.builds(LedgerSpec, prose=st.integers(0, 6), table_rows=st.integers(0, 30), bullets=st.integers(0, 8),
                      cjk=st.integers(0, 3), aliases=st.integers(0, 2), by_role=st.integers(0, 3),
                      conflicts=st.integers(0, 3), near_misses=st.integers(0, 2), filler=st.integers(0, 4),
                      long_lines=st.booleans()),
       seed=st.integers(0, 2**16), chunk_tokens=st.sampled_from([96, 512]), invent=st.booleans())
def test_hf_engine_with_its_grammar_over_a_perfect_model(hf_engine, spec, seed, chunk_tokens, invent):
    """Through the hf engine's own decoding under the records grammar (maxItems closes arrays, max_tokens
    cuts), a perfect model's records come out exactly once and invented ones never survive."""
    swap, engine = hf_engine
    doc = ledger("d", spec, seed)
    swap.oracle = LedgerOracle([doc], invent=invent, seed=seed)
    result = asyncio.run(read_document(engine, None, doc.text, config(chunk_tokens, memory_tokens=256)))
    check_against_gold(doc, result, swap.oracle.invented)


@pytest.mark.slow
def test_batch_job_writes_every_record_of_a_dense_page(ray_local, tmp_path, smollm2_dir, tokenizer):
    """The batch job over the OpenAI engine writes all 130 records of a page that states 130 payments in one
    chunk (over the 50 a records call may return), and nothing an inventing model made up."""
    from memagent_cli.main import main
    from pipelines.records_output import read_records
    from tests.pipeline_helpers import read_output, write_rows

    dense = ledger("dense", LedgerSpec(prose=0, table_rows=130, near_misses=0, filler=0), 11)
    mixed = ledger("mixed", LedgerSpec(prose=8, bullets=6, cjk=3, aliases=2, by_role=3, conflicts=3, long_lines=True), 12)
    oracle = LedgerOracle([dense, mixed], invent=True, seed=5)
    write_rows(tmp_path / "in" / "part-0.parquet", [{"id": d.id, "context": d.text} for d in (dense, mixed)])
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    with serving(oracle_app(oracle.reply, tokenizer), free_port()) as url:
        rc = main(["batch", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--engine", "openai",
                   "--endpoint", url, "--model", str(smollm2_dir), "--served-model", "oracle",
                   "--schema", str(tmp_path / "schema.json"), "--require-grounding", "--chunk-tokens", "4000",
                   "--memory-tokens", "1200", "--answer-tokens", "16", "--query-tokens", "400", "--no-progress"])
    assert rc == 0
    rows = {r["id"]: r for r in read_output(tmp_path / "out")}
    assert rows["dense"]["n_records_payments"] == 130 and rows["dense"]["record_splits"] >= 2
    assert all(rows[i]["error"] is None and rows[i]["record_failed_pieces"] == 0 for i in rows)
    written = read_records(str(tmp_path / "out"), "payments").to_pylist()
    for doc in (dense, mixed):
        got = {(r["payer"], r["date"].isoformat()): r["amount"] for r in written if r["id"] == doc.id}
        assert got == {k: g["amount"] for k, g in gold(doc).items()}
        for r in (r for r in written if r["id"] == doc.id):  # the written columns, as the records read
            key = (r["payer"], r["date"].isoformat())
            assert [json.loads(c["value"]) for c in r["record_conflicts"] if c["field"] == "amount"] == \
                gold(doc)[key]["conflicts"]
            for ev in r["record_evidence"]:
                check_span(doc, *key, ev["field"], ev["char_start"], ev["char_end"], ev["grounding"])
