"""Seconds per 1K document tokens vs document length: the memory agent is linear, the baseline is capped.

    python -m benchmarks.scaling --model tiny --lengths 8192,32768,131072,262144 \\
        --out benchmarks/results/scaling.json
    python -m benchmarks.scaling --model smollm2-135m --lengths 8192,32768 --append \\
        --out benchmarks/results/scaling.json

One NIAH document per length (sized with a word-count estimate; the JSON has the real token
count), read by the memory agent (``small`` preset), and by the full-context baseline where the
document fits the model window (the whole document in one prompt, middle dropped to fit:
``memagent.full_context.read_full_context``). ``--model tiny`` builds a 2-layer random Llama
with SmolLM2's tokenizer (``benchmarks.common.build_tiny_llama``): its memory updates always
run to the ``memory_tokens`` cap, so every chunk costs the same, which isolates how the agent's
cost grows with length. ``--append`` adds runs to an existing output file (one file, several
models; each run records its model).

Headline key ``ratio_256k_vs_8k``: seconds per 1K tokens at the longest length over the
shortest, memory agent, for the model that ran both 8K and 256K (target <= 1.10); per model
under ``ratios``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    add_threads_option,
    loadavg,
    machine,
    print_table,
    resolve_bench_model,
    set_threads,
    write_json,
)


def long_niah(target_tokens: int, seed: int = 7) -> dict:
    """A NIAH row of about ``target_tokens`` (word-count sizing: no tokenizer calls on megabytes)."""
    from memagent.data.demo import niah_row

    return niah_row(0, target_tokens, depth=0.5, seed=seed)


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="'tiny' (random 2-layer Llama) or a registered model")
    parser.add_argument("--lengths", default="8192,32768,131072,262144")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--memory-tokens", type=int, default=None, help="override the preset's memory_tokens (per-chunk generation cap)")
    parser.add_argument("--baseline-max", type=int, default=8192, help="run the full-context baseline up to this length")
    parser.add_argument("--append", action="store_true", help="add runs to an existing --out file")
    parser.add_argument("--out", default="runs/bench/scaling.json")
    add_threads_option(parser)
    return parser.parse_args()


def main() -> None:
    args = parse_args()

    from memagent.agent import check_config, read_document
    from memagent.config import preset
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine
    from memagent.full_context import read_full_context

    out = Path(args.out)
    previous = json.loads(out.read_text()) if args.append and out.exists() else {}
    runs: list[dict] = list(previous.get("runs", []))
    model_dir, label = resolve_bench_model(args.model, tempfile.mkdtemp(prefix="bench-scaling-"))
    engine = TransformersEngine.from_config(EngineConfig(model=str(model_dir)), name=label)
    threads = set_threads(args.threads)
    config = preset(args.preset).with_overrides(memory_tokens=args.memory_tokens)
    check_config(engine, config)
    asyncio.run(read_document(engine, "What is it?", "A warm-up document. " * 50, config))

    for n in [int(x) for x in args.lengths.split(",")]:
        row = long_niah(n)
        for method in ("memagent", "full-context"):
            if method == "full-context" and n > args.baseline_max:
                continue
            reader = read_document if method == "memagent" else read_full_context
            load0 = loadavg()
            t0 = time.perf_counter()
            result = asyncio.run(reader(engine, row["question"], row["context"], config))
            wall = time.perf_counter() - t0
            mem = [s for s in result.steps if s.kind == "memory"]
            run = {
                "model": args.model, "model_label": label, "threads": threads, "memory_tokens": config.memory_tokens, "method": method, "target_tokens": n,
                "context_tokens": result.context_tokens, "n_chunks": result.n_chunks, "truncated": result.truncated,
                "prompt_tokens": sum(s.prompt_tokens for s in result.steps),
                "seconds": round(wall, 2), "seconds_per_1k_tokens": round(wall / (result.context_tokens / 1000), 4),
                "seconds_per_chunk": round(sum(s.seconds for s in mem) / len(mem), 3) if mem else None,
                "memory_tokens_mean": round(sum(s.completion_tokens for s in mem) / len(mem), 1) if mem else None,
                "correct": any(a in (result.prediction or "") for a in row["answers"]),
                "loadavg_start": load0, "loadavg_end": loadavg(),
            }
            runs = [r for r in runs if not (r["model"] == args.model and r["method"] == method
                                            and r["target_tokens"] == n)] + [run]
            print(f"{args.model} {method} {n}: {wall:.1f}s, {run['seconds_per_1k_tokens']} s/1K tokens, "
                  f"{result.n_chunks} chunks; load {run['loadavg_end']}", flush=True)
            write_json(out, summarise(runs, args, config))

    result = summarise(runs, args, config)
    write_json(out, result)
    print_table(["model", "method", "tokens", "chunks", "seconds", "s / 1K tokens", "load (1 min)"], [
        [r["model"], r["method"], r["context_tokens"], r["n_chunks"], r["seconds"], r["seconds_per_1k_tokens"],
         r["loadavg_end"][0]] for r in sorted(runs, key=lambda r: (r["model"], r["method"], r["target_tokens"]))
    ])
    print(f"ratio_256k_vs_8k = {result['ratio_256k_vs_8k']}; wrote {out}")


def summarise(runs: list[dict], args: argparse.Namespace, config) -> dict:
    ratios = {}
    for model in sorted({r["model"] for r in runs}):
        mine = sorted((r for r in runs if r["model"] == model and r["method"] == "memagent"),
                      key=lambda r: r["target_tokens"])
        if len(mine) > 1:
            ratios[model] = {"longest_vs_shortest": round(mine[-1]["seconds_per_1k_tokens"] / mine[0]["seconds_per_1k_tokens"], 3),
                             "lengths": [mine[0]["target_tokens"], mine[-1]["target_tokens"]]}
    headline = next((v["longest_vs_shortest"] for v in ratios.values() if v["lengths"] == [8192, 262144]), None)
    return {
        "benchmark": "scaling",
        "ratio_256k_vs_8k": headline,
        "ratios": ratios,
        "models_by_length": {m: sorted({r["target_tokens"] for r in runs if r["model"] == m}) for m in {r["model"] for r in runs}},
        "settings": {"preset": args.preset, "agent_last_run": config.model_dump(), "baseline_max": args.baseline_max,
                     "document": "NIAH, word-count sized; context_tokens is the real count",
                     "tiny": "2 layers, 64 wide, random weights, SmolLM2 tokenizer, 8192-token window"},
        "runs": runs, "machine": machine(),
    }


if __name__ == "__main__":
    main()
