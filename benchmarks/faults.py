"""Recomputation per fault: chunks read again after random faults at every store the batch job writes
(chain checkpoints, records files, output files, the lease), then plain reruns.

    nice python -m benchmarks.faults --out benchmarks/results/faults.json [--sequences 200] [--every 10]

The suite's harness (``memagent_testing/faults.py``: the product's driver, ``pipelines.driver.run_phases``, with an
in-process row phase in place of Ray Data's that calls the actor's and writer's product functions, every
store call through ``memagent_testing/fault_fs.py``; a perfect ledger reader, no model) reads
three generated ledgers (``--scale`` 4: about 28, 56 and 32 chunks of 64 tokens, a checkpoint every
``--every`` memory updates) under ``--sequences`` random fault sequences on each of local disk and S3
(moto's server on loopback). A sequence is the machine lost at a random checkpoint write of run 1 (a
preemption) and 0 to 3 more faults (fail, lost response, kill before or after, delay, reordered listing)
at random calls of any store in the runs that follow; plain reruns follow until every id is done. Each
sequence is checked as the tests check it (every id once, the fault-free chain, the records once, no
leftovers) and measured: chunks re-read = memory updates asked minus the fault-free job's.

Headline keys: ``reread_per_fault`` (median and worst over the sequences of chunks re-read divided by
faults injected; the bound is ``every``), ``reread_per_sequence`` and, per store the faults after the preemption hit,
``per_site``.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import loadavg, machine, print_table, write_json  # noqa: E402
from memagent_testing.fault_fs import FAULTS, SITES, applies  # noqa: E402
from memagent_testing.faults import documents, run_job, steps_without_times, write_input  # noqa: E402


def sequences(where: str, output_root: str, s3, tokenizer, docs, input_dir: str, n: int, every: int,
              seed: int) -> list[dict]:
    rng = random.Random(seed)
    counter = iter(range(10**9))

    def out() -> str:
        return f"{output_root}/out{next(counter)}"

    clean = run_job(docs, input_dir, out(), s3, tokenizer, {}, every_steps=every)
    writes = clean.calls[(1, "checkpoint", "open_output_stream")]
    probe = run_job(docs, input_dir, out(), s3, tokenizer, {(1, "checkpoint", "open_output_stream", writes // 2): "preempt"},
                    every_steps=every)
    keys = sorted(set(clean.calls) | set(probe.calls))
    calls = {k: max(clean.calls.get(k, 0), probe.calls.get(k, 0)) for k in keys}
    results = []
    for _ in range(n):
        plan = {(1, "checkpoint", "open_output_stream", rng.randrange(writes)): "preempt"}
        for _ in range(rng.randint(0, 3)):
            run, site, call = rng.choice(keys)
            fault = rng.choice([f for f in FAULTS if applies(f, call)])
            plan[(run, site, call, rng.randrange(calls[(run, site, call)]))] = fault
        outcome = run_job(docs, input_dir, out(), s3, tokenizer, plan, every_steps=every)
        for d in docs:
            (row,) = outcome.rows[d.id]
            (want,) = clean.rows[d.id]
            assert row["error"] is None and steps_without_times(row) == steps_without_times(want), (where, plan)
        assert outcome.records == clean.records, (where, plan)
        reread = outcome.updates - clean.updates
        results.append(dict(where=where, faults=len(outcome.injected), reread=reread, runs=outcome.runs,
                            sites=sorted({i[1] for i in outcome.injected if i[4] != "preempt"}), injected=[list(i) for i in outcome.injected]))
    return results, {d.id: clean.rows[d.id][0]["n_chunks"] for d in docs}


def summary(results: list[dict], every: int) -> dict:
    hit = [r for r in results if r["faults"]]
    per_fault = [r["reread"] / r["faults"] for r in hit]
    per_seq = [r["reread"] for r in results]
    return dict(sequences=len(results), with_a_fault=len(hit), faults=sum(r["faults"] for r in results),
                bound_per_fault=every,
                reread_per_fault=dict(median=statistics.median(per_fault) if per_fault else 0,
                                      worst=max(per_fault, default=0)),
                reread_per_sequence=dict(median=statistics.median(per_seq) if per_seq else 0,
                                         worst=max(per_seq, default=0)),
                over_bound=sum(r["reread"] > every * max(1, r["faults"]) for r in results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/faults.json")
    ap.add_argument("--sequences", type=int, default=200, help="random fault sequences per store")
    ap.add_argument("--scale", type=int, default=4, help="document length, in multiples of the test documents")
    ap.add_argument("--every", type=int, default=10, help="checkpoint interval in memory updates")
    ap.add_argument("--stores", default="local,s3")
    args = ap.parse_args()
    logging.getLogger("pipelines").setLevel(logging.ERROR)  # every injected fault logs its warning
    from transformers import AutoTokenizer

    from memagent.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model("smollm2-135m")))
    docs = documents(args.scale)
    results: list[dict] = []
    stores = args.stores.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        input_dir = write_input(Path(tmp) / "in", docs)
        if "local" in stores:
            found, chunks = sequences("local", f"{tmp}/out", None, tokenizer, docs, input_dir, args.sequences, args.every, 1)
            results += found
        if "s3" in stores:
            import os

            from infra.local_s3 import CREDENTIALS, s3_server
            from pipelines.storage import S3Options

            os.environ.update(CREDENTIALS)
            with s3_server(buckets=("lake",)) as endpoint:
                found, chunks = sequences("s3", "s3://lake", S3Options(endpoint_url=endpoint), tokenizer, docs,
                                          input_dir, args.sequences, args.every, 2)
                results += found
    per_store = {s: summary([r for r in results if r["where"] == s], args.every) for s in stores}
    per_site = {s: summary([r for r in results if s in r["sites"]], args.every) for s in SITES}
    total = summary(results, args.every)
    rows = [[s, v["sequences"], v["faults"], v["reread_per_fault"]["median"], v["reread_per_fault"]["worst"],
             v["reread_per_sequence"]["median"], v["reread_per_sequence"]["worst"], v["over_bound"]]
            for s, v in {**per_store, **{f"faults at {k}": v for k, v in per_site.items()}, "all": total}.items()]
    print_table(["sequences", "n", "faults", "re-read/fault median", "worst", "re-read/sequence median", "worst",
                 "over bound"], rows)
    write_json(args.out, dict(**total, per_store=per_store, per_site=per_site, settings=vars(args), load=loadavg(),
                              machine=machine(), chunks=chunks, sequences_detail=results))


if __name__ == "__main__":
    main()
