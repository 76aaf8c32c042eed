"""What grounding a record value costs when the text does not hold it, at a 1M-token document.

    nice python -m benchmarks.grounding_cost --out benchmarks/results/grounding_cost.json

Generates a ledger-like document of about ``--tokens`` tokens (SmolLM2's tokenizer counts them):
sentences naming payers, amounts in many spellings (``1,037.50``, ``1.037,50 EUR``, ``1 037,50`` with
U+00A0, ``(1,037.50)``) and dates. A records call reads one chunk of ``--chunk-tokens`` in the middle,
with a memory of ``--memory-chars`` behind it. For values stated nowhere (a string, a number, a date;
each one new, as a model's are) it times :func:`memagent.extraction.record_grounding.ground_value`:

- ``default``: the window, then the memory (``ground_elsewhere`` off, the default);
- ``elsewhere``: then the whole document too (``--ground-elsewhere``);

each after the document's scan is cached, and the scan itself (numbers and dates, once per document:
``scan_seconds``) with the bytes the cache holds for it (``cache_bytes``: the text and the scan).

Headline keys: ``default_ms`` per kind (median ms per unfound value; target <= 5 each, ``met``),
``elsewhere_ms`` per kind, ``scan_seconds``, ``cache_bytes``; ``peak_rss_mb`` and ``grounding_rss_mb``
(the peak's growth while grounding; MB = 2^20 bytes),
``loadavg`` before and after, ``uptime`` and ``lscpu`` (model, flags) beside them. Also writes the
markdown table next to the JSON (``.md``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import resource
import statistics
import subprocess
import time
from typing import Any, Callable

from benchmarks.common import loadavg, machine, table, write_json

PAYERS = ["Harlow Freight Ltd", "Kestrel Logistics", "Birch & Sons", "Acme Holdings", "Cedar Trading GmbH",
          "Dune Shipping SA", "Orchid Imports", "Raven Maritime", "Walnut Textiles", "Summit Foods plc"]
TEMPLATES = [
    "On {date} {payer} paid {amount} for storage.",
    "{payer} was invoiced {amount} on {date}; the invoice is due in 30 days.",
    "The balance of {payer} stood at {amount} at {date}.",
    "A credit note of {amount} was issued to {payer} ({date}).",
    "The warehouse was inspected on {date} and no damage was found.",
    "Pallets are stacked four high in aisle 7 of the north hall.",
]


def amount(rng: random.Random) -> str:
    """An amount in one of the spellings users write."""
    whole, cents = rng.randint(1, 99_999), rng.randint(0, 99)
    grouped = f"{whole:,}"
    return rng.choice([
        f"{grouped}.{cents:02d}", f"USD {grouped}.{cents:02d}", f"${grouped}.{cents:02d}",
        f"EUR {grouped.replace(',', '.')},{cents:02d}", f"{grouped.replace(',', chr(0xa0))},{cents:02d}\u00a0EUR",
        f"CHF {grouped.replace(',', chr(39))}.{cents:02d}", f"({grouped}.{cents:02d})", f"{whole}",
    ])


def date(rng: random.Random) -> str:
    d = dt.date(2015, 1, 1) + dt.timedelta(days=rng.randint(0, 3000))
    return rng.choice([d.isoformat(), f"{d:%B} {d.day}, {d.year}", f"{d:%d.%m.%Y}", f"{d.day} {d:%b} {d.year}"])


def document(tokens: int, count: Callable[[str], int], seed: int = 0) -> tuple[str, int]:
    """At least ``tokens`` tokens of generated ledger sentences, in blocks of 2,000 (each generated anew, so
    the scan meets as many distinct spellings as a real ledger of that length), and their token count (the
    blocks' sum: counting the whole text at once would set the process's peak memory)."""
    rng = random.Random(seed)
    blocks, total = [], 0
    while total < tokens:
        blocks.append(" ".join(rng.choice(TEMPLATES).format(payer=rng.choice(PAYERS), amount=amount(rng),
                                                            date=date(rng)) for _ in range(2000)))
        total += count(blocks[-1])
    return " ".join(blocks), total


def median_ms(fn: Callable[[int], Any], repeats: int) -> dict[str, Any]:
    """``fn(i)`` for ``i`` in range(repeats), each timed: median, min and max in ms."""
    ms = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(i)
        ms.append((time.perf_counter() - t0) * 1000)
    return {"median": round(statistics.median(ms), 3), "min": round(min(ms), 3), "max": round(max(ms), 3)}


def unfound(kind: str, i: int) -> Any:
    """A value of ``kind`` the document never states, new each time (as a model's values are)."""
    return {"string": f"Zephyr Maritime Group {i}", "number": 987_654.25 + i,
            "date": (dt.date(1990, 1, 1) + dt.timedelta(days=i)).isoformat()}[kind]


def _shell(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def lscpu() -> dict[str, str]:
    """lscpu's model name and flags."""
    rows = dict(line.split(":", 1) for line in _shell(["lscpu"]).splitlines() if ":" in line)
    return {k: rows.get(k, "").strip() for k in ("Model name", "Flags", "CPU(s)")}


def measure(text: str, chunk_chars: int, memory_chars: int, repeats: int) -> dict[str, Any]:
    from memagent.extraction import grounding
    from memagent.extraction.record_grounding import MemoryTrail, ground_value
    from memagent.extraction.spellings import scan

    mid = len(text) // 2
    window = (mid, mid + chunk_chars)
    memory = text[mid - memory_chars:mid]
    steps = tuple((memory, s, s + chunk_chars) for s in range(0, mid, max(1, mid // 8)))
    chain = MemoryTrail(memory, steps)
    t0 = time.perf_counter()
    found = scan(text)
    scan_seconds = time.perf_counter() - t0
    grounding._scan(text)  # the document's scan cached, as after its first value
    out: dict[str, Any] = {"scan_seconds": round(scan_seconds, 3), "numbers": len(found.numbers.starts),
                           "dates": len(found.dates.starts), "cache_bytes": grounding._scans.held,
                           "default": {}, "elsewhere": {}}
    for kind in ("string", "number", "date"):
        for mode, elsewhere, n in (("default", False, repeats), ("elsewhere", True, max(3, repeats // 10))):
            def one(i: int, kind: str = kind, elsewhere: bool = elsewhere) -> None:
                assert ground_value(kind, unfound(kind, i), text, window, chain, elsewhere=elsewhere) is None
            out[mode][kind] = median_ms(one, n)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=1_000_000)
    p.add_argument("--chunk-tokens", type=int, default=5000, help="the window a records call reads (paper: 5000)")
    p.add_argument("--memory-chars", type=int, default=4000, help="the memory behind the call (~1024 tokens)")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--target-ms", type=float, default=5.0)
    p.add_argument("--out", default="benchmarks/results/grounding_cost.json")
    args = p.parse_args()

    from memagent.models import load_tokenizer

    tok = load_tokenizer("smollm2-135m")

    def count(s: str) -> int:
        return len(tok(s, add_special_tokens=False)["input_ids"])

    load_before, uptime = loadavg(), _shell(["uptime"])
    text, tokens = document(args.tokens, count)
    chars_per_token = len(text) / tokens
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    got = measure(text, int(args.chunk_tokens * chars_per_token), args.memory_chars, args.repeats)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    default_ms = {k: v["median"] for k, v in got["default"].items()}
    result = {
        "default_ms": default_ms, "elsewhere_ms": {k: v["median"] for k, v in got["elsewhere"].items()},
        "target_ms": args.target_ms, "met": all(v <= args.target_ms for v in default_ms.values()),
        "scan_seconds": got["scan_seconds"], "cache_bytes": got["cache_bytes"],
        "document": {"tokens": tokens, "chars": len(text), "numbers": got["numbers"], "dates": got["dates"]},
        "settings": {**vars(args), "chunk_chars": int(args.chunk_tokens * chars_per_token)},
        "raw": {"default": got["default"], "elsewhere": got["elsewhere"]},
        "peak_rss_mb": round(peak_rss, 1), "rss_before_grounding_mb": round(base_rss, 1),
        "grounding_rss_mb": round(peak_rss - base_rss, 1),
        "loadavg": {"before": load_before, "after": loadavg()}, "uptime": uptime, "lscpu": lscpu(),
        "machine": machine(),
    }
    out = write_json(args.out, result)
    md = markdown(result)
    out.with_suffix(".md").write_text(md)
    print(md)


def markdown(r: dict[str, Any]) -> str:
    rows = [[kind, r["default_ms"][kind], r["elsewhere_ms"][kind], r["target_ms"],
             "yes" if r["default_ms"][kind] <= r["target_ms"] else "no"] for kind in r["default_ms"]]
    doc = r["document"]
    return "\n".join([
        f"# Grounding cost of an unfound value, {doc['tokens']:,}-token document ({doc['chars']:,} chars)", "",
        table(["kind", "default ms (window + memory)", "--ground-elsewhere ms", "target ms", "met"], rows), "",
        f"Per document: the number and date scan takes {r['scan_seconds']} s once ({doc['numbers']:,} numbers, "
        f"{doc['dates']:,} dates); the cache holds {r['cache_bytes'] / 2**20:.1f} MiB for it (text included).",
        f"Peak RSS {r['peak_rss_mb']} MB ({r['grounding_rss_mb']} MB of it while grounding). CPU: {r['lscpu']['Model name'] or r['machine']['cpu']} "
        f"({r['machine']['cores']} cores, {', '.join(r['machine']['simd'])}); load {r['loadavg']['before']} before, "
        f"{r['loadavg']['after']} after; `{r['uptime']}`.",
        f"Command: `nice python -m benchmarks.grounding_cost --tokens {r['settings']['tokens']} --out "
        f"{r['settings']['out']}`", ""])


if __name__ == "__main__":
    main()
