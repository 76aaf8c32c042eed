"""Record extraction (issue 32, item 9): payments planted in generated statements of 8K-1M tokens.

    nice python -m benchmarks.records --out benchmarks/results/records.json
    nice python -m benchmarks.records --sizes 8192 --model-docs 2 --no-langextract --out /tmp/r.json  # smoke

Corpus: :mod:`memagent.data.records_corpus` (seeded): payments keyed by (payer, date) among filler,
with aliases (introduced by name, later paid by role), amendments (a later chunk corrects the
amount), triples (one payment stated in three chunks), near misses (invoices, planned and
disputed payments) and quiet stretches with no records.

Three parts, one run, each in its own subprocess (peak RSS is the reading process's ``ru_maxrss``):

1. ``scripted`` -- **a test double, not a model**: :class:`ScriptedEngine` answers each call from
   the text it is shown (regexes over the planted sentences; the memory update writes the aliases
   it has seen into the memory, the records call resolves roles through the memory it is shown).
   It measures the pipeline (chunking, records calls, split-and-reread under the reply budget,
   grounding, merge), never extraction quality. Token counts are the SmolLM2 tokenizer's (chat
   template included); a reply over ``max_tokens`` is cut there with ``finish_reason`` "length".
   One document per size in ``--sizes``.
2. ``model`` -- the packaged model (smollm2-135m) on ``--model-docs`` short documents.
3. ``langextract`` -- LangExtract (a separate venv, ``--langextract-python``) on the ``--sizes``
   documents, run by :mod:`benchmarks.langextract_peer`: its OpenAI provider against an oracle
   endpoint that answers each prompt from the planted sentences of the chunk in it (the scripted
   double's part for LangExtract: architecture vs architecture); it writes its own key into ``--out``.

A measurement, never an assertion. ``--deadline HH:MM`` (UTC) cuts the model and peer parts
short (figures so far, labelled partial).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import loadavg, write_json
from benchmarks.records_report import model_summary, print_summary, scripted_summary

SEED = 32
ROOT = Path(__file__).resolve().parent.parent

NAME = r"[A-Z][a-z]+ [A-Z][a-z]+ Ltd"
PAY = re.compile(rf"(?:(?P<payer>{NAME})|The (?P<role>[A-Z][a-z]+)) paid (?P<amount>\d+) on "
                 r"(?P<date>\d{4}-\d{2}-\d{2})(?: via (?P<bank>[A-Za-z]+))?\.")
AMEND = re.compile(rf"Amendment: the payment (?P<payer>{NAME}) made on (?P<date>\d{{4}}-\d{{2}}-\d{{2}}) "
                   r"is corrected to (?P<amount>\d+)\.")
INTRO = re.compile(rf"({NAME}) \(hereinafter the ([A-Z][a-z]+)\)")
MEM_ALIAS = re.compile(rf"the ([A-Z][a-z]+) = ({NAME})")


def peak_rss_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _between(text: str, a: str, b: str) -> str:
    return text.split(a, 1)[1].split(b, 1)[0] if a in text else ""


def _key(payer: Any, date: Any) -> tuple[str, str]:
    return " ".join(str(payer).split()).casefold(), str(date)


# ---------------------------------------------------------------- scripted engine (a test double)


def make_scripted_engine(tokenizer: Any, context_window: int = 16384) -> Any:
    from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams

    class ScriptedEngine(Engine):
        """Answers from the planted sentences of the text it is shown (a test double: it measures the
        pipeline, not a model). Token counts from the tokenizer; replies over max_tokens are cut."""

        def __init__(self) -> None:
            self.name, self.context_window, self.tokenizer, self.stats = "scripted-double", context_window, tokenizer, EngineStats()
            self.log: list[dict[str, int | str]] = []
            self._memory_ids: list[int] = []

        def _reply(self, text: str, params: SamplingParams) -> tuple[str, int, str]:
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) > params.max_tokens:
                return self.tokenizer.decode(ids[: params.max_tokens]), params.max_tokens, "length"
            return text, len(ids) + 1, "stop"  # + the end-of-turn token

        async def chat(self, messages, params: SamplingParams) -> Completion:
            content = messages[-1]["content"]
            ids = self.encode_chat(messages)
            memory = _between(content, "<memory>\n", "\n</memory>")
            section = _between(content, "<section>\n", "\n</section>") if "</section>" in content else \
                content.split("<section>\n", 1)[-1]
            aliases = {role: name for role, name in MEM_ALIAS.findall(memory)}
            aliases.update({role: name for name, role in INTRO.findall(section)})
            if "Reply with a JSON array of the" in content:
                section = content.split("<section>\n", 1)[1].rsplit("\n</section>", 1)[0]
                found: list[tuple[int, dict]] = []
                for m in PAY.finditer(section):
                    payer = m["payer"] or aliases.get(m["role"])
                    if payer is None:
                        continue  # a role the memory does not resolve: not stated as far as this call knows
                    rec: dict[str, Any] = {"payer": payer, "date": m["date"], "amount": int(m["amount"])}
                    if m["bank"]:
                        rec["bank"] = {"name": m["bank"]}
                    found.append((m.start(), rec))
                for m in AMEND.finditer(section):
                    found.append((m.start(), {"payer": m["payer"], "date": m["date"], "amount": int(m["amount"])}))
                text, n_out, finish = self._reply(json.dumps([r for _, r in sorted(found, key=lambda x: x[0])]), params)
                shared = 0
                for a, b in zip(ids, self._memory_ids):
                    if a != b:
                        break
                    shared += 1
                self.log.append({"kind": "records", "prompt": len(ids), "completion": n_out, "shared": shared,
                                 "finish": finish})
                return Completion(text=text, prompt_tokens=len(ids), completion_tokens=n_out, finish_reason=finish)
            if "Updated memory:" in content:
                self._memory_ids = ids
                new = "; ".join(f"the {r} = {n}" for r, n in sorted(aliases.items())) or "No aliases yet."
                text, n_out, finish = self._reply(new, params)
                self.log.append({"kind": "memory", "prompt": len(ids), "completion": n_out, "shared": 0, "finish": finish})
                return Completion(text=text, prompt_tokens=len(ids), completion_tokens=n_out, finish_reason=finish)
            text, n_out, finish = self._reply('{"holder": null}', params)
            self.log.append({"kind": "answer", "prompt": len(ids), "completion": n_out, "shared": 0, "finish": finish})
            return Completion(text=text, prompt_tokens=len(ids), completion_tokens=n_out, finish_reason=finish)

    return ScriptedEngine()


# ---------------------------------------------------------------- scoring


def line_spans(text: str) -> list[tuple[int, int]]:
    out, pos = [], 0
    for line in text.split("\n"):
        out.append((pos, pos + len(line)))
        pos += len(line) + 1
    return out


def score(doc: dict[str, Any], records: list[Any], chunk_bounds: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    """Recall/precision by key, field exact match on matched records, per-case results, grounding."""
    gold = {_key(g["payer"], g["date"]): g for g in doc["gold"]}
    pred: dict[tuple[str, str], Any] = {}
    dup = 0
    for r in records:
        v = r.values
        k = _key(v.get("payer"), v.get("date"))
        dup += k in pred
        pred.setdefault(k, r)
    tp = [k for k in pred if k in gold]
    amount_ok = sum(1 for k in tp if isinstance(pred[k].values.get("amount"), (int, float))
                    and float(pred[k].values["amount"]) == float(gold[k]["amount"]))
    banked = [k for k in tp if "bank" in gold[k]]
    bank_ok = sum(1 for k in banked if str((pred[k].values.get("bank") or {}).get("name", "")).casefold()
                  == gold[k]["bank"]["name"].casefold())
    cases: dict[str, dict[str, int]] = {}
    for k, g in gold.items():
        c = cases.setdefault(g["kind"], {"gold": 0, "found": 0, "amount_ok": 0, "one_record_3_mentions": 0})
        c["gold"] += 1
        if k in pred:
            c["found"] += 1
            c["amount_ok"] += float(pred[k].values.get("amount") or -1) == float(g["amount"])
            if g["kind"] == "triple":
                c["one_record_3_mentions"] += pred[k].mentions == 3
    evidence = [e for k in pred for e in pred[k].evidence.values()]
    out = {"gold": len(gold), "predicted": len(records), "true_positive": len(tp), "duplicate_keys": dup,
           "recall": round(len(tp) / len(gold), 4) if gold else None,
           "precision": round(len(tp) / len(records), 4) if records else None,
           "amount_exact": [amount_ok, len(tp)], "bank_exact": [bank_ok, len(banked)],
           "grounded": [sum(1 for e in evidence if e.char_start is not None), len(evidence)],
           "cases": cases}
    if chunk_bounds is not None:  # planted lines cut by a chunk boundary (no per-chunk call sees them whole)
        spans, ends = line_spans(doc["text"]), [e for _, e in chunk_bounds[:-1]]
        import bisect

        def cut(i: int) -> bool:
            a, b = spans[i]
            j = bisect.bisect_right(ends, a)
            return j < len(ends) and ends[j] < b

        missed = [k for k in gold if k not in pred]
        out["planted_lines_cut_by_chunk_boundary"] = sum(cut(i) for g in gold.values() for i in g["lines"])
        out["missed_with_a_cut_line"] = sum(1 for k in missed if any(cut(i) for i in gold[k]["lines"]))
        out["missed"] = [dict(gold[k], text=None) for k in missed][:10]
    return out


# ---------------------------------------------------------------- children


def child_scripted(doc_path: str, out_path: str) -> None:
    from transformers import AutoTokenizer

    from memagent.agent import read_document
    from memagent.config import AgentConfig
    from memagent.data.records_corpus import SCHEMA
    from memagent.models import resolve_model
    from memagent.prompts import memory_update_messages, records_messages

    doc = json.loads(Path(doc_path).read_text())
    tok = AutoTokenizer.from_pretrained(str(resolve_model("smollm2-135m")))
    engine = make_scripted_engine(tok)
    config = AgentConfig(preset="small", query_tokens=200, extraction=SCHEMA)
    rss_before = peak_rss_mb()
    t0 = time.perf_counter()
    res = asyncio.run(read_document(engine, None, doc["text"], config))
    wall = time.perf_counter() - t0
    schema = config.extraction
    question = schema.question()
    request = schema.records_instruction("payments")
    t_mem = engine.count_chat_tokens(memory_update_messages(question, "", "", config.instruction, config.prompts))
    t_rec = engine.count_chat_tokens(records_messages(question, "", "", request, config.instruction, config.prompts))
    e_mem = engine.encode_chat(memory_update_messages(question, "", "", config.instruction, config.prompts))
    e_rec = engine.encode_chat(records_messages(question, "", "", request, config.instruction, config.prompts))
    shared_empty = next((i for i, (a, b) in enumerate(zip(e_mem, e_rec)) if a != b), min(len(e_mem), len(e_rec)))
    log = engine.log
    mem = [c for c in log if c["kind"] == "memory"]
    rec = [c for c in log if c["kind"] == "records"]
    doc_tokens = res.context_tokens
    mem_tok = sum(c["prompt"] + c["completion"] for c in mem)
    rec_tok = sum(c["prompt"] + c["completion"] for c in rec)
    rec_uncached = sum(c["prompt"] - c["shared"] + c["completion"] for c in rec)
    beyond_mem = sum(c["prompt"] - t_mem for c in mem)
    beyond_rec = sum(c["prompt"] - t_rec for c in rec)
    suffix = t_rec - shared_empty  # the records request after the shared prefix (template)
    beyond_rec_uncached = sum(max(0, c["prompt"] - c["shared"] - suffix) for c in rec)
    bounds = [(s.char_start, s.char_end) for s in res.steps if s.kind == "memory"]
    out = {
        "engine": "scripted test double (reads the planted sentences; measures the pipeline, not a model)",
        "id": doc["id"], "target_tokens": doc["target_tokens"], "document_tokens": doc_tokens, "chars": len(doc["text"]),
        "chunks": res.n_chunks, "truncated": res.truncated, "cases_planted": doc["cases"],
        "near_misses": doc["n_near_misses"], "quiet_regions": doc["quiet_regions"],
        "wall_s": round(wall, 2), "peak_rss_mb": peak_rss_mb(), "rss_before_read_mb": rss_before,
        "record_splits": res.record_splits, "record_failed_pieces": res.record_failed,
        "calls": {"memory": len(mem), "records": len(rec), "records_cut_at_budget": sum(c["finish"] == "length" for c in rec)},
        "tokens": {"memory_prompt": sum(c["prompt"] for c in mem), "memory_completion": sum(c["completion"] for c in mem),
                   "records_prompt": sum(c["prompt"] for c in rec), "records_completion": sum(c["completion"] for c in rec),
                   "records_prompt_beyond_shared_prefix": sum(c["prompt"] - c["shared"] for c in rec)},
        "records_cost_vs_memory_update": round(rec_tok / mem_tok, 4),
        "records_cost_vs_memory_update_with_prefix_sharing": round(rec_uncached / mem_tok, 4),
        "template_tokens": {"memory_update": t_mem, "records": t_rec, "records_suffix_after_shared_prefix": suffix},
        "prompt_tokens_beyond_template_per_document_token": {
            "memory_updates": round(beyond_mem / doc_tokens, 4),
            "memory_updates_plus_records_uncached": round((beyond_mem + beyond_rec_uncached) / doc_tokens, 4),
            "memory_updates_plus_records_no_prefix_sharing": round((beyond_mem + beyond_rec) / doc_tokens, 4)},
        "score": score(doc, (res.records or {}).get("payments", []), bounds),
    }
    Path(out_path).write_text(json.dumps(out, indent=2, default=str))


class LoggingEngine:
    """Delegates to an engine; keeps each records call's reply (schema validity is judged after)."""

    def __init__(self, inner: Any) -> None:
        self._inner, self.calls, self.on_call = inner, [], None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def chat(self, messages, params):
        t0 = time.perf_counter()
        c = await self._inner.chat(messages, params)
        kind = "records" if params.json_schema and "Reply with a JSON array of the" in messages[-1]["content"] else \
            ("memory" if "Updated memory:" in messages[-1]["content"] else "answer")
        self.calls.append({"kind": kind, "text": c.text, "finish": c.finish_reason, "prompt": c.prompt_tokens,
                           "completion": c.completion_tokens})
        if self.on_call:
            self.on_call()
        print(f"[model] {kind} {c.prompt_tokens}+{c.completion_tokens} tok {c.finish_reason} "
              f"{time.perf_counter() - t0:.1f}s", file=sys.stderr, flush=True)
        return c


def child_model(docs_path: str, out_path: str, deadline: float, threads: int, max_batch: int) -> None:
    import torch

    from memagent.agent import read_document
    from memagent.config import AgentConfig
    from memagent.data.records_corpus import SCHEMA
    from memagent.engines import EngineConfig, make_engine
    from memagent.extraction.reading import _parse

    torch.set_num_threads(threads)
    from memagent.extraction import reading

    reading.MIN_SPLIT_CHARS = int(os.environ.get("RECORDS_BENCH_MIN_SPLIT_CHARS", reading.MIN_SPLIT_CHARS))
    docs = json.loads(Path(docs_path).read_text())
    engine = LoggingEngine(make_engine(EngineConfig(model="smollm2-135m", dtype="fp32", max_batch_size=max_batch)))
    memory_tokens = int(os.environ.get("RECORDS_BENCH_MEMORY_TOKENS", "128"))  # also the records reply budget
    config = AgentConfig(chunk_tokens=512, memory_tokens=memory_tokens, answer_tokens=48, query_tokens=200,
                         extraction=SCHEMA)
    schema = config.extraction
    results: list[dict[str, Any]] = []
    t_start = time.perf_counter()

    def dump(done: bool) -> None:
        rec_calls = [c for c in engine.calls if c["kind"] == "records"]
        valid = sum(1 for c in rec_calls if c["finish"] != "length" and _parse(schema, "payments", c["text"]) is not None)
        Path(out_path).write_text(json.dumps({
            "done": done, "docs_read": len(results), "wall_s": round(time.perf_counter() - t_start, 1),
            "peak_rss_mb": peak_rss_mb(), "docs": results, "loadavg": loadavg(), "memory_tokens": memory_tokens,
            "min_split_chars": __import__("memagent.extraction.reading", fromlist=["x"]).MIN_SPLIT_CHARS,
            "records_finish": [c["finish"] for c in engine.calls if c["kind"] == "records"],
            "records_calls": len(rec_calls), "records_calls_valid": valid,
            "records_calls_cut_at_budget": sum(c["finish"] == "length" for c in rec_calls),
            "tokens": {k: sum(c[p] for c in engine.calls if c["kind"] == k) for k in ("memory", "records", "answer")
                       for p in ("prompt",)} | {f"{k}_completion": sum(c["completion"] for c in engine.calls if c["kind"] == k)
                                                for k in ("memory", "records", "answer")},
            "sample_records_replies": [c["text"][:300] for c in rec_calls[:4]],
        }, indent=2, default=str))

    async def one(doc: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        res = await read_document(engine, None, doc["text"], config)
        s = score(doc, (res.records or {}).get("payments", []))
        results.append({"id": doc["id"], "document_tokens": res.context_tokens, "chunks": res.n_chunks,
                        "wall_s": round(time.perf_counter() - t0, 1), "record_splits": res.record_splits,
                        "record_failed_pieces": res.record_failed, "score": s,
                        "predicted": [r.values for r in (res.records or {}).get("payments", [])][:12]})
        dump(False)

    async def run() -> None:
        pending = list(docs)
        while pending and time.time() < deadline - 60:
            batch, pending = pending[:max_batch], pending[max_batch:]
            await asyncio.gather(*(one(d) for d in batch))

    engine.on_call = lambda: dump(False)
    dump(False)
    asyncio.run(run())
    dump(True)


# ---------------------------------------------------------------- parent


def run_child(args: list[str], timeout: float) -> tuple[int, float]:
    return run_child_module("benchmarks.records", args, timeout)


def run_child_module(module: str, args: list[str], timeout: float) -> tuple[int, float]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, timeout=max(timeout, 5), check=False)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        rc = -9
    return rc, round(time.perf_counter() - t0, 1)


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring); the ``--child-*`` options are the parts' subprocesses'."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results/records.json")
    ap.add_argument("--sizes", default="8192,65536,262144,1048576", help="scripted documents' target tokens")
    ap.add_argument("--model-docs", type=int, default=6)
    ap.add_argument("--model-tokens", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=3)
    ap.add_argument("--deadline", default=None, help="HH:MM UTC: model and peer parts stop before it")
    ap.add_argument("--no-model", action="store_true")
    ap.add_argument("--no-langextract", action="store_true")
    ap.add_argument("--langextract-python", default=None,
                    help="the python of a venv with langextract installed: runs the peer row "
                         "(benchmarks.langextract_peer)")
    ap.add_argument("--no-scripted", action="store_true")
    ap.add_argument("--model-result", default=None,
                    help="a --child-model JSON already written (run beside the scripted part)")
    ap.add_argument("--model-key", default="model", help="the JSON key of the model part")
    ap.add_argument("--update", action="store_true", help="keep the parts already in --out (a part run later)")
    ap.add_argument("--child-scripted", nargs=2, metavar=("DOC", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--child-model", nargs=2, metavar=("DOCS", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--child-deadline", type=float, default=0, help=argparse.SUPPRESS)
    return ap.parse_args()


def deadline_epoch(deadline: str | None) -> float:
    """When the model and peer parts stop: ``HH:MM`` UTC today, else an hour from now (epoch seconds)."""
    if not deadline:
        return time.time() + 3600
    now = dt.datetime.now(dt.UTC)
    h, m = map(int, deadline.split(":"))
    return now.replace(hour=h, minute=m, second=0, microsecond=0).timestamp()


def start_output(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON's header; with --update, the parts already in --out, this run appended to its ``runs``."""
    out: dict[str, Any] = {"benchmark": "records", "issue": "32 item 9", "seed": SEED,
                           "started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                           "command": "nice python -m benchmarks.records " + " ".join(sys.argv[1:]),
                           "corpus": "memagent.data.records_corpus.statement (payments keyed by payer+date; aliases, "
                                     "amendments, triples, near misses, quiet stretches)"}
    if args.update and Path(args.out).exists():
        old = json.loads(Path(args.out).read_text())
        old.pop("machine", None)
        out = {**old, "runs": old.get("runs", []) + [{"command": out["command"], "started_utc": out["started_utc"]}]}
    return out


def scripted_part(args: argparse.Namespace, work: Path, out: dict[str, Any]) -> None:
    """1. The scripted engine, one subprocess per size in --sizes; --out rewritten after each."""
    from memagent.data.records_corpus import statement

    scripted = []
    for size in [int(s) for s in args.sizes.split(",") if s and not args.no_scripted]:
        doc = statement(f"stmt-{size}", size, SEED)
        doc["target_tokens"] = size
        p, o = work / f"doc-{size}.json", work / f"res-{size}.json"
        p.write_text(json.dumps(doc))
        la = loadavg()
        rc, wall = run_child(["--child-scripted", str(p), str(o)], 1800)
        r = json.loads(o.read_text()) if o.exists() else {"target_tokens": size, "error": f"child rc {rc}"}
        r["loadavg_before"], r["loadavg_after"], r["child_wall_s"] = la, loadavg(), wall
        scripted.append(r)
        out["scripted"] = {"label": "scripted test double: reads planted sentences; measures the pipeline, not a model",
                           "config": {"preset": "small", "chunk_tokens": 1024, "memory_tokens": 160,
                                      "records_reply_budget": 160, "query_tokens": 200},
                           "documents": scripted}
        write_json(args.out, out)
        figures = {k: r.get(k) for k in ('document_tokens', 'chunks', 'wall_s', 'peak_rss_mb')}
        print(f"scripted {size}: {json.dumps(figures)}", flush=True)
    ok = [r for r in scripted if "score" in r] if not args.no_scripted else []
    if ok:
        out["scripted"]["summary"] = scripted_summary(ok)
        write_json(args.out, out)


def model_part(args: argparse.Namespace, work: Path, out: dict[str, Any], deadline: float) -> None:
    """2. The packaged model on --model-docs short documents, in a subprocess (or a --model-result merged)."""
    from memagent.data.records_corpus import statement

    docs = [statement(f"short-{i}", args.model_tokens, SEED + 1) for i in range(args.model_docs)]
    dp = work / "model-docs.json"
    dp.write_text(json.dumps(docs))
    if args.no_model:
        return
    o = work / "model.json"
    la = loadavg()
    budget = deadline - time.time() - (240 if not args.no_langextract else 60)
    if args.model_result:
        o, rc, wall = Path(args.model_result), "separate process", None
    else:
        rc, wall = run_child(["--child-model", str(dp), str(o), "--child-deadline", str(time.time() + budget),
                              "--threads", str(args.threads), "--max-batch", str(args.max_batch)], budget + 30)
    m = json.loads(o.read_text()) if o.exists() else {"error": f"child rc {rc}", "docs": []}
    m["rc"], m["child_wall_s"] = rc, wall
    m["loadavg_before" if not args.model_result else "loadavg_at_merge"] = la
    m["loadavg_after"] = loadavg()
    m["summary"] = model_summary(m, len(docs), args.threads, args.max_batch)
    out[args.model_key] = m
    write_json(args.out, out)


def langextract_part(args: argparse.Namespace, out: dict[str, Any], deadline: float) -> dict[str, Any]:
    """3. The LangExtract peer: its own module (LangExtract lives in a separate venv; it merges its key into
    --out). Returns the JSON as it then stands."""
    if args.no_langextract or not args.langextract_python:
        out["langextract"] = {"run": False, "reason": "--no-langextract" if args.no_langextract else
                              "no --langextract-python (a python with langextract installed, in a separate venv)"}
        return out
    write_json(args.out, out)
    rc, wall = run_child_module("benchmarks.langextract_peer", ["--langextract-python", args.langextract_python,
                                "--sizes", args.sizes, "--out", args.out], max(deadline - time.time(), 600))
    out = json.loads(Path(args.out).read_text())
    out.pop("machine", None)
    if rc != 0:
        out["langextract"] = {"run": False, "reason": f"benchmarks.langextract_peer exited {rc} after {wall} s"}
    return out


def main() -> None:
    args = parse_args()
    if args.child_scripted:
        return child_scripted(*args.child_scripted)
    if args.child_model:
        return child_model(*args.child_model, args.child_deadline, args.threads, args.max_batch)

    deadline = deadline_epoch(args.deadline)
    work = Path(tempfile.mkdtemp(prefix="records-bench-"))
    out = start_output(args)
    scripted_part(args, work, out)
    model_part(args, work, out, deadline)
    out = langextract_part(args, out, deadline)
    write_json(args.out, out)
    print_summary(out)


if __name__ == "__main__":
    main()
