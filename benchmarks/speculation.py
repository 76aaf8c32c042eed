"""Speculation on one long document, read alone by the packaged model, once per drafting mode.

    python -m benchmarks.speculation --out benchmarks/results/speculation.json
    python -m benchmarks.speculation --modes none,ngram,aligned,both,both:8 --tokens 6000 \
        --out benchmarks/results/speculation_aligned.json

Generates one NIAH document of ``--tokens`` tokens (~32 chunks at the ``small`` preset for 33K) and
reads it once per mode with the same engine and model: ``none`` (no speculation), ``ngram``
(prompt lookup), ``aligned`` (drafts from the prompt aligned with the reply: the previous
memory), ``both`` (the engine's default: per row the better proposal); ``MODE:K`` drafts a fixed
``K`` tokens each step instead of the adaptive length (``K`` caps both drafters); ``MODE+learn`` lets
the adaptive length learn from the wall clock and earlier rows (``--draft-learning``, greedy replies
then vary run to run; the default is a function of the row's own drafts). The reads run in
lockstep (chunk i of every mode, then chunk i + 1, ...; one call at a time), so all see the same
load on a shared CPU; each call is timed alone. Also measures the forward cost table behind the
adaptive draft length (``--cost``: B rows × t tokens over a ~1,100-token context), under the
engine's attention (``forward_cost``) and transformers' ``sdpa`` (``forward_cost_sdpa``, which
copies the KV cache on every masked multi-token forward; ``memagent.engines.gqa_attention``).

Headline keys (``modes[label]``; the top-level ones are the headline mode's, ``both`` when read,
against ``none``):
- ``speedup``: seconds per chunk without ÷ with speculation;
- ``identical_steps``: memory-update and answer steps whose text is the same as ``none``'s;
- ``acceptance``: drafted tokens kept ÷ drafted; ``tokens_per_step``: completion tokens per
  decode step (``memory_tokens_per_forward``: on memory updates only);
- ``forwards_per_update``, ``unchanged_forwards``: decode forwards of each memory update, and of
  those whose memory equals the previous one (the copy-aware target: a handful);
- ``drafters``: per drafter (ngram, aligned) the rows that drafted from it, drafted, kept;
- ``per_step``: per conversation of the headline read, (drafted, accepted, completion_tokens,
  decode_steps, seconds) (the latency-model engine fits its acceptance distribution from it).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import resource
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import (DecodeForwards, add_threads_option, loadavg, machine, print_table, set_threads,
                               write_json)


class Lockstep:
    """An engine wrapper: one call at a time across wrappers sharing ``lock``; times each call alone
    and keeps the decode forwards (``all_forwards``' records) made during its own calls."""

    def __init__(self, inner, lock: asyncio.Lock, label: str, all_forwards: DecodeForwards):
        self.inner, self.lock, self.label, self.all_forwards = inner, lock, label, all_forwards
        self.name, self.context_window = inner.name, inner.context_window
        self.tokenizer, self.stats = inner.tokenizer, inner.stats
        self.seconds: list[float] = []
        self.loads: list[float] = []
        self.forwards: list[tuple[int, int, int, float]] = []
        self.drafters: list[dict] = []  # per forward, per drafter (rows, drafted, kept) when recorded

    async def chat(self, messages, params):
        async with self.lock:
            t0, seen = time.perf_counter(), len(self.all_forwards.steps)
            reply = await self.inner.chat(messages, params)
            self.seconds.append(time.perf_counter() - t0)
            self.forwards.extend(self.all_forwards.steps[seen:])
            self.drafters.extend(getattr(self.all_forwards, "drafters", [])[seen:])
            self.loads.append(loadavg()[0])
            await asyncio.sleep(0)  # let the other read take the lock next
            return reply

    def encode_chat(self, messages):
        return self.inner.encode_chat(messages)

    def count_chat_tokens(self, messages):
        return self.inner.count_chat_tokens(messages)


def forward_cost(engine, context_tokens: int = 1100, rows=(1, 4, 16), tokens=(1, 2, 3, 9, 33), repeats: int = 3,
                 attention: str | None = None) -> dict:
    """Median seconds of one forward of ``B × t`` tokens over a cache of ``context_tokens`` per row,
    under the model's ``attention`` implementation (default: the engine's), with a digest of the
    logits (the same inputs under every implementation: equal digests are equal bits)."""
    import hashlib

    import torch

    from memagent.engines.kv_cache import ReservedCache

    model = engine.model
    before = model.config._attn_implementation
    model.set_attn_implementation(attention or before)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 20000, (1, context_tokens), generator=g)
    table = []
    with torch.inference_mode():
        base = ReservedCache(engine.num_layers, context_tokens + max(tokens) + 1)
        model(input_ids=ids, cache=base, use_cache=True, logits_to_keep=1)
        for b in rows:
            kv = [(layer.keys.expand(b, -1, -1, -1).contiguous(), layer.values.expand(b, -1, -1, -1).contiguous())
                  for layer in base.layers]
            cache = ReservedCache(engine.num_layers, context_tokens + max(tokens) + 1, kv)
            for t in tokens:
                mask = torch.ones((b, context_tokens + t), dtype=torch.long)
                pos = torch.arange(context_tokens, context_tokens + t).expand(b, -1)
                step = torch.randint(100, 20000, (b, t), generator=g)
                times = []
                for _ in range(repeats + 1):
                    t0 = time.perf_counter()
                    logits = model(input_ids=step, position_ids=pos, attention_mask=mask, cache=cache,
                                   use_cache=True).logits
                    times.append(time.perf_counter() - t0)
                    cache.truncate(context_tokens)
                table.append({"rows": b, "tokens": t, "seconds": round(statistics.median(times[1:]), 5),
                              "logits_sha256": hashlib.sha256(logits.float().numpy().tobytes()).hexdigest()[:16],
                              "loadavg": loadavg()[0]})
                print(model.config._attn_implementation, table[-1], flush=True)
    model.set_attn_implementation(before)
    import numpy as np

    x = np.array([[1.0, r["rows"], r["rows"] * r["tokens"]] for r in table])
    y = np.array([r["seconds"] for r in table])
    c0, c_row, c_tok = np.linalg.lstsq(x, y, rcond=None)[0]
    return {"context_tokens": context_tokens, "attention": attention or before, "table": table,
            "fit": {"c0": round(float(c0), 5), "c_row": round(float(c_row), 6), "c_tok": round(float(c_tok), 6)}}


class DrafterCounts(DecodeForwards):
    """Also keeps each forward's ``decode_drafters`` record (per drafter: rows, drafted, kept)."""

    def __init__(self) -> None:
        super().__init__()
        self.drafters: list[dict] = []

    def emit(self, record) -> None:
        super().emit(record)
        if getattr(record, "decode_forward", None) is not None:
            self.drafters.append(getattr(record, "decode_drafters", {}))


def spec_for(mode: str, base):
    """The engine's speculation settings for ``mode`` (``none``, ``ngram``, ``aligned``, ``both``, ``MODE:K``;
    ``MODE+learn``: the draft length learnt from measured forward times and earlier rows, ``draft_learning``)."""
    mode, learn, _ = mode.partition("+learn")
    if learn:
        return replace(spec_for(mode, base), learn=True)
    name, _, k = mode.partition(":")
    if name == "none":
        return replace(base, max_draft=0)
    spec = {"ngram": replace(base, aligned_draft=0), "aligned": replace(base, ngram=False),
            "both": base}[name]
    return replace(spec, max_draft=int(k), aligned_draft=int(k) if spec.aligned_draft else 0, adaptive=False) if k else spec


def mode_summary(result, wrapper: Lockstep, base=None) -> dict:
    """Figures of one read (``base``: the ``none`` read's summary, for speedup and identity)."""
    comps = result.completions or []
    drafted, accepted = sum(c.draft_tokens for c in comps), sum(c.accepted_tokens for c in comps)
    steps, tokens = sum(c.decode_steps for c in comps), sum(c.completion_tokens for c in comps)
    memory = [(s, c) for s, c in zip(result.steps, comps) if s.kind == "memory"]
    unchanged = [c.decode_steps for (s, c), (prev, _) in zip(memory[1:], memory) if s.memory == prev.memory]
    by_drafter: dict[str, list[int]] = {}
    for forward in wrapper.drafters:
        for name, counts in forward.items():
            acc = by_drafter.setdefault(name, [0, 0, 0])
            for j, x in enumerate(counts):
                acc[j] += x
    sec = wrapper.seconds
    n = len(result.steps)
    out = {
        "seconds_per_chunk": sum(sec[:-1]) / max(1, n - 1), "seconds_total": sum(sec),
        "acceptance": accepted / drafted if drafted else None,
        "tokens_per_step": tokens / steps if steps else None,
        "memory_tokens_per_forward": (sum(c.completion_tokens for _, c in memory) / sum(c.decode_steps for _, c in memory)
                                      if memory else None),
        "forwards_per_update": [c.decode_steps for _, c in memory],
        "unchanged_updates": len(unchanged), "unchanged_forwards": unchanged,
        "drafted": drafted, "accepted": accepted, "decode_steps": steps, "completion_tokens": tokens,
        "drafters": {k: dict(zip(("rows", "drafted", "kept"), v)) for k, v in by_drafter.items()},
        "seconds_each": [round(x, 3) for x in sec], "loadavg_each": wrapper.loads,
        "decode_forwards": [(k, round(t, 4)) for k, _b, _a, t in wrapper.forwards],
        "answer": result.response, "memories": [s.memory for s in result.steps],
    }
    if base is not None:
        out["speedup"] = base["seconds_total_chunks"] / sum(sec[:-1]) if sum(sec[:-1]) else None
        out["identical_steps"] = sum(a == b for a, b in zip(base["memories"], out["memories"]))
        out["differing_steps"] = [i for i, (a, b) in enumerate(zip(base["memories"], out["memories"])) if a != b]
    out["seconds_total_chunks"] = sum(sec[:-1])
    return out


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="auto", help="auto, bf16 or fp32 (greedy identity is exact in fp32)")
    ap.add_argument("--tokens", type=int, default=33_000, help="document length (small preset: ~1 chunk per 1K)")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--modes", default="none,both",
                    help="comma-separated: none, ngram, aligned, both; MODE:K drafts a fixed K tokens a step; "
                         "MODE+learn learns the draft length from forward times and earlier rows")
    ap.add_argument("--cost", action="store_true", help="also measure the forward cost table (B × t)")
    ap.add_argument("--no-read", action="store_true", help="only the cost table")
    add_threads_option(ap)
    return ap.parse_args()


def lockstep_engines(engine: Any, modes: list[str], forwards: DrafterCounts) -> dict[str, Lockstep]:
    """Per mode a copy of ``engine`` with the mode's speculation, wrapped so that all modes read in lockstep."""
    import copy

    lock = asyncio.Lock()
    wrapped = {}
    for mode in modes:
        e = copy.copy(engine)  # the model is shared; each mode its own cost model and acceptance priors
        e.speculation, e.cost, e.acceptance = spec_for(mode, engine.speculation), type(engine.cost)(), {}
        wrapped[mode] = Lockstep(e, lock, mode, forwards)
    return wrapped


def read_in_lockstep(args: argparse.Namespace, out: dict, modes: list[str], wrapped: dict[str, Lockstep],
                     headline: str, row: dict, config: Any, forwards: DrafterCounts) -> tuple[dict, list[dict], float]:
    """Every mode reads the document; after each headline step the figures so far go to --out.
    Returns the results by mode, the headline read's per-step figures and the wall seconds."""
    from memagent.agent import read_document

    results: dict = {}
    per_step: list[dict] = []

    def record(step, total) -> None:
        per_step.append({"step": step.step, "kind": step.kind, "drafted": step.draft_tokens,
                         "accepted": step.accepted_tokens, "completion_tokens": step.completion_tokens,
                         "seconds": wrapped[headline].seconds[-1] if wrapped[headline].seconds else None})
        out["per_step"] = per_step
        out["partial"] = {"seconds_each": {k: [round(x, 3) for x in w.seconds] for k, w in wrapped.items()}}
        write_json(args.out, out)  # partial results after every step
        print(f"step {step.step + 1}/{total}: drafted {step.draft_tokens} accepted {step.accepted_tokens} "
              f"tokens {step.completion_tokens} load {loadavg()[0]}", flush=True)

    async def read_all():
        async def one(label):
            results[label] = await read_document(wrapped[label], row["question"], row["context"], config,
                                                 keep_completions=True, on_step=record if label == headline else None)
        await asyncio.gather(*(one(m) for m in modes))

    t0 = time.perf_counter()
    with forwards:
        asyncio.run(read_all())
    return results, per_step, time.perf_counter() - t0


def mode_summaries(modes: list[str], results: dict, wrapped: dict[str, Lockstep]) -> dict:
    """Each mode's figures, against the ``none`` read's when there is one."""
    summaries: dict = {}
    base = None
    if "none" in modes:
        base = summaries["none"] = mode_summary(results["none"], wrapped["none"])
    for m in modes:
        if m != "none":
            summaries[m] = mode_summary(results[m], wrapped[m], base)
    return summaries


def write_results(args: argparse.Namespace, out: dict, config: Any, row: dict, headline: str, results: dict,
                  summaries: dict, per_step: list[dict], wall: float) -> None:
    """Write --out (the headline mode's figures on top) and print the modes' table."""
    head = summaries[headline]
    for s, c in zip(per_step, results[headline].completions or []):
        s["decode_steps"] = c.decode_steps
    out.update({
        "document": {"tokens": results[headline].context_tokens, "chunks": results[headline].n_chunks, "id": row["id"]},
        "preset": config.model_dump(include={"chunk_tokens", "memory_tokens", "answer_tokens"}),
        "headline": headline, "modes": summaries, "expected": row["answers"],
        **{k: head.get(k) for k in ("speedup", "identical_steps", "acceptance", "tokens_per_step",
                                     "memory_tokens_per_forward", "unchanged_forwards")},
        "steps": len(results[headline].steps),
        "wall_seconds": wall, "loadavg_end": loadavg(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "per_step": per_step,
    })
    out.pop("partial", None)
    write_json(args.out, out)
    print_table(["mode", "s / chunk", "speedup", "identical", "tok/fwd (memory)", "fwd/unchanged (median)",
                 "acceptance"], [
        [m, s["seconds_per_chunk"], s.get("speedup"), s.get("identical_steps"), s["memory_tokens_per_forward"],
         statistics.median(s["unchanged_forwards"]) if s["unchanged_forwards"] else None, s["acceptance"]]
        for m, s in summaries.items()])
    print(json.dumps({k: out[k] for k in ("headline", "speedup", "identical_steps", "steps", "acceptance",
                                           "memory_tokens_per_forward")}, indent=1))
    Path(args.out).touch()


def main() -> None:
    args = parse_args()
    threads = set_threads(args.threads)

    from memagent.config import preset
    from memagent.data.demo import niah_row
    from memagent.data.hotpotqa import count_tokens
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine

    engine = TransformersEngine.from_config(EngineConfig(model=args.model, dtype=args.dtype), name=args.model)
    out: dict = {"settings": {**vars(args), "threads": threads}, "machine": machine(), "loadavg_start": loadavg()}
    if args.cost:  # the engine's attention, then transformers' sdpa (which copies the cache per forward)
        out["forward_cost"] = forward_cost(engine)
        out["forward_cost_sdpa"] = forward_cost(engine, attention="sdpa")
        write_json(args.out, out)
    if args.no_read:
        return
    config = preset(args.preset)
    row = niah_row(0, args.tokens, depth=0.6, seed=23, count=functools.partial(count_tokens, engine.tokenizer))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    forwards = DrafterCounts()  # every read's decode forwards; each wrapper keeps its own
    wrapped = lockstep_engines(engine, modes, forwards)
    headline = "both" if "both" in modes else next((m for m in modes if m != "none"), modes[0])
    results, per_step, wall = read_in_lockstep(args, out, modes, wrapped, headline, row, config, forwards)
    summaries = mode_summaries(modes, results, wrapped)
    write_results(args, out, config, row, headline, results, summaries, per_step, wall)


if __name__ == "__main__":
    main()
