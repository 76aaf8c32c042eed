"""Ray Data jobs that synthesise training/evaluation sets at scale: work units in, Parquet out.

A work unit is one (question index, size) for HotpotQA or one (task, length, index) for RULER.
Units are spread over an actor pool; each actor loads the sources (local paths or ``s3://``
URIs every node can reach) and the tokenizer once, then makes samples with the library
functions. Samples depend only on ``(seed, unit)``, so the output equals a single-process run
(``memagent.data.hotpotqa.synthesize`` / ``RulerGenerator.generate``) row for row, in any order.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import ray
from ray.data import ActorPoolStrategy

from memagent.data.hotpotqa import TRAINING_SCHEMA, DocPool, Size, load_hotpotqa, make_sample
from memagent.data.io import load_tokenizer, read_json, read_text
from memagent.data.ruler import RULER_SCHEMA, RulerGenerator, resolve_task


class HotpotSynthesizer:
    """Actor: holds the split's records, its document pool and the tokenizer."""

    def __init__(self, source: str, tokenizer: str, seed: int):
        self.records = load_hotpotqa(source)
        self.pool = DocPool.from_records(self.records)
        self.tokenizer = load_tokenizer(tokenizer)
        self.seed = seed

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        rows = [
            make_sample(self.records[int(i)], self.pool, (str(kind), int(value)), seed=self.seed, tokenizer=self.tokenizer)
            for i, kind, value in zip(batch["index"], batch["kind"], batch["value"])
        ]
        return pa.Table.from_pylist(rows, schema=TRAINING_SCHEMA)


class RulerSynthesizer:
    """Actor: holds a :class:`RulerGenerator` (tokenizer, essay, SQuAD, HotpotQA)."""

    def __init__(self, tokenizer: str, seed: int, haystack: str | None, squad: str | None, hotpotqa: str | None):
        self.generator = RulerGenerator(
            load_tokenizer(tokenizer),
            essay=read_text(haystack) if haystack else None,
            squad=read_json(squad) if squad else None,
            hotpotqa=load_hotpotqa(hotpotqa) if hotpotqa else None,
            seed=seed,
        )

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        rows = [
            self.generator.sample(str(task), int(length), int(index))
            for task, length, index in zip(batch["task"], batch["length"], batch["index"])
        ]
        return pa.Table.from_pylist(rows, schema=RULER_SCHEMA)


def _run(items: list[dict], udf: type, kwargs: dict[str, Any], out: str, workers: int, batch_size: int,
         address: str | None) -> int:
    if not items:
        raise ValueError("nothing to generate: no work units")
    if not ray.is_initialized():
        ray.init(address=address)
    ds = ray.data.from_items(items, override_num_blocks=min(len(items), max(1, workers) * 4))
    ds = ds.map_batches(
        udf,
        fn_constructor_kwargs=kwargs,
        compute=ActorPoolStrategy(size=workers),
        batch_size=batch_size,
        num_cpus=1,
        num_gpus=0,  # CPU work; a GPU request on a CPU cluster would hang
        udf_modifying_row_count=False,
    )
    ds.write_parquet(out)
    return len(items)


def synthesize_hotpotqa(
    source: str,
    out: str,
    sizes: Sequence[Size],
    *,
    samples: int | None = None,
    seed: int = 42,
    tokenizer: str = "smollm2-135m",
    workers: int = 2,
    batch_size: int = 4,
    address: str | None = None,
) -> int:
    """Write ``samples`` questions × ``sizes`` HotpotQA rows under ``out`` (a directory); returns rows."""
    n = len(load_hotpotqa(source))  # validate on the driver: a bad file fails before any actor starts
    n = n if samples is None else min(samples, n)
    items = [{"index": i, "kind": kind, "value": value} for kind, value in sizes for i in range(n)]
    kwargs = {"source": source, "tokenizer": tokenizer, "seed": seed}
    return _run(items, HotpotSynthesizer, kwargs, out, workers, batch_size, address)


def synthesize_ruler(
    tasks: Sequence[str],
    lengths: Sequence[int],
    out: str,
    *,
    samples: int = 128,
    seed: int = 42,
    tokenizer: str = "smollm2-135m",
    haystack: str | None = None,
    squad: str | None = None,
    hotpotqa: str | None = None,
    workers: int = 2,
    batch_size: int = 1,
    address: str | None = None,
) -> int:
    """Write ``samples`` rows per (task, length) under ``out`` (a directory); returns rows."""
    tasks = [resolve_task(t) for t in tasks]
    items = [{"task": t, "length": int(L), "index": i} for t in tasks for L in lengths for i in range(samples)]
    kwargs = {"tokenizer": tokenizer, "seed": seed, "haystack": haystack, "squad": squad, "hotpotqa": hotpotqa}
    return _run(items, RulerSynthesizer, kwargs, out, workers, batch_size, address)

