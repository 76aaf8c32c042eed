"""Shared bits of the benchmark scripts: machine description, timing, JSON out, tables, a tiny model.

Benchmarks are measurements, never assertions: each script writes one JSON file (headline
figure under a documented key, raw timings, settings, this machine) and prints a short table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

# No network, nothing from a hub; local Ray on loopback (set before ray is imported).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
import pipelines  # noqa: E402,F401 - a local Ray binds 127.0.0.1 (set before ray is imported)


def cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), platform.processor())


def cpu_flags() -> list[str]:
    """The SIMD flags that decide matmul speed (AVX2/AVX512/AMX/bf16)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    return sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))


def machine() -> dict:
    """Cores, CPU model, torch version and threads, and the load average (1/5/15 min) right now."""
    import torch

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "simd": cpu_flags(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "python": platform.python_version(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def timed(fn: Callable[[], Any], repeats: int = 3, warmup: int = 1) -> dict:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` times; seconds of each and their median.

    Returns ``{"seconds": [...], "median": m, "min": ..., "max": ..., "result": last return value}``.
    """
    for _ in range(warmup):
        fn()
    seconds = []
    result = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - t0)
    return {"seconds": [round(s, 6) for s in seconds], "median": statistics.median(seconds),
            "min": min(seconds), "max": max(seconds), "result": result}


class DecodeForwards(logging.Handler):
    """The hf decode loop's DEBUG records, collected: ``steps`` holds one (k, rows, active rows,
    seconds) per decode forward while the handler is attached (``with DecodeForwards() as f:``)."""

    LOGGER = "memagent.engines.hf_decode"

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.steps: list[tuple[int, int, int, float]] = []
        self._level = logging.NOTSET

    def emit(self, record: logging.LogRecord) -> None:
        step = getattr(record, "decode_forward", None)
        if step is not None:
            self.steps.append(step)

    def __enter__(self) -> DecodeForwards:
        logger = logging.getLogger(self.LOGGER)
        self._level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logger = logging.getLogger(self.LOGGER)
        logger.removeHandler(self)
        logger.setLevel(self._level)


def batch_mean(sizes: Mapping[int, int]) -> float:
    """Mean requests per forward of an engine's ``stats.batch_sizes`` ({size: forwards})."""
    return sum(size * n for size, n in sizes.items()) / max(1, sum(sizes.values()))


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs)


def write_json(path: str | Path, data: dict) -> Path:
    """Write ``data`` (plus ``machine`` if absent) to ``path`` as indented JSON; returns the path."""
    data = dict(data)
    data.setdefault("machine", machine())
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")  # benchmarks rewrite their results as they go: a kill keeps the last
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    tmp.replace(out)
    return out


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table of ``rows`` under ``headers``."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    print("\n" + table(headers, rows) + "\n", flush=True)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def build_tiny_llama(out_dir: str | Path, tokenizer_dir: str | Path | None = None, *, hidden_size: int = 64,
                     layers: int = 2, max_position_embeddings: int = 8192, seed: int = 0) -> Path:
    """A small random Llama with SmolLM2's tokenizer and chat template (as tests/conftest.py builds).

    Its replies are random tokens, so every memory update runs to the ``memory_tokens`` cap:
    each chunk costs the same, which is what a linearity measurement wants. Returns ``out_dir``.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from memagent.models import resolve_model

    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir or resolve_model("smollm2-135m")))
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=2 * hidden_size, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_position_embeddings,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def resolve_bench_model(name: str, work: str | Path) -> tuple[Path, str]:
    """``"tiny"`` builds the tiny random Llama under ``work``; anything else goes through resolve_model."""
    if name == "tiny":
        return build_tiny_llama(Path(work) / "tiny-llama"), "tiny-llama (2 layers, 64 wide, random)"
    from memagent.models import resolve_model

    return resolve_model(name), name


def bench_model(name: str) -> str:
    """A model name for EngineConfig: ``"tiny"`` becomes a freshly built tiny Llama's directory."""
    if name != "tiny":
        return name
    import tempfile

    return str(build_tiny_llama(Path(tempfile.mkdtemp(prefix="bench-tiny-")) / "tiny-llama"))


def add_threads_option(parser: argparse.ArgumentParser) -> None:
    """``--threads N``: torch threads for the run (on a shared CPU, 1 is often fastest)."""
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, = cores)")


def set_threads(n: int | None) -> int:
    """``torch.set_num_threads(n)`` when given; returns the thread count in use."""
    import torch

    if n:
        torch.set_num_threads(n)
    return torch.get_num_threads()


def niah_docs(tokenizer: Any, n: int, tokens: int) -> list[dict]:
    """The benchmark documents: ``n`` NIAH rows of ``tokens`` tokens, needles at spread depths.

    concurrency and pipeline read the same set, so their timings compare.
    """
    import functools

    from memagent.data.demo import niah_row
    from memagent.data.hotpotqa import count_tokens

    count = functools.partial(count_tokens, tokenizer)
    return [niah_row(i, tokens, depth=(i % 8 + 1) / 9, seed=11, count=count) for i in range(n)]
