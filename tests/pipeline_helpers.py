"""Helpers shared by the pipeline tests: input datasets and reading outputs back."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from memagent.config import AgentConfig
from memagent.data.demo import niah_row

# Small enough that a random tiny model reads a document in well under a second.
FAST_AGENT = AgentConfig(chunk_tokens=64, memory_tokens=8, answer_tokens=6, query_tokens=64)


def good_rows(n: int, start: int = 0, tokens: int = 150) -> list[dict]:
    rows = [niah_row(i, tokens, depth=0.5, seed=7) for i in range(start, start + n)]
    return [{"id": f"doc-{i:03d}", "question": r["question"], "context": r["context"], "answers": r["answers"],
             "source": "generated"} for i, r in zip(range(start, start + n), rows)]


def write_rows(path: Path, rows: list[dict], schema: pa.Schema | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def read_output(path: str | Path, filesystem=None) -> list[dict]:
    ds = pads.dataset(str(path), format="parquet", filesystem=filesystem, exclude_invalid_files=False,
                      ignore_prefixes=["_", "."])
    return ds.to_table().to_pylist()
