"""NIAH QA read by the memory agent on each engine (issue 66, figure c): the hf engine with and without its
prefix cache, and llama.cpp (the same GGUF file, the same threads) with its last prompt's KV and with
``LlamaRAMCache``.

    pip install llama-cpp-python   # compiles llama.cpp; not a dependency of the project
    python -m benchmarks.prefix_cache_niah --docs 4 --doc-tokens 3000 --threads 2

Each document is a whole read (:func:`memagent.agent.read_document`: a memory update per chunk, then the
answer), greedy, with the ``small`` preset's budgets; every engine reads a short warm-up document first (not
counted), then each document in turn, so all see the same load. llama.cpp runs behind a minimal :class:`~memagent.engines.base.Engine` (plain greedy chats,
one at a time, its prompt tokens computed read from its own counter ``n_p_eval``). A NIAH read shares less
across its calls than extraction does: only the template's instructions and the question open every call,
and the memory and chunk after them differ each time; and the memory updates decode up to
``memory_tokens`` each, so decoding is most of a read. Reported per engine: prompt tokens computed and
reused per document, wall per document, the answers found. A measurement, never an assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
from typing import Any

from benchmarks.common import add_threads_option, loadavg, machine, median, niah_docs, print_table, set_threads, \
    write_json
from benchmarks.prefix_cache_llamacpp import LlamaCppReader
from memagent.agent import read_document
from memagent.config import preset
from memagent.engines import EngineConfig
from memagent.engines.base import Completion, Engine, EngineStats, Messages, SamplingParams
from memagent.engines.hf import TransformersEngine
from memagent.models import packaged_gguf


class LlamaCppEngine(Engine):
    """llama.cpp in process as an engine for greedy, unconstrained chats (what a NIAH read asks)."""

    def __init__(self, reader: LlamaCppReader, tokenizer: Any, context_window: int, name: str):
        self.reader, self.tokenizer, self.context_window, self.name = reader, tokenizer, context_window, name
        self.stats = EngineStats()
        self._one = asyncio.Lock()  # one llama.cpp context: one call at a time

    async def chat(self, messages: Messages, params: SamplingParams, *, on_tokens: Any = None) -> Completion:
        if not params.greedy or params.json_schema is not None or params.logprobs:
            raise ValueError("this benchmark's llama.cpp engine serves greedy text chats only")
        async with self._one:
            r = await asyncio.to_thread(self.reader.chat, list(messages), params.max_tokens, list(params.stop))
        return self.stats.count(Completion(r["text"], r["prompt_tokens"], r["completion_tokens"], r["finish_reason"],
                                           cached_prompt_tokens=r["reused_tokens"]))


def read_one(engine: Engine, doc: dict, config: Any) -> dict:
    t0 = time.perf_counter()
    result = asyncio.run(read_document(engine, doc["question"], doc["context"], config))
    return {"seconds": time.perf_counter() - t0, "load": loadavg()[0], "chunks": result.n_chunks,
            "prompt_tokens": sum(s.prompt_tokens for s in result.steps),
            "reused_tokens": sum(s.cached_prompt_tokens for s in result.steps),
            "completion_tokens": sum(s.completion_tokens for s in result.steps),
            "found": any(a in (result.prediction or result.response) for a in doc["answers"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--doc-tokens", type=int, default=3000)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    ap.add_argument("--out", default="benchmarks/results/prefix_cache_niah.json")
    add_threads_option(ap)
    args = ap.parse_args()
    threads = set_threads(args.threads)
    config = preset("small")
    hf = {f"hf ({'prefix cache' if on else 'no cache'})": TransformersEngine.from_config(
        EngineConfig(dtype=args.dtype, enable_prefix_caching=on)) for on in (True, False)}
    some = next(iter(hf.values()))
    engines: dict[str, Engine] = {**hf, **{f"llama.cpp ({c})": LlamaCppEngine(
        LlamaCppReader(packaged_gguf(), threads, c), some.tokenizer, some.context_window, f"llama.cpp-{c}")
        for c in ("slot", "ram")}}
    docs = niah_docs(some.tokenizer, args.docs, args.doc_tokens)
    warm = {"question": "What is in it?", "context": docs[0]["context"][:2000], "answers": []}
    for engine in engines.values():  # first calls pay for loading and kernels' first runs, not the workload
        read_one(engine, warm, config)
    rows: dict[str, list[dict]] = {name: [] for name in engines}
    for i, doc in enumerate(docs):  # in turn: every engine under the same load
        for name, engine in engines.items():
            rows[name].append(read_one(engine, doc, config))
        print(f"doc {i + 1}: " + ", ".join(f"{k} {v[-1]['seconds']:.1f}s" for k, v in rows.items())
              + f", load {loadavg()[0]:.1f}", flush=True)
    summary = {name: {"prompt_tokens_per_doc": sum(r["prompt_tokens"] for r in rs) / len(rs),
                      "prefill_tokens_per_doc": sum(r["prompt_tokens"] - r["reused_tokens"] for r in rs) / len(rs),
                      "completion_tokens_per_doc": sum(r["completion_tokens"] for r in rs) / len(rs),
                      "wall_per_doc_median_s": median([r["seconds"] for r in rs]),
                      "found": sum(r["found"] for r in rs), "load_median": median([r["load"] for r in rs])}
               for name, rs in rows.items()}
    base = summary["hf (prefix cache)"]["wall_per_doc_median_s"]
    data = {"docs": args.docs, "doc_tokens": args.doc_tokens, "agent": config.model_dump(include={
        "chunk_tokens", "memory_tokens", "answer_tokens", "query_tokens"}), "threads": threads,
        "dtype": str(some.dtype), "gguf": packaged_gguf().name, "summary": summary,
        "wall_ratio_over_hf_cache": {n: s["wall_per_doc_median_s"] / base for n, s in summary.items()},
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "per_doc": rows,
        "machine": machine()}
    write_json(args.out, data)
    print_table(["engine", "prompt tok/doc", "prefill tok/doc", "decoded tok/doc", "wall/doc (median s)", "found",
                 "load"],
                [[n, s["prompt_tokens_per_doc"], s["prefill_tokens_per_doc"], s["completion_tokens_per_doc"],
                  s["wall_per_doc_median_s"], f"{s['found']}/{args.docs}", s["load_median"]]
                 for n, s in summary.items()])
    print(f"wall over hf with its prefix cache: {data['wall_ratio_over_hf_cache']}")


if __name__ == "__main__":
    main()
