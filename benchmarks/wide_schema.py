"""Calls and tokens per document for a 400-leaf schema: the grouped read against one read per field.

    nice python -m benchmarks.wide_schema --out benchmarks/results/wide_schema.json

A 400-leaf schema (tests/wide_schemas.py: sections of nested objects, top-level leaves; seed 5) and a
gold object stated one sentence per section (about 4,000 tokens) are read by the perfect reader of
tests/wide_schemas.py behind the in-process oracle engine, counting every call's prompt tokens (the
packaged SmolLM2 tokenizer's chat template) and reply tokens:

- ``grouped``: the memory agent with the whole schema and the ``small`` preset's budgets derived from it
  (one memory update per chunk with the compact field list; one constrained final call per answer group);
- ``per_field``: one read per leaf (a one-field schema each: a memory update per chunk and a final call),
  the way a one-question-per-field extractor reads.

Both read the same document in the same chunks, and both must give the gold values (checked). Writes the
JSON and a short Markdown table beside it.
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
from tests.oracle.servers import OracleEngine
from tests.wide_schemas import WideReader, count_leaves, gold_for, statement, wide_schema


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/wide_schema.json")
    ap.add_argument("--leaves", type=int, default=400)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--chunk-tokens", type=int, default=1024)
    args = ap.parse_args()
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
