"""CPU roofline vs the engine: matmul GFLOP/s and memory bandwidth, and what prefill/decode achieve.

    python -m benchmarks.roofline --out benchmarks/results/roofline.json

Measured in one run: fp32 (and bf16) ``torch.matmul`` of square matrices (torch's default
threads), read bandwidth (sum of a large fp32 tensor) and copy bandwidth; then the engine's
prefill and decode through its real path (``engine.chat`` -> ``model.generate``), timed by
wrapping ``model.forward``: prefill runs up to the first forward over the whole batch (the
engine may prefill rows one by one first, see ``ForwardTimer.split``), each later forward is a
decode step (the step *interval*, forward start to forward start, includes generate's own
per-step work).

Headline keys:
- ``matmul_gflops_fp32``: median GFLOP/s of an N x N fp32 matmul;
- ``bandwidth_gbs``: median read bandwidth (GB/s, 1e9 bytes);
- ``prefill_fraction``: {batch: achieved prefill FLOP/s / matmul_gflops_fp32}, with prefill FLOPs
  = 2 x matmul params x prompt tokens (matmul params = all weights but the input embedding; the
  tied LM head runs on the last position only, so it is left out; attention's L^2 term is
  reported separately, not counted);
- ``decode_fraction``: {batch: (weight bytes / decode step interval) / bandwidth_gbs}; the same
  with the KV cache bytes each step reads is under ``decode_fraction_with_kv``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import statistics
import time
from typing import Any

from benchmarks.common import (
    add_threads_option,
    bench_model,
    loadavg,
    machine,
    print_table,
    set_threads,
    timed,
    write_json,
)


def matmul_gflops(n: int, dtype, repeats: int) -> dict:
    import torch

    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    t = timed(lambda: torch.matmul(a, b), repeats=repeats, warmup=1)
    return {"n": n, "dtype": str(dtype), "seconds": t["seconds"], "median_s": t["median"],
            "gflops": 2 * n**3 / t["median"] / 1e9}


def bandwidth(mb: int, repeats: int) -> dict:
    import torch

    x = torch.ones(mb * 2**20 // 4, dtype=torch.float32)
    y = torch.empty_like(x)
    nbytes = x.numel() * 4
    read = timed(lambda: x.sum(), repeats=repeats, warmup=1)
    copy = timed(lambda: y.copy_(x), repeats=repeats, warmup=1)
    return {"bytes": nbytes, "read_seconds": read["seconds"], "copy_seconds": copy["seconds"],
            "read_gbs": nbytes / read["median"] / 1e9, "copy_gbs": 2 * nbytes / copy["median"] / 1e9}


class ForwardTimer:
    """Wraps ``model.forward``: records (start, end, input length) of every call."""

    def __init__(self, model):
        self.model, self.calls = model, []
        self._orig = model.forward

        @functools.wraps(self._orig)
        def forward(*args, **kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            t0 = time.perf_counter()
            out = self._orig(*args, **kwargs)
            self.calls.append((t0, time.perf_counter(), tuple(ids.shape) if ids is not None else None))
            return out

        model.forward = forward

    def restore(self) -> None:
        self.model.forward = self._orig

    def split(self) -> dict:
        """Prefill seconds and decode step intervals / forward seconds.

        Prefill runs up to the first forward over the whole batch: one padded forward, or, when
        the engine prefills rows one by one (CPU, prompts of different lengths), the per-row
        forwards plus the batch pass over each row's last prompt token. Later calls are decode.
        """
        batch = max(c[2][0] for c in self.calls)
        first = next(i for i, c in enumerate(self.calls) if c[2][0] == batch)
        steps = self.calls[first + 1:]
        intervals = [b[0] - a[0] for a, b in itertools.pairwise(steps)]
        return {"prefill_s": self.calls[first][1] - self.calls[0][0], "prefill_forwards": first + 1,
                "prefill_shapes": [c[2] for c in self.calls[: first + 1]],
                "decode_forward_s": [round(c[1] - c[0], 5) for c in steps],
                "decode_interval_s": [round(x, 5) for x in intervals]}


async def engine_pass(engine, prompts: list[list[dict]], max_tokens: int):
    from memagent.engines.base import SamplingParams

    params = SamplingParams(max_tokens)
    return await asyncio.gather(*(engine.chat(m, params) for m in prompts))


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="document chunk tokens in each prompt")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--decode-steps", type=int, default=24)
    parser.add_argument("--matmul-n", type=int, default=2048)
    parser.add_argument("--bf16-n", type=int, default=512, help="bf16 is ~100x slower without AVX512-BF16/AMX")
    parser.add_argument("--bandwidth-mb", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="runs/bench/roofline.json")
    add_threads_option(parser)
    return parser.parse_args()


def measure_roofs(args: argparse.Namespace) -> dict:
    """The fp32 matmul rate at torch's default threads and at --threads, the bf16 matmul rate, and bandwidth."""
    import torch

    default_threads = torch.get_num_threads()
    mm32_default = matmul_gflops(args.matmul_n, torch.float32, args.repeats)
    print(f"fp32 matmul n={args.matmul_n}, {default_threads} threads: {mm32_default['gflops']:.1f} GFLOP/s", flush=True)
    threads = set_threads(args.threads)
    mm32 = mm32_default if threads == default_threads else matmul_gflops(args.matmul_n, torch.float32, args.repeats)
    print(f"fp32 matmul n={args.matmul_n}, {threads} threads: {mm32['gflops']:.1f} GFLOP/s", flush=True)
    mm16 = matmul_gflops(args.bf16_n, torch.bfloat16, max(2, args.repeats // 2))
    print(f"bf16 matmul n={args.bf16_n}: {mm16['gflops']:.2f} GFLOP/s", flush=True)
    bw = bandwidth(args.bandwidth_mb, args.repeats)
    print(f"bandwidth: read {bw['read_gbs']:.1f} GB/s, copy {bw['copy_gbs']:.1f} GB/s", flush=True)
    return {"default_threads": default_threads, "threads": threads, "mm32_default": mm32_default, "mm32": mm32,
            "mm16": mm16, "bw": bw}


def model_sizes(model: Any) -> dict:
    """The model's parameter counts, weight bytes, and KV-cache bytes per token."""
    params_total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    cfg = model.config
    kv_bytes_per_token = (2 * cfg.num_hidden_layers * cfg.num_key_value_heads
                          * (cfg.hidden_size // cfg.num_attention_heads) * next(model.parameters()).element_size())
    return {"params_total": params_total, "params_matmul": params_total - embed,
            "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "kv_bytes_per_token": kv_bytes_per_token}


def batch_run(engine: Any, prompts: list[list[dict]], b: int, args: argparse.Namespace, sizes: dict,
              peak_flops: float, peak_bw: float) -> dict:
    """One engine pass over ``b`` prompts, timed by forward: prefill FLOP/s and decode bytes/s against the roofs."""
    model, params_matmul, weight_bytes = engine.model, sizes["params_matmul"], sizes["weight_bytes"]
    cfg = model.config
    timer = ForwardTimer(model)
    t0 = time.perf_counter()
    out = asyncio.run(engine_pass(engine, prompts[:b], args.decode_steps))
    wall = time.perf_counter() - t0
    timer.restore()
    s = timer.split()
    prompt_len = max(c.prompt_tokens for c in out)  # the batch cache is left-padded to it
    real_tokens = sum(c.prompt_tokens for c in out)
    flops = 2 * params_matmul * real_tokens
    attn_flops = 2 * 2 * cfg.num_hidden_layers * cfg.hidden_size * sum(c.prompt_tokens**2 for c in out) / 2
    step = statistics.median(s["decode_interval_s"])
    fwd = statistics.median(s["decode_forward_s"])
    kv_bytes = sizes["kv_bytes_per_token"] * b * (prompt_len + args.decode_steps / 2)
    run = {
        "batch": b, "prompt_tokens_padded": prompt_len, "prompt_tokens_real": real_tokens, "wall_s": round(wall, 3),
        "prefill_s": round(s["prefill_s"], 4), "prefill_forwards": s["prefill_forwards"], "prefill_flops": flops,
        "attention_flops_not_counted": attn_flops,
        "prefill_gflops": flops / s["prefill_s"] / 1e9, "prefill_fraction": flops / s["prefill_s"] / peak_flops,
        "decode_steps": len(s["decode_forward_s"]), "decode_step_interval_median_s": step,
        "decode_forward_median_s": fwd, "decode_interval_s": s["decode_interval_s"],
        "decode_forward_s": s["decode_forward_s"],
        "weight_bytes_per_step": weight_bytes, "kv_bytes_per_step_mean": kv_bytes,
        "decode_weight_gbs": weight_bytes / step / 1e9, "decode_fraction": weight_bytes / step / peak_bw,
        "decode_fraction_with_kv": (weight_bytes + kv_bytes) / step / peak_bw,
        "decode_tokens_per_s": b / step,
    }
    print(f"batch {b}: prefill {run['prefill_s']:.2f}s ({run['prefill_gflops']:.1f} GFLOP/s), "
          f"decode step {step * 1000:.1f} ms (forward {fwd * 1000:.1f} ms)", flush=True)
    return run


def write_results(args: argparse.Namespace, engine: Any, batches: list[int], roofs: dict, sizes: dict,
                  runs: list[dict], load_start: list[float]) -> None:
    """Write --out and print the roofs beside what prefill and decode achieved."""
    mm32, mm16, bw, threads = roofs["mm32"], roofs["mm16"], roofs["bw"], roofs["threads"]
    result = {
        "benchmark": "roofline",
        "matmul_gflops_fp32": round(mm32["gflops"], 2),
        "matmul_gflops_bf16": round(mm16["gflops"], 3),
        "bandwidth_gbs": round(bw["read_gbs"], 2),
        "copy_bandwidth_gbs": round(bw["copy_gbs"], 2),
        "prefill_fraction": {str(r["batch"]): round(r["prefill_fraction"], 3) for r in runs},
        "decode_fraction": {str(r["batch"]): round(r["decode_fraction"], 3) for r in runs},
        "decode_fraction_with_kv": {str(r["batch"]): round(r["decode_fraction_with_kv"], 3) for r in runs},
        "settings": {"model": args.model, "dtype": str(engine.dtype), "chunk_tokens": args.prompt_tokens,
                     "batches": batches, "decode_steps": args.decode_steps, "matmul_n": args.matmul_n,
                     "bf16_n": args.bf16_n, "threads": threads,
                     "roofs": "matmul and bandwidth at the engine's thread count (fp32 also at torch's default)",
                     "bandwidth_mb": args.bandwidth_mb, "repeats": args.repeats,
                     "flops_definition": "2 x matmul params (all but input embedding) x real prompt tokens",
                     "decode_bytes_definition": "all weight bytes (tied LM head read in full) per step interval"},
        "model": sizes,
        "matmul_fp32": mm32, "matmul_fp32_default_threads": roofs["mm32_default"],
        "matmul_gflops_fp32_default_threads": round(roofs["mm32_default"]["gflops"], 2),
        "default_threads": roofs["default_threads"],
        "threads": threads, "matmul_bf16": mm16, "bandwidth": bw, "engine_runs": runs,
        "loadavg_start": load_start, "loadavg_end": loadavg(), "machine": machine(),
    }
    out = write_json(args.out, result)
    print_table(["measure", "value", "fraction of roof"], [
        ["fp32 matmul GFLOP/s", result["matmul_gflops_fp32"], ""],
        ["bf16 matmul GFLOP/s", result["matmul_gflops_bf16"], ""],
        ["read bandwidth GB/s", result["bandwidth_gbs"], ""],
        *[[f"prefill GFLOP/s, batch {r['batch']}", round(r["prefill_gflops"], 2), round(r["prefill_fraction"], 3)]
          for r in runs],
        *[[f"decode weight GB/s, batch {r['batch']}", round(r["decode_weight_gbs"], 2), round(r["decode_fraction"], 3)]
          for r in runs],
    ])
    print(f"load average {result['loadavg_end']}; wrote {out}")


def main() -> None:
    args = parse_args()

    from memagent.agent import check_config
    from memagent.config import preset
    from memagent.data.demo import niah_row
    from memagent.data.hotpotqa import count_tokens
    from memagent.engines import EngineConfig, make_engine
    from memagent.prompts import NO_MEMORY, memory_update_messages

    load_start = loadavg()
    roofs = measure_roofs(args)
    peak_flops = roofs["mm32"]["gflops"] * 1e9
    peak_bw = roofs["bw"]["read_gbs"] * 1e9

    batches = [int(x) for x in args.batches.split(",")]
    engine = make_engine(EngineConfig(model=bench_model(args.model), dtype=args.dtype, max_batch_size=max(batches)))
    check_config(engine, preset("small"))
    sizes = model_sizes(engine.model)
    count = functools.partial(count_tokens, engine.tokenizer)
    rows = [niah_row(i, args.prompt_tokens, depth=0.5, seed=3, count=count) for i in range(max(batches))]
    prompts = [memory_update_messages(r["question"], NO_MEMORY, r["context"]) for r in rows]
    asyncio.run(engine_pass(engine, prompts[:1], 2))  # warm-up (first-call kernel setup)

    runs = [batch_run(engine, prompts, b, args, sizes, peak_flops, peak_bw) for b in batches]
    write_results(args, engine, batches, roofs, sizes, runs, load_start)


if __name__ == "__main__":
    main()
