"""Calls and tokens per document for a 400-leaf schema: the grouped read against one read per field.

    nice python -m benchmarks.wide_schema --out benchmarks/results/wide_schema.json

A 400-leaf schema (memagent_testing/wide_schemas.py: sections of nested objects, top-level leaves; seed 5) and a
gold object stated one sentence per section (about 4,000 tokens) are read by the perfect reader of
memagent_testing/wide_schemas.py behind the in-process oracle engine, counting every call's prompt tokens (the
packaged SmolLM2 tokenizer's chat template) and reply tokens:

- ``grouped``: the memory agent with the whole schema and the ``small`` preset's budgets derived from it
  (one memory update per chunk with the compact field list; one constrained final call per answer group);
- ``per_field``: one read per leaf (a one-field schema each: a memory update per chunk and a final call),
  the way a one-question-per-field extractor reads.

Both read the same document in the same chunks, and both must give the gold values (checked). Writes the
JSON and a short Markdown table beside it.

``--embedded``: instead, the packaged SmolLM2-135M-Instruct (hf engine, dtype auto, CPU) reads a 400-leaf
schema with two record types (seed 21) over a short filing through ``memagent.batch.answer_row`` with the
``small`` preset's derived budgets, as the batch job does: the row's error, its answer calls (groups, and
halves asked again after a cut reply), the replies cut at ``answer_tokens``, the leaves left out, the
non-null values, whether the written object validates against the user's schema (jsonschema), seconds
and peak RSS (``embedded`` in the JSON, a second table). What a 135M model writes is not gold: this says
the row completes and validates, not what it extracts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from memagent.agent import read_document
from memagent.config import AgentConfig
from memagent.extraction import schema_from
from memagent.extraction.output import parse_reply
from memagent.extraction.parse import iter_leaves
from memagent.extraction.resolve import without_nulls
from memagent_testing.oracle.servers import OracleEngine
from memagent_testing.wide_schemas import WideReader, count_leaves, gold_for, statement, wide_schema


class CountingEngine(OracleEngine):
    """The oracle engine counting calls, prompt tokens (chat template) and reply tokens."""

    def __init__(self, reply, tokenizer):
        super().__init__(reply, tokenizer)
        self.prompt_tokens = self.reply_tokens = 0

    async def chat(self, messages, params):
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        self.prompt_tokens += len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        done = await super().chat(messages, params)
        self.reply_tokens += done.completion_tokens
        return done


def read(raw: dict[str, Any], doc: dict[str, Any], text: str, tokenizer, chunk_tokens: int) -> dict[str, Any]:
    schema = schema_from(raw)
    engine = CountingEngine(WideReader(doc, {}).reply, tokenizer)
    config = AgentConfig(preset="small", extraction=raw).with_overrides(chunk_tokens=chunk_tokens)
    result = asyncio.run(read_document(engine, None, text, config))
    return {"calls": engine.calls, "prompt_tokens": engine.prompt_tokens, "reply_tokens": engine.reply_tokens,
            "chunks": result.n_chunks, "groups": len(schema.field_groups(config.answer_tokens)),
            "budgets": {k: getattr(config, k) for k in ("chunk_tokens", "memory_tokens", "answer_tokens",
                                                          "query_tokens")},
            "values": parse_reply(schema, result.response)}


def per_field(raw: dict[str, Any], doc: dict[str, Any], text: str, tokenizer, chunk_tokens: int) -> dict[str, Any]:
    """One read per leaf: the leaf as a one-field schema (its dotted path as the name, dots as ``__``)."""
    schema = schema_from(raw)
    totals = {"calls": 0, "prompt_tokens": 0, "reply_tokens": 0, "reads": 0}
    for path, _, value in iter_leaves(schema.fields, doc):
        node: Any = raw
        for part in path.split("."):
            node = node["properties"][part]
        name = path.replace(".", "__")
        one = {"type": "object", "properties": {name: node}}
        got = read(one, {name: value} if value is not None else {}, text, tokenizer, chunk_tokens)
        assert got["values"].get(name) == value, (path, got["values"], value)
        for k in ("calls", "prompt_tokens", "reply_tokens"):
            totals[k] += got[k]
        totals["reads"] += 1
    return totals


FILING = "Quarterly filing of Cedar Harbor Ltd. Revenue was 48,250 and the status is open. Filed 2021-03-14."


def embedded(leaves: int, seed: int) -> dict[str, Any]:
    """The packaged model reads a wide schema end to end (see the module docstring)."""
    import resource

    from jsonschema import Draft202012Validator

    from memagent.batch import answer_row
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine
    from memagent.models import resolve_model

    raw = wide_schema(leaves, seed, 2)
    config = AgentConfig(preset="small", extraction=raw)
    schema = config.extraction
    engine = TransformersEngine.from_config(EngineConfig(model=str(resolve_model("smollm2-135m"))),
                                            name="smollm2-135m")
    t0 = time.perf_counter()
    row = asyncio.run(answer_row(engine, {"id": "d0", "context": FILING}, config))
    seconds = time.perf_counter() - t0
    answers = [s for s in row["steps"] if s["kind"] == "answer"]
    whole = json.loads(row["extraction"]) if row["error"] is None else None
    return {"leaves": count_leaves(raw), "seed": seed, "budgets": {k: getattr(config, k) for k in (
                "chunk_tokens", "memory_tokens", "answer_tokens", "query_tokens")},
            "groups": len(schema.field_groups(config.answer_tokens)), "answer_calls": len(answers),
            "cut_replies": sum(s["finish_reason"] == "length" for s in answers),
            "error": row["error"], "left_out": row["schema_errors"] or [],
            "non_null_values": sum(v is not None for _, _, v in iter_leaves(schema.fields, whole or {})),
            "valid": whole is not None and schema.errors(whole) == []
            and not list(Draft202012Validator(raw).iter_errors(whole)),
            "seconds": round(seconds, 1), "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}


def write_embedded(out: dict[str, Any], path: Path) -> None:
    e = out["embedded"]
    table = ["| leaves | groups | answer calls | cut replies | leaves left out | non-null values | error | "
             "valid under the user's schema | seconds | peak RSS MiB |", "|---|---|---|---|---|---|---|---|---|---|",
             f"| {e['leaves']} | {e['groups']} | {e['answer_calls']} | {e['cut_replies']} | {len(e['left_out'])} | "
             f"{e['non_null_values']} | {e['error'] or 'none'} | {e['valid']} | {e['seconds']} | {e['peak_rss_mib']} |"]
    path.with_suffix(".md").write_text(
        f"# Wide schema on the packaged model (SmolLM2-135M-Instruct, CPU)\n\nBudgets: {e['budgets']}; "
        f"machine: {out['machine']}\n\n" + "\n".join(table) + "\n")
    print("\n".join(table))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/wide_schema.json")
    ap.add_argument("--leaves", type=int, default=400)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--chunk-tokens", type=int, default=1024)
    ap.add_argument("--embedded", action="store_true", help="the packaged model reads a 400-leaf schema instead")
    args = ap.parse_args()
    if args.embedded:
        from benchmarks.common import machine

        out = {"machine": machine(), "embedded": embedded(args.leaves, 21)}
        out["machine"]["loadavg_after"] = machine()["loadavg"]
        path = Path(args.out).with_suffix(".embedded.json")
        path.write_text(json.dumps(out, indent=2) + "\n")
        write_embedded(out, path)
        return
    from transformers import AutoTokenizer

    from memagent.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model("smollm2-135m")))
    raw = wide_schema(args.leaves, args.seed)
    gold = gold_for(raw, args.seed)
    doc, text = without_nulls(gold), statement(gold)
    t0 = time.perf_counter()
    grouped = read(raw, doc, text, tokenizer, args.chunk_tokens)
    assert grouped.pop("values") == doc, "the grouped read lost values"
    baseline = per_field(raw, doc, text, tokenizer, args.chunk_tokens)
    out = {"leaves": count_leaves(raw), "seed": args.seed, "document_tokens": len(tokenizer(text)["input_ids"]),
           "grouped": grouped, "per_field": baseline, "seconds": round(time.perf_counter() - t0, 1),
           "ratio": {k: round(baseline[k] / grouped[k], 2) for k in ("calls", "prompt_tokens", "reply_tokens")}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    total = {m: out[m]["prompt_tokens"] + out[m]["reply_tokens"] for m in ("grouped", "per_field")}
    table = ["| way | calls / doc | prompt tokens / doc | reply tokens / doc | all tokens / doc |",
             "|---|---|---|---|---|",
             f"| grouped ({grouped['chunks']} chunks, {grouped['groups']} answer groups) | {grouped['calls']} | "
             f"{grouped['prompt_tokens']:,} | {grouped['reply_tokens']:,} | {total['grouped']:,} |",
             f"| one read per field ({baseline['reads']} reads) | {baseline['calls']:,} | "
             f"{baseline['prompt_tokens']:,} | {baseline['reply_tokens']:,} | {total['per_field']:,} |",
             f"| per field / grouped | {out['ratio']['calls']}x | {out['ratio']['prompt_tokens']}x | "
             f"{out['ratio']['reply_tokens']}x | {round(total['per_field'] / total['grouped'], 2)}x |"]
    Path(args.out).with_suffix(".md").write_text(
        f"# Wide schema: {out['leaves']} leaves, a {out['document_tokens']:,}-token document\n\n"
        f"Budgets (small preset, derived from the schema): {grouped['budgets']}\n\n" + "\n".join(table) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
