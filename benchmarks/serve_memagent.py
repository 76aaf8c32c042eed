"""The ``memagent`` served model: the server's peak memory from 8K to 1M prompt tokens, and the time
to the first streamed memory update.

Each size runs in a fresh ``memagent serve`` process (so its peak RSS, ``VmHWM``, is that
request's); an OpenAI-style streamed request sends the document as the system message and a
question as the user message, and the client times the first ``reasoning_content`` delta and the
end. Headline: ``rss_ratio`` = peak RSS at the largest size / at the smallest (flat: ~1).

The tiny random Llama (2 layers, 64 wide, SmolLM2's real tokenizer) keeps a 1M-token read within
minutes on a CPU; ``--model smollm2-135m`` runs the packaged model (small sizes).

    python -m benchmarks.serve_memagent --sizes 8192,65536,262144,1048576 \\
        --out benchmarks/results/serve_memagent.json
    python -m benchmarks.serve_memagent --model smollm2-135m --sizes 8192,32768 --memory-tokens 64 \\
        --out benchmarks/results/serve_memagent_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.common import loadavg, machine, print_table, resolve_bench_model, write_json

SENTENCE = "Record {i}: the shipment to depot {d} left on day {t} carrying {n} crates of parts."


def document(tokenizer, tokens: int) -> str:
    """Synthetic text of about ``tokens`` tokens (sentences of a measured length)."""
    per = len(tokenizer(SENTENCE.format(i=12345, d=77, t=301, n=42), add_special_tokens=False)["input_ids"])
    n = tokens // per + 1
    return " ".join(SENTENCE.format(i=i, d=i % 97, t=i % 365, n=i % 50) for i in range(n))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model: Path, args: argparse.Namespace, port: int) -> subprocess.Popen:
    return launch(["--model", str(model), "--port", str(port), "--max-body-bytes", str(256 * 2**20),
                   "--chunk-tokens", str(args.chunk_tokens), "--memory-tokens", str(args.memory_tokens),
                   "--answer-tokens", "16", "--log-level", "warning"], args.threads, port)


def launch(flags: list[str], threads: int, port: int) -> subprocess.Popen:
    """``memagent serve FLAGS`` in a subprocess (``threads`` OpenMP threads), once ``/health`` answers."""
    cmd = [sys.executable, "-m", "memagent_cli", "serve", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("memagent serve did not start")
        time.sleep(0.5)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def one(model: Path, args: argparse.Namespace, text: str) -> dict:
    """One streamed memagent request against a fresh server: its timings and the server's peak RSS."""
    port = free_port()
    proc = start(model, args, port)
    try:
        idle_mb = peak_rss_mb(proc.pid)
        body = {"model": "memagent", "stream": True, "stream_options": {"include_usage": True},
                "messages": [{"role": "system", "content": text}, {"role": "user", "content": "Which depot got day 42?"}]}
        t0, first, updates, use = time.perf_counter(), None, 0, None
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=None) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    use = chunk["usage"]
                if chunk["choices"] and "reasoning_content" in chunk["choices"][0]["delta"]:
                    updates += 1
                    first = first if first is not None else time.perf_counter() - t0
        wall = time.perf_counter() - t0
        return {"idle_rss_mb": round(idle_mb, 1), "peak_rss_mb": round(peak_rss_mb(proc.pid), 1),
                "first_update_s": round(first, 3), "wall_s": round(wall, 2), "memory_updates": updates,
                "usage": use, "body_mb": round(len(json.dumps(body)) / 2**20, 2)}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", help="'tiny' (random, real tokenizer) or a registered model")
    p.add_argument("--sizes", default="8192,65536,262144,1048576", help="prompt tokens, comma-separated")
    p.add_argument("--chunk-tokens", type=int, default=4096)
    p.add_argument("--memory-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="benchmarks/results/serve_memagent.json")
    args = p.parse_args()
    from transformers import AutoTokenizer

    work = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    model, described = resolve_bench_model(args.model, work)
    tok = AutoTokenizer.from_pretrained(str(model))
    runs = {}
    for size in (int(s) for s in args.sizes.split(",")):
        text = document(tok, size)
        runs[size] = {"prompt_tokens": len(tok(text, add_special_tokens=False)["input_ids"]), **one(model, args, text)}
        print(size, runs[size], flush=True)
    sizes = sorted(runs)
    result = {"model": described, "settings": vars(args), "runs": runs,
              "rss_ratio": round(runs[sizes[-1]]["peak_rss_mb"] / runs[sizes[0]]["peak_rss_mb"], 3),
              "machine": machine(), "load_after": loadavg()}
    write_json(args.out, result)
    print_table(["tokens", "peak RSS MB", "idle MB", "first update s", "wall s", "updates", "body MB"],
                [[runs[s]["prompt_tokens"], runs[s]["peak_rss_mb"], runs[s]["idle_rss_mb"], runs[s]["first_update_s"],
                  runs[s]["wall_s"], runs[s]["memory_updates"], runs[s]["body_mb"]] for s in sizes])


if __name__ == "__main__":
    main()
