"""What constraining a reply to a JSON Schema costs: grammar libraries, and the hf engine per token.

    python -m benchmarks.grammar --threads 1 --out benchmarks/results/grammar.json
    PYTHONPATH=/tmp/xg python -m benchmarks.grammar --libraries llguidance,xgrammar --no-engine --out /tmp/g.json
    python -m benchmarks.grammar --libraries '' --out benchmarks/results/grammar.json   # engine only

A part not run (no libraries, or ``--no-engine``) keeps the figures ``--out`` already holds.

1. ``libraries``: each grammar library that imports (llguidance is a dependency; xgrammar and
   outlines-core only when installed, e.g. ``pip install --no-deps --target /tmp/xg xgrammar
   apache-tvm-ffi`` and ``PYTHONPATH``), in its own process: tokenizer setup and schema compile
   seconds, then the mask of every position of a 52-token valid reply (computed and applied to a
   ``[V]`` logits row), 5 passes after a warm-up; peak RSS of that process.
2. ``engine`` (headline ``engine.overhead_ms_per_token``): the packaged model in the hf engine,
   speculation off, one request at a time, greedy, ``--answer-tokens`` budget: the same
   extraction prompts with and without the schema; milliseconds per decode step each way (each
   prompt's prefill, timed by a 1-token call first, taken out; ``ms_per_token`` keeps it in),
   and how many replies parse and validate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from importlib import metadata
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import add_threads_option, loadavg, machine, print_table, set_threads, write_json

SCHEMA = {"type": "object", "properties": {
    "party": {"type": "string", "description": "the counterparty's name"},
    "effective_date": {"type": "string", "format": "date", "description": "the date the contract takes effect"},
    "amount": {"type": "number", "description": "total amount payable"},
    "currency": {"enum": ["USD", "EUR", "GBP"], "description": "currency of the amount"},
    "signatories": {"type": "array", "items": {"type": "string"}, "description": "people who signed"}},
    "required": ["party", "effective_date", "amount", "currency", "signatories"]}
REPLY = {"party": "Harlow Freight Ltd", "effective_date": "2021-03-14", "amount": 48250.5, "currency": "GBP",
         "signatories": ["A. Smith", "B. Jones"]}
PARTIES = ["Harlow Freight Ltd", "Norbridge Mills plc", "Castell Data GmbH", "Oakham & Reyes LLP", "Vantor Marine SA",
           "Kestrel Foods Inc", "Lyle Textiles Ltd", "Brightwater Energy AG"]


def _llguidance(tok: Any, V: int, schema: str, out: dict) -> tuple[Callable, Callable, Callable]:
    """llguidance's matcher for ``schema``: start, mask and accept steps (setup and compile seconds into ``out``)."""
    import numpy as np
    import torch

    t = time.perf_counter()  # the library's import counts to its tokenizer setup
    import llguidance
    import llguidance.hf

    lt = llguidance.hf.from_tokenizer(tok, n_vocab=V)
    out["tokenizer_s"] = time.perf_counter() - t
    t = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        schema, defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"})
    template = llguidance.LLMatcher(lt, grammar, log_level=0)
    out["compile_s"] = time.perf_counter() - t
    bits = torch.zeros((V + 31) // 32, dtype=torch.int32)

    def start():
        return template.deep_copy()

    def mask(m, logits):
        m.unsafe_compute_mask_ptr(bits.data_ptr(), bits.numel() * 4)
        allowed = torch.from_numpy(np.unpackbits(bits.numpy().view(np.uint8), bitorder="little")[:V].view(np.bool_))
        logits.masked_fill_(~allowed, float("-inf"))

    def accept(m, i):
        return m.consume_token(i)

    return start, mask, accept


def _xgrammar(tok: Any, V: int, schema: str, out: dict) -> tuple[Callable, Callable, Callable]:
    """xgrammar's matcher for ``schema``: start, mask and accept steps (setup and compile seconds into ``out``)."""
    t = time.perf_counter()  # the library's import counts to its tokenizer setup
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=V)
    out["tokenizer_s"] = time.perf_counter() - t
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    t = time.perf_counter()
    compiled = compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"))
    out["compile_s"] = time.perf_counter() - t
    bitmask = xgr.allocate_token_bitmask(1, V)

    def start():
        return xgr.GrammarMatcher(compiled)

    def mask(m, logits):
        m.fill_next_token_bitmask(bitmask)
        xgr.apply_token_bitmask_inplace(logits.view(1, -1), bitmask)

    def accept(m, i):
        return m.accept_token(i)

    return start, mask, accept


def _outlines_core(tok: Any, V: int, schema: str, out: dict) -> tuple[Callable, Callable, Callable]:
    """outlines-core's guide for ``schema``: start, mask and accept steps (setup and compile seconds into ``out``)."""
    import torch

    t = time.perf_counter()  # the library's import counts to its tokenizer setup
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema

    vocab: dict[str, list[int]] = {}
    for i in range(V):
        if i not in tok.all_special_ids:
            vocab.setdefault(tok.convert_tokens_to_string([tok.convert_ids_to_tokens(i)]), []).append(i)
    voc = oc.Vocabulary(tok.eos_token_id, vocab)
    out["tokenizer_s"] = time.perf_counter() - t
    t = time.perf_counter()
    index = oc.Index(build_regex_from_schema(schema, whitespace_pattern=""), voc)
    out["compile_s"] = time.perf_counter() - t

    def start():
        return oc.Guide(index)

    def mask(m, logits):
        keep = torch.full((V,), float("-inf"))
        keep[torch.tensor(m.get_tokens())] = 0
        logits.add_(keep)

    def accept(m, i):
        m.advance(i)
        return True

    return start, mask, accept


MATCHERS = {"llguidance": _llguidance, "xgrammar": _xgrammar, "outlines-core": _outlines_core}


def _mask_times(lib: str, ids: list[int], V: int, start: Callable, mask: Callable, accept: Callable) -> list[float]:
    """Seconds of each position's mask (computed and applied to a ``[V]`` logits row): 5 passes after a warm-up."""
    import torch

    def one_pass() -> list[float]:
        m, times = start(), []
        for i in ids:
            logits = torch.zeros(V)
            t0 = time.perf_counter()
            mask(m, logits)
            times.append(time.perf_counter() - t0)
            if not torch.isfinite(logits[i]) or not accept(m, i):
                raise RuntimeError(f"{lib} refused token {i} of a valid reply")
        return times

    one_pass()
    return [x for _ in range(5) for x in one_pass()]


def _library(lib: str) -> dict:
    """One library's figures (run in a fresh process: the peak RSS is its own)."""
    import torch
    from transformers import AutoTokenizer

    from memagent.models import resolve_model

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(str(resolve_model("smollm2-135m")))
    V = len(tok)
    schema = json.dumps(SCHEMA)
    ids = tok(json.dumps(REPLY, separators=(",", ":")), add_special_tokens=False)["input_ids"]
    out: dict = {"library": lib, "version": metadata.version(lib), "vocab": V, "reply_tokens": len(ids),
                 "load_before": loadavg()}
    if lib not in MATCHERS:
        raise ValueError(f"unknown library {lib!r}")
    start, mask, accept = MATCHERS[lib](tok, V, schema, out)
    times = _mask_times(lib, ids, V, start, mask, accept)
    out.update(mask_ms_mean=1000 * statistics.mean(times), mask_ms_p50=1000 * statistics.median(times),
               mask_ms_max=1000 * max(times), peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               load_after=loadavg())
    return out


def libraries(names: list[str]) -> list[dict]:
    results = []
    for lib in names:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.grammar", "--one-library", lib],
                              capture_output=True, text=True)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            results.append({"library": lib, "error": tail[:300]})
        else:
            results.append(json.loads(lines[-1]))
    return results


def _prompt(i: int) -> list[dict[str, str]]:
    party = PARTIES[i % len(PARTIES)]
    text = (f"This services agreement is made between {party} (the Supplier) and the Client. It takes effect on "
            f"{1 + i % 28} March 20{10 + i}. The total amount payable is {1000 * (i + 3)} GBP, in twelve monthly "
            f"instalments. Signed for the Supplier by A. Smith and for the Client by B. Jones.")
    fields = "; ".join(f"{k}: {v['description']}" for k, v in SCHEMA["properties"].items())
    return [{"role": "user", "content": f"{text}\n\nExtract these fields as one JSON object ({fields})."}]


def engine(n: int, answer_tokens: int) -> dict:
    import jsonschema

    from memagent.engines import EngineConfig, SamplingParams, make_engine

    eng = make_engine(EngineConfig(engine="hf", model="smollm2-135m", dtype="fp32", speculate=False, max_batch_size=1))
    schema = json.dumps(SCHEMA)
    runs: dict[str, list[dict]] = {"constrained": [], "free": []}

    async def one(i: int, constrained: bool) -> dict:
        params = SamplingParams(max_tokens=answer_tokens, json_schema=schema if constrained else None)
        t0 = time.perf_counter()
        await eng.chat(_prompt(i), SamplingParams(max_tokens=1, json_schema=params.json_schema))
        prefill = time.perf_counter() - t0  # the prompt's forward (+ one token): taken out of the per-token cost
        t0 = time.perf_counter()
        c = await eng.chat(_prompt(i), params)
        wall = time.perf_counter() - t0
        try:
            jsonschema.validate(json.loads(c.text), SCHEMA, format_checker=jsonschema.FormatChecker())
            valid = True
        except (ValueError, jsonschema.ValidationError):
            valid = False
        return {"wall_s": wall, "prefill_s": prefill, "tokens": c.completion_tokens, "valid": valid,
                "finish": c.finish_reason, "text": c.text}

    asyncio.run(one(0, True))  # warm-up: the grammar's tokenizer and the model's first forwards
    asyncio.run(one(0, False))
    load_before = loadavg()
    for i in range(n):  # interleaved, so load changes hit both sides alike
        for kind in ("constrained", "free"):
            runs[kind].append(asyncio.run(one(i, kind == "constrained")))
    summary = {}
    for kind, rs in runs.items():
        tokens = sum(r["tokens"] for r in rs)
        decode_s = sum(max(r["wall_s"] - r["prefill_s"], 0.0) for r in rs)
        summary[kind] = {"ms_per_token": 1000 * sum(r["wall_s"] for r in rs) / max(tokens, 1),
                         "decode_ms_per_token": 1000 * decode_s / max(tokens - len(rs), 1),
                         "tokens": tokens, "valid_rate": sum(r["valid"] for r in rs) / len(rs)}
    c, f = summary["constrained"], summary["free"]
    return {"prompts": n, "answer_tokens": answer_tokens, "load_before": load_before, "load_after": loadavg(),
            "overhead_ms_per_token": c["decode_ms_per_token"] - f["decode_ms_per_token"],
            "overhead_ms_per_token_with_prefill": c["ms_per_token"] - f["ms_per_token"],
            **summary, "runs": runs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None)
    p.add_argument("--libraries", default="llguidance,xgrammar,outlines-core")
    p.add_argument("--no-engine", action="store_true")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--answer-tokens", type=int, default=96)
    p.add_argument("--one-library", default=None, help=argparse.SUPPRESS)
    add_threads_option(p)
    args = p.parse_args()
    if args.one_library:
        print(json.dumps(_library(args.one_library)))
        return
    threads = set_threads(args.threads)
    libs = libraries([x for x in args.libraries.split(",") if x])
    print_table(["library", "tokenizer s", "compile s", "mask ms mean", "p50", "max", "peak RSS MB"],
                [[r["library"], *(r.get(k, r.get("error", "")) for k in
                                  ("tokenizer_s", "compile_s", "mask_ms_mean", "mask_ms_p50", "mask_ms_max",
                                   "peak_rss_mb"))] for r in libs])
    # A part not run this time (``--libraries ''`` or ``--no-engine``) keeps its figures from ``--out``.
    out = Path(args.out) if args.out else None
    result = {k: v for k, v in json.loads(out.read_text()).items() if k != "machine"} if out and out.exists() else {}
    result["schema"] = SCHEMA
    if libs:
        result.update(libraries=libs, threads=threads, libraries_machine=machine())
    if not args.no_engine:
        e = engine(args.prompts, args.answer_tokens)
        result.update(engine=e, engine_threads=threads)  # "machine" (written below) is the engine run's
        print_table(["answer", "decode ms per token", "ms per token (with prefill)", "tokens", "valid JSON"],
                    [[k, e[k]["decode_ms_per_token"], e[k]["ms_per_token"], e[k]["tokens"], e[k]["valid_rate"]]
                     for k in ("constrained", "free")])
        print(f"constraint overhead: {e['overhead_ms_per_token']:.2f} ms per decode step")
    if out:
        write_json(out, result)


if __name__ == "__main__":
    main()
