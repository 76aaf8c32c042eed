"""Corpus extraction on generated contracts: one memory chain for five typed fields vs one chain per field.

    python -m benchmarks.extraction --threads 1 --out benchmarks/results/extraction.json
    python -m benchmarks.extraction --docs 3 --baseline-docs 1 --min-tokens 300 --max-tokens 600 --out /tmp/x.json

Generates ``--docs`` contracts of ``--min-tokens``..``--max-tokens`` tokens (log-uniform;
:mod:`memagent.data.contracts`: five typed fields at random depths among near misses, some
amended later in the text) and reads them in one process on the packaged model (the ``small``
preset, ``answer_tokens`` raised to what the schema's JSON needs), the engine batching up to
``--max-in-flight`` chains. With ``--phased``, in phases each timed on its own:

1. ``one_chain_sample``: one chain per document for all five fields (``memagent batch --schema``'s
   read) on a random ``--baseline-docs`` of the documents;
2. ``per_field_sample``: the one-question-per-field baseline on the same documents: one chain
   per field, each with a one-field schema (same budgets, same constrained answer), with as
   many chains in flight as phase 1 had (min(``--max-in-flight``, ``--baseline-docs``)), so the
   two walls compare at the same batching;
3. ``one_chain_rest``: the one-chain read of the other documents;
4. ``unconstrained``: each finished document's final-answer call again, from the same final
   memory, without the schema constraint (the schema-valid rate without constraints; by
   default it follows each document's read at once).

By default (a shared CPU, where a run may be cut) phases 1-3 are one queue instead: each sampled
document's one chain and its five per-field chains, then the other documents, always
``--max-in-flight`` chains at once, so every read shares the same batches; the baseline's cost
is then compared in *chain seconds* (the sum of each read's own latency: the wall of reading
the chains one at a time at that concurrency) besides the tokens, and a cut run still holds
whole documents of both kinds. ``--corpus-cache FILE`` keeps the generated corpus (Parquet).

``--deadline HH:MM`` (UTC) stops starting chains ``--reserve-s`` before it (reads in flight
finish); the JSON is rewritten after every finished read, so it always holds the figures so far,
and says ``partial`` with the reason when fewer documents than asked were read.

Headline keys: ``schema_valid_rate`` (constrained, target 1.0) and ``schema_valid_rate_unconstrained``;
``exact_match`` per field with a 95% Wilson interval; ``evidence_correct_rate`` (of correct
values, the cited span lies inside the planted span); ``tokens_ratio`` (document tokens read by
the per-field baseline ÷ by one chain, same documents; target >= 3) and ``wall_ratio``.
A measurement, never an assertion.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import random
import resource
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.common import add_threads_option, bench_model, loadavg, machine, print_table, set_threads, write_json
from memagent.data.contracts import ANSWER_TOKENS

SAMPLE_SEED = 26
ISSUE_DOCS, ISSUE_BASELINE_DOCS = 100, 30  # the minimum run the targets are stated for; a smaller one is labelled partial


def exact(kind: str, got: Any, gold: Any) -> bool:
    """Exact match; text ignores case and runs of spaces, numbers compare as numbers."""
    if got is None:
        return False
    if kind in ("number", "integer"):
        return isinstance(got, (int, float)) and not isinstance(got, bool) and float(got) == float(gold)
    if kind in ("string", "enum"):
        return " ".join(str(got).split()).casefold() == " ".join(str(gold).split()).casefold()
    return got == gold


def wilson(k: int, n: int) -> dict[str, Any]:
    from memagent.evaluate import wilson_interval

    if not n:
        return {"rate": None, "ci_low": None, "ci_high": None, "n": 0}
    lo, hi = wilson_interval(k / n, n)
    return {"rate": round(k / n, 4), "ci_low": round(lo, 4), "ci_high": round(hi, 4), "k": k, "n": n}


class LoadSampler(threading.Thread):
    """1-minute load average every ``every`` seconds, in the background."""

    def __init__(self, every: float = 30.0) -> None:
        super().__init__(daemon=True)
        self.every, self.samples = every, [loadavg()[0]]

    def run(self) -> None:
        while True:
            time.sleep(self.every)
            self.samples.append(loadavg()[0])

    def summary(self) -> dict[str, float]:
        s = self.samples
        return {"min": min(s), "mean": round(sum(s) / len(s), 2), "max": max(s), "samples": len(s)}


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # Linux: KiB


def score_doc(rec: dict[str, Any], row: dict[str, Any], fields: list[Any]) -> None:
    """Per field of one read: correct, and for a correct value whether its evidence lies in the planted span."""
    gold = json.loads(row["gold"])
    spans = {s["field"]: (s["char_start"], s["char_end"]) for s in row["gold_spans"]}
    values = rec.get("values") or {}
    evidence = {e["field"]: e for e in rec.get("evidence") or []}
    rec["correct"], rec["evidence_inside"] = {}, {}
    asked = rec.get("asked") or [f.name for f in fields]
    for f in fields:
        if f.name not in asked:
            continue
        ok = bool(rec.get("valid")) and exact(f.kind, values.get(f.name), gold[f.name])
        rec["correct"][f.name] = ok
        if ok:
            e, (g0, g1) = evidence.get(f.name) or {}, spans[f.name]
            rec["evidence_inside"][f.name] = e.get("char_start") is not None and g0 <= e["char_start"] and e["char_end"] <= g1


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=100)
    parser.add_argument("--baseline-docs", type=int, default=30, help="random documents also read one chain per field")
    parser.add_argument("--min-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0, help="corpus seed")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--answer-tokens", type=int, default=ANSWER_TOKENS,
                        help=f"final answer budget (default {ANSWER_TOKENS}: the schema's JSON needs ~79)")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--max-in-flight", type=int, default=16, help="chains read at once (= the engine's batch)")
    parser.add_argument("--deadline", default=None, help="HH:MM UTC: start no read after deadline - reserve")
    parser.add_argument("--reserve-s", type=float, default=900, help="seconds kept before the deadline (default 900)")
    parser.add_argument("--phased", action="store_true", help="time the baseline and its one-chain reads as "
                        "separate phases (walls) instead of one interleaved queue")
    parser.add_argument("--shortest-first", action="store_true", help="queue the documents shortest first (a run "
                        "cut by --deadline then holds more whole documents; its figures cover the shortest)")
    parser.add_argument("--corpus-cache", default=None, help="Parquet file to keep/reuse the generated corpus")
    parser.add_argument("--out", default="runs/bench/extraction.json")
    add_threads_option(parser)
    return parser.parse_args()


def stop_time(deadline: str | None, reserve_s: float) -> float | None:
    """Epoch seconds after which no read starts: ``reserve_s`` before the next ``HH:MM`` UTC (None: no deadline)."""
    if not deadline:
        return None
    now = dt.datetime.now(dt.timezone.utc)
    h, m = (int(x) for x in deadline.split(":"))
    return time.time() + ((now.replace(hour=h, minute=m, second=0, microsecond=0) - now).total_seconds()
                          % 86400) - reserve_s


def agent_configs(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]]:
    """The contract schema, the one-chain agent config, and per field the config of its one-field schema."""
    from memagent.config import AgentConfig
    from memagent.data.contracts import CONTRACT_SCHEMA
    from memagent.extraction import schema_from

    schema = schema_from(CONTRACT_SCHEMA)
    config = AgentConfig(preset=args.preset, answer_tokens=args.answer_tokens, extraction=schema)
    one_field = {f.name: AgentConfig(preset=args.preset, answer_tokens=args.answer_tokens, extraction=schema_from(
        {"type": "object", "properties": {f.name: CONTRACT_SCHEMA["properties"][f.name]}, "required": [f.name]}))
        for f in schema.fields}
    return schema, config, one_field


def contract_rows(args: argparse.Namespace, engine: Any) -> tuple[list[dict[str, Any]], float]:
    """The generated contracts (from ``--corpus-cache`` when it holds the same corpus) and the seconds they took."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memagent.data.contracts import ContractCorpus, contract_corpus
    from memagent.data.hotpotqa import count_tokens

    t0 = time.perf_counter()
    cache = Path(args.corpus_cache) if args.corpus_cache else None
    key = {"docs": args.docs, "min": args.min_tokens, "max": args.max_tokens, "seed": args.seed, "model": args.model}
    if cache and cache.exists() and json.loads(pq.read_metadata(cache).metadata[b"corpus"]) == key:
        rows = pq.read_table(cache).to_pylist()
    else:
        corpus = ContractCorpus(docs=args.docs, min_tokens=args.min_tokens, max_tokens=args.max_tokens, seed=args.seed)
        rows = contract_corpus(corpus, count=lambda text: count_tokens(engine.tokenizer, text))
        if cache:
            cache.parent.mkdir(parents=True, exist_ok=True)
            table = pa.Table.from_pylist(rows)
            pq.write_table(table.replace_schema_metadata({"corpus": json.dumps(key)}), cache)
    return rows, time.perf_counter() - t0


def baseline_split(rows: list[dict[str, Any]], args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The ids of the seeded baseline sample and of the other documents (each shortest first with --shortest-first)."""
    by_id = {r["id"]: r for r in rows}
    sample = sorted(random.Random(SAMPLE_SEED).sample(list(by_id), min(args.baseline_docs, len(rows))))
    rest = [i for i in by_id if i not in set(sample)]
    if args.shortest_first:
        sample, rest = (sorted(ids, key=lambda i: by_id[i]["target_tokens"]) for ids in (sample, rest))
    return sample, rest


@dataclass
class ExtractionRun:
    """One run's reads: its engine, corpus and agent configs, the records so far, and the phases queueing them."""

    args: argparse.Namespace
    engine: Any
    schema: Any
    config: Any
    one_field: dict[str, Any]
    rows: list[dict[str, Any]]
    sample: list[str]
    threads: int
    load: LoadSampler
    t_start: float
    corpus_s: float
    stop_at: float | None
    records: dict[str, list[dict[str, Any]]] = field(
        default_factory=lambda: {"one_chain": [], "per_field": [], "unconstrained": []})
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.fields = list(self.schema.fields)
        self.by_id = {r["id"]: r for r in self.rows}

    async def read(self, doc_id: str, cfg: Any, asked: list[str]) -> dict[str, Any]:
        """One chain over one document with ``cfg``'s schema, scored on the fields it ``asked``."""
        from memagent.agent import read_document
        from memagent.extraction import InvalidOutput, extraction_columns

        row, sch = self.by_id[doc_id], cfg.extraction
        rec: dict[str, Any] = {"id": doc_id, "asked": asked, "target_tokens": row["target_tokens"],
                               "amended": row["amended"]}
        t = time.perf_counter()
        try:
            result = await read_document(self.engine, None, row["context"], cfg)
        except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
            rec.update(valid=False, error=f"{type(exc).__name__}: {exc}"[:300])
            score_doc(rec, row, self.fields)  # an error row extracts nothing: wrong on every field
            return rec
        rec.update(seconds=round(time.perf_counter() - t, 2), context_tokens=result.context_tokens,
                   n_chunks=result.n_chunks, prompt_tokens=sum(s.prompt_tokens for s in result.steps),
                   completion_tokens=sum(s.completion_tokens for s in result.steps), response=result.response,
                   memory=result.memory)
        try:
            cols = extraction_columns(sch, result.response, result.steps, row["context"])
            rec.update(valid=True, values=json.loads(cols["extraction"]), evidence=cols["field_evidence"])
        except InvalidOutput as exc:
            rec.update(valid=False, invalid=str(exc))
        score_doc(rec, row, self.fields)
        return rec

    async def unconstrained(self, rec: dict[str, Any]) -> dict[str, Any]:
        """The final-answer call of a finished one-chain read again, from its final memory, without the schema."""
        from memagent.engines import SamplingParams
        from memagent.extraction import InvalidOutput, parse_reply
        from memagent.prompts import final_answer_messages

        schema, config = self.schema, self.config
        messages = final_answer_messages(schema.question(), rec["memory"], "json", config.instruction, config.prompts,
                                         schema.answer_instruction())
        reply = await self.engine.chat(messages, SamplingParams(config.answer_tokens, config.temperature,
                                                                config.top_p, priority=-1))
        out = {"id": rec["id"], "asked": rec["asked"], "response": reply.text,
               "completion_tokens": reply.completion_tokens}
        try:
            out.update(valid=True, values=parse_reply(schema, reply.text))
        except InvalidOutput as exc:
            out.update(valid=False, invalid=str(exc))
        score_doc(out, self.by_id[rec["id"]], self.fields)
        return out

    async def run_phase(self, name: str, bucket: str, jobs: list, deadline: bool = True, in_flight: int = 0) -> None:
        """Run ``jobs`` at most ``in_flight`` at once (default --max-in-flight), saving the JSON after each."""
        sem = asyncio.Semaphore(in_flight or self.args.max_in_flight)
        records, fields = self.records, self.fields
        t = time.perf_counter()

        async def one(job):
            async with sem:
                if deadline and self.stop_at is not None and time.time() > self.stop_at:
                    self.skipped[name] = self.skipped.get(name, 0) + 1
                    return
                rec = await job()
                rec["phase"] = name
                if bucket == "mixed" and len(rec["asked"]) == len(fields) and rec.get("memory") is not None:
                    u = await self.unconstrained(rec)  # right away: a cut run keeps both answers of every document
                    u["phase"] = name
                    records["unconstrained"].append(u)
                to = bucket if bucket != "mixed" else "one_chain" if len(rec["asked"]) == len(fields) else "per_field"
                records[to].append(rec)
                self.phases[name] = {"jobs": len(jobs), "done": sum(1 for k, v in records.items() for r in v
                                                                    if r["phase"] == name
                                                                    and (k != "unconstrained" or bucket == k)),
                                     "wall_s": round(time.perf_counter() - t, 2), "loadavg_end": loadavg()}
                self.save()

        await asyncio.gather(*(one(j) for j in jobs))
        print(f"{name}: {self.phases.get(name)}", flush=True)

    def jobs_one_chain(self, ids: list[str]) -> list:
        """One job per document: its one-chain read of all the fields."""
        return [lambda i=i: self.read(i, self.config, [f.name for f in self.fields]) for i in ids]

    def jobs_per_field(self, doc_id: str) -> list:
        """One job per field of a document: its read with that field's one-field schema."""
        return [lambda i=doc_id, f=f: self.read(i, self.one_field[f.name], [f.name]) for f in self.fields]

    def save(self) -> dict[str, Any]:
        """Summarize the reads so far and rewrite --out with them."""
        result = summarize(self.args, self.rows, self.sample, self.records, self.phases, self.skipped, self.fields,
                           self.config, self.threads, self.load, self.t_start, self.corpus_s)
        write_json(self.args.out, result)
        return result

    def run_all(self, rest: list[str]) -> None:
        """The phases in order (--phased), else one interleaved queue; then the unconstrained answers (--phased)."""
        args, sample = self.args, self.sample
        if args.phased:
            pair = min(args.max_in_flight, len(sample))  # both ways of the sample at the same concurrency
            asyncio.run(self.run_phase("one_chain_sample", "one_chain", self.jobs_one_chain(sample), in_flight=pair))
            asyncio.run(self.run_phase("per_field_sample", "per_field",
                                       [j for i in sample for j in self.jobs_per_field(i)], in_flight=pair))
            asyncio.run(self.run_phase("one_chain_rest", "one_chain", self.jobs_one_chain(rest)))
        else:  # one queue: the jobs' bucket is known from how many fields each asks
            jobs = [j for i in sample for j in [*self.jobs_one_chain([i]), *self.jobs_per_field(i)]] + \
                self.jobs_one_chain(rest)
            asyncio.run(self.run_phase("interleaved", "mixed", jobs))
        if args.phased:
            done = [r for r in self.records["one_chain"] if r.get("memory") is not None]
            asyncio.run(self.run_phase("unconstrained", "unconstrained",
                                       [lambda r=r: self.unconstrained(r) for r in done], deadline=False))


def main() -> None:
    args = parse_args()

    from memagent.agent import check_config
    from memagent.engines import EngineConfig, SamplingParams, make_engine

    t_start = time.perf_counter()
    load = LoadSampler()
    load.start()
    threads = set_threads(args.threads)
    stop_at = stop_time(args.deadline, args.reserve_s)
    engine = make_engine(EngineConfig(model=bench_model(args.model), max_batch_size=args.max_in_flight))
    schema, config, one_field = agent_configs(args)
    for c in [config, *one_field.values()]:
        check_config(engine, c)
    rows, corpus_s = contract_rows(args, engine)
    sample, rest = baseline_split(rows, args)
    asyncio.run(engine.chat([{"role": "user", "content": "Hello"}], SamplingParams(2)))  # warm-up
    print(f"{len(rows)} contracts ({sum(r['target_tokens'] for r in rows):,} target tokens) in {corpus_s:.1f}s; "
          f"baseline sample {len(sample)}; threads {threads}; load {loadavg()}", flush=True)
    run = ExtractionRun(args, engine, schema, config, one_field, rows, sample, threads, load, t_start, corpus_s,
                        stop_at)
    run.run_all(rest)
    result = run.save()
    report(result, args.out)


def _field_rates(recs: list[dict[str, Any]], fields: list[Any]) -> dict[str, Any]:
    out = {}
    for f in fields:
        got = [r["correct"][f.name] for r in recs if f.name in r.get("correct", {})]
        out[f.name] = wilson(sum(got), len(got))
    return out


def baseline_figures(one: list[dict[str, Any]], base: list[dict[str, Any]], base_done: set[str],
                     phases: dict[str, dict[str, Any]], fields: list[Any]) -> dict[str, Any]:
    """One chain vs one chain per field on the same documents: tokens, walls, chain seconds, exact match."""
    same = base_done & {r["id"] for r in one if "error" not in r}
    one_same = [r for r in one if r["id"] in same]
    base_same = [r for r in base if r["id"] in same]
    both = (("one_chain", one_same), ("per_field", base_same))
    tok = {k: sum(r.get("context_tokens", 0) for r in v) for k, v in both}
    prompt = {k: sum(r.get("prompt_tokens", 0) for r in v) for k, v in both}
    chain_s = {k: round(sum(r.get("seconds", 0) for r in v), 1) for k, v in both}
    p1, p2 = phases.get("one_chain_sample", {}), phases.get("per_field_sample", {})
    full_phases = bool(p1 and p2) and p1["done"] == p1["jobs"] and p2["done"] == p2["jobs"]
    per_field_acc = {
        f.name: {"one_chain": wilson(sum(r["correct"].get(f.name, False) for r in one_same), len(one_same)),
                 "per_field": wilson(sum(r["correct"].get(f.name, False) for r in base_same if f.name in r["correct"]),
                                     sum(1 for r in base_same if f.name in r["correct"]))}
        for f in fields}
    return {
        "documents": len(same), "same_documents": sorted(same),
        "doc_tokens_read": tok, "prompt_tokens": prompt,
        "tokens_ratio": round(tok["per_field"] / tok["one_chain"], 3) if tok["one_chain"] else None,
        "prompt_tokens_ratio": round(prompt["per_field"] / prompt["one_chain"], 3) if prompt["one_chain"] else None,
        "wall_s": {"one_chain": p1.get("wall_s"), "per_field": p2.get("wall_s")},
        "wall_ratio": round(p2["wall_s"] / p1["wall_s"], 3) if full_phases and p1.get("wall_s") else None,
        "wall_note": None if full_phases else "no separate phases (interleaved run) or a phase was cut",
        "chain_seconds": chain_s,
        "chain_seconds_ratio": round(chain_s["per_field"] / chain_s["one_chain"], 3) if chain_s["one_chain"] else None,
        "exact_match_per_field": per_field_acc,
    }


def partial_reasons(rows: list[dict[str, Any]], sample: list[str], one: list[dict[str, Any]],
                    base_done: set[str]) -> list[str]:
    """Why a run's figures are partial: sized below the issue's run, or documents not read (none: complete)."""
    reasons = []
    if len(rows) < ISSUE_DOCS or len(sample) < ISSUE_BASELINE_DOCS:
        reasons.append(f"sized below the issue's {ISSUE_DOCS} documents / {ISSUE_BASELINE_DOCS} baseline documents "
                       f"(--docs {len(rows)} --baseline-docs {len(sample)})")
    if len(one) < len(rows):
        reasons.append(f"{len(one)} of {len(rows)} documents read in one chain")
    if len(base_done) < len(sample):
        reasons.append(f"{len(base_done)} of {len(sample)} baseline documents read one chain per field")
    return reasons


def run_settings(args: argparse.Namespace, rows: list[dict[str, Any]], sample: list[str], config: Any, threads: int,
                 corpus_s: float) -> dict[str, Any]:
    """The run's settings as the JSON records them."""
    return {"docs": len(rows), "baseline_docs": len(sample), "sample_in_flight": min(args.max_in_flight, len(sample)),
            "phased": args.phased, "shortest_first": args.shortest_first, "min_tokens": args.min_tokens,
            "max_tokens": args.max_tokens, "seed": args.seed, "model": args.model, "preset": args.preset,
            "agent": {k: v for k, v in config.model_dump(mode="json").items() if k != "prompts"},
            "max_in_flight": args.max_in_flight, "threads": threads, "corpus_seconds": round(corpus_s, 1),
            "doc_tokens_total": sum(r["target_tokens"] for r in rows),
            "amended_docs": sum(1 for r in rows if r["amended"])}


def summarize(args, rows, sample, records, phases, skipped, fields, config, threads, load, t_start,
              corpus_s) -> dict[str, Any]:
    one = records["one_chain"]
    base = records["per_field"]
    unc = records["unconstrained"]
    valid = sum(1 for r in one if r.get("valid"))
    answered = [r for r in one if "error" not in r]
    all_correct = [(f, r) for r in one for f, ok in r.get("correct", {}).items() if ok]
    inside = sum(1 for f, r in all_correct if r["evidence_inside"].get(f))
    # Same documents both ways: the sample's documents read completely by the per-field baseline.
    base_done = {i for i in sample if sum(1 for r in base if r["id"] == i and "error" not in r) == len(fields)}
    amended = [r for r in one if r.get("amended")]
    reasons = partial_reasons(rows, sample, one, base_done)
    return {
        "benchmark": "extraction",
        "partial": bool(reasons), "partial_reason": "; ".join(reasons) or None,
        "schema_valid_rate": wilson(valid, len(answered)),
        "schema_valid_rate_unconstrained": wilson(sum(1 for r in unc if r.get("valid")), len(unc)),
        "exact_match": _field_rates(one, fields),
        "exact_match_unconstrained": _field_rates(unc, fields),
        "exact_match_amended_fields": wilson(
            sum(r["correct"].get(f, False) for r in amended for f in r["amended"]),
            sum(len(r["amended"]) for r in amended)),
        "evidence_correct_rate": wilson(inside, len(all_correct)),
        "baseline": baseline_figures(one, base, base_done, phases, fields),
        "errors": [{"id": r["id"], "phase": r["phase"], "error": r["error"]} for r in [*one, *base] if "error" in r],
        "invalid": [{"id": r["id"], "phase": r["phase"], "why": r["invalid"], "response": r.get("response", "")[:300]}
                    for r in [*one, *base, *unc] if "invalid" in r][:40],
        "phases": phases, "skipped_by_deadline": skipped,
        "settings": run_settings(args, rows, sample, config, threads, corpus_s),
        "seconds_total": round(time.perf_counter() - t_start, 1),
        "peak_rss_mb": peak_rss_mb(), "loadavg_during": load.summary(),
        "docs": [{k: v for k, v in r.items() if k not in ("memory", "evidence")} for r in [*one, *base]],
        "machine": machine(),
    }


def report(result: dict[str, Any], out: str) -> None:
    b = result["baseline"]
    rows = [[name, f"{100 * (v['rate'] or 0):.0f}% [{100 * (v['ci_low'] or 0):.0f}, {100 * (v['ci_high'] or 0):.0f}] "
             f"n={v['n']}", f"{100 * (b['exact_match_per_field'][name]['one_chain']['rate'] or 0):.0f}%",
             f"{100 * (b['exact_match_per_field'][name]['per_field']['rate'] or 0):.0f}%"]
            for name, v in result["exact_match"].items()]
    print_table(["field", "exact match, one chain (95% Wilson)", f"one chain on the {b['documents']}",
                 "per-field chains, same docs"], rows)
    sv, su, ev = result["schema_valid_rate"], result["schema_valid_rate_unconstrained"], result["evidence_correct_rate"]
    print_table(["figure", "value"], [
        ["schema-valid, constrained", f"{sv['rate']} (n={sv['n']})"],
        ["schema-valid, unconstrained (same memories)", f"{su['rate']} (n={su['n']})"],
        ["evidence inside the planted span (correct values)", f"{ev['rate']} (n={ev['n']})"],
        ["doc tokens read, per-field ÷ one chain", b["tokens_ratio"]],
        ["wall, per-field ÷ one chain (phased runs)", b["wall_ratio"]],
        ["chain seconds, per-field ÷ one chain", b["chain_seconds_ratio"]],
        ["peak RSS MB / load mean", f"{result['peak_rss_mb']} / {result['loadavg_during']['mean']}"],
        ["partial", result["partial_reason"] or "no"]])
    print(f"wrote {Path(out)}")


if __name__ == "__main__":
    main()
