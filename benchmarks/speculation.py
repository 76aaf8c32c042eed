"""Prompt-lookup speculation on one long document, read alone by the packaged model.

    python -m benchmarks.speculation --out benchmarks/results/speculation.json

Generates one NIAH document of ``--tokens`` tokens (~32 chunks at the ``small`` preset) and
reads it twice with the same engine and model, speculation off and on. The two reads run in
lockstep (off's chunk i, then on's chunk i, ...; one call at a time), so both see the same load
on a shared CPU; each call is timed alone. Also measures the forward cost table behind the
adaptive draft length (``--cost``: B rows × t tokens over a ~1,100-token context).

Headline keys:
- ``speedup``: seconds per chunk without ÷ with speculation (target ≥ 1.6);
- ``identical_steps``: memory-update and answer steps whose text is the same in both reads;
- ``acceptance``: drafted tokens kept ÷ drafted; ``accepted_per_step``: kept drafted tokens per
  decode step; ``tokens_per_step``: completion tokens per decode step;
- ``per_step``: per conversation of the speculative read, (drafted, accepted,
  completion_tokens, decode_steps, seconds), written after every step (the latency-model
  engine fits its acceptance distribution from it).
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

    async def chat(self, messages, params):
        async with self.lock:
            t0, seen = time.perf_counter(), len(self.all_forwards.steps)
            reply = await self.inner.chat(messages, params)
            self.seconds.append(time.perf_counter() - t0)
            self.forwards.extend(self.all_forwards.steps[seen:])
            self.loads.append(loadavg()[0])
            await asyncio.sleep(0)  # let the other read take the lock next
            return reply

    def encode_chat(self, messages):
        return self.inner.encode_chat(messages)

    def count_chat_tokens(self, messages):
        return self.inner.count_chat_tokens(messages)


def forward_cost(engine, context_tokens: int = 1100, rows=(1, 4, 16), tokens=(1, 3, 9), repeats: int = 3) -> dict:
    """Median seconds of one forward of ``B × t`` tokens over a cache of ``context_tokens`` per row."""
    import torch

    from memagent.engines.kv_cache import ReservedCache

    model = engine.model
    ids = torch.randint(100, 20000, (1, context_tokens))
    table = []
    with torch.inference_mode():
        base = ReservedCache(engine.num_layers, context_tokens + 16)
        model(input_ids=ids, cache=base, use_cache=True, logits_to_keep=1)
        for b in rows:
            kv = [(layer.keys.expand(b, -1, -1, -1).contiguous(), layer.values.expand(b, -1, -1, -1).contiguous())
                  for layer in base.layers]
            cache = ReservedCache(engine.num_layers, context_tokens + 16, kv)
            for t in tokens:
                mask = torch.ones((b, context_tokens + t), dtype=torch.long)
                pos = torch.arange(context_tokens, context_tokens + t).expand(b, -1)
                times = []
                for _ in range(repeats + 1):
                    step = torch.randint(100, 20000, (b, t))
                    t0 = time.perf_counter()
                    model(input_ids=step, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True)
                    times.append(time.perf_counter() - t0)
                    cache.truncate(context_tokens)
                table.append({"rows": b, "tokens": t, "seconds": round(statistics.median(times[1:]), 5),
                              "loadavg": loadavg()[0]})
                print(table[-1], flush=True)
    import numpy as np

    x = np.array([[1.0, r["rows"], r["rows"] * r["tokens"]] for r in table])
    y = np.array([r["seconds"] for r in table])
    c0, c_row, c_tok = np.linalg.lstsq(x, y, rcond=None)[0]
    return {"context_tokens": context_tokens, "table": table,
            "fit": {"c0": round(float(c0), 5), "c_row": round(float(c_row), 6), "c_tok": round(float(c_tok), 6)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=33_000, help="document length (small preset: ~1 chunk per 1K)")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--cost", action="store_true", help="also measure the forward cost table (B × t)")
    ap.add_argument("--no-read", action="store_true", help="only the cost table")
    add_threads_option(ap)
    args = ap.parse_args()
    threads = set_threads(args.threads)

    from memagent.agent import read_document
    from memagent.config import preset
    from memagent.data.demo import niah_row
    from memagent.data.hotpotqa import count_tokens
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine

    engine = TransformersEngine.from_config(EngineConfig(model=args.model), name=args.model)
    out: dict = {"settings": {**vars(args), "threads": threads}, "machine": machine(), "loadavg_start": loadavg()}
    if args.cost:
        out["forward_cost"] = forward_cost(engine)
        write_json(args.out, out)
    if args.no_read:
        return
    config = preset(args.preset)
    row = niah_row(0, args.tokens, depth=0.6, seed=23, count=functools.partial(count_tokens, engine.tokenizer))
    import copy

    off = copy.copy(engine)  # the model and cost model are shared
    off.speculation = replace(engine.speculation, max_draft=0)
    on = engine  # the engine's defaults (EngineConfig's): speculation on
    lock = asyncio.Lock()
    forwards = DecodeForwards()  # both reads' decode forwards; each wrapper keeps its own
    wrapped = {"off": Lockstep(off, lock, "off", forwards), "on": Lockstep(on, lock, "on", forwards)}
    results: dict = {}
    per_step: list[dict] = []

    def record(step, total) -> None:
        per_step.append({"step": step.step, "kind": step.kind, "drafted": step.draft_tokens,
                         "accepted": step.accepted_tokens, "completion_tokens": step.completion_tokens,
                         "seconds": wrapped["on"].seconds[-1] if wrapped["on"].seconds else None})
        out["per_step"] = per_step
        out["partial"] = {"seconds_each": {k: [round(x, 3) for x in w.seconds] for k, w in wrapped.items()},
                          "decode_forwards_on": [(k, round(sec, 4)) for k, _b, _a, sec in wrapped["on"].forwards]}
        write_json(args.out, out)  # partial results after every step
        print(f"step {step.step + 1}/{total}: drafted {step.draft_tokens} accepted {step.accepted_tokens} "
              f"tokens {step.completion_tokens} load {loadavg()[0]}", flush=True)

    async def both():
        async def one(label):
            results[label] = await read_document(wrapped[label], row["question"], row["context"], config,
                                                 keep_completions=True, on_step=record if label == "on" else None)
        await asyncio.gather(one("off"), one("on"))

    t0 = time.perf_counter()
    with forwards:
        asyncio.run(both())
    wall = time.perf_counter() - t0
    a, b = results["off"], results["on"]
    for s, c in zip(per_step, b.completions or []):
        s["decode_steps"] = c.decode_steps
    identical = sum(x.memory == y.memory for x, y in zip(a.steps, b.steps))
    comps = b.completions or []
    drafted, accepted = sum(c.draft_tokens for c in comps), sum(c.accepted_tokens for c in comps)
    steps, tokens = sum(c.decode_steps for c in comps), sum(c.completion_tokens for c in comps)
    sec_off, sec_on = wrapped["off"].seconds, wrapped["on"].seconds
    n = len(a.steps)
    out.update({
        "document": {"tokens": a.context_tokens, "chunks": a.n_chunks, "id": row["id"]},
        "preset": config.model_dump(include={"chunk_tokens", "memory_tokens", "answer_tokens"}),
        "seconds_per_chunk": {"off": sum(sec_off[:-1]) / max(1, n - 1), "on": sum(sec_on[:-1]) / max(1, n - 1)},
        "seconds_total": {"off": sum(sec_off), "on": sum(sec_on)},
        "speedup": sum(sec_off[:-1]) / sum(sec_on[:-1]),
        "speedup_per_step_median": statistics.median(x / y for x, y in zip(sec_off, sec_on)),
        "identical_steps": identical, "steps": n,
        "differing_steps": [i for i, (x, y) in enumerate(zip(a.steps, b.steps)) if x.memory != y.memory],
        "answers": {"off": a.response, "on": b.response, "expected": row["answers"]},
        "acceptance": accepted / drafted if drafted else None,
        "accepted_per_step": accepted / steps if steps else None,
        "tokens_per_step": tokens / steps if steps else None,
        "drafted": drafted, "accepted": accepted, "decode_steps": steps, "completion_tokens": tokens,
        "completion_tokens_off": sum(c.completion_tokens for c in a.completions or []),
        "seconds_each": {"off": [round(x, 3) for x in sec_off], "on": [round(x, 3) for x in sec_on]},
        "loadavg_each": wrapped["on"].loads,
        "decode_forwards_on": [(k, round(sec, 4)) for k, _b, _a, sec in wrapped["on"].forwards],
        "cost_model": {"c0": engine.cost.c0, "c_row": engine.cost.c_row, "c_tok": engine.cost.c_tok},
        "wall_seconds": wall, "loadavg_end": loadavg(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "per_step": per_step,
    })
    out.pop("partial", None)
    write_json(args.out, out)
    print_table(["", "off", "on"], [
        ["s / chunk", out["seconds_per_chunk"]["off"], out["seconds_per_chunk"]["on"]],
        ["completion tokens", out["completion_tokens_off"], tokens],
    ])
    print(json.dumps({k: out[k] for k in ("speedup", "identical_steps", "steps", "acceptance", "accepted_per_step",
                                           "tokens_per_step")}, indent=1))
    Path(args.out).touch()


if __name__ == "__main__":
    main()
