"""Training data: loading examples and a resumable, deterministic order over them."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

REQUIRED_COLUMNS = ("id", "question", "context", "answers")


def load_examples(data: str | Path | Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Training examples from a Parquet file/URI (local or s3://), a JSON/JSONL file, or a list of dicts.

    Each needs ``id``, ``question``, ``context`` (strings) and ``answers`` (a list of strings, or
    one string); other columns are kept. A bad example is a ``ValueError`` that names it: the
    file and line for JSON Lines (``FILE:LINE: what is wrong``), the row otherwise.
    """
    if isinstance(data, (str, Path)):
        src = str(data)
        if src.endswith((".jsonl", ".json")):
            from memagent.data.io import read_json, read_json_lines

            located = (read_json_lines(src) if src.endswith(".jsonl") else
                       [(None, r) for r in _as_list(read_json(src), src)])
            where = [f"{src}:{line}" if line is not None else f"{src}: record {i}"
                     for i, (line, _) in enumerate(located)]
            rows = [r for _, r in located]
        else:
            from memagent.data.io import read_parquet_table

            rows = read_parquet_table(src).to_pylist()
            where = [f"{src}: row {i}" for i in range(len(rows))]
    else:
        rows = list(data)
        where = [f"training data: example {i}" for i in range(len(rows))]
    if not rows:
        raise ValueError(f"training data{f' {data}' if isinstance(data, (str, Path)) else ''} is empty")
    return [_check_example(r, at) for r, at in zip(rows, where)]


def check_source(data: str | Path | Sequence[Mapping[str, Any]]) -> None:
    """Check training data where the job starts, before any worker or model: JSON/JSONL and lists
    fully (:func:`load_examples`), Parquet by its columns and the small ones' values (the contexts
    are left to the workers' own :func:`load_examples`)."""
    if not isinstance(data, (str, Path)) or str(data).endswith((".jsonl", ".json")):
        load_examples(data)
        return
    import pyarrow.dataset as pads

    from memagent.data.io import filesystem

    src = str(data)
    fs, inner = filesystem(src)
    try:
        dataset = pads.dataset(inner, filesystem=fs, format="parquet")
    except FileNotFoundError:
        raise FileNotFoundError(f"no such file or directory: {src}") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in dataset.schema.names]
    if missing:
        raise ValueError(f"{src}: missing column(s) {', '.join(missing)} (training data needs columns "
                         f"{list(REQUIRED_COLUMNS)})")
    small = dataset.to_table(columns=[c for c in REQUIRED_COLUMNS if c != "context"]).to_pylist()
    if not small:
        raise ValueError(f"training data {src} is empty")
    for i, row in enumerate(small):
        _check_example({**row, "context": ""}, f"{src}: row {i}")


def _as_list(value: Any, src: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{src}: expected a JSON list of records (or JSON Lines), got {type(value).__name__}")
    return value


def _check_example(row: Any, where: str) -> dict[str, Any]:
    """The example as a dict with ``answers`` a list of strings; a ``ValueError`` at ``where`` if it is not one."""
    if not isinstance(row, Mapping):
        raise ValueError(f"{where}: expected a JSON object with {', '.join(REQUIRED_COLUMNS)}, got "
                         f"{type(row).__name__}")
    missing = [c for c in REQUIRED_COLUMNS if c not in row]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)} (training data needs columns "
                         f"{list(REQUIRED_COLUMNS)})")
    row = dict(row)
    for col in ("id", "question", "context"):
        if not isinstance(row[col], str):
            raise ValueError(f"{where}: {col} must be a string, got {type(row[col]).__name__}")
    answers = row["answers"]
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, (list, tuple)) or not answers or not all(isinstance(a, str) for a in answers):
        raise ValueError(f"{where}: answers must be a non-empty list of strings, got {answers!r:.80}")
    row["answers"] = list(answers)
    return row


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
