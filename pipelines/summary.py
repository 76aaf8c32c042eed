"""What one batch QA run wrote: counts, accuracy, throughput and how full the actors were kept."""

from __future__ import annotations

from dataclasses import dataclass, field


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

    @property
    def tokens_per_second(self) -> float:
        return self.context_tokens / self.seconds if self.seconds > 0 else 0.0

    def lines(self) -> list[str]:
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
            *self.occupancy_lines(),
            *self.speculation_lines(),
        ]

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
