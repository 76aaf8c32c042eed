"""The scale benchmark's lake: documents of lognormal lengths, filler prose with one planted needle each, as Parquet.

Used by :mod:`benchmarks.scale` (``make_lake``); the lake's count, seed and length histogram go into its JSON.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

HIST_EDGES = [0, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 512_000, 1_000_001]
WORDS = ("river harbour merchant lantern quiet market northern valley window garden stone bridge "
         "winter morning letter council road forest copper wagon festival mill tower orchard "
         "painter station archive meadow cellar ferry").split()
NAMES = "Alder Birch Cedar Dune Ember Fable Garnet Heron Iris Juniper Kestrel Linden".split()


def lake_lengths(n: int, seed: int, median: int = 8_000, sigma: float = 1.2, cap: int = 1_000_000) -> list[int]:
    """``n`` document lengths in tokens, seeded: lognormal around ``median`` (``sigma``), within 200..``cap``."""
    rng = random.Random(seed)
    return [max(200, min(cap, int(round(median * math.exp(rng.gauss(0.0, sigma)))))) for _ in range(n)]


def histogram(lengths: list[int]) -> list[dict]:
    """Documents per length bin (``HIST_EDGES``)."""
    return [{"from": lo, "to": hi - 1 if hi == HIST_EDGES[-1] else hi,
             "docs": sum(lo <= x < hi for x in lengths)} for lo, hi in zip(HIST_EDGES, HIST_EDGES[1:])]


def corpus(seed: int, sentences: int, fact_every: int) -> str:
    """Filler prose; one sentence in ``fact_every`` holds a digit string (what the simulated memory keeps)."""
    rng = random.Random(seed)
    out = []
    for i in range(sentences):
        if i % fact_every == fact_every // 2:
            out.append(f"Ledger {rng.randint(10, 9999)} names {rng.choice(NAMES)} as keeper of the "
                       f"{rng.choice(WORDS)}.")
        else:
            words = rng.choices(WORDS, k=rng.randint(8, 16))
            out.append(" ".join(words).capitalize() + ".")
    return " ".join(out)


def make_lake(path: Path, n: int, seed: int, fact_every: int, files: int, tokenizer) -> dict:
    """Write the lake; contexts are slices of one generated corpus (cheap), sized by chars/token."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memagent.bpe_offsets import tiktoken_bpe_for

    lengths = lake_lengths(n, seed)
    if (path / "lake.json").exists():  # --keep: the same lake again
        import json

        return json.loads((path / "lake.json").read_text())
    text = corpus(seed, min(400_000, 200 + sum(lengths) // 12), fact_every)
    enc = tiktoken_bpe_for(tokenizer).encoding
    sample = text[:400_000]
    chars_per_token = len(sample) / len(enc.encode_ordinary(sample))
    rng = random.Random(seed + 1)
    rows = []
    for i, tokens in enumerate(lengths):
        chars = int(tokens * chars_per_token)
        start = rng.randrange(0, len(text))
        body = text[start:start + chars]
        while len(body) < chars:  # wrap around the corpus
            body += " " + text[:chars - len(body) - 1]
        key, value = f"{rng.choice(WORDS)}-{rng.choice(WORDS)}-{i}", str(rng.randint(1_000_000, 9_999_999))
        at = rng.randrange(0, max(1, len(body)))
        at = body.rfind(". ", 0, at) + 2 if body.rfind(". ", 0, at) > 0 else 0
        context = body[:at] + f"The special magic number for {key} is: {value}. " + body[at:]
        rows.append({"id": f"doc-{i:05d}", "question": f"What is the special magic number for {key}?",
                     "context": context, "answers": [value], "target_tokens": tokens})
    path.mkdir(parents=True, exist_ok=True)
    per = -(-n // files)
    for f in range(files):
        part = rows[f * per:(f + 1) * per]
        if part:
            pq.write_table(pa.Table.from_pylist(part), path / f"part-{f:03d}.parquet")
    info = {"docs": n, "seed": seed, "median_tokens": 8_000, "sigma": 1.2, "cap_tokens": 1_000_000,
            "tokens_total": sum(lengths), "tokens_max": max(lengths), "tokens_median": sorted(lengths)[n // 2],
            "tokens_mean": round(sum(lengths) / n), "chars_per_token": round(chars_per_token, 3),
            "fact_sentence_every": fact_every, "files": files, "histogram": histogram(lengths)}
    import json

    (path / "lake.json").write_text(json.dumps(info))
    return info
