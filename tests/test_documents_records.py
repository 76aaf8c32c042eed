"""Records read from a converted PDF carry their pages: a perfect records reader
(memagent_testing/oracle/records_oracle.py) over a PDF whose payments the test put on known pages,
through the batch job: the rows' ``evidence_pages``, the exported ``_records`` dataset and the report."""

from __future__ import annotations

import functools

import pytest

from memagent.config import AgentConfig
from memagent.documents import convert
from memagent.engines import EngineConfig
from memagent.extraction import schema_from
from memagent_testing.document_files import render_pdf, sample_paragraphs
from memagent_testing.oracle.ledger import SCHEMA, Ledger, Statement
from memagent_testing.oracle.records_oracle import LedgerOracle
from memagent_testing.oracle.servers import oracle_engine
from pipelines.batch_qa import BatchQAConfig, run_batch_qa
from pipelines.job import JobConfig
from tests.pipeline_helpers import read_output

pytestmark = pytest.mark.slow

# Payments by page: two paragraphs a page, filler elsewhere.
PAYMENTS = {1: ("Harlow Freight Ltd", "2021-03-14", 1250), 3: ("Brant Mills Ltd", "2022-07-01", 880),
            4: ("Corran Textiles Ltd", "2023-11-20", 4410)}


def ledger_pdf(doc_id: str) -> tuple[bytes, Ledger]:
    """The rendered PDF and the ledger of its converted text (each payment's sentence and span) for the oracle."""
    filler = iter(sample_paragraphs(8))
    paragraphs = []
    for page in range(1, 5):
        payer, date, amount = PAYMENTS.get(page, (None, None, None))
        paragraphs += [f"{payer} paid {amount} on {date}." if payer else next(filler), next(filler)]
    data = render_pdf(paragraphs, page_break_every=2).data
    text = convert(data, doc_id).text
    statements = []
    for payer, date, amount in PAYMENTS.values():
        sentence = f"{payer} paid {amount} on {date}."
        start = text.find(sentence)
        assert start >= 0, sentence
        statements.append(Statement(payer, date, amount, start, start + len(sentence), payer))
    return data, Ledger(doc_id, text, statements)


def test_records_of_a_pdf_carry_their_pages_in_rows_dataset_and_report(ray_local, smollm2_dir, tmp_path):
    """Every record the perfect reader finds in a PDF has each evidence span on the page its payment sits on,
    in the row's evidence_pages, in the records dataset's evidence_pages and as the report snippet's "p. N"."""
    from memagent.report.records import records_view
    from pipelines.records_output import RECORDS_DIR, read_records
    from pipelines.report import read_record_views

    lake = tmp_path / "lake"
    lake.mkdir()
    data, ledger = ledger_pdf("ledger.pdf")
    (lake / "ledger.pdf").write_bytes(data)
    agent = AgentConfig(chunk_tokens=96, memory_tokens=384, answer_tokens=16, query_tokens=400,
                        extraction=schema_from(SCHEMA), require_grounding=True)
    cfg = BatchQAConfig(input=str(lake), output=str(tmp_path / "out"), engine=EngineConfig(model=str(smollm2_dir)),
                        agent=agent, job=JobConfig(batch_size=4, progress=False))
    run_batch_qa(cfg, build_engine=functools.partial(oracle_engine, LedgerOracle([ledger]).reply, str(smollm2_dir)))

    page_of = {payer: page for page, (payer, _, _) in PAYMENTS.items()}
    row = read_output(cfg.output)[0]
    assert row["error"] is None and row["n_records_payments"] == len(PAYMENTS)
    in_row = {e["span"]: e["pages"] for e in row["evidence_pages"]}
    for i, record in enumerate(row["records_payments"]):
        for j, _ in enumerate(record["record_evidence"]):
            assert in_row[f"records_payments[{i}].record_evidence[{j}]"] == [page_of[record["payer"]]]

    import pyarrow.parquet as pq

    exported = pq.read_table(tmp_path / "out" / RECORDS_DIR / "payments").to_pylist()
    for records in (exported, read_records(cfg.output, "payments").to_pylist()):
        assert sorted(r["payer"] for r in records) == sorted(page_of)
        for r in records:
            assert r["record_evidence"] and len(r["evidence_pages"]) == len(r["record_evidence"])
            for j, (ev, pages) in enumerate(zip(r["record_evidence"], r["evidence_pages"])):
                assert pages == {"span": f"record_evidence[{j}]", "char_start": ev["char_start"],
                                 "char_end": ev["char_end"], "pages": [page_of[r["payer"]]]}

    views, errors = read_record_views(*_fs(cfg.output), cfg.output, None, row["config"])
    assert not errors
    shown = {r["v"][views[0]["cols"].index("payer")]: r["sn"] for r in views[0]["rows"]}
    assert {payer: [s[3] for s in snips] for payer, snips in shown.items()} == \
        {payer: [f"p. {page}"] for payer, page in page_of.items()}
    assert records_view("payments", [{"id": "x", "record_evidence": [{"char_start": 0, "char_end": 3}]}],
                        {"x": "abcdef"})["rows"][0]["sn"][0][3:] == []  # no page map: no label


def _fs(uri: str):
    from pipelines import storage

    return storage.filesystem(uri, None)
