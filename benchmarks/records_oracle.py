"""Records against a perfect model (issue 42, item 7): adversarial ledgers, beside LangExtract on the same documents.

    nice python -m benchmarks.records_oracle --out benchmarks/results/records_oracle.json
    nice python -m benchmarks.records_oracle --langextract-python PY --out benchmarks/results/records_oracle.json

Documents: :mod:`memagent_testing.oracle.ledger` (seeded): a dense table of 260 payments and a list of 220, each
in one chunk (8,000 tokens); a long mixed ledger (prose in several date and amount spellings, CJK
sentences, aliases defined once and used by role, keys stated again with other amounts, near
misses, long lines) read in 5,000-token chunks. Each is read twice by the memory agent with the
**perfect model** of memagent_testing/oracle in place of the model (it answers each call from the ground
truth, honours the request's schema and ``max_tokens`` like a structured-outputs server): once
plain, once inventing one record per call from values stated only outside the passage. Budgets:
the paper's memory (1,024 tokens; a records reply's budget), ``--require-grounding``.

Per document: gold records, recall and precision (a record is right when its key and amount are
the gold's), conflicts recovered, invented records that survived, calls (memory updates, records
calls), splits, pieces left unread, wall, and this process's peak RSS (one process: the figure is
the largest so far). With ``--langextract-python``: LangExtract (its defaults, OpenAI provider)
against an oracle endpoint that answers each LangExtract prompt with the statements wholly inside
its chunk (a role resolved only when its definition is in that chunk: LangExtract carries nothing
between chunks), scored the same way. A measurement, never an assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import loadavg, print_table, write_json
from memagent.agent import read_document
from memagent.config import AgentConfig
from memagent.extraction import schema_from
from memagent_testing.oracle.ledger import SCHEMA, Ledger, LedgerSpec, gold, ledger

DOCS = {  # id -> (spec, seed, chunk tokens): the dense pages fit one chunk
    "dense-table-260": (LedgerSpec(prose=0, table_rows=260, near_misses=0, filler=0), 42, 8000),
    "dense-list-220": (LedgerSpec(prose=0, bullets=220, near_misses=0, filler=0), 43, 8000),
    "mixed-ledger": (LedgerSpec(prose=300, bullets=60, cjk=60, aliases=5, by_role=60, conflicts=80, near_misses=80,
                                filler=300, long_lines=True), 44, 5000),
}


def config(chunk_tokens: int) -> AgentConfig:
    return AgentConfig(chunk_tokens=chunk_tokens, memory_tokens=1024, answer_tokens=16, query_tokens=400,
                       extraction=schema_from(SCHEMA), require_grounding=True)


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def score(doc: Ledger, records: list[tuple[str, str, float]]) -> dict[str, Any]:
    """Recall and precision of ``(payer, date, amount)`` records against the gold (key and amount right)."""
    want = {(k[0], k[1], g["amount"]) for k, g in gold(doc).items()}
    got = set(records)
    hit = len(want & got)
    return {"gold": len(want), "returned": len(records), "duplicates": len(records) - len(got),
            "recall": round(hit / max(len(want), 1), 4), "precision": round(hit / max(len(records), 1), 4)}


def read_ours(doc: Ledger, invent: bool, tokenizer: Any, chunk_tokens: int) -> dict[str, Any]:
    from memagent_testing.oracle.records_oracle import LedgerOracle
    from memagent_testing.oracle.servers import OracleEngine

    oracle = LedgerOracle([doc], invent=invent, seed=7)
    engine = OracleEngine(oracle.reply, tokenizer)
    t0 = time.perf_counter()
    result = asyncio.run(read_document(engine, None, doc.text, config(chunk_tokens)))
    wall = time.perf_counter() - t0
    got = result.records["payments"]
    expected = gold(doc)
    conflicts = sum(len(g["conflicts"]) for g in expected.values())
    recovered = sum(len([c for c in r.conflicts if c.field == "amount"]) for r in got
                    if [c.value for c in r.conflicts if c.field == "amount"]
                    == expected.get((r.values["payer"], r.values["date"]), {}).get("conflicts"))
    stated = {(s.payer, s.date, s.amount) for s in doc.statements}
    fakes = {(f["payer"], f["date"], f["amount"]) for f in oracle.invented} - stated
    rows = [(r.values["payer"], r.values["date"], r.values["amount"]) for r in got]
    tally = result.records_tally
    return {"score": score(doc, rows), "conflicts_stated": conflicts, "conflicts_recovered": recovered,
            "invented_in_replies": len(fakes), "invented_survived": len(fakes & set(rows)),
            "chunks": result.n_chunks, "tokens": result.context_tokens, "calls": engine.calls,
            "memory_calls": result.n_chunks, "records_calls": engine.calls - result.n_chunks,
            "tally": tally.to_dict(), "wall_s": round(wall, 2), "peak_rss_mb": peak_rss_mb()}


def langextract_reply(doc: Ledger) -> Any:
    """LangExtract prompt -> (reply, stats): the statements wholly inside the prompt's chunk."""
    from benchmarks.langextract_peer import CLASS, prompt_chunk
    from memagent_testing.oracle.records_oracle import DEFINITION

    def reply(prompt: str) -> tuple[str, dict[str, int]]:
        chunk = prompt_chunk(prompt)
        at = doc.text.find(chunk)
        aliases = {role: name.strip() for name, role in DEFINITION.findall(chunk)}
        items, unresolved = [], 0
        for s in (s for s in doc.statements if at >= 0 and at <= s.start and s.end <= at + len(chunk)):
            payer = s.payer if s.written_payer == s.payer else aliases.get(f"the {s.written_payer}")
            unresolved += payer is None
            if payer is not None:
                items.append({CLASS: doc.text[s.start:s.end], f"{CLASS}_attributes":
                              {"payer": payer, "date": s.date, "amount": f"{s.amount:g}"}})
        text = json.dumps({"extractions": items}, ensure_ascii=False, indent=2)
        if "```json" in prompt[: len(prompt) - len(chunk)]:
            text = f"```json\n{text}\n```"
        return text, {"prompt_chars": len(prompt), "chunk_chars": len(chunk), "reply_chars": len(text),
                      "extractions": len(items), "unresolved_roles": unresolved}
    return reply


def read_langextract(doc: Ledger, py: str, work: Path) -> dict[str, Any]:
    import os

    from benchmarks.langextract_peer import CHILD, ROOT, Oracle

    tp, op = work / f"{doc.id}.txt", work / f"{doc.id}.json"
    tp.write_text(doc.text)
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
           "OPENAI_API_KEY": "oracle-needs-no-key"}
    with Oracle(langextract_reply(doc)) as oracle:
        t0 = time.perf_counter()
        rc = subprocess.run([py, "-I", str(CHILD), "--text", str(tp), "--base-url", oracle.base_url, "--out", str(op)],
                            cwd=ROOT, env=env, capture_output=True, timeout=3600, check=False).returncode
        calls = list(oracle.calls)
    if rc != 0 or not op.exists():
        return {"error": f"child rc {rc}"}
    child = json.loads(op.read_text())
    rows = []
    for e in child["extractions"]:
        a = e.get("attributes") or {}
        try:
            rows.append((a.get("payer"), a.get("date"), float(str(a.get("amount")).replace(",", ""))))
        except ValueError:
            continue
    return {"score": score(doc, rows), "calls": len(calls), "wall_s": round(time.perf_counter() - t0, 2),
            "peak_rss_mb": child["peak_rss_mb"], "langextract_version": child["langextract_version"],
            "role_payments_unresolved": sum(c["unresolved_roles"] for c in calls),
            "extractions_without_span": sum(e["char_interval"] is None for e in child["extractions"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/records_oracle.json")
    ap.add_argument("--langextract-python", default=None, help="python of a venv with langextract and openai")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from memagent.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model("smollm2-135m")))
    out: dict[str, Any] = {"command": "python -m benchmarks.records_oracle", "loadavg_before": loadavg(),
                           "config": {"memory_tokens": 1024, "require_grounding": True}, "documents": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for doc_id, (spec, seed, chunk_tokens) in DOCS.items():
            doc = ledger(doc_id, spec, seed)
            row: dict[str, Any] = {"chars": len(doc.text), "statements": len(doc.statements),
                                   "chunk_tokens": chunk_tokens, "perfect": read_ours(doc, False, tokenizer, chunk_tokens),
                                   "perfect_inventing": read_ours(doc, True, tokenizer, chunk_tokens)}
            if args.langextract_python:
                row["langextract"] = read_langextract(doc, args.langextract_python, Path(tmp))
            out["documents"][doc_id] = row
    out["loadavg_after"] = loadavg()
    write_json(args.out, out)
    table = []
    for doc_id, r in out["documents"].items():
        for part in ("perfect", "perfect_inventing", "langextract"):
            if part in r and "score" in r[part]:
                p = r[part]
                table.append([doc_id, part, p["score"]["gold"], p["score"]["recall"], p["score"]["precision"],
                              p.get("invented_survived", "-"), p.get("conflicts_recovered", "-"), p["calls"],
                              p["peak_rss_mb"]])
    print_table(["document", "reader", "gold", "recall", "precision", "invented kept", "conflicts", "calls",
                 "peak RSS MB"], table)


if __name__ == "__main__":
    main()
