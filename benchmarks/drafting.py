"""N-gram drafting per decode step: the incremental index against the full scan it replaced.

    python -m benchmarks.drafting --out benchmarks/results/drafting.json

A row's history is ``L`` tokens (Zipf-distributed ids over a 49,152-token vocabulary, the shape
of text: a few ids everywhere, most rare). Each decode step appends 1–8 kept tokens, then drafts
(n = 4, 3, 2; up to 8 tokens): ``miss`` steps append fresh tokens (no n-gram recurs, so every
size is tried: the scan's worst case), ``copy`` steps append a span copied from earlier in the
history (the lookup hits). The index (:class:`~memagent.engines.speculation.NgramIndex`, the
hf engine's drafter) is timed as the decode loop drives it (``observe`` + ``propose``); the full
scan (the old ``find_draft``, kept as the oracle in memagent_testing/drafts.py) with the history
concatenated per step, as the loop did before. Every step's drafts are compared.

Headline keys: ``index_ms_per_step[L]`` (target ≤ 0.05 ms per row at L = 200,000) and
``scan_ms_per_step[L]``; ``build_seconds[L]`` is the index's one-time build over a prompt of
``L`` tokens, ``index_mb[L]`` its size (tracemalloc), ``identical`` whether every draft matched.
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

import numpy as np

from benchmarks.common import loadavg, print_table, write_json
from memagent.engines.speculation import NgramDrafter, TokenHistory
from memagent_testing.drafts import find_draft as full_scan

VOCAB, N_MIN, N_MAX, MAX_DRAFT = 49_152, 2, 4, 8


def history_tokens(length: int, rng: np.random.Generator) -> list[int]:
    return (rng.zipf(1.2, length) % VOCAB).tolist()


def steps(prompt: list[int], count: int, rng: np.random.Generator) -> list[list[int]]:
    """``count`` steps of kept tokens, alternating a miss (fresh ids) and a copy of an earlier span."""
    out = []
    for j in range(count):
        m = int(rng.integers(1, 9))
        if j % 2:
            at = int(rng.integers(0, len(prompt) - m))
            out.append(prompt[at : at + m])
        else:
            out.append((rng.integers(VOCAB, 2 * VOCAB, m)).tolist())  # ids the prompt never holds
    return out


def time_index(prompt: list[int], kept: list[list[int]]) -> tuple[float, list[list[int]]]:
    """Seconds per step of the drafter (observe + propose) and its drafts."""
    history = TokenHistory(prompt, reserve=sum(map(len, kept)))  # as the decode loop holds a row's tokens
    drafter, drafts = NgramDrafter(history, N_MIN, N_MAX), []
    t0 = time.perf_counter()
    for new in kept:
        history.extend(new)
        drafter.observe(history, len(new))
        drafts.append(drafter.propose(history, MAX_DRAFT))
    return (time.perf_counter() - t0) / len(kept), drafts


def time_scan(prompt: list[int], kept: list[list[int]]) -> tuple[float, list[list[int]]]:
    """Seconds per step of the full scan (with the per-step concatenation) and its drafts."""
    history, drafts = np.asarray(prompt, dtype=np.int64), []
    t0 = time.perf_counter()
    for new in kept:
        history = np.concatenate([history, np.asarray(new, dtype=np.int64)])
        drafts.append(full_scan(history, MAX_DRAFT, N_MIN, N_MAX))
    return (time.perf_counter() - t0) / len(kept), drafts


def index_size(prompt: list[int]) -> tuple[float, float]:
    """(build seconds, MB held by the index) for a prompt (the size from a second build: tracemalloc slows one)."""
    t0 = time.perf_counter()
    NgramDrafter(prompt, N_MIN, N_MAX)
    seconds = time.perf_counter() - t0
    tracemalloc.start()
    drafter = NgramDrafter(prompt, N_MIN, N_MAX)
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del drafter
    return seconds, size / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/drafting.json")
    parser.add_argument("--lengths", default="6000,200000", help="history lengths L, comma-separated")
    parser.add_argument("--steps", type=int, default=2000, help="decode steps timed for the index")
    parser.add_argument("--scan-steps", type=int, default=40, help="decode steps timed for the full scan")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    result: dict = {"settings": vars(args) | {"n_min": N_MIN, "n_max": N_MAX, "max_draft": MAX_DRAFT},
                    "loadavg_start": loadavg(), "index_ms_per_step": {}, "scan_ms_per_step": {},
                    "build_seconds": {}, "index_mb": {}, "identical": {}}
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        prompt = history_tokens(length, rng)
        kept = steps(prompt, args.steps, rng)
        index_s, drafts = time_index(prompt, kept)
        scan_s, scanned = time_scan(prompt, kept[: args.scan_steps])
        build_s, mb = index_size(prompt)
        same = drafts[: args.scan_steps] == scanned
        result["index_ms_per_step"][length] = round(index_s * 1e3, 5)
        result["scan_ms_per_step"][length] = round(scan_s * 1e3, 3)
        result["build_seconds"][length] = round(build_s, 4)
        result["index_mb"][length] = round(mb, 1)
        result["identical"][length] = same
        rows.append([length, index_s * 1e3, scan_s * 1e3, scan_s / index_s, build_s, mb, same])
    result["loadavg_end"] = loadavg()
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    write_json(args.out, result)
    print_table(["L", "index ms/step", "scan ms/step", "speedup", "build s", "index MB", "identical"], rows)


if __name__ == "__main__":
    main()
