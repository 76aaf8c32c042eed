"""Data commands: ``memagent synth hotpotqa|ruler|statements|filings|contracts`` and ``memagent filter``.

Each calls the one implementation of its stage (``pipelines.synthesize.write_hotpotqa`` /
``write_ruler``, ``memagent.data.filter.run_filter``), which the train flow calls too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Callable

from memagent.engines import DEFAULT_MODEL
from memagent_cli.flags import add_model_flags, build, parse_int
from memagent_cli.options import add_engine_flags, engine_config


def _report(summary: dict[str, Any]) -> int:
    json.dump(summary, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _synth_job(args: argparse.Namespace) -> Any:
    from pipelines.synthesize import SynthJob

    return build(SynthJob, args._synth_job_flags.values(args), "Ray options")


def cmd_synth_hotpotqa(args: argparse.Namespace) -> int:
    from memagent.data.hotpotqa import HotpotSynthConfig
    from pipelines.synthesize import write_hotpotqa

    cfg = build(HotpotSynthConfig, args._hotpot_flags.values(args), "synthesis options")
    t0 = time.perf_counter()
    written, rows = write_hotpotqa(cfg, args.out, args.tokenizer, _synth_job(args))
    return _report({"rows": rows, "out": written, "sizes": [f"{k}={v}" for k, v in cfg.sizes()],
                    "seconds": round(time.perf_counter() - t0, 2)})


def cmd_synth_ruler(args: argparse.Namespace) -> int:
    from memagent.data.ruler import RulerItems
    from pipelines.synthesize import write_ruler

    items = build(RulerItems, args._items_flags.values(args), "item options")
    t0 = time.perf_counter()
    written, rows = write_ruler(items, args.out, args.tokenizer, _synth_job(args))
    return _report({"rows": rows, "out": written, "tasks": items.tasks, "lengths": items.lengths,
                    "seconds": round(time.perf_counter() - t0, 2)})


def cmd_synth_statements(args: argparse.Namespace) -> int:
    """Generated bank statements with planted payments (memagent.data.records_corpus): an input for
    ``memagent batch --schema docs/schemas/statement.json``; ``gold`` holds each document's planted records."""
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    from memagent.data.records_corpus import statement

    if args.docs < 1 or args.tokens < 1:
        raise ValueError("--docs and --tokens must be at least 1")
    docs = [statement(f"statement-{i:03d}", args.tokens, args.seed) for i in range(args.docs)]
    rows = [{"id": d["id"], "context": d["text"], "gold": json.dumps(d["gold"], ensure_ascii=False, default=str)}
            for d in docs]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), args.out)
    return _report({"rows": len(rows), "out": args.out, "records": sum(len(d["gold"]) for d in docs),
                    "chars": sum(len(d["text"]) for d in docs)})


def cmd_synth_filings(args: argparse.Namespace) -> int:
    """Generated quarterly-filing-like documents (memagent.data.filings): an input for ``memagent batch --schema
    docs/schemas/filing.json``; ``gold`` holds each document's object in that schema's shape (JSON text)."""
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    from memagent.data.filings import filings

    if args.docs < 1 or args.filler < 0:
        raise ValueError("--docs must be at least 1 and --filler at least 0")
    docs = filings(args.docs, args.seed, args.filler)
    rows = [{"id": d["id"], "context": d["text"], "gold": json.dumps(d["gold"], ensure_ascii=False)} for d in docs]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), args.out)
    metrics = sum(len(m) for d in docs for sec, props in d["gold"].items() if sec != "meta" for m in props.values())
    return _report({"rows": len(rows), "out": args.out, "metrics": metrics, "chars": sum(len(d["text"]) for d in docs)})


def cmd_synth_contracts(args: argparse.Namespace) -> int:
    """Generated contracts with planted, typed fields (memagent.data.contracts) and their JSON Schema:
    an input for ``memagent batch --schema OUT/contract.schema.json``."""
    from memagent.data.contracts import ContractCorpus, write_contracts

    corpus = build(ContractCorpus, args._contracts_flags.values(args), "corpus options")
    data, schema = write_contracts(args.out, corpus, args.tokenizer)
    return _report({"rows": corpus.docs, "out": str(data), "schema": str(schema)})


def dropped_path(output: str) -> str:
    """``kept.parquet`` -> ``kept.dropped.parquet``; a directory gets a ``-dropped`` sibling."""
    return output[: -len(".parquet")] + ".dropped.parquet" if output.endswith(".parquet") else output.rstrip("/") + "-dropped"


def filter_input(path: str) -> tuple[list[dict], Any]:
    """Rows and their Arrow schema; a HotpotQA JSON becomes rows of id/question/answers."""
    import pyarrow as pa

    from memagent.data.hotpotqa import load_hotpotqa
    from memagent.data.io import read_parquet_table

    if path.endswith((".json", ".jsonl")):
        rows = [{"id": r.id, "question": r.question, "answers": [r.answer]} for r in load_hotpotqa(path)]
        schema = pa.schema([("id", pa.string()), ("question", pa.string()), ("answers", pa.list_(pa.string()))])
        return rows, schema
    table = read_parquet_table(path)
    return table.to_pylist(), table.schema


def cmd_filter(args: argparse.Namespace) -> int:
    from memagent.data.filter import FilterConfig, run_filter

    cfg = build(FilterConfig, args._filter_flags.values(args), "filter options")
    rows, schema = filter_input(args.input)
    if args.limit is not None:
        rows = rows[: args.limit]
    t0 = time.perf_counter()
    summary = run_filter(rows, schema, cfg, engine_config(args), args.output, args.dropped or dropped_path(args.output))
    return _report({**summary, "seconds": round(time.perf_counter() - t0, 2)})


def _add_synth_common(p: argparse.ArgumentParser) -> None:
    from pipelines.synthesize import SynthJob

    p.add_argument("--out", required=True, help="output Parquet file (or directory with --ray), local or s3://")
    p.add_argument("--tokenizer", default=DEFAULT_MODEL,
                   help=f"model name, HF dir or GGUF whose tokenizer measures lengths (default {DEFAULT_MODEL})")
    p.set_defaults(_synth_job_flags=add_model_flags(p, SynthJob, "where it runs"), starts_ray=True)


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    synth = sub.add_parser("synth", help="synthesise long-context training/evaluation data")
    _add_synth_commands(synth.add_subparsers(dest="synth_kind", required=True), common)
    _add_filter_command(sub, common)


def _add_synth_commands(kinds: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from memagent.data.contracts import ContractCorpus
    from memagent.data.hotpotqa import HotpotSynthConfig
    from memagent.data.ruler import RulerItems

    hp = kinds.add_parser("hotpotqa", parents=[common], help="HotpotQA questions hidden among distractor documents")
    hp.set_defaults(func=cmd_synth_hotpotqa,
                    _hotpot_flags=add_model_flags(hp, HotpotSynthConfig, "synthesis", required=("source",)))
    _add_synth_common(hp)

    ru = kinds.add_parser("ruler", parents=[common], help="RULER NIAH/VT/CWE/FWE/QA samples")
    ru.set_defaults(func=cmd_synth_ruler, _items_flags=add_model_flags(ru, RulerItems, "items",
                                                                       required=("tasks", "lengths")))
    _add_synth_common(ru)

    _add_planted_corpus(kinds, common, "statements", cmd_synth_statements,
                        "bank statements with planted payments (aliases, amendments, repeats, near misses) "
                        "for record extraction (docs/schemas/statement.json)",
                        ("--tokens", parse_int, 1024, "about this many tokens each"))
    _add_planted_corpus(kinds, common, "filings", cmd_synth_filings,
                        "quarterly-filing-like documents (statement tables with scale lines, a segment table, "
                        "prose, footnotes, restated prior periods, guidance) for docs/schemas/filing.json",
                        ("--filler", int, 2, "filler paragraphs after each statement"))

    con = kinds.add_parser("contracts", parents=[common],
                           help="services agreements with five typed fields planted among near misses and amendments, "
                                "for field extraction (writes contract.schema.json beside them)")
    con.add_argument("--out", required=True, help="directory for contracts.parquet and contract.schema.json")
    con.add_argument("--tokenizer", default=DEFAULT_MODEL,
                     help=f"model name, HF dir or GGUF whose tokenizer measures lengths (default {DEFAULT_MODEL})")
    con.set_defaults(func=cmd_synth_contracts, _contracts_flags=add_model_flags(con, ContractCorpus, "corpus"))


def _add_planted_corpus(kinds: argparse._SubParsersAction, common: argparse.ArgumentParser, name: str,
                        func: Callable[[argparse.Namespace], int], help: str,
                        size: tuple[str, Callable[[str], int], int, str]) -> None:
    """A generator of documents with planted records and their ``gold``: --out, --docs, its size flag, --seed."""
    p = kinds.add_parser(name, parents=[common], help=help)
    p.add_argument("--out", required=True, help="output Parquet file (columns id, context, gold)")
    p.add_argument("--docs", type=int, default=2, help="documents (default 2)")
    flag, kind, default, what = size
    p.add_argument(flag, type=kind, default=default, help=f"{what} (default {default})")
    p.add_argument("--seed", type=int, default=0, help="the corpus is a function of the seed (default 0)")
    p.set_defaults(func=func)


def _add_filter_command(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from memagent.data.filter import FilterConfig

    fl = sub.add_parser("filter", parents=[common], help="drop questions a model answers without context (best-of-k)")
    fl.add_argument("--input", required=True, help="Parquet (file/dir) or HotpotQA JSON with question + answers")
    fl.add_argument("--output", required=True, help="Parquet file for the kept rows")
    fl.add_argument("--dropped", help="Parquet file for dropped rows (default: OUTPUT with .dropped before .parquet)")
    fl.add_argument("--limit", type=int, help="only the first N input rows")
    fl.set_defaults(func=cmd_filter, _filter_flags=add_model_flags(fl, FilterConfig, "filter"))
    add_engine_flags(fl)
