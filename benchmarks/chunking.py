"""Tokenise + chunk one very long document (SmolLM2 tokenizer): seconds and peak memory.

    python -m benchmarks.chunking --out benchmarks/results/chunking.json

Writes a generated NIAH-style text of about ``--tokens`` tokens to a temporary file, then runs
``memagent.chunking.chunk_document`` on it in ``--repeats`` fresh subprocesses (so each peak RSS
is only that process: imports + tokenizer + the text, then the work). Each child reports
``ru_maxrss`` after loading (baseline) and after chunking (peak).

Headline keys: ``seconds`` (median wall of chunk_document; target <= 5) and ``peak_rss_mb``
(peak RSS minus the baseline, MB = 2^20 bytes; target <= 1500); ``peak_rss_total_mb`` is the
whole child process.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import loadavg, machine, print_table, write_json


def write_text(path: Path, tokens: int, seed: int = 0) -> int:
    """About ``tokens`` tokens of filler with one needle in the middle; returns characters written."""
    from memagent.data.demo import FILLER, TOKENS_PER_WORD

    rng = random.Random(seed)
    words_needed = int(tokens / TOKENS_PER_WORD)
    parts, words = [], 0
    while words < words_needed:
        s = rng.choice(FILLER)
        parts.append(s)
        words += len(s.split())
    parts.insert(len(parts) // 2, "The special magic number for calm-otter is: 4829113.")
    text = " ".join(parts)
    path.write_text(text)
    return len(text)


def child(text_path: str, model: str, chunk_tokens: int) -> None:
    import resource

    from memagent.chunking import chunk_document
    from memagent.models import load_tokenizer

    tok = load_tokenizer(model)
    text = Path(text_path).read_text()
    tok("warm up", add_special_tokens=False, return_offsets_mapping=True)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    doc = chunk_document(tok, text, chunk_tokens)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"seconds": seconds, "baseline_rss_mb": base / 1024, "peak_rss_total_mb": peak / 1024,
                      "peak_rss_mb": (peak - base) / 1024, "context_tokens": doc.context_tokens,
                      "chunks": len(doc.chunks), "chars": len(text)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3_500_000)
    parser.add_argument("--chunk-tokens", type=int, default=1024)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="runs/bench/chunking.json")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.model, args.chunk_tokens)
        return

    work = Path(tempfile.mkdtemp(prefix="bench-chunking-"))
    text_path = work / "doc.txt"
    chars = write_text(text_path, args.tokens)
    runs = []
    for i in range(args.repeats):
        load0 = loadavg()
        proc = subprocess.run([sys.executable, "-m", "benchmarks.chunking", "--child", str(text_path),
                               "--model", args.model, "--chunk-tokens", str(args.chunk_tokens)],
                              capture_output=True, text=True, check=True, env=os.environ.copy())
        run = json.loads(proc.stdout.strip().splitlines()[-1])
        run["loadavg_start"] = load0
        runs.append(run)
        print(f"run {i}: {run['seconds']:.2f}s, peak RSS +{run['peak_rss_mb']:.0f} MB "
              f"(total {run['peak_rss_total_mb']:.0f} MB); load {load0}", flush=True)
    text_path.unlink()
    result = {
        "benchmark": "chunking",
        "seconds": round(statistics.median(r["seconds"] for r in runs), 3),
        "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs), 1),
        "peak_rss_total_mb": round(max(r["peak_rss_total_mb"] for r in runs), 1),
        "baseline_rss_mb": round(statistics.median(r["baseline_rss_mb"] for r in runs), 1),
        "context_tokens": runs[0]["context_tokens"], "chunks": runs[0]["chunks"], "chars": chars,
        "targets": {"seconds": 5.0, "peak_rss_mb": 1500},
        "settings": {"tokens": args.tokens, "chunk_tokens": args.chunk_tokens, "model": args.model,
                     "repeats": args.repeats, "rss": "ru_maxrss of a fresh child; baseline after imports, "
                     "tokenizer load and reading the text"},
        "runs": runs, "loadavg_end": loadavg(), "machine": machine(),
    }
    out = write_json(args.out, result)
    print_table(["tokens", "chunks", "seconds (median)", "peak RSS MB (work)", "peak RSS MB (process)"],
                [[result["context_tokens"], result["chunks"], result["seconds"], result["peak_rss_mb"],
                  result["peak_rss_total_mb"]]])
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
