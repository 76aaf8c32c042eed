"""Recomputation per fault: chunks read again after random storage faults and kills, then plain reruns.

    nice python -m benchmarks.faults --out benchmarks/results/faults.json [--sequences 200] [--every 10]

The fault-injection harness of the suite (``tests/faults.py``: the real checkpoint code, a hashing
engine, no model) runs ``--docs`` documents of ``--tokens`` tokens (32-token chunks, a checkpoint
every ``--every`` memory updates) under ``--sequences`` random fault sequences on each of local disk
and S3 (moto's server on loopback). A sequence is 1 to 4 faults (fail, lost response, kill before or
after, delay, reordered listing): a kill at a random checkpoint write of run 1 (a preemption) and 0
to 3 more at random storage calls of the runs that follow (the calls a kill-and-resume makes); plain reruns
follow until every id is done. Each sequence is checked as the tests check it (every id once, the
fault-free chain) and measured: chunks re-read = memory updates asked minus the fault-free run's.

Headline keys: ``reread_per_fault`` (median and worst over the sequences of chunks re-read divided
by faults injected; the bound is ``every``) and ``reread_per_sequence`` (median and worst).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import loadavg, machine, print_table, write_json  # noqa: E402
from tests.faults import FAULTS, run_job  # noqa: E402


def rows(n: int, tokens: int) -> list[dict]:
    from memagent.data.demo import niah_row

    out = []
    for i in range(n):
        r = niah_row(i, tokens, depth=0.5, seed=13)
        out.append({"id": f"doc/{i}", "question": r["question"], "context": r["context"]})
    return out


def sequences(where: str, output_root: str, s3, tokenizer, docs: list[dict], n: int, every: int,
              seed: int) -> list[dict]:
    rng = random.Random(seed)
    counter = iter(range(10**9))

    def out() -> str:
        return f"{output_root}/out{next(counter)}"

    clean = run_job(docs, out(), s3, tokenizer, {}, every_steps=every)
    calls: dict = {}
    run_job(docs, out(), s3, tokenizer, {(1, "open_output_stream", 3): "kill_before"}, every_steps=every,
            calls=calls)
    sites = sorted(calls)
    results = []
    for _ in range(n):
        # A preemption somewhere in run 1's writes, then 0 to 3 faults at calls the runs make.
        plan = {(1, "open_output_stream", rng.randrange(calls[(1, "open_output_stream")])): "kill_before"}
        for _ in range(rng.randint(0, 3)):
            run, name = rng.choice(sites)
            plan[(run, name, rng.randrange(calls[(run, name)]))] = rng.choice(FAULTS)
        outcome = run_job(docs, out(), s3, tokenizer, plan, every_steps=every)
        for d in docs:
            (rec,) = outcome.committed[d["id"]]
            assert rec["error"] is None and rec["steps"][-1]["step"] == len(rec["steps"]) - 1
            assert rec["memory"] == clean.committed[d["id"]][0]["memory"], (where, plan)
        reread = outcome.updates - clean.updates
        results.append(dict(where=where, faults=len(outcome.injected), reread=reread, runs=outcome.runs,
                            injected=[list(i) for i in outcome.injected]))
    return results


def summary(results: list[dict], every: int) -> dict:
    hit = [r for r in results if r["faults"]]
    per_fault = [r["reread"] / r["faults"] for r in hit]
    per_seq = [r["reread"] for r in results]
    return dict(sequences=len(results), with_a_fault=len(hit), bound_per_fault=every,
                reread_per_fault=dict(median=statistics.median(per_fault) if per_fault else 0,
                                      worst=max(per_fault, default=0)),
                reread_per_sequence=dict(median=statistics.median(per_seq), worst=max(per_seq)),
                over_bound=sum(r["reread"] > every * max(1, r["faults"]) for r in results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/faults.json")
    ap.add_argument("--sequences", type=int, default=200, help="random fault sequences per store")
    ap.add_argument("--docs", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=1200)
    ap.add_argument("--every", type=int, default=10, help="checkpoint interval in memory updates")
    ap.add_argument("--stores", default="local,s3")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from memagent.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model("smollm2-135m")))
    docs = rows(args.docs, args.tokens)
    results: list[dict] = []
    stores = args.stores.split(",")
    if "local" in stores:
        with tempfile.TemporaryDirectory() as tmp:
            results += sequences("local", tmp, None, tokenizer, docs, args.sequences, args.every, 1)
    if "s3" in stores:
        import os

        from infra.local_s3 import CREDENTIALS, s3_server
        from pipelines.storage import S3Options

        os.environ.update(CREDENTIALS)
        with s3_server(buckets=("lake",)) as endpoint:
            results += sequences("s3", "s3://lake", S3Options(endpoint_url=endpoint), tokenizer, docs,
                                 args.sequences, args.every, 2)
    per_store = {s: summary([r for r in results if r["where"] == s], args.every) for s in stores}
    total = summary(results, args.every)
    print_table(["store", "sequences", "re-read/fault median", "worst", "re-read/sequence median", "worst",
                 "over bound"],
                [[s, v["sequences"], v["reread_per_fault"]["median"], v["reread_per_fault"]["worst"],
                  v["reread_per_sequence"]["median"], v["reread_per_sequence"]["worst"], v["over_bound"]]
                 for s, v in {**per_store, "all": total}.items()])
    write_json(args.out, dict(**total, per_store=per_store, settings=vars(args), load=loadavg(), machine=machine(),
                              sequences_detail=results))


if __name__ == "__main__":
    main()
