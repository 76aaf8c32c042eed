"""One prepared check of the vLLM path on a GPU machine (a few minutes; run by check_vllm.sh).

1. Load the packaged SmolLM2 export in vLLM.
2. Make 64 needle-in-a-haystack documents (1-4 chunks each) and read them all concurrently
   with the memory agent (``read_document``); score the answers.
3. Read a subset one document at a time (sequential) for the speed-up of concurrency.
4. Read the subset with the transformers engine on the same GPU: traces must have the same
   shape (step kinds, n_chunks, chunk spans); the agreement of answers is reported.
5. Run tests/gpu/test_vllm_engine.py (after this script's engines are shut down).

Prints a short table; writes ``$OUT/check_vllm.json`` when ``OUT`` is set. Exit code 1 when a
shape check or the tests fail.

    python tests/gpu/check_vllm.py [--docs 64] [--subset 16] [--no-pytest]
    python tests/gpu/check_vllm.py --docs 4 --subset 2 --preset tiny --lengths 300,600 --no-pytest  # CPU smoke
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from memagent.agent import Result, read_document  # noqa: E402
from memagent.config import preset  # noqa: E402
from memagent.data.demo import niah_row  # noqa: E402
from memagent.data.hotpotqa import count_tokens  # noqa: E402
from memagent.verify import sub_em  # noqa: E402

LENGTHS = (900, 1800, 2700, 3600)  # with the small preset (chunk 1024): 1 to 4 chunks per document


def make_docs(tokenizer: Any, n: int, lengths: tuple[int, ...] = LENGTHS, seed: int = 0) -> list[dict]:
    """``n`` NIAH rows cycling through ``lengths`` (tokens), needle depths spread over 0.1..0.9."""
    count = functools.partial(count_tokens, tokenizer)
    return [niah_row(i, lengths[i % len(lengths)], 0.1 + 0.8 * (i % 9) / 8, seed, count) for i in range(n)]


async def read_concurrently(engine: Any, rows: list[dict], agent: Any) -> list[Result]:
    return await asyncio.gather(*(read_document(engine, r["question"], r["context"], agent) for r in rows))


async def read_sequentially(engine: Any, rows: list[dict], agent: Any) -> list[Result]:
    return [await read_document(engine, r["question"], r["context"], agent) for r in rows]


def timed(fn: Any, *args: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def run_summary(name: str, rows: list[dict], results: list[Result], seconds: float) -> dict:
    steps = sum(len(r.steps) for r in results)
    tokens = sum(s.completion_tokens for r in results for s in r.steps)
    return {
        "run": name, "docs": len(rows), "seconds": round(seconds, 2), "docs_per_s": round(len(rows) / seconds, 3),
        "steps": steps, "generated_tokens": tokens, "tokens_per_s": round(tokens / seconds, 1),
        "accuracy": round(sum(sub_em(r.prediction, row["answers"]) for r, row in zip(results, rows)) / len(rows), 3),
    }


def shape(result: Result) -> tuple:
    """What must not depend on the engine: chunking and the sequence of conversations."""
    return (result.n_chunks, result.context_tokens, result.truncated,
            tuple((s.kind, s.chunk_index, s.char_start, s.char_end) for s in result.steps))


def budgets_respected(result: Result, agent: Any) -> bool:
    return all(s.completion_tokens <= (agent.answer_tokens if s.kind == "answer" else agent.memory_tokens)
               for s in result.steps)


def run_pytest() -> dict:
    test = Path(__file__).with_name("test_vllm_engine.py")
    cmd = [sys.executable, "-m", "pytest", str(test), "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    print("\n".join(tail))
    return {"returncode": proc.returncode, "seconds": round(time.perf_counter() - t0, 1), "tail": tail}


def print_table(runs: list[dict]) -> None:
    cols = ["run", "docs", "seconds", "docs_per_s", "tokens_per_s", "accuracy"]
    print("\n" + " | ".join(f"{c:>14}" for c in cols))
    for r in runs:
        print(" | ".join(f"{r[c]!s:>14}" for c in cols))


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--subset", type=int, default=16, help="documents read sequentially and with transformers")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--preset", default="small", help="agent budgets (tiny for a CPU smoke run)")
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="document lengths in tokens")
    ap.add_argument("--no-pytest", action="store_true")
    return ap.parse_args()


def read_with_vllm(engine: Any, args: argparse.Namespace, agent: Any,
                   report: dict[str, Any]) -> tuple[list[dict], list[Result], list[Result], list[dict]]:
    """vLLM reads every document concurrently, then the subset one at a time; its engine is shut down after.
    Returns the documents, both reads' results and their run summaries."""
    rows = make_docs(engine.tokenizer, args.docs, tuple(int(n) for n in args.lengths.split(",")))
    subset = rows[: args.subset]
    try:
        asyncio.run(read_concurrently(engine, rows[:2], agent))  # warm-up (compiles, fills caches)
        concurrent, t_conc = timed(asyncio.run, read_concurrently(engine, rows, agent))
        report["vllm_max_in_flight"] = engine.max_in_flight
        sequential, t_seq = timed(asyncio.run, read_sequentially(engine, subset, agent))
    finally:
        engine.shutdown()
    runs = [run_summary("vllm concurrent", rows, concurrent, t_conc),
            run_summary("vllm sequential", subset, sequential, t_seq)]
    return rows, concurrent, sequential, runs


def shape_failures(args: argparse.Namespace, report: dict[str, Any], rows: list[dict], concurrent: list[Result],
                   sequential: list[Result], hf_results: list[Result], agent: Any) -> list[str]:
    """What fails the check: trace shapes unlike transformers' or the sequential reads', budgets, no concurrency."""
    subset = rows[: args.subset]
    failures: list[str] = []
    mismatched = [row["id"] for row, a, b in zip(subset, concurrent, hf_results) if shape(a) != shape(b)]
    if mismatched:
        failures.append(f"trace shape differs from transformers for {mismatched}")
    if [shape(r) for r in sequential] != [shape(r) for r in concurrent[: len(subset)]]:
        failures.append("sequential and concurrent vLLM reads differ in shape")
    over = [row["id"] for row, r in zip(rows, concurrent) if not budgets_respected(r, agent)]
    if over:
        failures.append(f"token budgets exceeded in {over}")
    if report["vllm_max_in_flight"] < min(args.docs, 8):
        failures.append(f"only {report['vllm_max_in_flight']} requests were ever in flight: no concurrency")
    return failures


def write_report(report: dict[str, Any]) -> None:
    """Write ``$OUT/check_vllm.json`` when ``OUT`` is set."""
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "check_vllm.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {out}")


def main() -> int:
    args = parse_args()

    import torch
    import vllm

    from memagent.engines import EngineConfig, make_engine
    from memagent.engines.hf import TransformersEngine
    from memagent.models import resolve_model

    report: dict[str, Any] = {
        "vllm": vllm.__version__, "torch": torch.__version__, "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    device = "cuda" if torch.cuda.is_available() else "cpu"
    agent = preset(args.preset)
    report["agent"] = agent.model_dump()
    print(f"vLLM {report['vllm']} on {report['gpu'] or 'CPU'}; agent budgets: chunk {agent.chunk_tokens}, "
          f"memory {agent.memory_tokens}, answer {agent.answer_tokens}", flush=True)

    model_dir = resolve_model("smollm2-135m")
    cfg = EngineConfig(engine="vllm", model="smollm2-135m", device=device, max_batch_size=args.docs,
                       max_model_len=4096,
                       **({"gpu_memory_utilization": args.gpu_memory_utilization} if device == "cuda" else {}))
    engine, report["vllm_load_s"] = timed(make_engine, cfg)
    rows, concurrent, sequential, runs = read_with_vllm(engine, args, agent, report)
    subset = rows[: args.subset]

    hf, report["hf_load_s"] = timed(lambda: TransformersEngine.from_config(
        EngineConfig(model=str(model_dir), device=device, max_batch_size=args.subset), name="smollm2-135m"))
    asyncio.run(read_concurrently(hf, rows[:2], agent))  # warm-up
    hf_results, t_hf = timed(asyncio.run, read_concurrently(hf, subset, agent))
    runs.append(run_summary("hf concurrent", subset, hf_results, t_hf))
    del hf

    failures = shape_failures(args, report, rows, concurrent, sequential, hf_results, agent)
    report["same_prediction_as_hf"] = round(
        sum(a.prediction == b.prediction for a, b in zip(concurrent, hf_results)) / len(subset), 3)
    report["chunks_per_doc"] = sorted({r.n_chunks for r in concurrent})
    report["speedup_concurrent_vs_sequential"] = round(runs[0]["docs_per_s"] / runs[1]["docs_per_s"], 2)
    report["speedup_vllm_vs_hf"] = round(runs[0]["docs_per_s"] / runs[2]["docs_per_s"], 2)
    report["runs"] = runs
    print_table(runs)
    print(f"\nconcurrent/sequential: x{report['speedup_concurrent_vs_sequential']}, vLLM/transformers: "
          f"x{report['speedup_vllm_vs_hf']}, max in flight {report['vllm_max_in_flight']}, chunks per doc "
          f"{report['chunks_per_doc']}, same prediction as transformers {report['same_prediction_as_hf']:.0%}")

    if not args.no_pytest:
        report["pytest"] = run_pytest()
        if report["pytest"]["returncode"] != 0:
            failures.append("tests/gpu/test_vllm_engine.py failed")
    report["failures"] = failures
    print("\nFAIL:\n  " + "\n  ".join(failures) if failures else "\nOK: all checks passed")
    write_report(report)
    return 1 if failures else 0


if __name__ == "__main__":  # vLLM's engine core is a subprocess: the guard is required
    sys.exit(main())
