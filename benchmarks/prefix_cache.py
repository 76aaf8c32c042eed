"""Prefix KV reuse on an extraction workload: the hf engine with vs without its prefix cache.

    python -m benchmarks.prefix_cache --schema A.json --schema B.json --docs 20 --out benchmarks/results/prefix_cache.json

Per document, the two prompts every extraction read of a one-chunk document sends (rendered by the
project's own functions): the memory update (the schema's question, no memory yet, the document) and
the final answer (the question, a memory, the schema's answer instruction). Both start with the
template's instructions and the schema's question (``--schema``: real schemas, their properties merged
into one, so the question is ``>= 1,000`` tokens for the issue's figure); only the document and the
memory differ. Documents are
generated contracts (:mod:`memagent.data.contracts`) of ``--doc-tokens`` tokens.

Two engines on the packaged model (same dtype, same threads). Every document is read with the
cache; the first ``--wall-docs`` also without it, interleaved (document i with, then without, so
both see the same load: the wall figures and the reply check come from those). Without the cache
the engine computes every prompt token (``cached_prompt_tokens`` is 0: tests/test_prefix_cache.py),
so its prefill per document is the prompt's length, counted for all documents. Headline:
``prefill_tokens_per_doc`` with and without (prompt tokens the engine computed; reused ones not
counted) and their ratio; wall per document (median, the wall documents) with the load beside it;
``identical_replies``: whether the greedy replies matched on the wall documents.
Replies are short (``--max-tokens``): prefill is what the cache saves. A measurement, never an assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import tempfile
import time
from pathlib import Path

from benchmarks.common import add_threads_option, loadavg, machine, median, print_table, set_threads, write_json
from memagent.data.contracts import contract_row
from memagent.engines import EngineConfig, SamplingParams
from memagent.engines.hf import TransformersEngine
from memagent.extraction import load_schema
from memagent.prompts import NO_MEMORY, final_answer_messages, memory_update_messages


def merged_schema(paths: list[str], out: Path) -> Path:
    """One object schema holding every property of ``paths``' schemas (a later name taken again is prefixed)."""
    merged: dict = {"type": "object", "properties": {}, "required": []}
    for path in paths:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        for name, prop in data.get("properties", {}).items():
            key = name if name not in merged["properties"] else f"{Path(path).stem}_{name}"
            merged["properties"][key] = prop
            if name in data.get("required", []):
                merged["required"].append(key)
        merged.setdefault("$defs", {}).update(data.get("$defs", {}))
    out.write_text(json.dumps(merged), encoding="utf-8")
    return out


def document_prompts(schema_path: Path, docs: int, doc_tokens: int) -> tuple[int, list[list[list[dict]]]]:
    """Per document its (memory update, final answer) messages; and the question's length in characters."""
    schema = load_schema(schema_path)
    question = schema.question()
    out = []
    for i in range(docs):
        text = contract_row(i, doc_tokens, seed=66)["context"]
        memory = text[: len(text) // 4]  # a memory the size a read keeps: its words differ per document
        out.append([memory_update_messages(question, NO_MEMORY, text),
                    final_answer_messages(question, memory, "json", answer_instruction=schema.answer_instruction())])
    return len(question), out


def run_doc(engine: TransformersEngine, calls: list[list[dict]], params: SamplingParams) -> dict:
    """One document's calls, one after the other; its tokens and wall."""
    async def go():
        return [await engine.chat(m, params) for m in calls]

    t0 = time.perf_counter()
    replies = asyncio.run(go())
    return {"seconds": time.perf_counter() - t0, "load": loadavg()[0],
            "prompt_tokens": sum(r.prompt_tokens for r in replies),
            "reused_tokens": sum(r.cached_prompt_tokens for r in replies),
            "replies": [r.token_ids for r in replies]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schema", action="append", required=True,
                    help="JSON Schema file; repeat it to merge schemas (the question is the prefix)")
    ap.add_argument("--docs", type=int, default=20)
    ap.add_argument("--doc-tokens", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--wall-docs", type=int, default=20, help="documents also read without the cache (wall)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    ap.add_argument("--out", default="benchmarks/results/prefix_cache.json")
    add_threads_option(ap)
    args = ap.parse_args()
    set_threads(args.threads)
    schema_path = merged_schema(args.schema, Path(tempfile.mkdtemp()) / "schema.json")
    question_chars, prompts = document_prompts(schema_path, args.docs, args.doc_tokens)
    engines = {on: TransformersEngine.from_config(EngineConfig(dtype=args.dtype, enable_prefix_caching=on))
               for on in (True, False)}
    question_tokens = engines[True].count_chat_tokens(
        [{"role": "user", "content": load_schema(schema_path).question()}])
    params = SamplingParams(max_tokens=args.max_tokens)
    rows: dict[str, list[dict]] = {"with": [], "without": []}
    for i, calls in enumerate(prompts):  # interleaved: a wall document with, then without, under the same load
        rows["with"].append(run_doc(engines[True], calls, params))
        if i < args.wall_docs:
            rows["without"].append(run_doc(engines[False], calls, params))
        print(f"doc {i + 1}: with {rows['with'][-1]['seconds']:.1f}s "
              + (f"without {rows['without'][-1]['seconds']:.1f}s " if i < args.wall_docs else "")
              + f"load {loadavg()[0]:.1f}", flush=True)
    walls = len(rows["without"])
    prompt_tokens = [sum(engines[False].count_chat_tokens(m) for m in calls) for calls in prompts]
    summary = {}
    for name, rs in rows.items():
        computed = ([r["prompt_tokens"] - r["reused_tokens"] for r in rs] if name == "with" else prompt_tokens)
        summary[name] = {"prefill_tokens_per_doc": sum(computed) / len(computed),
                         "prompt_tokens_per_doc": sum(prompt_tokens) / len(prompt_tokens),
                         "reused_tokens_per_doc": sum(r["reused_tokens"] for r in rs) / len(rs),
                         "wall_per_doc_median_s": median([r["seconds"] for r in rs[:walls]]),
                         "wall_total_s": sum(r["seconds"] for r in rs[:walls]),
                         "load_median": median([r["load"] for r in rs[:walls]])}
    assert all(r["reused_tokens"] == 0 and r["prompt_tokens"] == n for r, n in zip(rows["without"], prompt_tokens))
    # The first document fills the cache: the steady state is every document after it.
    steady = [r["prompt_tokens"] - r["reused_tokens"] for r in rows["with"][1:]]
    data = {
        "schemas": [Path(p).name for p in args.schema], "docs": args.docs, "doc_tokens": args.doc_tokens,
        "question_tokens": question_tokens, "question_chars": question_chars, "max_tokens": args.max_tokens,
        "dtype": str(engines[True].dtype), "prefix_cache_mib": EngineConfig().prefix_cache_mib,
        "summary": summary,
        "prefill_ratio": summary["without"]["prefill_tokens_per_doc"] / summary["with"]["prefill_tokens_per_doc"],
        "prefill_ratio_after_first_doc": (summary["without"]["prefill_tokens_per_doc"] / (sum(steady) / len(steady))
                                          if steady else None),
        "wall_ratio": summary["without"]["wall_total_s"] / summary["with"]["wall_total_s"],
        "wall_ratio_after_first_doc": (sum(r["seconds"] for r in rows["without"][1:])
                                       / sum(r["seconds"] for r in rows["with"][1:walls]) if walls > 1 else None),
        "wall_docs": walls,
        "identical_replies": [r["replies"] for r in rows["with"][:walls]] == [r["replies"] for r in rows["without"]],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "prefix_cache_bytes_at_end": engines[True].prefix_cache.bytes,
        "per_doc": {name: [{k: v for k, v in r.items() if k != "replies"} for r in rs] for name, rs in rows.items()},
        "machine": machine(),
    }
    write_json(args.out, data)
    print_table(["engine", "prefill tok/doc", "reused tok/doc", "wall/doc (median s)", "load"],
                [[name, s["prefill_tokens_per_doc"], s["reused_tokens_per_doc"], s["wall_per_doc_median_s"],
                  s["load_median"]] for name, s in summary.items()])
    print(f"prefill ratio {data['prefill_ratio']:.2f}x, wall ratio {data['wall_ratio']:.2f}x, "
          f"identical replies {data['identical_replies']}, question {question_tokens} tokens")


if __name__ == "__main__":
    main()
