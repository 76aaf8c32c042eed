"""Sequential vs concurrent reads of the same documents through one TransformersEngine.

    python -m benchmarks.concurrency --out benchmarks/results/concurrency.json

Generates ``--docs`` NIAH documents of ``--tokens`` tokens (1-2 chunks at the ``small``
preset), reads them one after another, then all at once (one coroutine per document, the
engine batches their calls), on one engine with the packaged model. Every ``model.forward`` is
timed, so the JSON splits each run into prefill and decode seconds.

Headline keys:
- ``ratio``: sequential wall / concurrent wall (issue target >= 6);
- ``fraction_of_bound``: bound / concurrent wall, where the bound is what this CPU allows for
  the concurrent run: its prefill FLOPs (2 x matmul params x real prompt tokens, every prompt)
  at the fp32 matmul rate measured in the same run, plus its decode steps (forwards of one
  token per row) at the median measured step interval of that run (target >= 0.8).

``--speculation MODES`` skips the sequential read and reads the documents concurrently on one
engine without speculation, then once per mode (``benchmarks.speculation.spec_for``: ``ngram``,
``aligned``, ``both``, ``MODE:K`` for a fixed ``K`` drafted tokens a step; ``both`` alone is the
engine's default against none). Per mode under ``speculation.modes``: ``ratio`` is wall without
÷ wall with (target ≥ 1.0), ``identical_rows`` counts rows whose every memory and answer match
the read without, and ``k_by_active_rows`` shows the draft length chosen per number of rows
still decoding (where the adaptive rule switched drafting off). The top-level ``speculation``
keys repeat the first mode's, with ``off``/``on`` for it. Each read also says what its decode
forwards cost (``decode_forward_s``; ``forward_cost``: per rows × tokens the measured mean beside
the engine's cost model, ``observed_fit`` beside ``model_fit``: is the adaptive rule's price right?).

    python -m benchmarks.concurrency --threads 1 --docs 16 --tokens 1200 \
        --speculation ngram,both,both:4,both:8,both:16,both:32 --out benchmarks/results/concurrency_speculation_k.json

``--sequential-docs N`` reads only the first N documents sequentially and scales the time to
all documents (stated in the JSON as ``sequential_extrapolated``) when the full sequential run
does not fit the time at hand.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import statistics
import time
from typing import Any

from benchmarks.common import (
    DecodeForwards,
    add_threads_option,
    bench_model,
    loadavg,
    machine,
    niah_docs,
    print_table,
    set_threads,
    write_json,
)
from benchmarks.roofline import matmul_gflops


class ForwardLog:
    """Wraps ``model.forward``; keeps (start, end, batch, length) of every call."""

    def __init__(self, model):
        self.model, self.calls = model, []
        self._orig = model.forward

        def forward(*args, **kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            t0 = time.perf_counter()
            out = self._orig(*args, **kwargs)
            self.calls.append((t0, time.perf_counter(), int(ids.shape[0]), int(ids.shape[1])))
            return out

        model.forward = forward

    def restore(self) -> None:
        self.model.forward = self._orig

    def summary(self) -> dict:
        pre = [c for c in self.calls if c[3] > 1]
        dec = [c for c in self.calls if c[3] == 1]
        # A decode step's cost is its interval to the next forward of the same generate: approximate
        # by the forward time plus generate's per-step work (the gap to the next call when it is a decode).
        gaps = [b[0] - a[0] for a, b in zip(self.calls, self.calls[1:]) if a[3] == 1 and b[3] == 1]
        return {
            "prefill_calls": len(pre), "prefill_s": sum(c[1] - c[0] for c in pre),
            "prefill_tokens_padded": sum(c[2] * c[3] for c in pre),
            "decode_steps": len(dec), "decode_forward_s": sum(c[1] - c[0] for c in dec),
            "decode_rows": sum(c[2] for c in dec),
            "decode_interval_median_s": statistics.median(gaps) if gaps else None,
            "decode_batch_sizes": sorted({c[2] for c in dec}),
        }


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=1200, help="document length in tokens")
    parser.add_argument("--sequential-docs", type=int, default=None, help="read only this many sequentially")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--out", default="runs/bench/concurrency.json")
    parser.add_argument("--speculation", default=None, metavar="MODES",
                        help="comma-separated drafting modes (ngram, aligned, both, MODE:K): concurrent reads "
                        "without speculation, then once per mode (no sequential read)")
    add_threads_option(parser)
    return parser.parse_args()


async def read_sequentially(engine: Any, config: Any, rows: list[dict]) -> list:
    """Read ``rows`` one after another."""
    from memagent.agent import read_document

    return [await read_document(engine, row["question"], row["context"], config) for row in rows]


async def read_concurrently(engine: Any, config: Any, rows: list[dict]) -> list:
    """Read ``rows`` all at once (one coroutine per document; the engine batches their calls)."""
    from memagent.agent import read_document

    return await asyncio.gather(*(read_document(engine, row["question"], row["context"], config) for row in rows))


def timed_read(kind: str, rs: list[dict], engine: Any, config: Any, params_matmul: int) -> dict:
    """Read ``rs`` ``kind`` (sequential or concurrent) with every forward timed: the run's prefill/decode split."""
    log = ForwardLog(engine.model)
    n0 = engine.stats.batch_sizes.copy()
    t0 = time.perf_counter()
    reader = read_sequentially if kind == "sequential" else read_concurrently
    results = asyncio.run(reader(engine, config, rs))
    wall = time.perf_counter() - t0
    log.restore()
    s = log.summary()
    real_prompt = sum(st.prompt_tokens for r in results for st in r.steps)
    s.update({
        "docs": len(rs), "wall_s": round(wall, 2), "context_tokens": sum(r.context_tokens for r in results),
        "chunks": sum(r.n_chunks for r in results), "calls": sum(len(r.steps) for r in results),
        "prompt_tokens_real": real_prompt, "prefill_flops": 2 * params_matmul * real_prompt,
        "completion_tokens": sum(st.completion_tokens for r in results for st in r.steps),
        "engine_batch_sizes": dict(engine.stats.batch_sizes - n0),  # {rows: forwards}
        "correct": sum(any(a in (r.prediction or "") for a in row["answers"]) for r, row in zip(results, rs)),
        "loadavg_end": loadavg(),
    })
    s["other_s"] = round(wall - s["prefill_s"] - s["decode_forward_s"], 2)
    s["doc_tokens_per_s"] = s["context_tokens"] / wall
    print(f"{kind}: {wall:.1f}s (prefill {s['prefill_s']:.1f}s, decode {s['decode_forward_s']:.1f}s, "
          f"{s['decode_steps']} steps); load {s['loadavg_end']}", flush=True)
    return s


def write_results(args: argparse.Namespace, engine: Any, config: Any, threads: int, load_start: list[float],
                  mm: dict, seq: dict, conc: dict, n_seq: int) -> None:
    """Write --out (the ratio and the fraction of the bound) and print the two runs."""
    scale = args.docs / n_seq
    seq_wall = seq["wall_s"] * scale
    peak = mm["gflops"] * 1e9
    bound = conc["prefill_flops"] / peak + conc["decode_steps"] * (conc["decode_interval_median_s"] or 0.0)
    seq_bound = seq["prefill_flops"] / peak + seq["decode_steps"] * (seq["decode_interval_median_s"] or 0.0)
    result = {
        "benchmark": "concurrency",
        "ratio": round(seq_wall / conc["wall_s"], 3),
        "fraction_of_bound": round(bound / conc["wall_s"], 3),
        "sequential_wall_s": round(seq_wall, 2), "concurrent_wall_s": conc["wall_s"],
        "sequential_extrapolated": n_seq != args.docs,
        "sequential_doc_tokens_per_s": round(seq["context_tokens"] / seq["wall_s"], 2),
        "concurrent_doc_tokens_per_s": round(conc["doc_tokens_per_s"], 2),
        "bound_s": round(bound, 2),
        "bound_parts": {"prefill_s_at_matmul_rate": round(conc["prefill_flops"] / peak, 2),
                        "decode_s": round(conc["decode_steps"] * (conc["decode_interval_median_s"] or 0), 2)},
        "sequential_bound_s": round(seq_bound * scale, 2),
        "sequential_prefill_share": round(seq["prefill_s"] / seq["wall_s"], 3),
        "sequential_decode_share": round(seq["decode_forward_s"] / seq["wall_s"], 3),
        "concurrent_prefill_share": round(conc["prefill_s"] / conc["wall_s"], 3),
        "concurrent_decode_share": round(conc["decode_forward_s"] / conc["wall_s"], 3),
        "matmul_gflops_fp32": round(mm["gflops"], 2),
        "settings": {"docs": args.docs, "doc_tokens": args.tokens, "sequential_docs": n_seq, "model": args.model,
                     "preset": args.preset, "agent": config.model_dump(), "dtype": str(engine.dtype),
                     "max_batch_size": engine.max_batch_size, "threads": threads},
        "sequential": seq, "concurrent": conc, "matmul": mm,
        "loadavg_start": load_start, "machine": machine(),
    }
    out = write_json(args.out, result)
    print_table(["run", "docs", "wall s", "prefill s", "decode s", "other s", "doc tok/s", "correct"], [
        [k, r["docs"], r["wall_s"], round(r["prefill_s"], 1), round(r["decode_forward_s"], 1), r["other_s"],
         round(r["context_tokens"] / r["wall_s"], 1), r["correct"]]
        for k, r in (("sequential", seq), ("concurrent", conc))
    ])
    print(f"ratio {result['ratio']} (sequential{' extrapolated' if result['sequential_extrapolated'] else ''} "
          f"{seq_wall:.1f}s / concurrent {conc['wall_s']}s); bound {bound:.1f}s -> fraction "
          f"{result['fraction_of_bound']}")
    print(f"wrote {out}")


def main() -> None:
    args = parse_args()

    import torch

    from memagent.agent import check_config
    from memagent.config import preset
    from memagent.engines import EngineConfig, SamplingParams, make_engine

    load_start = loadavg()
    threads = set_threads(args.threads)
    engine = make_engine(EngineConfig(model=bench_model(args.model), dtype=args.dtype,
                                      max_batch_size=max(16, args.docs)))
    config = preset(args.preset)
    check_config(engine, config)
    rows = niah_docs(engine.tokenizer, args.docs, args.tokens)
    params_matmul = (sum(p.numel() for p in engine.model.parameters())
                     - engine.model.get_input_embeddings().weight.numel())

    asyncio.run(engine.chat([{"role": "user", "content": "Hello"}], SamplingParams(2)))  # warm-up
    mm = matmul_gflops(2048, torch.float32, 3)
    print(f"fp32 matmul: {mm['gflops']:.1f} GFLOP/s; load {loadavg()}", flush=True)

    if args.speculation:
        concurrent = functools.partial(read_concurrently, engine, config)
        compare_speculation(engine, rows, concurrent, args, config, threads, load_start)
        return
    n_seq = args.sequential_docs or args.docs
    seq = timed_read("sequential", rows[:n_seq], engine, config, params_matmul)
    conc = timed_read("concurrent", rows, engine, config, params_matmul)
    write_results(args, engine, config, threads, load_start, mm, seq, conc, n_seq)


def forward_costs(steps: list[tuple[int, int, int, float]], cost) -> dict:
    """What the decode forwards of one read cost, beside what the engine's cost model says they cost.

    ``steps``: (k, rows, active rows, seconds) per forward, ``t = k + 1`` tokens a row. Returns the
    decode seconds, per (rows, t) the forwards' count, mean seconds and the model's price, and the
    least-squares fit of ``c0 + c_row·rows + c_tok·rows·t`` to these forwards beside the model's.
    """
    import numpy as np

    by_shape: dict[tuple[int, int], list[float]] = {}
    for k, b, _active, seconds in steps:
        by_shape.setdefault((b, k + 1), []).append(seconds)
    table = [{"rows": b, "tokens": t, "forwards": len(xs), "mean_s": round(statistics.mean(xs), 4),
              "model_s": round(cost.seconds(b, t), 4)} for (b, t), xs in sorted(by_shape.items())]
    fit = None
    if len(by_shape) >= 2:
        x = np.array([[1.0, b, b * (k + 1)] for k, b, _a, _s in steps])
        fit = dict(zip(("c0", "c_row", "c_tok"), np.linalg.lstsq(x, [s for *_, s in steps], rcond=None)[0].round(6)))
    return {"decode_forward_s": round(sum(s for *_, s in steps), 2), "forward_cost": table,
            "observed_fit": fit, "model_fit": {"c0": round(cost.c0, 6), "c_row": round(cost.c_row, 6),
                                               "c_tok": round(cost.c_tok, 6)}}


def speculation_read(engine: Any, label: str, rows: list[dict], concurrent: Any) -> dict:
    """One concurrent read at the engine's current speculation (mode ``label``): wall, outputs, forwards, k chosen."""
    from collections import Counter, defaultdict

    with DecodeForwards() as forwards:
        t0 = time.perf_counter()
        results = asyncio.run(concurrent(rows))
        wall = time.perf_counter() - t0
    by_active: dict[int, Counter] = defaultdict(Counter)
    for k, _b, active, _s in forwards.steps:
        by_active[active][k] += 1
    run = {"wall_s": round(wall, 2), "results": results, "decode_forwards": len(forwards.steps),
           "loadavg_end": loadavg(), **forward_costs(forwards.steps, engine.cost),
           "k_by_active_rows": {a: dict(sorted(c.items())) for a, c in sorted(by_active.items())},
           "completion_tokens": sum(st.completion_tokens for r in results for st in r.steps),
           "drafted": sum(st.draft_tokens for r in results for st in r.steps),
           "accepted": sum(st.accepted_tokens for r in results for st in r.steps)}
    print(f"speculation {label}: {wall:.1f}s, {len(forwards.steps)} decode forwards "
          f"({run['decode_forward_s']}s); load {loadavg()}", flush=True)
    return run


def against_none(off: dict, r: dict, rows: list[dict]) -> dict:
    """A mode's read beside the read without speculation: wall ratio, identical rows, acceptance."""
    same = sum(all(x.memory == y.memory for x, y in zip(a.steps, b.steps)) and a.response == b.response
               for a, b in zip(off["results"], r["results"]))
    drafting = [a for a, c in r["k_by_active_rows"].items() if any(k > 0 for k in c)]
    return {"ratio": round(off["wall_s"] / r["wall_s"], 3), "identical_rows": same, "rows": len(rows),
            "acceptance": r["accepted"] / r["drafted"] if r["drafted"] else None,
            "drafted_with_active_rows_at_most": max(drafting, default=0),
            **{k: v for k, v in r.items() if k != "results"}}


def compare_speculation(engine, rows, concurrent, args, config, threads, load_start) -> None:
    """Concurrent reads without speculation, then once per mode: wall, outputs, k chosen."""
    from benchmarks.speculation import spec_for

    spec_on = engine.speculation
    modes = [m for m in args.speculation.split(",") if m and m != "none"]
    if not modes:
        raise SystemExit("--speculation: name at least one drafting mode besides none (ngram, aligned, both, MODE:K)")
    runs = {}
    for label in ("none", *modes):
        engine.speculation = spec_for(label, spec_on)
        runs[label] = speculation_read(engine, label, rows, concurrent)
    engine.speculation = spec_on
    off = runs["none"]
    per_mode = {label: against_none(off, runs[label], rows) for label in modes}
    head = per_mode[modes[0]]
    result = {
        "benchmark": "concurrency-speculation",
        "speculation": {
            **{k: head[k] for k in ("ratio", "identical_rows", "rows", "acceptance",
                                    "drafted_with_active_rows_at_most")},
            "note": "k_by_active_rows: {rows still decoding: {k chosen: forwards}}",
            "off": {k: v for k, v in off.items() if k != "results"},
            "on": {k: v for k, v in runs[modes[0]].items() if k != "results"},
            "modes": per_mode,
        },
        "settings": {"docs": args.docs, "doc_tokens": args.tokens, "model": args.model, "preset": args.preset,
                     "agent": config.model_dump(), "dtype": str(engine.dtype), "max_batch_size": engine.max_batch_size,
                     "threads": threads, "speculation": vars(spec_on), "modes": ["none", *modes]},
        "loadavg_start": load_start, "machine": machine(),
    }
    out = write_json(args.out, result)
    print_table(["mode", "wall s", "ratio", "identical rows", "decode forwards", "acceptance", "load end"],
                [[k, r["wall_s"], round(off["wall_s"] / r["wall_s"], 3),
                  per_mode[k]["identical_rows"] if k in per_mode else len(rows), r["decode_forwards"],
                  round(r["accepted"] / r["drafted"], 3) if r["drafted"] else "-", r["loadavg_end"][0]]
                 for k, r in runs.items()])
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
