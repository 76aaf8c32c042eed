"""Time to first token, and a stop string that ends the decode at 4 tokens under ``max_tokens`` 4,096 (issue 53, item 8).

    nice python -m benchmarks.serve_stop --out benchmarks/results/serve_stop.json

A real ``memagent serve`` (a subprocess, the packaged model, dtype auto, ``--threads`` torch threads)
answers streamed greedy requests through httpx:

- ``probe``: the prompt once, ``max_tokens`` 16, whole; the stop string is then the text of the
  first of its tokens from the 4th on whose text first occurs where that token begins (so the
  reply ends just before it: about 4 tokens);
- ``stop``: ``--repeats`` streamed requests with ``max_tokens`` 4,096 and that stop string: time to the
  first content delta (TTFT), time to the last chunk, ``usage.completion_tokens`` and the finish reason;
- ``no_stop``: the same request without the stop string, once (it decodes until the model ends its
  turn or 4,096 tokens): what the decode costs when ``stop`` is applied after decoding, as it was.

Seconds are wall on this machine; the server's peak RSS beside them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import httpx

from benchmarks.common import loadavg, machine, print_table, table, write_json
from benchmarks.serve_memagent import free_port, launch, peak_rss_mb

PROMPT = "Write a long story about a lighthouse keeper who finds a message in a bottle. Make it very detailed."


def streamed(url: str, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed request: seconds to the first content delta and to the end, the text, usage, finish."""
    t0, first, text, use, finish = time.perf_counter(), None, "", None, None
    with httpx.stream("POST", url, json={**body, "stream": True, "stream_options": {"include_usage": True}},
                      timeout=None) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            use = chunk.get("usage") or use
            if chunk["choices"]:
                delta = chunk["choices"][0]["delta"]
                finish = chunk["choices"][0].get("finish_reason") or finish
                if delta.get("content"):
                    first = first if first is not None else time.perf_counter() - t0
                    text += delta["content"]
    return {"ttft_s": round(first, 3) if first is not None else None, "wall_s": round(time.perf_counter() - t0, 3),
            "completion_tokens": use["completion_tokens"], "finish_reason": finish, "chars": len(text)}


def stop_string(text: str, tokenizer: Any, at: int = 3) -> tuple[str, int]:
    """A piece of ``text`` that first occurs where its token ``k >= at`` begins: (the piece, k)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    for k in range(at, len(ids)):
        head, piece = tokenizer.decode(ids[:k]), tokenizer.decode(ids[k:k + 1])
        if piece.strip() and text.startswith(head) and text.find(piece) == len(head):
            return piece, k
    raise RuntimeError(f"no stop string found in {text!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/serve_stop.json")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from memagent.models import load_tokenizer

    tokenizer = load_tokenizer("smollm2-135m")
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    body = {"model": "smollm2-135m", "temperature": 0, "messages": [{"role": "user", "content": PROMPT}]}
    out: dict[str, Any] = {"command": f"nice python -m benchmarks.serve_stop --repeats {args.repeats} "
                                      f"--threads {args.threads} --out {args.out}", "loadavg_before": loadavg(),
                           "machine": machine(), "prompt": PROMPT}
    proc = launch(["--model", "smollm2-135m", "--port", str(port), "--log-level", "warning"], args.threads, port)
    try:
        probe = httpx.post(url, json={**body, "max_tokens": 16}, timeout=None).json()["choices"][0]["message"]
        stop, k = stop_string(probe["content"], tokenizer)
        out["stop"] = {"string": stop, "first_at_token": k}
        runs = [streamed(url, {**body, "max_tokens": 4096, "stop": [stop]}) for _ in range(args.repeats)]
        out["with_stop"] = {"runs": runs, "ttft_s_median": statistics.median(r["ttft_s"] for r in runs),
                            "wall_s_median": statistics.median(r["wall_s"] for r in runs)}
        out["no_stop"] = streamed(url, {**body, "max_tokens": 4096})
        out["server_peak_rss_mb"] = round(peak_rss_mb(proc.pid), 1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    out["loadavg_after"] = loadavg()
    path = write_json(args.out, out)
    w, n = out["with_stop"], out["no_stop"]
    headers = ["request (max_tokens 4,096, greedy, streamed)", "TTFT s", "wall s", "completion tokens", "finish"]
    rows = [[f"stop={stop!r} (first at token {k}), median of {args.repeats}", w["ttft_s_median"],
             w["wall_s_median"], w["runs"][0]["completion_tokens"], w["runs"][0]["finish_reason"]],
            ["no stop", n["ttft_s"], n["wall_s"], n["completion_tokens"], n["finish_reason"]]]
    print_table(headers, rows)
    path.with_suffix(".md").write_text(
        f"# Stop strings end the decode (`{out['command']}`)\n\n" + table(headers, rows) + "\n\n"
        f"The packaged model (SmolLM2-135M-Instruct, dtype auto) behind `memagent serve`, {args.threads} torch "
        f"threads; CPU {out['machine']['cpu']} ({', '.join(out['machine']['simd'])}); load "
        f"{out['loadavg_before']} before, {out['loadavg_after']} after; server peak RSS "
        f"{out['server_peak_rss_mb']} MB.\n")


if __name__ == "__main__":
    main()
