"""Does speculation change answers in bf16? Paired reads with speculation off and on, against the
nondeterminism of batch composition alone.

    nice python -m benchmarks.bf16_speculation --out benchmarks/results/bf16_speculation.json

Reads a set of short documents (1-3 chunks at the ``tiny`` preset, by default) with the packaged model in
``--dtype`` (bf16), greedy decoding, directly through :func:`memagent.agent.read_document` (no
Ray), ``--batch-size`` documents in flight on one engine, once per configuration:

- ``off``: no speculation, documents in the listed order;
- ``on``: speculation (the engine's default drafting), the same order;
- ``off_shuffled``: no speculation, the documents in a seeded shuffle (other batch companions:
  the baseline nondeterminism of bf16 batch composition);
- optionally ``off_bsK`` (``--extra-batch-size K``): no speculation, K documents in flight.

Documents: NIAH rows of the demo corpus generator (``memagent.data.demo.niah_row``, needle depths
0.1..0.9, a few lengths), RULER ``niah_single_1`` rows (``memagent.data.ruler``) and RULER ``qa_2``
rows built from the shipped HotpotQA dev sample (its 24 questions). Scored as the repo scores
them (``string_match_all`` for NIAH, ``sub_em`` for QA).

Headline keys: ``changed`` (per comparison: fraction of answers, of extracted predictions and of
final memories that differ, each with a Wilson 95% interval), ``accuracy`` (per configuration,
with its interval) and ``paired`` (per comparison: discordant counts and McNemar's exact p). The
spec comparison is ``off_vs_on``; the baseline is ``off_vs_off_shuffled``. A measurement, never
an assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import random
import resource
import subprocess
import time
from typing import Any

from benchmarks.common import batch_mean, loadavg, machine, print_table, write_json


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p (binomial test of b vs c discordant pairs at 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def documents(tokenizer, n_niah: int, n_ruler: int, n_hotpot: int, lengths: list[int], seed: int) -> list[dict]:
    from memagent.data.demo import niah_row
    from memagent.data.hotpotqa import count_tokens, load_hotpotqa
    from memagent.data.ruler import RulerGenerator
    from memagent.data.samples import HOTPOTQA_DEV

    count = functools.partial(count_tokens, tokenizer)
    docs = []
    for i in range(n_niah):
        depth = (i % 9 + 1) / 10
        row = niah_row(i, lengths[i % len(lengths)], depth=depth, seed=seed, count=count)
        docs.append({**row, "source": "demo_niah", "metric": "string_match_all", "depth": depth})
    gen = RulerGenerator(tokenizer, hotpotqa=load_hotpotqa(str(HOTPOTQA_DEV)), seed=42)
    for i in range(n_ruler):
        # RULER lengths count the 128-token answer budget and the question: a little more than the demo rows'.
        row = gen.sample("niah_single_1", lengths[i % len(lengths)] + 200, i)
        docs.append({"id": row["id"], "question": row["question"], "context": row["context"], "answers": row["answers"],
                     "source": "ruler_niah_single_1", "metric": row["metric"], "depth": row["needle_depths"][0] / 100})
    for i in range(n_hotpot):
        row = gen.sample("qa_2", lengths[-1], i)
        docs.append({"id": row["id"], "question": row["question"], "context": row["context"], "answers": row["answers"],
                     "source": "ruler_qa_2_hotpotqa", "metric": row["metric"], "depth": None})
    return docs


def read_all(engine, docs: list[dict], order: list[int], in_flight: int, agent, on_done) -> tuple[dict, float]:
    """Read ``docs`` in ``order``, ``in_flight`` at a time on ``engine``; returns results by doc index and wall."""
    from memagent.agent import read_document

    out: dict[int, dict] = {}

    async def main() -> None:
        sem = asyncio.Semaphore(in_flight)

        async def one(i: int) -> None:
            async with sem:
                d = docs[i]
                t0 = time.perf_counter()
                r = await read_document(engine, d["question"], d["context"], agent)
                out[i] = {"response": r.response, "prediction": r.prediction, "memory": r.memory,
                          "memories": [s.memory for s in r.steps if s.kind == "memory"], "chunks": r.n_chunks,
                          "tokens": r.context_tokens, "drafted": sum(s.draft_tokens for s in r.steps),
                          "accepted": sum(s.accepted_tokens for s in r.steps),
                          "seconds": round(time.perf_counter() - t0, 2)}
                on_done(len(out))

        # Tasks created in ``order``: the semaphore admits them in that order.
        await asyncio.gather(*(one(i) for i in order))
        await engine.close()

    t0 = time.perf_counter()
    asyncio.run(main())
    return out, time.perf_counter() - t0


def score_run(docs: list[dict], run: dict[int, dict]) -> list[float]:
    from memagent.verify import score

    return [score(d["metric"], run[i]["prediction"], d["answers"]) if i in run else math.nan
            for i, d in enumerate(docs)]


def wilson(k: float, n: int) -> list[float]:
    from memagent.evaluate import wilson_interval

    return [round(x, 4) for x in wilson_interval(k / n, n)] if n else [math.nan, math.nan]


def compare(docs: list[dict], a: dict, b: dict, sa: list[float], sb: list[float]) -> dict:
    idx = [i for i in range(len(docs)) if i in a and i in b]
    n = len(idx)
    out: dict = {"n": n}
    for field in ("response", "prediction", "memory"):
        k = sum(a[i][field] != b[i][field] for i in idx)
        out[f"{field}_changed"] = k
        out[f"{field}_changed_frac"] = round(k / n, 4) if n else None
        out[f"{field}_changed_ci95"] = wilson(k, n)
    # The memory step where the two reads first part (None: identical chains).
    first = []
    for i in idx:
        ma, mb = a[i]["memories"], b[i]["memories"]
        first.append(next((s for s, (x, y) in enumerate(zip(ma, mb)) if x != y), None))
    out["first_differing_memory_step"] = {str(k): first.count(k) for k in sorted(set(first), key=lambda x: (x is None, x))}
    correct_a = [sa[i] >= 1 for i in idx]
    correct_b = [sb[i] >= 1 for i in idx]
    only_a = sum(x and not y for x, y in zip(correct_a, correct_b))
    only_b = sum(y and not x for x, y in zip(correct_a, correct_b))
    out.update({"right_only_first": only_a, "right_only_second": only_b, "discordant": only_a + only_b,
                "discordant_frac": round((only_a + only_b) / n, 4) if n else None,
                "discordant_ci95": wilson(only_a + only_b, n), "mcnemar_exact_p": round(mcnemar_exact(only_a, only_b), 4)})
    by_source: dict[str, dict] = {}
    for i in idx:
        s = by_source.setdefault(docs[i]["source"], {"n": 0, "response_changed": 0, "discordant": 0})
        s["n"] += 1
        s["response_changed"] += a[i]["response"] != b[i]["response"]
        s["discordant"] += (sa[i] >= 1) != (sb[i] >= 1)
    out["by_source"] = by_source
    return out


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--preset", default="tiny",
                    help="budget preset (tiny: 256-token chunks, 48-token memory; small: 1,024 and 160)")
    ap.add_argument("--niah", type=int, default=60, help="demo-corpus NIAH rows")
    ap.add_argument("--ruler", type=int, default=30, help="RULER niah_single_1 rows")
    ap.add_argument("--hotpot", type=int, default=24, help="RULER qa_2 rows from the shipped HotpotQA sample")
    ap.add_argument("--lengths", default="200,450,700", help="document lengths in tokens (tiny preset: 1-3 chunks)")
    ap.add_argument("--batch-size", type=int, default=16, help="documents in flight = engine max_batch_size")
    ap.add_argument("--extra-batch-size", type=int, default=0, help="also read without speculation at this batch size")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--verbose", action="store_true", help="a progress line per document")
    return ap.parse_args()


def run_configs(args: argparse.Namespace, n: int) -> list[tuple[str, bool, int, list[int]]]:
    """(label, speculate, documents in flight, reading order) of each configuration, in the order they run."""
    shuffled = list(range(n))
    random.Random(args.seed).shuffle(shuffled)
    configs = [("off", False, args.batch_size, list(range(n))),
               ("on", True, args.batch_size, list(range(n))),
               ("off_shuffled", False, args.batch_size, shuffled)]
    if args.extra_batch_size:
        configs.append((f"off_bs{args.extra_batch_size}", False, args.extra_batch_size, list(range(n))))
    return configs


def write_summary(out: dict, docs: list[dict], configs: list[tuple], runs: dict[str, dict],
                  scores: dict[str, list[float]], args: argparse.Namespace, t_start: float, partial: bool) -> None:
    """Accuracy per configuration, the pairwise comparisons and per-document rows of the runs so far; writes --out."""
    out["accuracy"] = {}
    for label in runs:
        done = [s for s in scores[label] if not math.isnan(s)]
        k = sum(s >= 1 for s in done)
        out["accuracy"][label] = {"n": len(done), "correct": k, "accuracy": round(k / len(done), 4) if done else None,
                                  "ci95": wilson(k, len(done))}
    out["changed"] = {}
    pairs = [("off", "on"), ("off", "off_shuffled")] + [("off", c[0]) for c in configs[3:]] + [("off_shuffled", "on")]
    for a, b in pairs:
        if a in runs and b in runs:
            out["changed"][f"{a}_vs_{b}"] = compare(docs, runs[a], runs[b], scores[a], scores[b])
    out["per_document"] = [{"id": d["id"], "source": d["source"], "depth": d["depth"], "answers": d["answers"],
                            **{f"{label}_prediction": runs[label][i]["prediction"]
                               for label in runs if i in runs[label]},
                            **{f"{label}_score": scores[label][i] for label in runs if i in runs[label]},
                            "chunks": next((runs[label][i]["chunks"] for label in runs if i in runs[label]), None)}
                           for i, d in enumerate(docs)]
    out["peak_rss_mib"] = peak_rss_mib()
    out["loadavg_end"] = loadavg()
    out["uptime_end"] = uptime()
    out["wall_s"] = round(time.perf_counter() - t_start, 1)
    out["complete"] = not partial
    write_json(args.out, out)


def read_config(engine: Any, args: argparse.Namespace, docs: list[dict], agent: Any,
                config: tuple[str, bool, int, list[int]], t_start: float) -> tuple[dict[int, dict], dict]:
    """Read every document in one configuration on its engine: the results by document and the run's figures."""
    label, speculate, bs, order = config
    n = len(docs)
    loads: list[float] = []

    def progress(done: int) -> None:
        loads.append(loadavg()[0])
        if done % 10 == 0 or done == n or args.verbose:
            print(f"[{label}] {done}/{n} docs  load {loads[-1]}  {time.perf_counter() - t_start:.0f}s", flush=True)

    result, wall = read_all(engine, docs, order, bs, agent, progress)
    return result, {"speculate": speculate, "batch_size": bs,
                    "order": "shuffled" if order != sorted(order) else "listed",
                    "wall_s": round(wall, 1), "docs": len(result),
                    "chunks": sum(r["chunks"] for r in result.values()),
                    "drafted": sum(r["drafted"] for r in result.values()),
                    "accepted": sum(r["accepted"] for r in result.values()),
                    "batch_sizes_mean": round(batch_mean(engine.stats.batch_sizes), 2),
                    "loadavg_min_mean_max": [min(loads), round(sum(loads) / len(loads), 2), max(loads)]
                    if loads else None,
                    "dtype": str(engine.dtype)}


def print_results(out: dict, out_path: str) -> None:
    """Print accuracy per configuration and the pairwise comparisons."""
    rows = [[label, a["n"], a["correct"], a["accuracy"], f"[{a['ci95'][0]}, {a['ci95'][1]}]",
             out["runs"][label]["wall_s"]] for label, a in out["accuracy"].items()]
    print_table(["config", "n", "correct", "accuracy", "95% CI", "wall s"], rows)
    print_table(["comparison", "n", "answers changed", "memories changed", "discordant (1st/2nd right)", "McNemar p"],
                [[k, c["n"], f"{c['response_changed']} ({c['response_changed_frac']})",
                  f"{c['memory_changed']} ({c['memory_changed_frac']})",
                  f"{c['discordant']} ({c['right_only_first']}/{c['right_only_second']})", c["mcnemar_exact_p"]]
                 for k, c in out["changed"].items()])
    print(f"peak RSS {out['peak_rss_mib']} MiB; {out['uptime_end']}; wrote {out_path}")


def main() -> None:
    args = parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from memagent.config import preset
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine
    from memagent.models import load_tokenizer

    t_start = time.perf_counter()
    agent = preset(args.preset)
    assert agent.temperature == 0.0, "greedy decoding"
    lengths = [int(x) for x in args.lengths.split(",")]
    docs = documents(load_tokenizer(args.model), args.niah, args.ruler, args.hotpot, lengths, args.seed)
    configs = run_configs(args, len(docs))

    out: dict = {"benchmark": "bf16_speculation", "settings": {**vars(args), "agent": agent.model_dump()},
                 "uptime_start": uptime(), "machine": machine(),
                 "documents": {"n": len(docs), "by_source": {s: sum(d["source"] == s for d in docs)
                                                             for s in dict.fromkeys(d["source"] for d in docs)}},
                 "runs": {}, "complete": False}
    runs: dict[str, dict] = {}
    scores: dict[str, list[float]] = {}
    for label, speculate, bs, order in configs:
        engine = TransformersEngine.from_config(
            EngineConfig(model=args.model, dtype=args.dtype, max_batch_size=bs, speculate=speculate), name=args.model)
        assert str(engine.dtype) == {"bf16": "torch.bfloat16", "fp32": "torch.float32"}.get(args.dtype,
                                                                                          str(engine.dtype))
        runs[label], out["runs"][label] = read_config(engine, args, docs, agent, (label, speculate, bs, order),
                                                      t_start)
        scores[label] = score_run(docs, runs[label])
        del engine
        write_summary(out, docs, configs, runs, scores, args, t_start, partial=label != configs[-1][0])
    print_results(out, args.out)


if __name__ == "__main__":
    main()
