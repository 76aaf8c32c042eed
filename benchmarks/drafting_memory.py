"""Memory the hf decode loop's drafting holds per row: 64 rows of 128K-token prompts (issue 52, item 7).

    nice python -m benchmarks.drafting_memory --out benchmarks/results/drafting_memory.json

Each row's prompt is ``--tokens`` Zipf-distributed ids over a 49,152-token vocabulary (the shape of
text, as benchmarks/drafting.py), held as the request's own ``list[int]`` (the engine's
``Row.prompt_ids``; counted in the baseline, not in drafting). The loop's own per-row drafting state
is then built for ``--rows`` rows, as :meth:`memagent.engines.hf_decode.DecodeLoop.run` builds it
(the row's token history and its n-gram and aligned drafters, default settings), and each row is
driven ``--steps`` decode steps (observe the kept tokens, then both drafters propose).

No model runs: a forward at 64 × 128K tokens does not fit this machine; what is measured is what
drafting adds to a served batch of that shape. Keys: ``rss_mb`` (VmRSS) after the prompts (the
baseline) and after the drafting state is built, ``drafting_mb`` their difference, ``peak_rss_mb``
(VmHWM), ``per_row_mb`` (tracemalloc over one row's build), ``build_s`` per row and
``step_ms`` per row-step. ``label`` names the code measured (``--label``); results accumulate per
label in ``--out`` (``runs``). ``before-603bc4e`` was measured by this script at commit 603bc4e with
``loop.row_drafting(row)`` replaced by ``(list(row.prompt_ids), loop._drafters(row))``, the loop's
construction then (a list copy of the prompt, an n-gram index of tuple-keyed dicts with its own list,
an int64 copy for the aligned drafter).
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from pathlib import Path

import numpy as np

from benchmarks.common import loadavg, machine, print_table, table, write_json
from benchmarks.drafting import history_tokens, steps
from memagent.engines.config import EngineConfig
from memagent.engines.hf_decode import DecodeLoop, Row, Speculation


def status_mb(key: str) -> float:
    """``VmRSS`` / ``VmHWM`` of this process, MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    raise KeyError(key)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/drafting_memory.json")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=131_072)
    ap.add_argument("--steps", type=int, default=200, help="decode steps driven per row")
    ap.add_argument("--max-tokens", type=int, default=1024, help="each row's reply budget")
    ap.add_argument("--label", default="after", help="which code this measures (results kept per label)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    loop = DecodeLoop(model=None, eos_ids={0}, pad_id=0, spec=Speculation.from_config(EngineConfig(model="x")))
    base = history_tokens(args.tokens, rng)
    # Distinct lists per row with shared int objects, as requests' token lists (their ints are the tokenizer's).
    rows = [Row(prompt_ids=base[i:] + base[:i], max_tokens=args.max_tokens) for i in range(args.rows)]
    kept = steps(base, args.steps, rng)
    rss0 = status_mb("VmRSS")
    tracemalloc.start()
    probe = loop.row_drafting(rows[0])
    per_row_mb = tracemalloc.get_traced_memory()[0] / 2**20
    tracemalloc.stop()
    del probe
    t0 = time.perf_counter()
    states = [loop.row_drafting(r) for r in rows]
    build_s = (time.perf_counter() - t0) / len(rows)
    rss1 = status_mb("VmRSS")
    t0 = time.perf_counter()
    for history, drafters in states:
        for new in kept:
            history.extend(new)
            for d in drafters:
                d.observe(history, len(new))
            for d in drafters:
                d.propose(history, 8)
    step_ms = 1000 * (time.perf_counter() - t0) / (len(states) * len(kept))
    result = {"rows": args.rows, "tokens": args.tokens, "steps": args.steps, "rss_mb": {"prompts": rss0,
              "drafting_built": rss1, "after_steps": status_mb("VmRSS")}, "drafting_mb": round(rss1 - rss0, 1),
              "peak_rss_mb": status_mb("VmHWM"), "per_row_mb": round(per_row_mb, 2), "build_s": round(build_s, 4),
              "step_ms": round(step_ms, 4), "loadavg": loadavg(), "machine": machine(),
              "command": f"nice python -m benchmarks.drafting_memory --rows {args.rows} --tokens {args.tokens} "
                         f"--steps {args.steps} --label {args.label} --out {args.out}"}
    path = Path(args.out)
    out = json.loads(path.read_text()).get("runs", {}) if path.exists() else {}
    out[args.label] = result
    write_json(path, {"runs": out})
    headers = ["code", "rows × tokens", "drafting MB (RSS)", "per row MB (tracemalloc)", "peak RSS MB",
               "build s / row", "ms / row-step"]
    rows_t = [[label, f"{r['rows']} × {r['tokens']}", r["drafting_mb"], r["per_row_mb"], r["peak_rss_mb"],
               r["build_s"], r["step_ms"]] for label, r in out.items()]
    print_table(headers, rows_t)
    path.with_suffix(".md").write_text(
        "# Drafting memory of the hf decode loop (no model; prompts counted in the baseline)\n\n"
        + table(headers, rows_t) + "\n\nA row labelled with a commit was measured at that commit (see the module "
        "docstring).\n\n" + "\n".join(f"- {label}: `{r['command']}`, load {r['loadavg']}, "
                                                      f"{r['machine']['cpu']}" for label, r in out.items()) + "\n")


if __name__ == "__main__":
    main()
