"""The evaluation job: one item set, every method through the batch QA job, one report.

    items = RULER-style set (task × length × samples), generated once and reused on reruns
    for method in (memagent, full-context):
        predictions/<method>/ = batch QA job(items, method)     # resumable, error rows kept
    results.csv / results.md / heatmap.png / accuracy_vs_length.png / summary.json

Both methods read the identical items with the same model, answer format and decoding; the
full-context baseline drops the middle of documents longer than the model's window (the
window used is written to the summary and the table notes).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator

from memagent.batch import Method
from memagent.config import JOB_PRESET, AgentConfig, preset
from memagent.data.ruler import NIAH as NIAH_SPECS, RulerItems
from memagent.engines import EngineConfig
from memagent.evaluate import plot_accuracy_vs_length, plot_heatmap, results_markdown, retention_markdown, summarize, \
    summarize_retention
from memagent.redact import redact
from memagent.retention import row_retention
from pipelines.batch_qa import BatchQAConfig, run_batch_qa
from pipelines.job import JobConfig

log = logging.getLogger(__name__)

# The eval input keeps what the job and the report need; the generator's own `context_tokens`
# would clash with the job's output column of that name.
ITEM_COLUMNS = ["id", "task", "length", "question", "context", "answers", "metric"]
OPTIONAL_ITEM_COLUMNS = ["needle_depths"]  # kept for depth analyses when the set has it


class EvalConfig(BaseModel):
    """One evaluation run: which items, which methods, which model, where the report goes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    out: str = Field("runs/eval", description="Local run directory: items, predictions per method, report")
    items: RulerItems = Field(default_factory=RulerItems, description="The RULER items to generate.")
    items_file: str | None = Field(None, description="Evaluate this Parquet item set (RULER schema) instead of "
                                   "generating one")
    methods: list[Method] = Field(["memagent", "full-context"], min_length=1,
                                  description="Reading methods to compare: memagent, full-context")
    engine: EngineConfig = Field(default_factory=EngineConfig)
    agent: AgentConfig = Field(default_factory=lambda: preset(JOB_PRESET))
    job: JobConfig = Field(default_factory=JobConfig)

    @model_validator(mode="after")
    def _check(self) -> EvalConfig:
        if self.items_file is None and not (self.items.tasks and self.items.lengths):
            raise ValueError("give tasks and lengths to generate an item set, or items_file=PATH to use one")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods repeat: {self.methods}")
        return self

    def item_spec(self) -> dict[str, Any]:
        """What determines the item set: which items (selection) and how each is generated (sources)."""
        i = self.items
        return {"tasks": i.tasks, "lengths": sorted(i.lengths), "samples": i.samples, "seed": i.seed,
                "items": self.items_file, "tokenizer": self.engine.tokenizer or self.engine.model,
                "haystack": i.haystack, "squad": i.squad, "hotpotqa": i.hotpotqa}


# Every generated item is a function of (seed, task, length, index) and these sources alone,
# so a rerun may select other tasks/lengths/samples and keep the predictions it shares.
SELECTION_KEYS = ("tasks", "lengths", "samples")


@dataclass
class EvalSummary:
    out: str
    items: int
    results_csv: str
    results_md: str
    heatmap: str
    lines_plot: str
    seconds_per_method: dict[str, float]
    full_context_window: int | None


def model_context_window(engine: EngineConfig) -> int:
    """The window the engine will report, read from the model config without loading weights."""
    if engine.context_window:
        return engine.context_window
    from transformers import AutoConfig

    from memagent.models import resolve_model

    config = AutoConfig.from_pretrained(str(resolve_model(engine.tokenizer or engine.model)))
    return int(getattr(config, "max_position_embeddings", 2048))


def build_items(cfg: EvalConfig, path: Path) -> int:
    """Generate the item set (or copy the given one) to ``path``; reuse it when the spec matches."""
    spec_path = path.with_suffix(".spec.json")
    spec = cfg.item_spec()
    if path.exists():
        old = json.loads(spec_path.read_text()) if spec_path.exists() else None
        if old == spec:
            return pads.dataset(path).count_rows()
        if not _same_sources(old, spec):
            raise ValueError(f"{path.parent} holds an evaluation generated differently ({old}); use a new --out")
        log.info("item selection changed (%s); regenerating items, predictions of shared items are kept",
                 {k: spec[k] for k in SELECTION_KEYS})
    from memagent.data.io import read_records
    from memagent.models import load_tokenizer

    if cfg.items_file:
        rows = read_records(cfg.items_file)
    else:
        rows = list(cfg.items.rows(load_tokenizer(cfg.engine.tokenizer or cfg.engine.model)))
    if not rows:
        raise ValueError(f"no items to evaluate in {cfg.items_file or 'the generated set'}")
    rows = [as_item(r) for r in rows]
    missing = [c for c in ITEM_COLUMNS if c not in rows[0]]
    if missing:
        raise ValueError(f"items {cfg.items_file}: missing columns {missing}; expected {ITEM_COLUMNS}")
    keep = ITEM_COLUMNS + [c for c in OPTIONAL_ITEM_COLUMNS if c in rows[0]]
    table = pa.Table.from_pylist([{c: r[c] for c in keep} for r in rows])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)  # atomic: a killed run never leaves half an item set
    spec_path.write_text(json.dumps(spec, indent=2))
    return len(table)


def as_item(row: dict[str, Any]) -> dict[str, Any]:
    """A training-set row (``memagent synth hotpotqa``: no ``task``, ``length`` or ``metric``) as an eval
    item: task = its ``source``, length = its ``target_tokens`` (else its measured ``context_tokens``),
    metric ``sub_em`` (the QA metric); an item set's own columns are kept as they are."""
    if "task" in row or "source" not in row:
        return row
    length = row.get("target_tokens") or row.get("context_tokens")
    return {**row, "task": row["source"], "length": length, "metric": row.get("metric") or "sub_em"}


def _same_sources(old: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Both specs generate identical items for the (task, length, index) they share."""
    if old is None or new["items"] is not None or old.get("items") is not None:
        return False
    return all(old.get(k) == v for k, v in new.items() if k not in SELECTION_KEYS)


def read_predictions(out: Path, methods: list[str], item_ids: set[str]) -> list[dict[str, Any]]:
    """Prediction rows of the current items; every item must have exactly one row per method.

    Rows of items no longer selected (an earlier run with other lengths) stay on disk, unused.
    """
    records = []
    for method in methods:
        rows = pads.dataset(out / "predictions" / method, format="parquet", exclude_invalid_files=True).to_table(
            columns=["id", "method", "task", "length", "score", "error", "seconds", "context_tokens", "truncated"]
        ).to_pylist()
        rows = [r for r in rows if r["id"] in item_ids]
        ids = {r["id"] for r in rows}
        if len(rows) != len(item_ids) or ids != item_ids:
            raise RuntimeError(f"{method}: {len(rows)} prediction rows for {len(ids)} of {len(item_ids)} items; "
                               "rerun to finish")
        records += rows
    return records


NIAH_TASKS = list(NIAH_SPECS)
RETENTION_INPUTS = ["id", "method", "task", "length", "steps", "context", "answers", "gold_positions"]


def read_retention(out: Path, item_ids: set[str]) -> list[dict[str, Any]]:
    """Per memory-agent row with known evidence (NIAH needles, qa_2 supporting paragraphs): method, task, length
    and :func:`memagent.retention.row_retention`'s counts. Read in batches: a row holds its whole context."""
    path = out / "predictions" / "memagent"
    if not path.exists():
        return []
    ds = pads.dataset(path, format="parquet", exclude_invalid_files=True)
    columns = [c for c in RETENTION_INPUTS if c in ds.schema.names]  # given items may lack answers/gold_positions
    if not {"id", "task", "steps", "context"} <= set(columns):
        return []
    records = []
    for batch in ds.to_batches(columns=columns, filter=pads.field("task").isin(["qa_2", *NIAH_TASKS]), batch_size=64):
        for row in batch.to_pylist():
            counts = row_retention(row) if row["id"] in item_ids else None
            if counts is not None:
                records.append({k: row[k] for k in ("method", "task", "length")} | counts)
    return records


def run_evaluation(cfg: EvalConfig) -> EvalSummary:
    """Generate/reuse items, run each method through the batch job, write the report."""
    out = Path(cfg.out)
    items_path = out / "items.parquet"
    n_items = build_items(cfg, items_path)
    window = model_context_window(cfg.engine) if "full-context" in cfg.methods else None
    seconds: dict[str, float] = {}
    for method in cfg.methods:
        job = BatchQAConfig(
            input=str(items_path), output=str(out / "predictions" / method), engine=cfg.engine, agent=cfg.agent,
            method=method, job=cfg.job,
        )
        t0 = time.perf_counter()
        summary = run_batch_qa(job)
        seconds[method] = round(time.perf_counter() - t0, 1)
        log.info("%s: %s", method, "; ".join(summary.lines()))

    item_ids = set(pads.dataset(items_path).to_table(columns=["id"]).column("id").to_pylist())
    records = read_predictions(out, cfg.methods, item_ids)
    table = summarize(records)
    notes = [f"Model {cfg.engine.model} ({cfg.engine.engine}); memory agent budgets: chunk {cfg.agent.chunk_tokens}, "
             f"memory {cfg.agent.memory_tokens}, answer {cfg.agent.answer_tokens} tokens."]
    if window:
        notes.append(f"full-context reads at most the model's window of {window} tokens (prompt + answer); "
                     "longer documents lose their middle.")
    table.to_csv(out / "results.csv", index=False)
    retention = summarize_retention(read_retention(out, item_ids))
    retention.to_csv(out / "retention.csv", index=False)
    (out / "results.md").write_text(results_markdown(table, notes) + "\n" + retention_markdown(retention))
    heatmap = plot_heatmap(table, out / "heatmap.png", title=f"Accuracy (%) — {cfg.engine.model}")
    lines = plot_accuracy_vs_length(table, out / "accuracy_vs_length.png")
    result = EvalSummary(out=str(out), items=n_items, results_csv=str(out / "results.csv"),
                         results_md=str(out / "results.md"), heatmap=str(heatmap), lines_plot=str(lines),
                         seconds_per_method=seconds, full_context_window=window)
    (out / "summary.json").write_text(json.dumps({**asdict(result), "config": redact(cfg.model_dump(mode="json")),
                                                  "notes": notes}, indent=2))
    return result
