"""``memagent synth hotpotqa|ruler`` and ``memagent filter``: argparse wiring and handlers.

Registered on ``memagent`` through the ``memagent.commands`` entry point; every command sets
``func`` (``handler(args) -> int``, the exit code). Lists are comma-separated and accept a
``k`` suffix (×1024): ``--lengths 8k,32k``. Without ``--ray`` generation runs in this process
and writes one Parquet file; with ``--ray`` a Ray Data job writes a directory of files.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time
from typing import Any, Callable


def int_list(text: str) -> list[int]:
    """``"8192,32k"`` -> ``[8192, 32768]``; rejects empty items and non-positive numbers."""
    out = []
    for item in text.split(","):
        item = item.strip().lower()
        if not item:
            raise argparse.ArgumentTypeError(f"empty item in list {text!r}")
        scale = 1024 if item.endswith("k") else 1
        try:
            value = int(item[:-1] if scale > 1 else item) * scale
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not an integer (lists are comma-separated)") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{item!r} must be positive")
        out.append(value)
    return out


def str_list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("empty list")
    return items


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=42, help="global seed (default 42)")
    p.add_argument("--tokenizer", default="smollm2-135m",
                   help="model name, HF dir or GGUF whose tokenizer measures lengths (default smollm2-135m)")
    p.add_argument("--ray", action="store_true", help="generate with a Ray Data job (output: a directory)")
    p.add_argument("--address", default=None, help="Ray cluster address (default: a local Ray)")
    p.add_argument("--workers", type=int, default=2, help="Ray actors (default 2)")


def add_synth_commands(subparsers: Any) -> None:
    """Add ``synth`` (with ``hotpotqa`` and ``ruler``) and ``filter`` to an argparse subparsers object."""
    synth = subparsers.add_parser("synth", help="synthesise long-context training/evaluation data")
    kinds = synth.add_subparsers(dest="synth_kind", required=True)

    hp = kinds.add_parser("hotpotqa", help="HotpotQA questions hidden among distractor documents")
    hp.add_argument("--source", required=True, help="official HotpotQA JSON/JSONL (local or s3://)")
    hp.add_argument("--out", required=True, help="output Parquet file or directory (local or s3://)")
    size = hp.add_mutually_exclusive_group(required=True)
    size.add_argument("--num-docs", type=int_list, help="documents per sample, e.g. 50,100,200")
    size.add_argument("--tokens", type=int_list, help="target context tokens, e.g. 8k,32k")
    hp.add_argument("--samples", type=int, default=None, help="first N questions (default: all)")
    _common(hp)
    hp.set_defaults(func=cmd_synth_hotpotqa)

    ru = kinds.add_parser("ruler", help="RULER NIAH/VT/CWE/FWE/QA samples")
    ru.add_argument("--tasks", required=True, type=str_list, help="e.g. vt,niah_single_1 (qa = qa_1 SQuAD; qa_2 HotpotQA)")
    ru.add_argument("--lengths", required=True, type=int_list, help="total tokens, e.g. 8192,32768")
    ru.add_argument("--out", required=True, help="output Parquet file or directory (local or s3://)")
    ru.add_argument("--samples", type=int, default=128, help="samples per task and length (default 128)")
    ru.add_argument("--haystack", help="essay text file for the essay tasks (RULER: pg_essays.txt)")
    ru.add_argument("--squad", help="SQuAD v2.0 JSON for qa_1")
    ru.add_argument("--hotpotqa", help="HotpotQA JSON for qa_2")
    _common(ru)
    ru.set_defaults(func=cmd_synth_ruler)

    fl = subparsers.add_parser("filter", help="drop questions a model answers without context (best-of-k)")
    fl.add_argument("--input", required=True, help="Parquet (file/dir) or HotpotQA JSON with question + answers")
    fl.add_argument("--output", required=True, help="Parquet file for the kept rows")
    fl.add_argument("--dropped", help="Parquet file for dropped rows (default: OUTPUT with .dropped before .parquet)")
    fl.add_argument("--model", action="append", help="model(s) to ask; repeat for several (default smollm2-135m)")
    fl.add_argument("--k", type=int, default=2, help="samples per model (default 2)")
    fl.add_argument("--max-tokens", type=int, default=512)
    fl.add_argument("--temperature", type=float, default=1.0)
    fl.add_argument("--top-p", type=float, default=0.7)
    fl.add_argument("--engine", default="hf", help="engine backend (default hf = transformers)")
    fl.add_argument("--device", default="auto", help="cpu, cuda or auto")
    fl.add_argument("--batch-size", type=int, default=16, help="engine batch size (default 16)")
    fl.add_argument("--limit", type=int, help="only the first N input rows")
    fl.add_argument("--max-keep", type=int, help="keep at most the first N survivors (paper: 8192 train, 128 dev)")
    fl.add_argument("--keep-responses", action="store_true", help="store every raw response")
    fl.set_defaults(func=cmd_filter)


def _friendly(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Missing/unreadable files become ``ValueError`` (the main CLI prints those as one line)."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except OSError as exc:
            raise ValueError(str(exc)) from exc

    return run


def _report(summary: dict) -> int:
    json.dump(summary, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


@_friendly
def cmd_synth_hotpotqa(args: argparse.Namespace) -> int:
    from memagent.data.hotpotqa import TRAINING_SCHEMA, load_hotpotqa, sizes_from, synthesize
    from memagent.data.io import load_tokenizer, write_parquet

    sizes = sizes_from(args.num_docs or (), args.tokens or ())
    t0 = time.perf_counter()
    if args.ray:
        from pipelines.synthesize import synthesize_hotpotqa

        rows = synthesize_hotpotqa(args.source, args.out, sizes, samples=args.samples, seed=args.seed,
                                   tokenizer=args.tokenizer, workers=args.workers, address=args.address)
        written = args.out
    else:
        records = load_hotpotqa(args.source)
        out = list(synthesize(records, sizes, seed=args.seed, samples=args.samples, tokenizer=load_tokenizer(args.tokenizer)))
        written, rows = write_parquet(out, args.out, TRAINING_SCHEMA), len(out)
    return _report({"rows": rows, "out": written, "sizes": [f"{k}={v}" for k, v in sizes],
                    "seconds": round(time.perf_counter() - t0, 2)})


@_friendly
def cmd_synth_ruler(args: argparse.Namespace) -> int:
    from memagent.data.io import load_tokenizer, read_json, read_text, write_parquet
    from memagent.data.hotpotqa import load_hotpotqa
    from memagent.data.ruler import RULER_SCHEMA, RulerGenerator, resolve_task

    tasks = [resolve_task(t) for t in args.tasks]
    t0 = time.perf_counter()
    if args.ray:
        from pipelines.synthesize import synthesize_ruler

        rows = synthesize_ruler(tasks, args.lengths, args.out, samples=args.samples, seed=args.seed,
                                tokenizer=args.tokenizer, haystack=args.haystack, squad=args.squad,
                                hotpotqa=args.hotpotqa, workers=args.workers, address=args.address)
        written = args.out
    else:
        gen = RulerGenerator(
            load_tokenizer(args.tokenizer),
            essay=read_text(args.haystack) if args.haystack else None,
            squad=read_json(args.squad) if args.squad else None,
            hotpotqa=load_hotpotqa(args.hotpotqa) if args.hotpotqa else None,
            seed=args.seed,
        )
        out = list(gen.generate(tasks, args.lengths, args.samples))
        written, rows = write_parquet(out, args.out, RULER_SCHEMA), len(out)
    return _report({"rows": rows, "out": written, "tasks": tasks, "lengths": args.lengths,
                    "seconds": round(time.perf_counter() - t0, 2)})


def dropped_path(output: str) -> str:
    """``kept.parquet`` -> ``kept.dropped.parquet``; a directory gets a ``-dropped`` sibling."""
    return output[: -len(".parquet")] + ".dropped.parquet" if output.endswith(".parquet") else output.rstrip("/") + "-dropped"


def _filter_input(path: str) -> tuple[list[dict], Any]:
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


@_friendly
def cmd_filter(args: argparse.Namespace) -> int:
    from memagent.data.filter import filter_no_context, output_schema
    from memagent.data.io import write_parquet
    from memagent.engines import EngineConfig, make_engine

    rows, schema = _filter_input(args.input)
    if args.limit is not None:
        rows = rows[: args.limit]
    models = args.model or ["smollm2-135m"]
    t0 = time.perf_counter()
    engines = [make_engine(EngineConfig(engine=args.engine, model=m, device=args.device, max_batch_size=args.batch_size))
               for m in models]
    result = asyncio.run(filter_no_context(
        rows, engines, k=args.k, max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        keep_responses=args.keep_responses))
    summary = result.summary()
    kept = result.kept if args.max_keep is None else result.kept[: args.max_keep]
    out_schema = output_schema(schema, args.keep_responses)
    dropped_to = args.dropped or dropped_path(args.output)
    summary.update(
        written_kept=len(kept), models=models, k=args.k, seconds=round(time.perf_counter() - t0, 2),
        output=write_parquet(kept, args.output, out_schema), dropped_output=write_parquet(result.dropped, dropped_to, out_schema),
    )
    return _report(summary)
