"""Greedy answers of the base model and a trained checkpoint on fresh NIAH examples; one JSON file.

    .venv/bin/python benchmarks/policy_samples.py --checkpoint RUN/checkpoints/step_000030/hf \\
        --chunk-tokens 128 --memory-tokens 32 --answer-tokens 24 --out benchmarks/results/policy_samples.json

The examples come from ``train_curve.niah`` with another seed than training's, so none was
trained on. For each model: the share of final answers containing the number (the curve's
lenient reward, here at temperature 0) and a few memories and answers verbatim, to see *what*
the policy learned, not only its reward.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script
    from benchmarks.common import add_threads_option, machine, set_threads

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", type=Path, required=True, help="an HF export of a training run")
    p.add_argument("--base", default="smollm2-135m")
    p.add_argument("--examples", type=int, default=16)
    p.add_argument("--sentences", type=int, default=6)
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--chunk-tokens", type=int, default=128)
    p.add_argument("--memory-tokens", type=int, default=32)
    p.add_argument("--answer-tokens", type=int, default=24)
    p.add_argument("--query-tokens", type=int, default=64)
    p.add_argument("--show", type=int, default=4, help="examples kept verbatim per model")
    add_threads_option(p)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/policy_samples.json"))
    args = p.parse_args(argv)

    from benchmarks.train_curve import niah
    from memagent.agent import read_document
    from memagent.config import AgentConfig
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine
    from memagent.models import resolve_model
    from memagent.verify import contains_any

    set_threads(args.threads)
    agent = AgentConfig(chunk_tokens=args.chunk_tokens, memory_tokens=args.memory_tokens,
                        answer_tokens=args.answer_tokens, query_tokens=args.query_tokens)
    rows = niah(args.examples, sentences=args.sentences, seed=args.seed)
    result: dict = {"machine": machine(), "agent_config": agent.model_dump(), "seed": args.seed,
                    "examples": len(rows), "models": {}}
    for name, path in (("base", resolve_model(args.base)), ("trained", args.checkpoint)):
        engine = TransformersEngine.from_config(EngineConfig(model=str(path), dtype="fp32", device="cpu"))

        async def read_all(engine=engine):
            return await asyncio.gather(*(read_document(engine, r["question"], r["context"], agent) for r in rows))

        reads = asyncio.run(read_all())
        hits = [contains_any(x.response, r["answers"]) for x, r in zip(reads, rows)]
        result["models"][name] = {
            "path": str(path),
            "contains_rate": sum(hits) / len(hits),
            "samples": [{"answer": r["answers"][0], "memory": x.memory, "response": x.response}
                        for x, r in list(zip(reads, rows))[: args.show]],
        }
        print(f"{name}: {sum(hits)}/{len(hits)} answers contain the number")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
