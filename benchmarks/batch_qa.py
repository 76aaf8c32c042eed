"""Batch QA throughput: rows/s and document tokens/s of the Ray Data job at several batch sizes.

    python -m benchmarks.batch_qa --docs 32 --tokens 1500 --batch-sizes 1,16 --out runs/bench/batch_qa.json

Generates ``--docs`` needle-in-a-haystack documents, runs the job (one actor, the packaged
model, the ``small`` preset unless told otherwise) once per batch size into a fresh output,
and writes JSON (headline key ``ratio`` = rows/s at the largest batch size over the smallest)
plus a short table. A measurement, never an assertion.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

# benchmarks.common also sets the local-Ray env vars (before ray is imported).
from benchmarks.common import machine, print_table, write_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=1500, help="document length in tokens")
    parser.add_argument("--batch-sizes", default="1,16")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--out", default="runs/bench/batch_qa.json")
    args = parser.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    from memagent.config import preset
    from memagent.data.demo import niah_row
    from memagent.data.hotpotqa import count_tokens
    from memagent.models import load_tokenizer
    from memagent.engines import EngineConfig
    from memagent.engines.hf import default_dtype
    from pipelines.batch_qa import BatchQAConfig, run_batch_qa

    count = functools.partial(count_tokens, load_tokenizer(args.model))
    rows = [niah_row(i, args.tokens, depth=(i % 8 + 1) / 9, seed=11, count=count) for i in range(args.docs)]
    work = Path(tempfile.mkdtemp(prefix="bench-batch-qa-"))
    pq.write_table(pa.Table.from_pylist(rows), work / "input.parquet")
    ray.init(include_dashboard=False, log_to_driver=False)
    runs = []
    for bs in [int(x) for x in args.batch_sizes.split(",")]:
        cfg = BatchQAConfig(input=str(work / "input.parquet"), output=str(work / f"out-bs{bs}"),
                            engine=EngineConfig(model=args.model, max_batch_size=max(bs, 16)),
                            agent=preset(args.preset), batch_size=bs, concurrency=args.concurrency, progress=False)
        t0 = time.perf_counter()
        summary = run_batch_qa(cfg)
        wall = time.perf_counter() - t0
        runs.append({"batch_size": bs, "rows": summary.rows_out, "errors": summary.error_rows,
                     "accuracy": summary.accuracy, "context_tokens": summary.context_tokens, "seconds": round(wall, 2),
                     "rows_per_s": round(summary.rows_out / wall, 4),
                     "tokens_per_s": round(summary.context_tokens / wall, 2)})
        print(f"batch_size={bs}: {runs[-1]}", flush=True)
    ray.shutdown()
    agent = preset(args.preset)
    result = {
        "benchmark": "batch_qa",
        "ratio": round(runs[-1]["rows_per_s"] / runs[0]["rows_per_s"], 3) if len(runs) > 1 else None,
        "docs": args.docs, "doc_tokens": args.tokens, "model": args.model, "preset": args.preset,
        "agent": agent.model_dump(), "concurrency": args.concurrency,
        "dtype": str(default_dtype("cpu")), "runs": runs, "machine": machine(),
    }
    out = write_json(args.out, result)
    print_table(["batch size", "rows", "seconds", "rows/s", "doc tokens/s", "accuracy"],
                [[r["batch_size"], r["rows"], r["seconds"], r["rows_per_s"], r["tokens_per_s"], r["accuracy"]]
                 for r in runs])
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
