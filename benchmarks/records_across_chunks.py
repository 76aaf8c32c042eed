"""Records joined across chunks (issue 51, item 8): an invoice's issue and its settlement stated 1, 4, 16 and
64 chunks apart, read by the perfect memory-keeping reader.

    nice python -m benchmarks.records_across_chunks --out benchmarks/results/records_across_chunks.json

Documents: :func:`memagent_testing.oracle.invoices.invoices` (seeded; the default seeded spellings: ``1,037.50``,
``EUR 1.037,50``, ``$1 037.50``, ``2021-03-14``, ``14 March 2021``, ``March 14, 2021``, ``14.03.2021``).
Each has 4 settled invoices and one never settled (open), their two sentences the distance's filler
lines apart (calibrated on the first document so that the median measured chunk distance is the
target; measured on every document, below), the settlement first for every other invoice,
3 filler lines between invoices, and every other document ends with a summary table restating every
settled invoice. Read in process (:class:`memagent_testing.oracle.servers.OracleEngine`, which cuts a reply at
``max_tokens`` as a server does) by :class:`memagent_testing.oracle.invoices.MemoryOracle`: a perfect model that
keeps each half-seen invoice in its memory (canonically, or in every other document as the text spells
it); in half the documents it also writes a half record as soon as it sees one half (``partial``: the
halves merge by key, and the open invoices' halves are dropped incomplete at the end), else it writes a
record only once both halves are known. Chunks of 64 tokens, memory 256,
``require_grounding`` on. Importing the reader from ``tests/`` follows ``benchmarks/records_oracle.py``.

Per distance: documents (as many as ``--seconds`` of this process's CPU time allow, split evenly over the
distances, at most ``--max-docs``), the measured chunk distance between each invoice's two sentences
(min / median / max: the chunk holding each sentence's end), gold records, recall and precision (a record is
right when all five values equal the gold), ``incomplete`` (records dropped at the end lacking a value:
the open invoices of the ``partial`` documents), conflicts, values dropped by grounding, the grounding
labels of the returned values (how many came through the memory), document tokens read per gold record,
and every failing document (seed, what was lost, invented or wrong). ``example``: one record of the
16-chunk distance with each value's chunk, grounding label and the text it is grounded in. Peak RSS of
this process. A measurement, never an assertion.

``--model-docs N``: the embedded model (SmolLM2-135M-Instruct, dtype auto) reads the first N documents
of each distance in ``--model-distances`` (the same documents and settings; concurrently, so the
engine batches them), ``--model-seconds`` of wall per distance at most (a read still going then is
counted unfinished). Its rows say what a 135M model keeps of a half record, not what the method can.
``--model-only`` keeps the perfect reader's rows already in ``--out`` (and their calibrated gaps) and runs
the model arm alone; a run of the perfect arm alone keeps the model arm's rows already there. Each arm's
command, loads, wall and peak RSS are its own (``perfect_run``, ``model_run``).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import resource
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.common import loadavg, machine, print_table, table, write_json
from memagent.agent import read_document
from memagent.config import AgentConfig
from memagent.extraction import schema_from

DISTANCES = (1, 4, 16, 64)
CHUNK_TOKENS, MEMORY_TOKENS = 64, 256
INVOICES, OPEN, STAGGER = 4, 1, 3


def config(schema: Any) -> AgentConfig:
    return AgentConfig(chunk_tokens=CHUNK_TOKENS, memory_tokens=MEMORY_TOKENS, answer_tokens=16, query_tokens=400,
                       extraction=schema, require_grounding=True)


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def lines_per_chunk(tokenizer: Any) -> float:
    from memagent_testing.oracle.invoices import FILLER

    per_line = statistics.mean(len(tokenizer(f + "\n", add_special_tokens=False)["input_ids"]) for f in FILLER)
    return CHUNK_TOKENS / per_line


def calibrate(distance: int, tokenizer: Any, schema: Any, per_line: float) -> tuple[int, float]:
    """The filler lines between an invoice's sentences whose measured median chunk distance is ``distance``
    (bisection over reads of the first document)."""
    tried: dict[int, float] = {}
    lo, hi = 0, round(distance * per_line) + 10  # the distance grows with the gap: bisect for the target
    while lo <= hi:
        gap = (lo + hi) // 2
        tried[gap] = statistics.median(read_one(distance, 0, gap, tokenizer, schema)["chunk_distances"])
        if tried[gap] == distance:
            break
        lo, hi = (gap + 1, hi) if tried[gap] < distance else (lo, gap - 1)
    best = min(tried, key=lambda g: (abs(tried[g] - distance), g))
    return best, tried[best]


def document(distance: int, k: int, gap: int) -> tuple[Any, Any]:
    """The ``k``-th document of a distance (seeded) and its perfect memory-keeping reader."""
    from memagent_testing.oracle.invoices import InvoiceSpec, MemoryOracle, invoices

    spec = InvoiceSpec(gaps=(gap,) * INVOICES, settled_first=(k % 2 == 0, k % 2 == 1), stagger=STAGGER, open=OPEN,
                       table=k % 2 == 0)
    doc = invoices(f"d{distance}-{k}", spec, 1000 * distance + k)
    return doc, MemoryOracle([doc], copy=k % 2 == 1, partial=k % 4 >= 2)


def read_one(distance: int, k: int, gap: int, tokenizer: Any, schema: Any) -> dict[str, Any]:
    from memagent_testing.oracle.servers import OracleEngine

    doc, oracle = document(distance, k, gap)
    result = asyncio.run(read_document(OracleEngine(oracle.reply, tokenizer), None, doc.text, config(schema)))
    return score(distance, k, doc, result, oracle)


def score(distance: int, k: int, doc: Any, result: Any, oracle: Any | None) -> dict[str, Any]:
    """One document's row: gold against the records ``result`` holds (``oracle``: the reader, when it is one)."""
    from memagent_testing.oracle.invoices import allowed_spans, gold

    seed = 1000 * distance + k
    ends = [s.char_end for s in result.steps if s.kind == "memory"]

    def chunk_of(char: int) -> int:
        return bisect.bisect_right(ends, char)  # chunk i spans [ends[i-1], ends[i])

    expected, got = gold(doc), result.records["invoices"]
    by_number = {i.invoice: i for i in doc.invoices}
    right = [r for r in got if expected.get(r.values.get("invoice")) == r.values]
    numbers = [r.values.get("invoice") for r in got]
    distances = [abs(chunk_of(i.spans["issue"][0][1] - 1) - chunk_of(i.spans["settle"][0][1] - 1))
                 for i in doc.invoices if i.settled is not None]
    labels: Counter[str] = Counter()
    outside = 0
    for r in got:
        for path, ev in r.evidence.items():
            labels[str(ev.grounding)] += 1
            inv = by_number.get(r.values.get("invoice"))
            if inv is None or ev.char_start is None or not any(a <= ev.char_start and ev.char_end <= b
                                                               for a, b in allowed_spans(inv, path)):
                outside += 1
    tally = result.records_tally
    row = {"seed": seed, "table": k % 2 == 0, "memory_as_spelled": oracle and oracle.copy,
           "partial": oracle and oracle.partial,
           "chars": len(doc.text),
           "chunks": result.n_chunks, "tokens": result.context_tokens, "gold": len(expected), "returned": len(got),
           "right": len(right), "chunk_distances": distances, "incomplete": tally.incomplete,
           "conflicts": sum(len(r.conflicts) for r in got), "dropped_values": tally.dropped_values,
           "failed": tally.failed, "labels": dict(labels), "grounded_outside_own_sentence": outside}
    if len(right) != len(expected) or len(got) != len(expected) or outside or row["conflicts"]:
        row["failure"] = {"lost": sorted(set(expected) - set(numbers)),
                          "invented": sorted(str(n) for n in set(numbers) - set(expected)),
                          "doubled": sorted(str(n) for n, c in Counter(numbers).items() if c > 1),
                          "wrong": [{"got": r.values, "gold": expected.get(r.values.get("invoice"))}
                                    for r in got if r not in right],
                          "incomplete_notes": result.records_incomplete}
    if distance == 16 and k < 4:
        row["example"] = example(doc.text, got, chunk_of)
    return row


def example(text: str, got: list[Any], chunk_of: Any) -> dict[str, Any] | None:
    """A record with a value grounded through the memory (one read in the chunk it was stated in preferred): each
    value, its chunk, label and span."""
    def clean(r: Any) -> bool:
        return all(ev.grounding == "memory" or chunk_of(ev.char_start) == ev.step for ev in r.evidence.values())
    for r in sorted(got, key=lambda r: not clean(r)):
        if any(ev.grounding == "memory" for ev in r.evidence.values()):
            return {"record": r.values, "mentions": r.mentions, "values": {
                path: {"value": r.values[path], "chunk": chunk_of(ev.char_start), "read_at_chunk": ev.step,
                       "grounding": ev.grounding, "text": text[ev.char_start:ev.char_end]}
                for path, ev in r.evidence.items()}}
    return None


def model_arm(gaps: dict[int, int], schema: Any, docs: int, seconds: float) -> dict[str, Any]:
    """The embedded model (SmolLM2-135M-Instruct, dtype auto) reads the first ``docs`` documents of each distance,
    concurrently (the engine batches them); a read past ``seconds`` of wall is counted as unfinished."""
    from memagent.engines import EngineConfig, make_engine

    engine = make_engine(EngineConfig(model="smollm2-135m", max_batch_size=max(docs, 1)))
    out: dict[str, Any] = {}

    async def distance_rows(distance: int, gap: int) -> dict[str, Any]:
        pairs = [document(distance, k, gap) for k in range(docs)]
        w0 = time.perf_counter()
        tasks = [asyncio.create_task(read_document(engine, None, d.text, config(schema))) for d, _ in pairs]
        done, pending = await asyncio.wait(tasks, timeout=seconds)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        rows = [score(distance, k, d, t.result(), None) for k, ((d, _), t) in enumerate(zip(pairs, tasks))
                if t in done and t.exception() is None]
        summary = summarise(rows) if rows else {"documents": 0}
        summary.update({"started": docs, "unfinished": len(pending),
                        "errors": [repr(t.exception()) for t in done if t.exception() is not None],
                        "wall_s": round(time.perf_counter() - w0, 1), "peak_rss_mb": peak_rss_mb()})
        return summary

    async def run() -> None:
        for distance, gap in gaps.items():
            out[str(distance)] = await distance_rows(distance, gap)
            print(f"model arm, distance {distance}: {out[str(distance)].get('recall')} recall, "
                  f"{out[str(distance)]['wall_s']} s", flush=True)
        await engine.close()

    asyncio.run(run())
    return out


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    gold_n = sum(r["gold"] for r in rows)
    returned = sum(r["returned"] for r in rows)
    right = sum(r["right"] for r in rows)
    dist = sorted(d for r in rows for d in r["chunk_distances"])
    labels: Counter[str] = Counter()
    for r in rows:
        labels.update(r["labels"])
    return {"documents": len(rows), "gold": gold_n, "returned": returned,
            "recall": round(right / max(gold_n, 1), 4), "precision": round(right / max(returned, 1), 4),
            "incomplete": sum(r["incomplete"] for r in rows), "open_invoices": OPEN * len(rows),
            "conflicts": sum(r["conflicts"] for r in rows), "dropped_values": sum(r["dropped_values"] for r in rows),
            "grounded_outside_own_sentence": sum(r["grounded_outside_own_sentence"] for r in rows),
            "chunk_distance": {"min": dist[0], "median": statistics.median(dist), "max": dist[-1]} if dist else None,
            "chunks_per_doc": round(statistics.mean(r["chunks"] for r in rows), 1),
            "tokens_per_record": round(sum(r["tokens"] for r in rows) / max(gold_n, 1), 1),
            "labels": dict(labels), "failures": [r for r in rows if "failure" in r]}


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/records_across_chunks.json")
    ap.add_argument("--seconds", type=float, default=300.0, help="CPU seconds in all, split over the distances")
    ap.add_argument("--max-docs", type=int, default=400, help="documents per distance at most")
    ap.add_argument("--model-docs", type=int, default=0, help="documents per distance the embedded model reads "
                    "(0: the model arm is not run)")
    ap.add_argument("--model-seconds", type=float, default=1800.0, help="wall seconds per distance for the model")
    ap.add_argument("--model-distances", default="1,4,16,64", help="the distances the model reads (comma-separated)")
    ap.add_argument("--model-only", action="store_true", help="keep the perfect reader's rows already in --out "
                    "(and their calibrated gaps) and run only the model arm (without it and --model-docs, the model "
                    "arm's rows already in --out are kept)")
    return ap.parse_args()


def run_command(args: argparse.Namespace) -> str:
    """The command line of this run, as the results record it."""
    return (f"nice python -m benchmarks.records_across_chunks --seconds {args.seconds:g} --max-docs {args.max_docs} "
            f"--model-docs {args.model_docs} --model-seconds {args.model_seconds:g} "
            f"--model-distances {args.model_distances} {'--model-only ' if args.model_only else ''}--out {args.out}")


def perfect_arm(args: argparse.Namespace, out: dict[str, Any], gaps: dict[int, int], tokenizer: Any, schema: Any,
                per_line: float) -> None:
    """The perfect reader per distance: calibrate the gap, then read documents for the distance's CPU share."""
    for distance in DISTANCES:
        gap, _ = calibrate(distance, tokenizer, schema, per_line)
        gaps[distance] = gap
        rows: list[dict[str, Any]] = []
        c0, w0 = time.process_time(), time.perf_counter()
        while len(rows) < args.max_docs and time.process_time() - c0 < args.seconds / len(DISTANCES):
            rows.append(read_one(distance, len(rows), gap, tokenizer, schema))
        summary = summarise(rows)
        summary.update({"filler_lines_between": gap, "cpu_s": round(time.process_time() - c0, 1),
                        "wall_s": round(time.perf_counter() - w0, 1), "peak_rss_mb": peak_rss_mb()})
        if any(r.get("example") for r in rows):
            out["example"] = next(r["example"] for r in rows if r.get("example"))
        out["distances"][str(distance)] = summary


def write_report(out: dict[str, Any], path: Path) -> None:
    """Print the tables and write them, with the run's settings and example, as Markdown next to ``path``."""
    headers = ["distance (chunks)", "measured min/med/max", "docs", "gold", "recall", "precision", "incomplete",
               "conflicts", "memory-grounded values", "doc tokens / record", "failing docs"]
    rows_t = [[d, "{min}/{median:g}/{max}".format(**s["chunk_distance"]), s["documents"], s["gold"], s["recall"],
               s["precision"], f"{s['incomplete']} (open {s['open_invoices']})", s["conflicts"],
               s["labels"].get("memory", 0), s["tokens_per_record"], len(s["failures"])]
              for d, s in out["distances"].items()]
    print_table(headers, rows_t)
    perfect = out["perfect_run"]
    md = [f"# Records joined across chunks, perfect memory-keeping reader (`{perfect['command']}`)", "",
          table(headers, rows_t), "",
          f"Chunks {CHUNK_TOKENS} tokens, memory {MEMORY_TOKENS}, require_grounding; {INVOICES} settled invoices and "
          f"{OPEN} open per document. CPU: {perfect['machine']['cpu']} ({perfect['machine']['cores']} cores, "
          f"{', '.join(perfect['machine']['simd'])}); load {perfect['loadavg_before']} before, "
          f"{perfect['loadavg_after']} after; wall {perfect['wall_s']} s; peak RSS {perfect['peak_rss_mb']} MB."]
    if out.get("example"):
        ex = out["example"]
        md += ["", f"Example (16-chunk distance): `{ex['record']}`", "", "| field | chunk | grounding | text |",
               "|---|---|---|---|"]
        md += [f"| {p} | {v['chunk']} | {v['grounding']} | `{v['text']}` |" for p, v in ex["values"].items()]
    if out.get("embedded_model"):
        headers_m = ["distance (chunks)", "docs read / started", "gold", "recall", "precision", "incomplete",
                     "conflicts", "memory-grounded values", "doc tokens / record", "wall s"]
        rows_m = [[d, f"{s['documents']}/{s['started']}", s.get("gold", 0), s.get("recall"), s.get("precision"),
                   s.get("incomplete"), s.get("conflicts"), s.get("labels", {}).get("memory", 0),
                   s.get("tokens_per_record"), s["wall_s"]] for d, s in out["embedded_model"].items()]
        print_table(headers_m, rows_m)
        md += ["", "## The embedded model (SmolLM2-135M-Instruct, dtype auto), same documents and settings", "",
               f"`{out['model_run']['command']}`; load {out['model_run']['loadavg_before']} before, "
               f"{out['model_run']['loadavg_after']} after; peak RSS {out['model_run']['peak_rss_mb']} MB; CPU flags "
               "as above.", "", table(headers_m, rows_m)]
    path.with_suffix(".md").write_text("\n".join(md) + "\n")


def main() -> None:
    args = parse_args()
    from transformers import AutoTokenizer

    from memagent.models import resolve_model
    from memagent_testing.oracle.invoices import SCHEMA

    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model("smollm2-135m")))
    schema = schema_from(SCHEMA)
    per_line = lines_per_chunk(tokenizer)
    out: dict[str, Any] = {"machine": machine(),
                           "config": {"chunk_tokens": CHUNK_TOKENS, "memory_tokens": MEMORY_TOKENS,
                                      "require_grounding": True, "invoices_per_doc": INVOICES, "open_per_doc": OPEN,
                                      "stagger_lines": STAGGER, "reader": "MemoryOracle, in process"},
                           "distances": {}}
    gaps: dict[int, int] = {}
    t_all = time.perf_counter()
    run = {"command": run_command(args), "loadavg_before": loadavg()}
    kept = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if args.model_only:  # the perfect arm's rows are kept as measured, with their own command and machine
        out.update({k: kept[k] for k in ("perfect_run", "distances", "example")})
        gaps = {int(d): s["filler_lines_between"] for d, s in kept["distances"].items()}
    elif not args.model_docs and "embedded_model" in kept:  # the model arm's rows are kept, with their command
        out.update({k: kept[k] for k in ("model_run", "embedded_model")})
    if not args.model_only:
        perfect_arm(args, out, gaps, tokenizer, schema, per_line)
        out["perfect_run"] = {**run, "loadavg_after": loadavg(), "wall_s": round(time.perf_counter() - t_all, 1),
                              "peak_rss_mb": peak_rss_mb(), "machine": out["machine"]}
    if args.model_docs:
        chosen = {int(d) for d in args.model_distances.split(",")}
        t_model = time.perf_counter()
        out["embedded_model"] = model_arm({d: g for d, g in gaps.items() if d in chosen}, schema, args.model_docs,
                                          args.model_seconds)
        out["model_run"] = {**run, "loadavg_after": loadavg(), "wall_s": round(time.perf_counter() - t_model, 1),
                            "peak_rss_mb": peak_rss_mb()}
    write_report(out, write_json(args.out, out))


if __name__ == "__main__":
    main()
