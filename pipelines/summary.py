"""What one batch QA run wrote: counts, accuracy, throughput and how full the actors were kept."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memagent.error_kinds import INFRA_PREFIX
from memagent.result_schema import (
    DROPPED_RECORDS_COLUMN, DROPPED_VALUES_COLUMN, N_RECORDS_PREFIX, RECORD_FAILED_COLUMN, RECORD_INVALID_COLUMN,
    RECORD_INCOMPLETE_COLUMN, RECORD_RUNAWAY_COLUMN, RECORD_SPLITS_COLUMN,
)
from pipelines.admission import occupancy

# The per-row record counts a summary adds up (besides the n_records_<type> columns): field -> column.
RECORD_COUNT_COLUMNS = {"record_splits": RECORD_SPLITS_COLUMN, "record_failed_pieces": RECORD_FAILED_COLUMN,
                        "record_runaway_pieces": RECORD_RUNAWAY_COLUMN, "record_invalid_items": RECORD_INVALID_COLUMN,
                        "dropped_values": DROPPED_VALUES_COLUMN, "dropped_records": DROPPED_RECORDS_COLUMN,
                        "record_incomplete": RECORD_INCOMPLETE_COLUMN}
EVIDENCE_COLUMNS = ("evidence_read", "evidence_captured", "evidence_retained")  # memagent/result_schema.py


@dataclass
class BatchSummary:
    rows_in: int
    skipped: int
    rows_out: int
    error_rows: int  # both kinds
    accuracy: float | None  # over this run's rows with answers, error rows counted wrong (as the evaluation does)
    context_tokens: int
    seconds: float
    output: str
    infra_errors: int = 0  # error rows that failed on the infrastructure: not done, a rerun redoes them
    accuracy_answered: float | None = None  # over the rows without error only
    scored_rows: int = 0  # rows with answers (the denominator of `accuracy`)
    # Continuous admission (filled by run_batch_qa from the actors' gates; None when no row ran).
    max_in_flight: int | None = None
    occupancy: float | None = None  # mean documents in flight / max_in_flight, all actors, job window
    actor_occupancy: dict[str, float] = field(default_factory=dict)  # per actor, over its own window
    peak_in_flight: int | None = None
    reading_seconds: float | None = None  # first document admitted to last document done, all actors
    actor_windows: dict[str, tuple[float, float]] = field(default_factory=dict)  # (first start, last done) s
    # How late the actors' event loops woke (mean over actors of their mean, the largest): CPU work
    # in an actor (chunking, prompt building) stalls every document in flight there.
    loop_lag_mean_s: float | None = None
    loop_lag_max_s: float | None = None
    # Prompt-lookup speculation, summed over actors (None: the engine reports no decode steps).
    draft_tokens: int = 0
    accepted_tokens: int = 0
    decode_steps: int | None = None
    stepped_tokens: int = 0  # completion tokens of the replies that reported decode steps
    # Prefill per call kind (memory, records, answer), summed over actors: [tokens computed, tokens whose
    # KV the engine reused] (the hf engine's prefix cache; engines that cannot say report none reused).
    prefill_by_call: dict[str, list[int]] = field(default_factory=dict)
    # Checkpoints: rows whose read resumed inside the document, the chunks they did not
    # read again, and checkpoints found but not used (stale: the input or config changed).
    resumed_rows: int = 0
    resumed_chunks: int = 0
    checkpoints_ignored: int = 0
    # Record types (extraction): records written per type by this run's rows, records replies split and
    # re-read, pieces left unread (their records are missing), and what require_grounding dropped (values
    # not found in the document; records whose key values were not all found).
    records: dict[str, int] = field(default_factory=dict)
    record_splits: int = 0
    record_failed_pieces: int = 0
    record_runaway_pieces: int = 0  # of the pieces left unread: the reply looped or listed records not in the text
    record_invalid_items: int = 0  # records dropped: they did not validate against the item schema
    dropped_values: int = 0
    dropped_records: int = 0
    record_incomplete: int = 0  # merged records dropped at the end: a required value never stated (or grounded)
    require_grounding: bool = False
    # Known evidence (NIAH needles, qa_2 supporting paragraphs; memagent/retention.py), summed over the rows.
    evidence_read: int = 0
    evidence_captured: int = 0
    evidence_retained: int = 0

    @classmethod
    def from_rows(cls, table: pa.Table, *, rows_in: int, skipped: int, seconds: float, output: str,
                  require_grounding: bool = False) -> BatchSummary:
        """Count this run's rows: ``table`` holds their ``id, error, score, context_tokens`` (and ``answers``;
        with record types ``n_records_<type>`` and the ``grounding_dropped_*`` counts)."""
        has_answers = "answers" in table.column_names
        scores = table.column("score").drop_null() if len(table) else pa.array([])
        errors = table.column("error").drop_null().cast(pa.string()) if len(table) else pa.array([], pa.string())
        # Rows that should have been scored: those with answers (error rows among them count as wrong).
        scored = len(scores)
        if has_answers and len(table):
            errored_with_answers = pc.and_(pc.is_valid(table.column("answers")), pc.is_valid(table.column("error")))
            scored += int(pc.sum(errored_with_answers).as_py() or 0)
        return cls(
            rows_in=rows_in,
            skipped=skipped,
            rows_out=len(table),
            error_rows=len(errors),
            infra_errors=int(pc.sum(pc.starts_with(errors, INFRA_PREFIX)).as_py() or 0) if len(errors) else 0,
            accuracy=(pc.sum(scores).as_py() or 0.0) / scored if scored else None,
            accuracy_answered=pc.mean(scores).as_py() if len(scores) else None,
            scored_rows=scored,
            context_tokens=int(pc.sum(table.column("context_tokens")).as_py() or 0) if len(table) else 0,
            seconds=seconds,
            output=output,
            **_resume_counts(table),
            **_record_counts(table),
            **{c: _sum(table, c) for c in EVIDENCE_COLUMNS if c in table.column_names},
            require_grounding=require_grounding,
        )

    def add_actor_snapshots(self, snapshots: dict[str, dict], max_in_flight: int) -> None:
        """Fill the admission and speculation figures from each actor's last gate/meter snapshot."""
        self.occupancy, self.actor_occupancy = occupancy(snapshots)
        self.max_in_flight = max_in_flight
        self.peak_in_flight = max((s["peak"] for s in snapshots.values()), default=None)
        starts = [s["first_start"] for s in snapshots.values() if s["first_start"] is not None]
        ends = [s["last_done"] for s in snapshots.values() if s["last_done"] is not None]
        self.reading_seconds = max(ends) - min(starts) if starts and ends else None
        self.actor_windows = {k: (round(s["first_start"] - min(starts), 3), round(s["last_done"] - min(starts), 3))
                              for k, s in snapshots.items() if s["first_start"] is not None and s["last_done"]}
        lags = [s for s in snapshots.values() if s.get("loop_lag_mean_s") is not None]
        if lags:
            self.loop_lag_mean_s = sum(s["loop_lag_mean_s"] for s in lags) / len(lags)
            self.loop_lag_max_s = max(s["loop_lag_max_s"] for s in lags)
        for key in ("draft_tokens", "accepted_tokens", "stepped_tokens"):
            setattr(self, key, sum(s.get(key, 0) for s in snapshots.values()))
        self.decode_steps = sum(s.get("decode_steps", 0) for s in snapshots.values()) or None
        self.prefill_by_call = {}
        for s in snapshots.values():
            for kind, (computed, reused) in s.get("prefill_by_call", {}).items():
                totals = self.prefill_by_call.setdefault(kind, [0, 0])
                totals[0], totals[1] = totals[0] + computed, totals[1] + reused

    def record(self) -> dict[str, Any]:
        """The headline figures as plain JSON-able data (flow results, artifacts)."""
        keys = ("rows_in", "skipped", "rows_out", "error_rows", "infra_errors", "accuracy", "accuracy_answered",
                "context_tokens", "resumed_rows", "resumed_chunks", "checkpoints_ignored", "records",
                *RECORD_COUNT_COLUMNS, "require_grounding", "prefill_by_call")
        return {**{k: getattr(self, k) for k in keys}, "seconds": round(self.seconds, 2),
                "tokens_per_second": round(self.tokens_per_second, 1), "output": self.output}

    @property
    def tokens_per_second(self) -> float:
        return self.context_tokens / self.seconds if self.seconds > 0 else 0.0

    def lines(self) -> list[str]:
        if self.rows_in == 0:  # one line: nothing was read, nothing started
            return [f"rows in:        0 (the input has no rows; nothing to do; output {self.output})"]
        acc = "n/a (no answers)" if self.accuracy is None else (
            f"{self.accuracy:.3f} over {self.scored_rows} rows, error rows counted wrong"
            + (f" ({self.accuracy_answered:.3f} over the rows without error)"
               if self.accuracy_answered is not None and self.error_rows else ""))
        errors = f"{self.error_rows}"
        if self.infra_errors:
            errors += (f" ({self.error_rows - self.infra_errors} row errors, done; {self.infra_errors} infrastructure "
                       "errors, redone by a rerun of the same command)")
        return [
            f"rows in:        {self.rows_in} ({self.skipped} already done, skipped)",
            f"rows out:       {self.rows_out} this run",
            f"error rows:     {errors}",
            f"accuracy:       {acc}",
            f"tokens read/s:  {self.tokens_per_second:.1f} ({self.context_tokens} tokens in {self.seconds:.1f} s)",
            f"output:         {self.output}",
            *self.resume_lines(),
            *self.records_lines(),
            *self.evidence_lines(),
            *self.occupancy_lines(),
            *self.speculation_lines(),
            *self.prefill_lines(),
        ]

    def resume_lines(self) -> list[str]:
        if not (self.resumed_rows or self.checkpoints_ignored):
            return []
        ignored = f"; {self.checkpoints_ignored} checkpoint(s) ignored (stale or unreadable)" \
            if self.checkpoints_ignored else ""
        return [f"resumed:        {self.resumed_rows} document(s) inside the text, {self.resumed_chunks} chunk(s) not "
                f"read again{ignored}"]

    def records_lines(self) -> list[str]:
        if not self.records:
            return []
        per = ", ".join(f"{n} {name}" for name, n in self.records.items())
        lines = [f"records:        {per}"]
        if self.record_splits or self.record_failed_pieces:
            runaway = (f", {self.record_runaway_pieces} of them because the reply ran away (looped, or listed records "
                      "the text does not state)") if self.record_runaway_pieces \
                else ""
            unread = (f"; {self.record_failed_pieces} piece(s) left (partly) unread, their records missing{runaway} "
                      "(the reply never fit --memory-tokens or never parsed: raise it, or use a stronger model)"
                      if self.record_failed_pieces else "")
            lines.append(f"  overflow:     {self.record_splits} reply(ies) split and re-read in halves{unread}")
        if self.record_invalid_items:
            lines.append(f"  invalid:      {self.record_invalid_items} record(s) dropped: not valid under the schema "
                         "(record_invalid_items)")
        if self.record_incomplete:
            lines.append(f"  incomplete:   {self.record_incomplete} record(s) dropped: a required value never stated "
                         "or grounded (record_incomplete; the fields each lacked are in schema_errors)")
        if self.require_grounding or self.dropped_values or self.dropped_records:
            lines.append(f"  grounding:    {self.dropped_values} value(s) and {self.dropped_records} record(s) dropped "
                         "(not found where the record was read; --require-grounding)")
        return lines

    def evidence_lines(self) -> list[str]:
        if not self.evidence_read:
            return []
        kept = f" ({self.evidence_retained / self.evidence_captured:.0%} of those captured)" \
            if self.evidence_captured else ""
        return [f"evidence:       {self.evidence_read} known item(s) read, {self.evidence_captured} captured by the "
                f"memory ({self.evidence_captured / self.evidence_read:.0%}), {self.evidence_retained} still held at "
                f"the answer{kept}"]

    def prefill_lines(self) -> list[str]:
        """Prompt tokens computed vs reused per call kind (nothing when the engine reused none)."""
        if not any(reused for _, reused in self.prefill_by_call.values()):
            return []
        parts = [f"{kind} {computed} computed, {reused} reused ({reused / max(computed + reused, 1):.0%})"
                 for kind, (computed, reused) in sorted(self.prefill_by_call.items())]
        return [f"prefill:        {'; '.join(parts)} (prompt tokens; reused: KV from the prefix cache)"]

    def speculation_lines(self) -> list[str]:
        if not self.decode_steps:
            return []
        rate = (f"{self.accepted_tokens / self.draft_tokens:.3f} ({self.accepted_tokens} of {self.draft_tokens} "
                "drafted tokens kept)" if self.draft_tokens else "n/a (nothing drafted)")
        return [f"speculation:    acceptance {rate}, "
                f"{self.stepped_tokens / self.decode_steps:.2f} tokens per decode step"]

    def occupancy_lines(self) -> list[str]:
        if self.occupancy is None:
            return []
        per = ", ".join(f"{k.split(':')[0]} {v:.2f}" for k, v in sorted(self.actor_occupancy.items()))
        reading = f", reading {self.reading_seconds:.1f} s" if self.reading_seconds is not None else ""
        lines = [f"occupancy:      {self.occupancy:.3f} (mean in-flight / max_in_flight={self.max_in_flight}, "
                 f"peak {self.peak_in_flight}{reading})", f"  per actor:    {per}"]
        if self.loop_lag_mean_s is not None:
            lines.append(f"  loop lag:     mean {self.loop_lag_mean_s * 1e3:.0f} ms, "
                         f"max {(self.loop_lag_max_s or 0) * 1e3:.0f} ms (how late the actors' event loops woke)")
        return lines


def _resume_counts(table: pa.Table) -> dict[str, int]:
    if "resumed_at_chunk" not in table.column_names or not len(table):
        return {}
    resumed = table.column("resumed_at_chunk").drop_null()
    ignored = table.column("checkpoint_ignored") if "checkpoint_ignored" in table.column_names else pa.array([])
    return dict(resumed_rows=len(resumed), resumed_chunks=int(pc.sum(resumed).as_py() or 0),
                checkpoints_ignored=len(ignored) - ignored.null_count)


def _sum(table: pa.Table, name: str) -> int:
    col = table.column(name)
    return int(pc.sum(col).as_py() or 0) if len(table) and not pa.types.is_null(col.type) else 0


def _record_counts(table: pa.Table) -> dict[str, Any]:
    """Records per type and the grounding drops, summed over the rows (none without record types)."""
    names = [c for c in table.column_names if c.startswith(N_RECORDS_PREFIX)]
    if not names:
        return {}
    out: dict[str, Any] = {"records": {c[len(N_RECORDS_PREFIX):]: _sum(table, c) for c in names}}
    for key, col in RECORD_COUNT_COLUMNS.items():
        if col in table.column_names:
            out[key] = _sum(table, col)
    return out
