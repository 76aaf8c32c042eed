"""Ray Data jobs that synthesise training/evaluation sets at scale: work units in, Parquet out.

A work unit is one (question index, size) for HotpotQA or one (task, length, index) for RULER.
Units are spread over an actor pool; each actor loads the sources (local paths or ``s3://``
URIs every node can reach) and the tokenizer once, then makes samples with the library
functions. Samples depend only on ``(seed, unit)``, so the output equals a single-process run
(``memagent.data.hotpotqa.synthesize`` / ``RulerGenerator.generate``) row for row, in any order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

from memagent.data.hotpotqa import TRAINING_SCHEMA, DocPool, HotpotSynthConfig, load_hotpotqa, make_sample
from memagent.data.io import write_parquet
from memagent.data.ruler import RULER_SCHEMA, RulerItems
from memagent.models import load_tokenizer
from pipelines.job import ray_init_address


class SynthJob(BaseModel):
    """Where synthesis runs: in this process (one Parquet file) or as a Ray Data job (a directory)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ray: bool = Field(False, description="Generate with a Ray Data job (output: a directory of files)")
    workers: int = Field(2, gt=0, description="Ray actors")
    ray_address: str | None = Field(None, description="Ray cluster address (default: a local Ray)")


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
    """Actor: holds the :class:`RulerGenerator` of ``items`` (tokenizer, essay, SQuAD, HotpotQA)."""

    def __init__(self, tokenizer: str, items: dict[str, Any]):
        self.generator = RulerItems(**items).generator(load_tokenizer(tokenizer))

    def __call__(self, batch: dict[str, np.ndarray]) -> pa.Table:
        rows = [
            self.generator.sample(str(task), int(length), int(index))
            for task, length, index in zip(batch["task"], batch["length"], batch["index"])
        ]
        return pa.Table.from_pylist(rows, schema=RULER_SCHEMA)


def _run(units: list[dict], udf: type, kwargs: dict[str, Any], out: str, job: SynthJob, batch_size: int) -> int:
    import ray
    from ray.data import ActorPoolStrategy

    if not units:
        raise ValueError("nothing to generate: no work units")
    if not ray.is_initialized():
        ray.init(address=ray_init_address(job.ray_address))
    ds = ray.data.from_items(units, override_num_blocks=min(len(units), job.workers * 4))
    ds = ds.map_batches(
        udf,
        fn_constructor_kwargs=kwargs,
        compute=ActorPoolStrategy(size=job.workers),
        batch_size=batch_size,
        num_cpus=1,
        num_gpus=0,  # CPU work; a GPU request on a CPU cluster would hang
        udf_modifying_row_count=False,
    )
    ds.write_parquet(out)
    return len(units)


def write_hotpotqa(cfg: HotpotSynthConfig, out: str, tokenizer: str, job: SynthJob = SynthJob()) -> tuple[str, int]:
    """The synthesis stage: every (question, size) sample to ``out``; returns (path written, rows)."""
    if not job.ray:
        records = load_hotpotqa(cfg.source)  # first: a bad file is named before the tokenizer loads
        rows = cfg.rows(load_tokenizer(tokenizer), records)
        return write_parquet(rows, out, TRAINING_SCHEMA), len(rows)
    n = len(load_hotpotqa(cfg.source))  # validate on the driver: a bad file fails before any actor starts
    n = n if cfg.samples is None else min(cfg.samples, n)
    units = [{"index": i, "kind": kind, "value": value} for kind, value in cfg.sizes() for i in range(n)]
    kwargs = {"source": cfg.source, "tokenizer": tokenizer, "seed": cfg.seed}
    return out, _run(units, HotpotSynthesizer, kwargs, out, job, batch_size=4)


def write_ruler(items: RulerItems, out: str, tokenizer: str, job: SynthJob = SynthJob()) -> tuple[str, int]:
    """The RULER stage: ``samples`` rows per (task, length) to ``out``; returns (path written, rows)."""
    if not job.ray:
        rows = list(items.rows(load_tokenizer(tokenizer)))
        return write_parquet(rows, out, RULER_SCHEMA), len(rows)
    units = [{"task": t, "length": int(L), "index": i}
             for t in items.tasks for L in items.lengths for i in range(items.samples)]
    kwargs = {"tokenizer": tokenizer, "items": items.model_dump()}
    return out, _run(units, RulerSynthesizer, kwargs, out, job, batch_size=1)
