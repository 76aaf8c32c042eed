"""Does the same greedy request get the same reply? Distinct replies among identical requests.

    python -m benchmarks.greedy_repeat --out benchmarks/results/greedy_repeat.json
    python -m benchmarks.greedy_repeat --configs default,learn,nospec --requests 20 --companions 8 \
        --out benchmarks/results/greedy_repeat.json

For each engine configuration (``default``: the flags' defaults; ``learn``: ``--draft-learning``,
the draft length learnt from forward times and earlier rows, as before issue 53; ``nospec``:
``--no-speculate``; ``fp32``: ``--dtype fp32``) one engine on the packaged model answers:

- ``alone``: ``--requests`` identical greedy requests, one at a time;
- ``crowded``: the same request ``--requests`` times, each beside ``--companions`` other requests
  sent at the same moment (one batch; the companions' prompts and lengths change from one
  repetition to the next, as a server's traffic does);
- ``together``: the same request ``--together`` at once (one batch of identical rows), ``--requests``
  replies in all;
- ``seeded``: ``--seeded`` identical requests at temperature 1 with one ``seed``, one at a time.

``--measures`` picks some of them (default all). ``--ops`` also measures why a batch can change a
row's bits (``ops``): per linear shape of the model, the matmul sizes (rows of the product) whose row 0
differs from the same row multiplied alone (``matmul_rows_differing``), and the logits of one
sequence alone against the same sequence left-padded in a batch (``padding``: positions differing,
largest difference).

Headline keys (``configs[name]``): ``alone_distinct``, ``crowded_distinct`` (distinct target replies
among the crowded ones), ``crowded_like_alone`` (crowded replies equal to the first alone reply),
``together_distinct``, ``together_like_alone``, ``seeded_distinct``; ``alone_seconds`` (median seconds of one alone request) and ``alone_decode_steps``.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import time

from benchmarks.common import add_threads_option, loadavg, machine, print_table, set_threads, write_json

TARGET = [{"role": "user", "content": "Write a short story about a robot who learns to paint. "
                                      "Then list five colors it loves."}]
TOPICS = ["the history of bread", "how tides work", "a day in a lighthouse", "why cats purr", "the moon landing",
          "learning the violin", "a recipe for soup", "the rules of chess", "how bees make honey", "winter in Oslo",
          "the water cycle", "building a bridge"]
CONFIGS = {"default": {}, "learn": {"draft_learning": True}, "nospec": {"speculate": False},
           "fp32": {"dtype": "fp32"}}


def companions(rep: int, n: int) -> list[tuple[list[dict[str, str]], int]]:
    """Repetition ``rep``'s ``n`` other requests: messages and max_tokens, different each repetition."""
    out = []
    for j in range(n):
        topic = TOPICS[(rep + j) % len(TOPICS)]
        words = " Please be detailed." * ((rep * 3 + j) % 5)
        out.append(([{"role": "user", "content": f"Tell me about {topic}.{words}"}], 24 + 8 * ((rep + j) % 7)))
    return out


def alone(engine, args, params) -> tuple[list, list[float]]:
    """``--requests`` replies to the target, one request at a time, and their seconds."""
    replies, seconds = [], []
    for _ in range(args.requests):
        t0 = time.perf_counter()
        replies.append(asyncio.run(engine.chat(TARGET, params)))
        seconds.append(time.perf_counter() - t0)
        print(f"alone {len(replies)}: {seconds[-1]:.2f} s, load {loadavg()[0]}", flush=True)
    return replies, seconds


def crowded(engine, args, params) -> list:
    """The target's replies, each sent beside ``--companions`` others (different each repetition)."""
    from memagent.engines import SamplingParams

    async def once(rep: int):
        others = [engine.chat(m, SamplingParams(max_tokens=n)) for m, n in companions(rep, args.companions)]
        return (await asyncio.gather(engine.chat(TARGET, params), *others))[0]

    return [asyncio.run(once(rep)) for rep in range(args.requests)]


def together(engine, args, params) -> list:
    """``--requests`` replies to the target, ``--together`` sent at once each time."""
    async def once():
        return await asyncio.gather(*(engine.chat(TARGET, params) for _ in range(args.together)))

    return [c for _ in range(max(1, args.requests // args.together)) for c in asyncio.run(once())]


def matmul_rows_differing(dtype, sizes=range(1, 200, 3)) -> dict[str, list[int]]:
    """Per ``in x out`` linear shape of the packaged model: the row counts M at which row 0 of ``x[:M] @ W``
    differs from ``x[:1] @ W`` (random weights and inputs; the kernel decides, not the values)."""
    import torch

    torch.manual_seed(0)
    out = {}
    for k, n in ((576, 192), (576, 576), (576, 1536), (1536, 576), (576, 49152)):
        w, x = torch.randn(n, k, dtype=dtype) / 30, torch.randn(max(sizes), k, dtype=dtype)
        ref = torch.nn.functional.linear(x[:1], w)
        out[f"{k}x{n}"] = [m for m in sizes if (torch.nn.functional.linear(x[:m], w)[:1] != ref).any()]
    return out


def padding(engine, pads=(1, 5, 17, 40), length: int = 30) -> list[dict]:
    """One random sequence's logits alone vs left-padded by ``pad`` beside a longer row (mask, positions)."""
    import torch

    torch.manual_seed(0)
    a = torch.randint(100, 40000, (1, length))
    with torch.inference_mode():
        base = engine.model(input_ids=a).logits[0]
        rows = []
        for pad in pads:
            ids = torch.cat([torch.cat([torch.zeros(1, pad, dtype=torch.long), a], 1),
                             torch.randint(100, 40000, (1, length + pad))])
            mask = torch.ones(2, length + pad, dtype=torch.long)
            mask[0, :pad] = 0
            logits = engine.model(input_ids=ids, attention_mask=mask,
                                  position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits[0, pad:]
            rows.append({"pad": pad, "differing": int((logits != base).sum()),
                         "max_abs": float((logits.float() - base.float()).abs().max())})
    return rows


def distinct(replies: list) -> int:
    return len({tuple(c.token_ids) for c in replies})


def measure(engine, args) -> dict:
    """The measures of one engine (module docstring) that ``--measures`` names."""
    from memagent.engines import SamplingParams

    greedy = SamplingParams(max_tokens=args.max_tokens)
    out: dict = {}
    if args.ops:
        out["ops"] = {"matmul_rows_differing": matmul_rows_differing(engine.dtype), "padding": padding(engine)}
    single, seconds = alone(engine, args, greedy)
    first = tuple(single[0].token_ids)
    if "alone" in args.measures:
        out |= {"alone_distinct": distinct(single), "alone_seconds": statistics.median(seconds),
                "alone_seconds_each": [round(s, 3) for s in seconds],
                "alone_decode_steps": [c.decode_steps for c in single],
                "completion_tokens": single[0].completion_tokens, "alone_reply": single[0].text}
    if "crowded" in args.measures:
        replies = crowded(engine, args, greedy)
        out |= {"crowded_distinct": distinct(replies), "crowded_like_alone": sum(tuple(c.token_ids) == first
                                                                                  for c in replies),
                "crowded_decode_steps": [c.decode_steps for c in replies]}
    if "together" in args.measures:
        replies = together(engine, args, greedy)
        out |= {"together_distinct": distinct(replies),
                "together_like_alone": sum(tuple(c.token_ids) == first for c in replies)}
    if "seeded" in args.measures:
        sampled = SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=7)
        out["seeded_distinct"] = distinct([asyncio.run(engine.chat(TARGET, sampled)) for _ in range(args.seeded)])
    return {**out, "loadavg_end": loadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--configs", default="default,learn,nospec", help=f"comma-separated of {', '.join(CONFIGS)}")
    ap.add_argument("--requests", type=int, default=20, help="identical requests alone, and crowded")
    ap.add_argument("--companions", type=int, default=8, help="other requests beside each crowded one")
    ap.add_argument("--seeded", type=int, default=10, help="identical seeded temperature-1 requests")
    ap.add_argument("--together", type=int, default=4, help="identical requests sent at once (together)")
    ap.add_argument("--ops", action="store_true", help="also measure the ops that make a batch change a row")
    ap.add_argument("--measures", default="alone,crowded,together,seeded",
                    help="comma-separated of alone, crowded, together, seeded (alone always runs: the reference)")
    ap.add_argument("--max-tokens", type=int, default=96)
    add_threads_option(ap)
    args = ap.parse_args()
    args.measures = [m.strip() for m in args.measures.split(",") if m.strip()]
    threads = set_threads(args.threads)

    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine

    out: dict = {"settings": {**vars(args), "threads": threads}, "machine": machine(), "loadavg_start": loadavg(),
                 "configs": {}}
    for name in [c.strip() for c in args.configs.split(",") if c.strip()]:
        engine = TransformersEngine.from_config(EngineConfig(model=args.model, **CONFIGS[name]), name=args.model)
        out["configs"][name] = {"dtype": str(engine.dtype), **measure(engine, args)}
        out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        write_json(args.out, out)  # after every configuration: a kill keeps what was measured
    n = args.requests
    print_table(["config", "dtype", f"alone distinct / {n}", f"crowded distinct / {n}", "crowded = alone",
                 f"together distinct / {n}", f"seeded distinct / {args.seeded}", "s / request alone", "forwards alone"],
                [[name, c["dtype"], c.get("alone_distinct"), c.get("crowded_distinct"), c.get("crowded_like_alone"),
                  c.get("together_distinct"), c.get("seeded_distinct"), c.get("alone_seconds"),
                  statistics.median(c["alone_decode_steps"]) if "alone_decode_steps" in c else None]
                 for name, c in out["configs"].items()])

if __name__ == "__main__":
    main()
