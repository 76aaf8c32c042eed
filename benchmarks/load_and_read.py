"""Model load time (first: GGUF dequantise + cache; then cached) and seconds per chunk of one read.

    python -m benchmarks.load_and_read --tokens 8000 --preset small --out runs/bench/load_and_read.json

The first load runs in a fresh cache directory so it always measures the GGUF path. Headline
keys: ``first_load_seconds``, ``cached_load_seconds``, ``seconds_per_chunk``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import tempfile
import time

from benchmarks.common import machine, print_table, write_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8000, help="document length in tokens")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--out", default="runs/bench/load_and_read.json")
    args = parser.parse_args()

    os.environ["MEMAGENT_CACHE"] = tempfile.mkdtemp(prefix="memagent-cache-")
    from memagent.agent import check_config, read_document
    from memagent.config import preset
    from memagent.data.demo import niah_row
    from memagent.data.hotpotqa import count_tokens
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine
    from memagent.models import resolve_model

    t0 = time.perf_counter()
    model_dir = resolve_model("smollm2-135m")
    materialise = time.perf_counter() - t0
    engine = TransformersEngine.from_config(EngineConfig(model=str(model_dir)))
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    engine = TransformersEngine.from_config(EngineConfig(model="smollm2-135m"))
    cached = time.perf_counter() - t1

    config = preset(args.preset)
    check_config(engine, config)
    count = functools.partial(count_tokens, engine.tokenizer)
    row = niah_row(0, args.tokens, depth=0.6, seed=5, count=count)
    t2 = time.perf_counter()
    result = asyncio.run(read_document(engine, row["question"], row["context"], config))
    read = time.perf_counter() - t2
    memory_steps = [s for s in result.steps if s.kind == "memory"]
    out = {
        "benchmark": "load_and_read",
        "first_load_seconds": round(first, 2),
        "materialise_seconds": round(materialise, 2),
        "cached_load_seconds": round(cached, 2),
        "seconds_per_chunk": round(sum(s.seconds for s in memory_steps) / len(memory_steps), 2),
        "answer_seconds": result.steps[-1].seconds,
        "read_seconds": round(read, 2),
        "context_tokens": result.context_tokens,
        "n_chunks": result.n_chunks,
        "memory_tokens_mean": round(sum(s.completion_tokens for s in memory_steps) / len(memory_steps), 1),
        "expected": row["answers"], "prediction": result.prediction,
        "dtype": str(engine.dtype), "preset": args.preset, "agent": config.model_dump(), "machine": machine(),
    }
    write_json(args.out, out)
    print_table(["first load s", "cached load s", "tokens", "chunks", "s/chunk", "answer s", "dtype"],
                [[out["first_load_seconds"], out["cached_load_seconds"], out["context_tokens"], out["n_chunks"],
                  out["seconds_per_chunk"], out["answer_seconds"], out["dtype"]]])
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
