"""Resume checks what it skips: each output row carries a fingerprint of what it was answered from.

``input_fingerprint`` = a hash of the row's question (or the job-level one; with an extraction
schema, the schema's field list), its context and the job settings that change answers (method,
engine and model, the agent config with its prompts and extraction schema; not the metric, which
only changes the score). A rerun into the same output compares the
fingerprints of the ids it would skip with its own input: if any differ, it refuses, naming how
many and one example, unless ``redo_changed`` (``--redo-changed``), which takes those rows out
of the output and answers them again (still exactly once). Outputs written before this column
existed are not checked.

A checkpoint log is keyed by more: the row's fingerprint plus what changes the tokens or the
arithmetic of a read without changing its answer's meaning (:func:`decode_parts`: dtype and
device, the model files, the tokenizer files, the versions of the libraries that decode). A rerun
after a library upgrade keeps its done rows, but never resumes a read written by the old stack;
the row's ``checkpoint_ignored`` names the part that differed (:func:`key_difference`). Each job
setting is a part of its own too (:func:`settings_parts`), so a changed one is named with its values.
"""

from __future__ import annotations

import hashlib
import json
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from memagent.documents.columns import DOCUMENT_SHA_COLUMN
from memagent.result_schema import FINGERPRINT_COLUMN as COLUMN  # the output column this module fills
from pipelines.batch_config import BatchQAConfig


def answer_key(cfg: BatchQAConfig) -> str:
    """The job settings that change answers, as one string."""
    e = cfg.engine
    return json.dumps({"method": cfg.method, "engine": e.engine, "model": e.served_model or e.model,
                       "agent": cfg.agent.model_dump(mode="json", exclude={"preset"})}, sort_keys=True)  # a label


DECODING_LIBRARIES = ("memagent", "torch", "transformers", "tokenizers", "vllm", "llama-cpp-python", "gguf")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                    "vocab.json", "merges.txt", "chat_template.jinja")


def _files_hash(directory: Path, tokenizer: bool) -> str:
    """A hash of a model directory's tokenizer files or its other files: small files by content,
    large ones (weights) by name and size."""
    h = hashlib.sha256()
    for f in sorted(p for p in directory.iterdir() if p.is_file() and (p.name in _TOKENIZER_FILES) == tokenizer):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}:".encode())
        if size <= 1 << 20:
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _model_dir(name: str | None) -> Path | None:
    if not name:
        return None
    try:
        from memagent.models import resolve_model

        return resolve_model(name)
    except Exception:  # noqa: BLE001 - a remote model (openai) or none on disk: its name stands for it
        return None


def decode_parts(engine_cfg: Any, engine: Any = None) -> dict[str, str]:
    """What a read's tokens and arithmetic depend on beyond the row's input fingerprint (see the module doc)."""
    model = _model_dir(engine_cfg.model) if engine_cfg.engine != "openai" else None
    tokenizer = _model_dir(engine_cfg.tokenizer) or model
    versions = {}
    for lib in DECODING_LIBRARIES:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            pass
    return {"dtype": f"{getattr(engine, 'dtype', None) or engine_cfg.dtype}@{getattr(engine, 'device', None) or ''}",
            "model": _files_hash(model, tokenizer=False) if model else str(engine_cfg.served_model or engine_cfg.model),
            "tokenizer": _files_hash(tokenizer, tokenizer=True) if tokenizer else str(engine_cfg.tokenizer),
            "versions": json.dumps(versions, sort_keys=True)}


def settings_parts(cfg: BatchQAConfig) -> dict[str, str]:
    """The job settings that change answers (:func:`answer_key`), one key part each (``job.method``,
    ``job.model``, ``agent.memory_heads``, ...), so that a checkpoint ignored for a changed setting names it
    and its values. The row's input fingerprint covers them too; these only say which."""
    settings = json.loads(answer_key(cfg))
    agent = settings.pop("agent")
    return {**{f"job.{k}": _part(v) for k, v in settings.items()}, **{f"agent.{k}": _part(v) for k, v in agent.items()}}


def _part(value: Any) -> str:
    """A setting as a key part: its JSON, or a hash of it when long (an extraction schema, prompts), so that every
    checkpoint segment, which stores its key, stays small."""
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 64 else "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def checkpoint_key(input_fingerprint: str, parts: dict[str, str]) -> str:
    """The key a row's checkpoint log is written and read under."""
    return json.dumps({"input": input_fingerprint, **parts}, sort_keys=True)


def key_difference(stored: str, wanted: str) -> str:
    """Which parts of two checkpoint keys differ, in words: a setting with its values ("agent.memory_heads:
    2 → 3"), a part of the stack by name ("dtype, versions"), "the input or config" when nothing says more."""
    try:
        a, b = json.loads(stored), json.loads(wanted)
    except (ValueError, RecursionError):  # a stored key is data from disk: any text, nested past the stack
        return "the input or config"
    if not isinstance(a, dict) or not isinstance(b, dict):
        return "the input or config"
    differ = [k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]
    settings = [k for k in differ if k.startswith(("job.", "agent."))]
    if settings:  # the input fingerprint covers the settings: the settings that changed say more
        differ = [k for k in differ if k != "input"]
    words = [f"{k}: {_value(a.get(k))} → {_value(b.get(k))}" if k in settings else
             "the input or config" if k == "input" else k for k in differ]
    return ", ".join(words[:4] + [f"and {len(words) - 4} more"] * (len(words) > 4)) or "nothing"


def _value(part: Any) -> str:
    """A setting's value in a key (JSON text), short; "unset" for a key written without it."""
    if not isinstance(part, str):
        return "unset"
    return part if len(part) <= 40 else part[:37] + "..."


def job_question(cfg: BatchQAConfig) -> str | None:
    """The question every row is read with, when the job sets one: the extraction schema's field
    list (a row's question column is then not read), else the job-level question (None: per row)."""
    schema = cfg.agent.extraction
    return schema.question() if schema is not None else cfg.question


def fingerprint(question: Any, context: Any, key: str) -> str:
    data = json.dumps([question, context, key], default=str, ensure_ascii=False).encode()
    return hashlib.sha256(data).hexdigest()[:24]


def _fingerprints(table: pa.Table, question: str | None, key: str) -> pa.Array:
    questions = [question] * len(table) if question is not None else table.column("question").to_pylist()
    contexts = table.column("context").to_pylist()
    if DOCUMENT_SHA_COLUMN in table.column_names:  # a document's file: a bad file (no context) that changes, changes
        contexts = [[c, sha] for c, sha in zip(contexts, table.column(DOCUMENT_SHA_COLUMN).to_pylist())]
    return pa.array([fingerprint(q, c, key) for q, c in zip(questions, contexts)], pa.string())


def add_fingerprints(batch: pa.Table, question: str | None, key: str) -> pa.Table:
    """Ray Data stage: append the ``input_fingerprint`` column (it passes through to the output)."""
    return batch.append_column(COLUMN, _fingerprints(batch, question, key))


def recorded_fingerprints(out_fs: pafs.FileSystem, done_files: list[str], done: pa.Array) -> dict[str, str]:
    """The fingerprints the output recorded for the ids in ``done`` (id -> fingerprint; outputs written
    before the column existed: none)."""
    recorded: dict[str, str] = {}
    for file in done_files:
        with out_fs.open_input_file(file) as f:
            pf = pq.ParquetFile(f)
            if COLUMN not in pf.schema_arrow.names:
                continue
            t = pf.read(columns=["id", COLUMN])
        recorded.update({i: fp for i, fp in zip(t.column("id").to_pylist(), t.column(COLUMN).to_pylist())
                         if fp is not None})
    done_set = set(done.to_pylist())
    return {i: fp for i, fp in recorded.items() if i in done_set}  # retryable rows are redone anyway


def changed_ids(in_fs: pafs.FileSystem, files: list[str], out_fs: pafs.FileSystem, done_files: list[str],
                done: pa.Array, question: str | None, key: str) -> pa.Array:
    """Ids done in the output whose recorded fingerprint differs from this input's (streamed, file by file)."""
    recorded = recorded_fingerprints(out_fs, done_files, done)
    if not recorded:
        return pa.array([], pa.string())
    wanted = pa.array(list(recorded), pa.string())
    changed: list[str] = []
    columns = ["id", "context", DOCUMENT_SHA_COLUMN, *([] if question is not None else ["question"])]
    for file in files:
        with in_fs.open_input_file(file) as f:
            pf = pq.ParquetFile(f)
            for batch in pf.iter_batches(columns=[c for c in columns if c in pf.schema_arrow.names], batch_size=1024):
                t = pa.Table.from_batches([batch])
                t = t.filter(pc.is_in(t.column("id").cast(pa.string()), value_set=wanted))
                if not len(t) or "context" not in t.column_names:
                    continue
                for i, fp in zip(t.column("id").to_pylist(), _fingerprints(t, question, key).to_pylist()):
                    if recorded.get(i) != fp:
                        changed.append(i)
    return pa.array(changed, pa.string())
