"""Faults at every store call of the batch job (checkpoints, records, output files, the lease), then plain
reruns: nothing lost, doubled, mixed or stuck (memagent_testing/faults.py runs the job, memagent_testing/fault_fs.py injects)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent_testing.fault_fs import FAULTS, LISTS, WRITES, applies
from memagent_testing.faults import documents, run_job, steps_without_times, write_input

EVERY = 2  # checkpoint interval (memory updates)
# The scenario every fault lands in: run 1's actor dies in its first checkpoint write (Ray retries the row,
# from the start: that log never landed), then the machine dies inside a later document, so run 2 takes the
# dead run's lease over, resumes (reads, replays, removes the log) and exports the records dataset.
BASE = {(1, "checkpoint", "open_output_stream", 0): "kill_after", (1, "checkpoint", "open_output_stream", 6): "preempt"}


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture(scope="module")
def docs():
    return documents()


@pytest.fixture(scope="module")
def input_dir(tmp_path_factory, docs) -> str:
    return write_input(tmp_path_factory.mktemp("faults-input"), docs)


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
def baseline(where, docs, input_dir, tokenizer):
    """The fault-free job (the oracle), and how often each store call ran in each run of the base scenario."""
    new_output, s3 = where
    clean = run_job(docs, input_dir, new_output(), s3, tokenizer, {}, every_steps=EVERY)
    assert clean.runs == 1 and clean.records and not clean.leftovers
    base = run_job(docs, input_dir, new_output(), s3, tokenizer, BASE, every_steps=EVERY)
    check(base, clean, docs)
    assert base.calls.get((2, "checkpoint", "open_input_stream"))  # run 2 resumed from the log
    return clean, base.calls


def check(outcome, clean, docs) -> int:
    """The harness's invariant; returns the chunks re-read."""
    for doc in docs:
        done = outcome.rows.get(doc.id, [])
        assert len(done) == 1, f"{doc.id} written {len(done)} times"  # every id exactly once
        (row,) = done
        assert row["error"] is None, row["error"]  # no row left failed by a fault a rerun heals
        steps = steps_without_times(row)
        assert [s["step"] for s in steps] == list(range(len(steps)))  # consecutive steps
        (want,) = clean.rows[doc.id]
        assert steps == steps_without_times(want) and row["memory"] == want["memory"]  # one chain
    assert outcome.records == clean.records  # the records, exactly once
    assert outcome.exported == clean.records  # and the records dataset's files hold them once
    assert not outcome.leftovers, outcome.leftovers  # no checkpoint log, stray export file or lease left
    reread = outcome.updates - clean.updates
    assert reread <= EVERY * max(1, len(outcome.injected)), (reread, outcome.injected)  # one interval per fault
    return reread


def sites(calls: dict[tuple[int, str, str], int], every_call: bool) -> list[tuple[int, str, str, int, str]]:
    """With ``every_call``: every store call of runs 1 and 2 failing, and each call site's first and last call
    with each other fault that applies. Without it (S3, where a call costs a request): each write and listing
    site's first call with each fault the store answers (a failure, a lost response, a reordered listing):
    reads fail alike on every store, and a kill leaves what the store call before it left, which the local
    sites and the random sequences on S3 cover. A delay only in the random sequences: it changes nothing a
    single fault could show."""
    out = []
    for (run, site, call), n in sorted(calls.items()):
        if run > 2 or not (every_call or call in WRITES + LISTS):
            continue
        at = sorted({0, n - 1}) if every_call else [0]
        faults = FAULTS if every_call else ("lost", "reorder")
        out += [(run, site, call, i, "fail") for i in (range(n) if every_call else at)]
        out += [(run, site, call, i, f) for i in at for f in faults if f not in ("delay", "fail") and applies(f, call)]
    return out


def test_the_sites_cover_every_store(baseline):
    """The enumerated sites hold a write and a listing of each store (checkpoints, the records dataset, output
    files, the lease) and a removal of each but the records dataset (run 2's export is the output's first, so
    it replaces nothing: an export's removals are faulted in tests/test_records_output.py): every kind of call
    the job makes to each store gets its faults."""
    _, calls = baseline
    made = {(site, call) for (run, site, call) in calls if run <= 2}
    for site in ("checkpoint", "records", "output"):
        assert (site, "open_output_stream") in made and (site, "get_file_info_selector") in made, site
        removes = any((site, call) in made for call in ("delete_file", "delete_dir", "delete_dir_contents"))
        assert removes or site == "records", site
    assert {("lease", "put"), ("lease", "delete"), ("lease", "read")} <= made


def test_a_fault_at_every_store_call_site_is_healed_by_reruns(where, docs, input_dir, tokenizer, baseline):
    """A failure of any store call (on S3: of each write or listing site's first), and a lost response, kill (not
    on S3) or reordered listing at each call site, leaves every id written once without error, each trace the
    fault-free chain, the records once, nothing left behind, and at most one checkpoint interval re-read per
    fault."""
    new_output, s3 = where
    clean, calls = baseline
    for run, site, call, n, fault in sites(calls, every_call=s3 is None):
        plan = {**BASE, (run, site, call, n): fault}
        outcome = run_job(docs, input_dir, new_output(), s3, tokenizer, plan, every_steps=EVERY)
        try:
            check(outcome, clean, docs)
        except AssertionError as exc:
            raise AssertionError(f"{fault} at run {run} {site} {call} #{n}: {exc}") from exc


@pytest.mark.slow
def test_random_fault_sequences_are_healed_by_reruns(where, docs, input_dir, tokenizer, baseline):
    """A machine lost at a checkpoint write of run 1 and up to 3 more faults at any store calls of the runs leave
    every id written once, one chain per trace, the records once, nothing left behind, and at most one checkpoint
    interval re-read per fault (60 sequences: 45 on local disk, 15 on S3, where each costs a second; the same
    derandomized draws on every machine, so a failure replays)."""
    new_output, s3 = where
    clean, calls = baseline
    keys = sorted(calls)

    @settings(max_examples=45 if s3 is None else 15, deadline=None, suppress_health_check=list(HealthCheck),
              derandomize=True)
    @given(data=st.data())
    def sequence(data):
        kill = data.draw(st.integers(0, calls[(1, "checkpoint", "open_output_stream")] - 1))
        more = data.draw(st.lists(st.tuples(st.sampled_from(keys), st.floats(0, 1, exclude_max=True),
                                            st.sampled_from(FAULTS)), max_size=3))
        plan = {(1, "checkpoint", "open_output_stream", kill): "preempt"}
        plan.update({(run, site, call, int(x * calls[(run, site, call)])): fault
                     for (run, site, call), x, fault in more})
        check(run_job(docs, input_dir, new_output(), s3, tokenizer, plan, every_steps=EVERY), clean, docs)

    sequence()
