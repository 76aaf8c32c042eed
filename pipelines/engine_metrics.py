"""Per-actor engine metrics, exported with ``ray.util.metrics`` (Ray dashboard / Prometheus).

Every series carries an ``actor`` tag (the Ray actor id, 8 characters). Ray prefixes the names
with ``ray_`` on its metrics endpoint (``ray.init(_metrics_export_port=P)`` then
``curl 127.0.0.1:P/metrics``, or the dashboard's Metrics tab with Prometheus/Grafana; the
endpoint is served by Ray's dashboard agent, so it needs ``ray[default]``'s packages, not only
``ray[data]``):

=================================== ========= ===================================================
memagent_docs_in_flight             gauge     documents reading now (the admission gate's count)
memagent_max_in_flight              gauge     the gate's size
memagent_occupancy                  gauge     mean in-flight / max_in_flight since the first row
memagent_requests_queued            gauge     engine requests not yet answered (the engine's own
                                              waiting queue when it reports one)
memagent_prefill_tokens_per_s       gauge     prompt tokens the engine answered, last interval
memagent_decode_tokens_per_s        gauge     completion tokens, last interval
memagent_memory_steps_per_s         gauge     memory-update conversations finished, last interval
memagent_step_latency_s             histogram seconds of one conversation (request to reply)
memagent_loop_lag_s                 gauge     how late the actor's event loop woke, last interval
                                              (CPU work in the actor: chunking, prompts; it
                                              delays every document in flight and the engine's
                                              own coroutines)
memagent_spec_acceptance_rate       gauge     drafted tokens the model kept / tokens drafted, since
                                              the actor started (prompt-lookup speculation; absent
                                              before the first draft)
memagent_tokens_per_decode_step     gauge     completion tokens / decode forward passes, since the
                                              actor started (1.0 without speculation; engines that
                                              report decode steps only)
memagent_prefill_reused_ratio       gauge     prompt tokens whose KV the engine reused (its prefix
                                              cache) / prompt tokens, since the actor started
memagent_docs_done_total            counter   documents finished (error rows included)
memagent_{prefill,decode}_tokens_total counter token totals (Prometheus ``rate()`` works on them)
=================================== ========= ===================================================
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from memagent.engines.base import Completion, Engine, Messages, SamplingParams

STEP_LATENCY_BOUNDARIES = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300]


class MeteredEngine(Engine):
    """An engine wrapper that counts requests in flight, conversation latency and memory steps."""

    def __init__(self, inner: Engine, memory_tokens: int | None = None):
        self.inner = inner
        self.name, self.context_window, self.tokenizer = inner.name, inner.context_window, inner.tokenizer
        self.stats = inner.stats
        self.memory_tokens = memory_tokens
        self.outstanding = 0
        self.memory_steps = 0
        self.latencies: list[float] = []  # drained by the meter
        # Speculation totals from the replies (Completion.draft_tokens / accepted_tokens / decode_steps).
        self.draft_tokens = self.accepted_tokens = self.decode_steps = self.stepped_tokens = 0
        # Per call kind (SamplingParams.call: memory, records, answer; "other" unsaid): prompt tokens the
        # engine computed and those whose KV it reused (Completion.cached_prompt_tokens).
        self.prefill_by_call: dict[str, list[int]] = {}

    @property
    def queued(self) -> int:
        own = getattr(self.inner, "queued", None)
        return int(own) if own is not None else self.outstanding

    async def chat(self, messages: Messages, params: SamplingParams) -> Completion:
        self.outstanding += 1
        t0 = time.perf_counter()
        try:
            reply = await self.inner.chat(messages, params)
        finally:
            self.outstanding -= 1
        self.latencies.append(time.perf_counter() - t0)
        self.draft_tokens += reply.draft_tokens
        counts = self.prefill_by_call.setdefault(params.call or "other", [0, 0])
        counts[0] += reply.prompt_tokens - reply.cached_prompt_tokens
        counts[1] += reply.cached_prompt_tokens
        self.accepted_tokens += reply.accepted_tokens
        if reply.decode_steps:  # replies from engines that count their decode steps
            self.decode_steps += reply.decode_steps
            self.stepped_tokens += reply.completion_tokens
        if self.memory_tokens is not None and params.max_tokens == self.memory_tokens:
            self.memory_steps += 1
        return reply

    def encode_chat(self, messages: Messages) -> list[int]:
        return self.inner.encode_chat(messages)

    def count_chat_tokens(self, messages: Messages) -> int:
        return self.inner.count_chat_tokens(messages)

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:  # anything else an engine offers (update_weights, ...)
        return getattr(self.inner, name)


class ActorMeter:
    """Publishes one actor's gauges every ``period_s`` from its gate and its metered engine."""

    def __init__(self, actor: str, engine: MeteredEngine, gate: Any, period_s: float = 1.0):
        from ray.util.metrics import Counter, Gauge, Histogram

        self.actor, self.engine, self.gate, self.period_s = actor, engine, gate, period_s
        self.tags = {"actor": actor}
        keys = ("actor",)
        g = lambda n, d: Gauge(n, d, tag_keys=keys)  # noqa: E731
        self.in_flight = g("memagent_docs_in_flight", "Documents reading now in this actor.")
        self.max_in_flight = g("memagent_max_in_flight", "Documents this actor may read at once.")
        self.occupancy = g("memagent_occupancy", "Mean documents in flight / max_in_flight since the first row.")
        self.queued = g("memagent_requests_queued", "Engine requests waiting for an answer.")
        self.prefill_tps = g("memagent_prefill_tokens_per_s", "Prompt tokens answered per second (last interval).")
        self.decode_tps = g("memagent_decode_tokens_per_s", "Completion tokens per second (last interval).")
        self.steps_ps = g("memagent_memory_steps_per_s", "Memory-update conversations per second (last interval).")
        self.latency = Histogram("memagent_step_latency_s", "Seconds of one agent conversation.",
                                 boundaries=STEP_LATENCY_BOUNDARIES, tag_keys=keys)
        self.docs_done = Counter("memagent_docs_done", "Documents finished (error rows included).", tag_keys=keys)
        self.prefill_total = Counter("memagent_prefill_tokens", "Prompt tokens answered.", tag_keys=keys)
        self.decode_total = Counter("memagent_decode_tokens", "Completion tokens generated.", tag_keys=keys)
        self._last = (time.perf_counter(), engine.stats.prompt_tokens, engine.stats.completion_tokens,
                      engine.memory_steps, gate.done)
        self.loop_lag = g("memagent_loop_lag_s", "Seconds the actor's event loop woke late (last interval).")
        self.acceptance = g("memagent_spec_acceptance_rate", "Drafted tokens kept / drafted (speculation), cumulative.")
        self.tokens_per_step = g("memagent_tokens_per_decode_step", "Completion tokens per decode forward, cumulative.")
        self.reused = g("memagent_prefill_reused_ratio", "Prompt tokens whose KV was reused / prompt tokens, cumulative.")
        self.lag_sum, self.lag_n, self.lag_max = 0.0, 0, 0.0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Start publishing on the running loop (the actor's); idempotent."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(self.period_s)
            lag = max(0.0, time.perf_counter() - t - self.period_s)
            self.lag_sum, self.lag_n, self.lag_max = self.lag_sum + lag, self.lag_n + 1, max(self.lag_max, lag)
            self.loop_lag.set(lag, self.tags)
            self.publish()

    def lag_snapshot(self) -> dict:
        """Mean and largest event-loop lag so far, seconds (None before the first interval)."""
        return {"loop_lag_mean_s": self.lag_sum / self.lag_n if self.lag_n else None,
                "loop_lag_max_s": self.lag_max if self.lag_n else None}

    def spec_snapshot(self) -> dict:
        """Speculation totals so far (the job summary sums them over actors)."""
        e = self.engine
        return {"draft_tokens": e.draft_tokens, "accepted_tokens": e.accepted_tokens,
                "decode_steps": e.decode_steps, "stepped_tokens": e.stepped_tokens,
                "prefill_by_call": {k: list(v) for k, v in e.prefill_by_call.items()}}

    def publish(self) -> None:
        now = time.perf_counter()
        stats, e, gate = self.engine.stats, self.engine, self.gate
        t, p, d, m, done = self._last
        dt = max(now - t, 1e-9)
        snap = gate.snapshot()
        self.in_flight.set(gate.in_flight, self.tags)
        self.max_in_flight.set(gate.limit, self.tags)
        if snap["first_start"] is not None and snap["at"] > snap["first_start"]:
            self.occupancy.set(snap["integral"] / (gate.limit * (snap["at"] - snap["first_start"])), self.tags)
        self.queued.set(e.queued, self.tags)
        self.prefill_tps.set((stats.prompt_tokens - p) / dt, self.tags)
        self.decode_tps.set((stats.completion_tokens - d) / dt, self.tags)
        self.steps_ps.set((e.memory_steps - m) / dt, self.tags)
        if stats.prompt_tokens > p:
            self.prefill_total.inc(stats.prompt_tokens - p, self.tags)
        if stats.completion_tokens > d:
            self.decode_total.inc(stats.completion_tokens - d, self.tags)
        if gate.done > done:
            self.docs_done.inc(gate.done - done, self.tags)
        if e.draft_tokens:
            self.acceptance.set(e.accepted_tokens / e.draft_tokens, self.tags)
        if e.decode_steps:
            self.tokens_per_step.set(e.stepped_tokens / e.decode_steps, self.tags)
        if stats.prompt_tokens:
            self.reused.set(stats.cached_prompt_tokens / stats.prompt_tokens, self.tags)
        latencies, e.latencies = e.latencies, []
        for x in latencies:
            self.latency.observe(x, self.tags)
        self._last = (now, stats.prompt_tokens, stats.completion_tokens, e.memory_steps, gate.done)
