"""Continuous admission in the batch job: the gate, the default, and the real Ray Data job with a scripted engine."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from pathlib import Path

import pytest

from memagent.engines import EngineConfig
from pipelines.admission import AdmissionPlan, Gate, default_max_in_flight, occupancy, resolve_max_in_flight
from pipelines.job import JobConfig
from tests.pipeline_helpers import FAST_AGENT, CrashOnce, ScriptedEngine, good_rows, read_output, scripted_engine, write_rows

REPO = Path(__file__).resolve().parents[1]


# -- units --------------------------------------------------------------------------------------

def test_gate_caps_in_flight_and_integrates():
    gate = Gate(3)
    seen = []

    async def doc(i):
        async with gate.slot():
            seen.append(gate.in_flight)
            await asyncio.sleep(0.01 * (i % 3 + 1))

    async def main():
        await asyncio.gather(*(doc(i) for i in range(10)))

    asyncio.run(main())
    snap = gate.snapshot()
    assert max(seen) == 3 == gate.peak and snap["done"] == 10 and snap["in_flight"] == 0
    occ, per = occupancy({"a:1": snap})
    assert 0.5 < occ <= 1.0 and per["a:1"] == pytest.approx(occ)


def test_a_long_document_reserves_the_gate():
    gate = Gate(6, reserve_limit=2)
    log = []  # (in_flight at admission, whether the long document was reading then)

    async def doc(seconds, long=False):
        async with gate.slot(long=long):
            log.append((gate.in_flight, gate.long_in_flight > 0 and not long))
            await asyncio.sleep(seconds)

    async def main():
        first = asyncio.ensure_future(doc(0.2, long=True))
        await asyncio.sleep(0.01)
        await asyncio.gather(first, *(doc(0.02) for _ in range(12)))
        await asyncio.gather(*(doc(0.05) for _ in range(6)))  # after it: the full limit again

    asyncio.run(main())
    during = [n for n, reading in log if reading]
    assert during and max(during) == 2  # only one other document beside the long one
    assert log[-6:] and max(n for n, _ in log[-6:]) == 6 and gate.done == 19
    with pytest.raises(ValueError, match="reserve_limit"):
        Gate(4, reserve_limit=5)


def test_meter_reports_a_blocked_event_loop():
    from pipelines.engine_metrics import ActorMeter, MeteredEngine

    async def main():
        meter = ActorMeter("a", MeteredEngine(ScriptedEngine(None, 0.0, None)), Gate(2), period_s=0.05)
        assert meter.lag_snapshot() == {"loop_lag_mean_s": None, "loop_lag_max_s": None}
        meter.start()
        await asyncio.sleep(0.12)
        time.sleep(0.3)  # CPU work on the actor's loop (chunking a long document, say)
        await asyncio.sleep(0.12)
        return meter.lag_snapshot()

    lag = asyncio.run(main())
    assert 0.2 < lag["loop_lag_max_s"] < 1.0 and 0 < lag["loop_lag_mean_s"] < lag["loop_lag_max_s"]


def test_long_documents_are_counted_in_tokens_by_the_reads_own_chunking():
    """A document is long from ``min_tokens`` tokens; when counted, the count is the chunking the read would
    do itself (same chunks), and a text the tokenizer fails on is not counted (its read fails as its row)."""
    from memagent.chunking import chunk_document
    from memagent.models import load_tokenizer
    from pipelines.admission import count_document

    text = "The river runs past the old mill. " * 300  # ~2,400 tokens, ~10,000 characters
    assert count_document(None, text, None, 64) == (False, None) and count_document(None, None, 10, 64) == (False, None)
    assert count_document(None, text, 20_000, 64) == (False, None)  # shorter in characters: no tokenizer needed
    tok = load_tokenizer("smollm2-135m")
    (long, doc), (short, _) = count_document(tok, text, 2_000, 64, 8), count_document(tok, text, 5_000, 64, 8)
    assert long and not short
    assert doc == chunk_document(tok, text, 64, 8) and doc.truncated and doc.context_tokens >= 2_000
    assert count_document(object(), text, 2_000, 64) == (False, None)  # not a tokenizer: not counted


def test_a_counted_document_is_not_tokenized_again_by_its_read(monkeypatch, tmp_path):
    """The worker's count of a long document is the read's chunking: the read then tokenizes no document text
    (only the question), and its answer is the one an uncounted read gives."""
    from memagent import chunking
    from memagent.models import load_tokenizer
    from pipelines.admission import count_document
    from pipelines.batch_qa import BatchQAConfig
    from pipelines.worker import read_row

    row = good_rows(1, tokens=3000)[0]
    tok = load_tokenizer("smollm2-135m")
    cfg = BatchQAConfig(input=str(tmp_path), output=str(tmp_path / "out"), agent=FAST_AGENT,
                        engine=EngineConfig(model="smollm2-135m"))
    long, chunked = count_document(tok, row["context"], 2_000, FAST_AGENT.chunk_tokens, FAST_AGENT.max_chunks)
    assert long and chunked is not None
    seen: list[int] = []
    original = chunking.document_offsets
    monkeypatch.setattr(chunking, "document_offsets", lambda t, text, *a: seen.append(len(text)) or original(t, text, *a))

    async def no_chain(_row):
        return {}

    engine = ScriptedEngine(tok, 0.0, None)
    once = asyncio.run(read_row(engine, row, cfg, no_chain, chunked=chunked))
    assert seen == [] and once["error"] is None and once["n_chunks"] == len(chunked.chunks)
    again = asyncio.run(read_row(engine, row, cfg, no_chain))
    assert seen == [len(row["context"])]
    assert {k: again[k] for k in ("response", "n_chunks", "context_tokens")} == \
        {k: once[k] for k in ("response", "n_chunks", "context_tokens")}


def test_long_document_settings_are_checked():
    from pipelines.job import JobConfig

    with pytest.raises(ValueError, match="long_document_in_flight"):
        JobConfig(max_in_flight=2, long_document_tokens=1000, long_document_in_flight=3)
    assert JobConfig(max_in_flight=2).long_document_in_flight == 4  # no reservation: nothing to check
    with pytest.raises(ValueError):
        JobConfig(long_document_tokens=0)


def test_one_default_per_engine():
    assert default_max_in_flight(EngineConfig()) == 16  # hf on CPU: benchmarks/results/concurrency.json
    assert default_max_in_flight(EngineConfig(engine="vllm", device="cuda")) == 256
    openai = EngineConfig(engine="openai", endpoint="http://127.0.0.1:1/v1", max_concurrency=40)
    assert default_max_in_flight(openai) == 40
    assert resolve_max_in_flight(3, openai) == 3
    assert AdmissionPlan(16).calls == 16 and AdmissionPlan(16, rows_per_call=4).calls == 4
    barrier = AdmissionPlan.for_job(JobConfig(max_in_flight=8, admission="barrier"), EngineConfig())
    assert barrier == AdmissionPlan(8, 8, 1, queued_per_actor=1)
    assert AdmissionPlan.for_job(JobConfig(), EngineConfig()) == AdmissionPlan(16, rows_per_call=1)
    assert AdmissionPlan(16).tasks_in_flight == 20 and barrier.tasks_in_flight == 2
    with pytest.raises(ValueError):
        AdmissionPlan(0)


# -- the real job on local Ray ------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_local():
    import ray

    # The actors import this module for the scripted engine.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    yield
    ray.shutdown()


def run_job(tiny_llama_dir, rows, tmp_path, name, *, log=None, sleep_s=0.03, max_in_flight=4, crash=None, **job):
    from pipelines.batch_qa import BatchQAConfig, run_batch_qa
    from pipelines.job import JobConfig

    inp = tmp_path / f"{name}-in"
    if not inp.exists():
        write_rows(inp / "part-0.parquet", rows)
    cfg = BatchQAConfig(input=str(inp), output=str(tmp_path / f"{name}-out"), agent=FAST_AGENT,
                        engine=EngineConfig(model=str(tiny_llama_dir)),
                        job=JobConfig(batch_size=4, max_in_flight=max_in_flight, progress=False, **job))
    build = functools.partial(scripted_engine, {"tokenizer": str(tiny_llama_dir), "sleep_s": sleep_s,
                                                "log": str(log) if log else None})
    if crash is not None:  # (at_call, marker)
        build = CrashOnce(*crash, build=build)
    return run_batch_qa(cfg, build_engine=build), read_output(tmp_path / f"{name}-out")


def long_and_short_rows() -> list[dict]:
    rows = good_rows(1, tokens=6000) + good_rows(20, start=1, tokens=100)  # the long one first
    for i, r in enumerate(rows):
        r["question"] = f"What is the special magic number number {i}?"  # one question per document
    return rows


@pytest.mark.slow
def test_short_documents_finish_while_the_long_one_reads(ray_local, tiny_llama_dir, tmp_path):
    """Short documents are admitted and finished while a long one reads, never more than 4 at once."""
    rows = long_and_short_rows()
    log = tmp_path / "calls.jsonl"
    summary, out = run_job(tiny_llama_dir, rows, tmp_path, "mix", log=log, sleep_s=0.05)
    assert sorted(r["id"] for r in out) == sorted(r["id"] for r in rows)  # every id exactly once
    assert all(r["error"] is None for r in out)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    spans = {}
    for c in calls:
        t0, t1 = spans.get(c["q"], (c["t"], c["t"]))
        spans[c["q"]] = (min(t0, c["t"]), max(t1, c["t"]))
    long_q = rows[0]["question"]
    long_start, long_end = spans.pop(long_q)
    assert len(spans) == 20
    assert out and next(r for r in out if r["id"] == rows[0]["id"])["n_chunks"] >= 80
    # Every short document finished while the long one was still reading (no batch barrier held them
    # back). The long one's first call comes after its chunking, which a loaded machine can stretch: a
    # short may start and end inside it, but at most 3 shorts are reading beside it at that call.
    assert all(t1 < long_end for _, t1 in spans.values()), (long_start, long_end, spans)
    assert sum(t0 <= long_start < t1 for t0, t1 in spans.values()) <= 3, (long_start, spans)
    assert sum(long_start < t0 for t0, _ in spans.values()) >= 10, (long_start, spans)
    # Never more than 4 documents reading at once (the gate's own count, and the engine's view).
    assert summary.max_in_flight == 4 and summary.peak_in_flight == 4
    events = sorted([(t0, 1) for t0, _ in spans.values()] + [(t1, -1) for _, t1 in spans.values()])
    level, top = 1, 1  # the long one is reading throughout
    for _, d in events:
        level += d
        top = max(top, level)
    assert top <= 4
    assert summary.occupancy is not None and 0 < summary.occupancy <= 1
    assert any(line.startswith("occupancy:") for line in summary.lines())


def call_spans(log: Path) -> dict[str, tuple[float, float]]:
    """Per question: the times of its first and last engine call."""
    spans: dict[str, tuple[float, float]] = {}
    for c in (json.loads(line) for line in log.read_text().splitlines()):
        t0, t1 = spans.get(c["q"], (c["t"], c["t"]))
        spans[c["q"]] = (min(t0, c["t"]), max(t1, c["t"]))
    return spans


@pytest.mark.slow
def test_longest_first_and_a_reserved_actor(ray_local, tiny_llama_dir, tmp_path):
    rows = long_and_short_rows()  # the long document first in the input
    log = tmp_path / "calls.jsonl"
    summary, out = run_job(tiny_llama_dir, rows, tmp_path, "reserve", log=log, sleep_s=0.05,
                           long_document_tokens=3000, long_document_in_flight=2)
    assert sorted(r["id"] for r in out) == sorted(r["id"] for r in rows) and all(r["error"] is None for r in out)
    spans = call_spans(log)
    long_start, long_end = spans.pop(rows[0]["question"])
    # A short document admitted while it read had no other short one beside it (the reservation: 2 in
    # flight), though the gate holds 4. The log shows engine calls, not admissions: up to 3 shorts
    # admitted just before the long one (while it was tokenized) can make their first call after its
    # first; every later short waited for those to end, so from the 4th on none overlaps another.
    started_during = sorted((t0, t1) for t0, t1 in spans.values() if long_start < t0 < long_end)
    assert len(started_during) >= 8, (long_start, long_end, sorted(spans.values()))
    for t0, _ in started_during[3:]:
        beside = [(a, b) for a, b in spans.values() if a < t0 < b]
        assert not beside, (t0, beside)
    assert summary.peak_in_flight <= 4

    # Longest first: the long document last in the input still starts among the first.
    rows = rows[1:] + rows[:1]
    log = tmp_path / "calls-sorted.jsonl"
    _, out = run_job(tiny_llama_dir, rows, tmp_path, "sorted", log=log, longest_first=True)
    assert sorted(r["id"] for r in out) == sorted(r["id"] for r in rows)
    spans = call_spans(log)
    long_start, _ = spans.pop(rows[-1]["question"])
    assert sum(long_start <= t0 for t0, _ in spans.values()) >= 20 - 3


@pytest.mark.slow
def test_crash_mid_job_and_rerun_give_every_id_once(ray_local, tiny_llama_dir, tmp_path):
    rows = good_rows(12, tokens=150)
    marker = tmp_path / "crashed"
    # The 20th conversation (~5 rows in): the rows in flight beside it die with the actor.
    summary, out = run_job(tiny_llama_dir, rows, tmp_path, "crash", sleep_s=0.05, crash=(20, marker))
    assert marker.exists(), "the injected crash did not happen"
    assert sorted(r["id"] for r in out) == [r["id"] for r in rows] and summary.rows_out == 12
    again, out = run_job(tiny_llama_dir, rows, tmp_path, "crash")
    assert again.rows_out == 0 and again.skipped == 12
    assert sorted(r["id"] for r in out) == [r["id"] for r in rows]


@pytest.mark.slow
def test_error_rows_unchanged_under_admission(ray_local, tiny_llama_dir, tmp_path):
    rows = good_rows(5)
    rows[1]["context"] = None
    rows[2]["context"] = "   \n"
    rows[3]["question"] = None
    summary, out = run_job(tiny_llama_dir, rows, tmp_path, "errors")
    errors = {r["id"]: r["error"] for r in out if r["error"]}
    assert sorted(r["id"] for r in out) == [r["id"] for r in rows]
    assert set(errors) == {"doc-001", "doc-002", "doc-003"} and summary.error_rows == 3
    assert "context must be a string, got null" in errors["doc-001"]
    assert "context is empty" in errors["doc-002"]
    assert "question must be a non-empty string" in errors["doc-003"]
    for r in out:
        if r["error"]:
            assert r["prediction"] is None and r["steps"] is None and r["score"] is None
