"""Faults at every checkpoint write site, then plain reruns: nothing lost, mixed or stuck (tests/faults.py)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent.data.demo import niah_row
from tests.faults import FAULTS, LISTS, WRITES, FaultyFS, run_job, steps_without_times

EVERY = 2  # checkpoint interval (memory updates)
# The scenario every fault lands in: run 1 is killed at its third segment (mid-document), so run 2
# resumes (reads, replays, removes) and run 3 is a plain rerun.
BASE = {(1, "open_output_stream", 2): "kill_before"}


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    out = []
    for i, tokens in enumerate((260, 200)):
        r = niah_row(i, tokens, depth=0.5, seed=7)
        out.append({"id": f"doc/{i}", "question": r["question"], "context": r["context"]})
    return out


@pytest.fixture(scope="module", params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def where(request, tmp_path_factory):
    """(a fresh output uri per call, S3Options or None) on local disk or a moto server on loopback."""
    if request.param == "local":
        root = tmp_path_factory.mktemp("faults")
        counter = iter(range(10**9))
        yield (lambda: str(root / f"out{next(counter)}")), None
        return
    import os

    from infra.local_s3 import CREDENTIALS, s3_server
    from pipelines.storage import S3Options

    old = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    try:
        with s3_server(buckets=("lake",)) as endpoint:
            counter = iter(range(10**9))
            yield (lambda: f"s3://lake/out{next(counter)}"), S3Options(endpoint_url=endpoint)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture(scope="module")
def baseline(where, rows, tokenizer):
    """The fault-free read (the oracle), and how often each storage call ran in each run of the base scenario."""
    new_output, s3 = where
    clean = run_job(rows, new_output(), s3, tokenizer, {}, every_steps=EVERY)
    assert clean.runs == 2 and all(len(v) == 1 for v in clean.committed.values())
    calls: dict = {}
    base = run_job(rows, new_output(), s3, tokenizer, BASE, every_steps=EVERY, calls=calls)
    check(base, clean, rows)
    assert calls.get((2, "open_input_stream"))  # run 2 resumed from the log
    return clean, calls


def check(outcome, baseline_outcome, rows) -> int:
    """The harness's invariant; returns the chunks re-read."""
    for row in rows:
        done = outcome.committed.get(row["id"], [])
        assert len(done) == 1, f"{row['id']} committed {len(done)} times"  # every id exactly once
        (record,) = done
        assert record["error"] is None  # no row left failed by a fault a rerun heals
        steps = steps_without_times(record)
        assert [s["step"] for s in steps] == list(range(len(steps)))  # consecutive steps
        want = steps_without_times(baseline_outcome.committed[row["id"]][0])
        assert steps == want and record["memory"] == baseline_outcome.committed[row["id"]][0]["memory"]  # one chain
    reread = outcome.updates - baseline_outcome.updates
    assert reread <= EVERY * max(1, len(outcome.injected)), (reread, outcome.injected)  # one interval per fault
    return reread


def sites(calls: dict[tuple[int, str], int]) -> list[tuple[int, str, int, str]]:
    """Every storage call site of runs 1 and 2 once (its first call and its last), with each fault that applies."""
    out = []
    for (run, name), n in sorted(calls.items()):
        if run > 2:
            continue
        reads = ["fail", "kill_before", "delay", *(["reorder"] if name in LISTS else [])]
        faults = [f for f in FAULTS if f != "reorder"] if name in WRITES else reads
        out += [(run, name, i, f) for i in sorted({0, n - 1}) for f in faults]
    return out


def test_a_fault_at_every_write_site_is_healed_by_reruns(where, rows, tokenizer, baseline):
    """A fault (fail, lost response, kill, delay, reordered listing) at each storage call site leaves every id done
    once, each trace the fault-free chain, and at most one checkpoint interval re-read per fault."""
    new_output, s3 = where
    clean, calls = baseline
    assert {(1, "open_output_stream"), (2, "get_file_info"), (2, "open_input_stream")} <= set(calls)
    for run, name, n, fault in sites(calls):
        plan = {**BASE, (run, name, n): fault}
        check(run_job(rows, new_output(), s3, tokenizer, plan, every_steps=EVERY), clean, rows)


@pytest.mark.slow
@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_random_fault_sequences_are_healed_by_reruns(where, rows, tokenizer, baseline, data):
    """A kill in run 1 and up to 3 more faults at any storage calls of the runs leave every id done once, one chain
    per trace, and at most one checkpoint interval re-read per fault (100 sequences on each of local disk and S3)."""
    new_output, s3 = where
    clean, calls = baseline
    sites = sorted(calls)
    kill = data.draw(st.integers(0, calls[(1, "open_output_stream")] - 1))  # a preemption in run 1's writes
    more = data.draw(st.lists(st.tuples(st.sampled_from(sites), st.floats(0, 1, exclude_max=True),
                                        st.sampled_from(FAULTS)), max_size=3))
    plan = {(1, "open_output_stream", kill): "kill_before"}
    plan.update({(run, name, int(x * calls[(run, name)])): fault for (run, name), x, fault in more})
    outcome = run_job(rows, new_output(), s3, tokenizer, plan, every_steps=EVERY)
    check(outcome, clean, rows)
