"""Records calls and prompt tokens per chunk for the filing schema: record types read in groups vs one call per type.

    nice python -m benchmarks.record_groups --out benchmarks/results/record_groups.json [--schema PATH]

Generated filings (memagent/data/filings.py, seeds 0..N-1: statement tables, a segment table, prose, guidance;
103 metrics each) are read with the filing schema (docs/schemas/filing.json: 52 lists of one shared ``metric``)
by the perfect filing reader (memagent_testing/oracle/filings.py) with the packaged SmolLM2 tokenizer, the ``small``
preset's budgets derived from the schema (the job's default flags) and the 8,192-token window checked:

- ``grouped``: as the job reads (:meth:`ExtractionSchema.record_groups`; a list whose reply overflows is read
  alone);
- ``per_type``: one records call per list per chunk (the read before issue 64), the same reader otherwise.

Each: records calls per chunk, records prompt tokens per chunk, and whether every gold metric came out
exactly once (checked). Also the documents of the filing with every table removed (``sparse``: prose,
guidance), where no reply overflows. ``--schema``: also report, for another schema (e.g. a public 10-Q schema),
its question tokens, groups and the window check (no reading: its lists are not the generator's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks.common import loadavg, write_json


def _gold(doc: dict) -> Counter:
    return Counter((f"{sec}.{name}", json.dumps({k: v for k, v in m.items() if v is not None}, sort_keys=True))
                   for sec, props in doc["gold"].items() if sec != "meta" for name, ms in props.items() for m in ms)


def _sparse(doc: dict) -> dict:
    """The filing with only its prose lines (no tables): each line's statements moved with it."""
    lines, keep, pos, moved = doc["text"].splitlines(), [], 0, {}
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln) + 1)
    for i, ln in enumerate(lines):
        if "stood at" in ln or ln.startswith("Guidance") or not any(c.isdigit() for c in ln):
            moved[starts[i]] = pos
            keep.append(ln)
            pos += len(ln) + 1
    statements = [{**s, "start": moved[s["start"]], "end": moved[s["start"]] + s["end"] - s["start"]}
                  for s in doc["statements"] if s["start"] in moved]
    gold = {"meta": doc["gold"]["meta"], **{sec: {n: [] for n in props} for sec, props in doc["gold"].items()
                                            if sec != "meta"}}
    for s in statements:
        for r in s["records"]:
            sec, name = r["type"].split(".")
            gold[sec][name].append(r["record"])
    return {**doc, "text": "\n".join(keep), "statements": statements, "gold": gold}


def read(docs: list[dict], tokenizer: Any, per_type: bool) -> dict[str, Any]:
    from memagent.agent import check_config, read_document
    from memagent.config import AgentConfig
    from memagent.data.filings import SCHEMA
    from memagent.extraction.record_groups import RecordGroup
    from memagent.extraction.schema import ExtractionSchema, schema_from
    from memagent_testing.oracle.filings import FilingOracle

    schema = schema_from(SCHEMA)
    cfg = AgentConfig(preset="small", extraction=schema)
    chunks = calls = tokens = exact = 0
    alone = (lambda self, reply: tuple(RecordGroup((r.name,)) for r in self.record_types)) if per_type else None
    with mock.patch.object(ExtractionSchema, "record_groups", alone) if alone else _nothing():
        for doc in docs:
            engine = FilingOracle(tokenizer, [doc])
            check_config(engine, cfg)
            result = asyncio.run(read_document(engine, None, doc["text"], cfg))
            got = Counter((n, json.dumps(r.values, sort_keys=True)) for n, rs in result.records.items() for r in rs)
            exact += int(got == _gold(doc))
            chunks += result.n_chunks
            records = [n for kind, n in engine.calls if kind == "records"]
            calls, tokens = calls + len(records), tokens + sum(records)
    return {"documents": len(docs), "chunks": chunks, "records_calls_per_chunk": round(calls / chunks, 2),
            "records_prompt_tokens_per_chunk": round(tokens / chunks), "documents_with_every_gold_metric": exact,
            "budgets": {k: getattr(cfg, k) for k in ("chunk_tokens", "memory_tokens", "answer_tokens",
                                                     "query_tokens")}}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


def other_schema(path: str, tokenizer: Any) -> dict[str, Any]:
    """Question tokens, groups and the window check of another schema at the default preset."""
    from memagent.agent import check_config
    from memagent.config import AgentConfig
    from memagent.engines.budget import TokenBudget
    from memagent.extraction.record_groups import group_reply_tokens
    from memagent.extraction import load_schema

    schema = load_schema(path)
    cfg = AgentConfig(preset="small", extraction=schema)
    n = len(tokenizer(schema.memory_question(cfg.answer_tokens), add_special_tokens=False)["input_ids"])
    groups = schema.record_groups(group_reply_tokens(cfg.memory_tokens, cfg.chunk_tokens, 8192, n))
    try:
        check_config(TokenBudget(tokenizer, 8192), cfg)
        fits = "fits"
    except ValueError as e:
        fits = str(e)
    return {"schema": Path(path).name, "record_types": len(schema.record_types), "groups": [len(g.names) for g in groups],
            "question_tokens": n, "query_tokens_budget": cfg.query_tokens, "window_8192": fits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/record_groups.json")
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--schema", action="append", default=[])
    args = ap.parse_args()
    from memagent.data.filings import filings
    from memagent.models import load_tokenizer, resolve_model

    tokenizer = load_tokenizer(str(resolve_model("smollm2-135m")))
    docs = filings(args.docs)
    out: dict[str, Any] = {"schema": "docs/schemas/filing.json (52 lists of $defs/metric)", "loadavg": loadavg()}
    for name, corpus in (("filings", docs), ("sparse", [_sparse(d) for d in docs])):
        out[name] = {"grouped": read(corpus, tokenizer, False), "per_type": read(corpus, tokenizer, True)}
    out["other_schemas"] = [other_schema(p, tokenizer) for p in args.schema]
    write_json(args.out, out)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
