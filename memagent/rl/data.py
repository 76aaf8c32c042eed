"""Training data: loading examples and a resumable, deterministic order over them."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

REQUIRED_COLUMNS = ("id", "question", "context", "answers")


def load_examples(data: str | Path | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Training examples from a Parquet file/URI (local or s3://), a JSONL file, or a list of dicts.

    Each needs ``id``, ``question``, ``context``, ``answers`` (list of strings); other
    columns are kept. Raises ``ValueError`` naming what is missing.
    """
    if isinstance(data, (str, Path)):
        src = str(data)
        if src.endswith((".jsonl", ".json")):
            rows = [json.loads(line) for line in Path(src).read_text().splitlines() if line.strip()]
        else:
            import pyarrow.parquet as pq

            rows = pq.read_table(src).to_pylist()
    else:
        rows = [dict(r) for r in data]
    if not rows:
        raise ValueError("training data is empty")
    missing = [c for c in REQUIRED_COLUMNS if c not in rows[0]]
    if missing:
        raise ValueError(f"training data lacks column(s) {missing}; needs {list(REQUIRED_COLUMNS)}")
    for r in rows:
        if isinstance(r["answers"], str):
            r["answers"] = [r["answers"]]
    return rows


class DataStream:
    """Examples in a seeded order, epoch after epoch, from a cursor that checkpoints restore.

    ``order(epoch)`` is a permutation fixed by (seed, epoch), so ``DataStream(cursor=k)``
    continues exactly where a stream that had drawn k examples stopped.
    """

    def __init__(self, examples: Sequence[Mapping[str, Any]], *, seed: int, shuffle: bool, cursor: int = 0):
        if not examples:
            raise ValueError("no examples for this rank")
        self.examples = list(examples)
        self.seed, self.shuffle, self.cursor = seed, shuffle, cursor
        self._orders: dict[int, list[int]] = {}

    def order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            n = len(self.examples)
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                self._orders[epoch] = torch.randperm(n, generator=g).tolist()
            else:
                self._orders[epoch] = list(range(n))
        return self._orders[epoch]

    def draw(self, n: int) -> list[Mapping[str, Any]]:
        out = []
        size = len(self.examples)
        for _ in range(n):
            epoch, pos = divmod(self.cursor, size)
            out.append(self.examples[self.order(epoch)[pos]])
            self.cursor += 1
        return out


def seed_everything(seed: int) -> None:
    """Seed Python's and torch's generators (the rollout's sampling draws from torch's)."""
    random.seed(seed)
    torch.manual_seed(seed)
