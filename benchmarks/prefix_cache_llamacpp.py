"""The prefix-cache workload against llama.cpp (issue 66, figure b): the hf engine with its prefix cache vs
llama.cpp's own prompt reuse, on the same prompts, the same GGUF file and the same threads.

    pip install llama-cpp-python   # compiles llama.cpp; not a dependency of the project
    python -m benchmarks.prefix_cache_llamacpp --schema A.json --schema B.json --docs 8 --threads 2

The workload is :mod:`benchmarks.prefix_cache`'s (per document its memory update and final answer, both
starting with the template and the schema's question; ``--max-tokens`` greedy tokens each, so the figure
is the prefill). llama.cpp reads the packaged GGUF file as it is (Q4_1 weights, its own kernels); the hf
engine reads the same file dequantized (``--dtype``, bf16 by ``auto`` on a CPU with avx512_bf16).
llama.cpp keeps the KV of its last prompt and evaluates only what follows the longest common prefix with
it (what a server slot with ``cache_prompt`` does); with ``LlamaRAMCache`` (llama-cpp-python's prompt
cache) it also loads the saved state of the earlier prompt sharing the longest prefix. Each document is
read by every engine in turn (hf, llama.cpp slot, llama.cpp ram) so all see the same load. Headline:
``wall_ratio_over_hf`` (above 1: the hf engine is faster) and the prompt tokens each engine computed
per document (llama.cpp's own ``n_p_eval``). A measurement, never an assertion.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from benchmarks.common import add_threads_option, loadavg, machine, median, print_table, set_threads, write_json
from benchmarks.prefix_cache import document_prompts, merged_schema, run_doc
from memagent.engines import EngineConfig, SamplingParams
from memagent.engines.hf import TransformersEngine
from memagent.models import packaged_gguf


class LlamaCppReader:
    """llama.cpp in process (``llama_cpp.Llama``, the chat template the GGUF file holds, as the hf engine
    uses): greedy chats, the prompt tokens llama.cpp evaluated read from its own counters (``n_p_eval``).

    ``cache``: "slot" keeps only the KV of the last prompt (a server slot with ``cache_prompt``: a call
    reuses its longest common prefix with the call before); "ram" adds llama-cpp-python's prompt cache
    (``LlamaRAMCache``: the state after each call saved, the longest-prefix state loaded), which can
    reuse a prefix from any earlier call, as the hf engine's prefix cache does.
    """

    def __init__(self, gguf: Path, threads: int, cache: str, n_ctx: int = 8192):
        from llama_cpp import Llama, LlamaRAMCache

        self.llm = Llama(model_path=str(gguf), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                         n_batch=512, verbose=False)
        if cache == "ram":
            self.llm.set_cache(LlamaRAMCache(capacity_bytes=4 << 30))

    def _evaluated(self) -> int:
        import llama_cpp

        return llama_cpp.llama_perf_context(self.llm._ctx.ctx).n_p_eval

    def chat(self, messages: list[dict], max_tokens: int, stop: list[str] | None = None) -> dict:
        before = self._evaluated()
        out = self.llm.create_chat_completion(messages=messages, max_tokens=max_tokens, temperature=0.0,
                                              top_k=1, seed=0, stop=stop or None)
        prompt = out["usage"]["prompt_tokens"]
        computed = min(prompt, self._evaluated() - before)
        return {"prompt_tokens": prompt, "reused_tokens": prompt - computed,
                "completion_tokens": out["usage"]["completion_tokens"],
                "finish_reason": "length" if out["choices"][0]["finish_reason"] == "length" else "stop",
                "text": out["choices"][0]["message"]["content"]}


def run_llamacpp(reader: LlamaCppReader, calls: list[list[dict]], max_tokens: int) -> dict:
    t0 = time.perf_counter()
    replies = [reader.chat(m, max_tokens) for m in calls]
    return {"seconds": time.perf_counter() - t0, "load": loadavg()[0],
            "prompt_tokens": sum(r["prompt_tokens"] for r in replies),
            "reused_tokens": sum(r["reused_tokens"] for r in replies), "texts": [r["text"] for r in replies]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schema", action="append", required=True, help="JSON Schema file; repeat it to merge")
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--doc-tokens", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=4)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"])
    ap.add_argument("--out", default="benchmarks/results/prefix_cache_llamacpp.json")
    add_threads_option(ap)
    args = ap.parse_args()
    threads = set_threads(args.threads)
    schema_path = merged_schema(args.schema, Path(tempfile.mkdtemp()) / "schema.json")
    _, prompts = document_prompts(schema_path, args.docs, args.doc_tokens)
    hf = TransformersEngine.from_config(EngineConfig(dtype=args.dtype, enable_prefix_caching=True))
    llamas = {f"llama.cpp ({c})": LlamaCppReader(packaged_gguf(), threads, c) for c in ("slot", "ram")}
    params = SamplingParams(max_tokens=args.max_tokens)
    rows: dict[str, list[dict]] = {"hf (prefix cache)": [], **{name: [] for name in llamas}}
    for i, calls in enumerate(prompts):  # in turn: every engine under the same load
        rows["hf (prefix cache)"].append(run_doc(hf, calls, params))
        for name, llama in llamas.items():
            rows[name].append(run_llamacpp(llama, calls, args.max_tokens))
        print(f"doc {i + 1}: " + ", ".join(f"{k} {v[-1]['seconds']:.2f}s" for k, v in rows.items())
              + f", load {loadavg()[0]:.1f}", flush=True)
    summary = {name: {"prefill_tokens_per_doc": sum(r["prompt_tokens"] - r["reused_tokens"] for r in rs) / len(rs),
                      "prompt_tokens_per_doc": sum(r["prompt_tokens"] for r in rs) / len(rs),
                      "wall_per_doc_median_s": median([r["seconds"] for r in rs]),
                      "wall_after_first_doc_s": sum(r["seconds"] for r in rs[1:]),
                      "load_median": median([r["load"] for r in rs])} for name, rs in rows.items()}
    hf_s = summary["hf (prefix cache)"]["wall_after_first_doc_s"]
    data = {"schemas": [Path(p).name for p in args.schema], "docs": args.docs, "doc_tokens": args.doc_tokens,
            "max_tokens": args.max_tokens, "threads": threads, "dtype": str(hf.dtype), "gguf": packaged_gguf().name,
            "summary": summary,
            "wall_ratio_over_hf": {n: summary[n]["wall_after_first_doc_s"] / hf_s for n in llamas} if hf_s else None,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "per_doc": {n: [{k: v for k, v in r.items() if k not in ("texts", "replies")} for r in rs]
                        for n, rs in rows.items()}, "machine": machine()}
    write_json(args.out, data)
    print_table(["engine", "prompt tok/doc", "prefill tok/doc", "wall/doc (median s)", "load"],
                [[n, s["prompt_tokens_per_doc"], s["prefill_tokens_per_doc"], s["wall_per_doc_median_s"],
                  s["load_median"]] for n, s in summary.items()])
    print(f"wall over hf's (after the first document): {data['wall_ratio_over_hf']}")


if __name__ == "__main__":
    main()
