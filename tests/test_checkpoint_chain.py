"""One chain out of a checkpoint log: the iterative resolution against the recursive walk it replaced."""

from __future__ import annotations

import random
from typing import Sequence

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent.agent import ReadState, Step
from memagent.checkpoint import FORMAT, Segment, SegmentStep, resume_path
from pipelines.checkpoints import CheckpointLog


def seg(first: int, n: int, attempt: str, parent: str | None = None) -> Segment:
    """A segment of ``n`` memory steps from ``first``, by ``attempt`` after ``parent``."""
    steps = [SegmentStep(step=first + k, kind="memory", chunk_index=first + k, char_start=0, char_end=1,
                         memory=f"{attempt} {first + k}", prompt_tokens=1, completion_tokens=1,
                         finish_reason="stop", seconds=0.0) for k in range(n)]
    return Segment(format=FORMAT, id="d", key="k", attempt=attempt, parent=parent, first_step=first, steps=steps,
                   next_chunk=first + n, char_offset=0, memory=f"{attempt} {first + n}")


def reference(segments: Sequence[Segment]) -> tuple[list[Segment], list[Segment]]:
    """The recursive walk ``resume_path`` was until it hit the recursion limit at ~1,000 segments: every
    path from each step-0 segment, in log order; a path replaces the best only when strictly better."""
    best: list[Segment] = []

    def follows(s: Segment, prev: Segment) -> bool:
        parent = s.parent if s.parent is not None else s.attempt
        return s.first_step == prev.first_step + len(prev.steps) and parent == prev.attempt

    def walk(path: list[Segment]) -> None:
        nonlocal best
        end = path[-1].first_step + len(path[-1].steps)
        best_end = best[-1].first_step + len(best[-1].steps) if best else -1
        if end > best_end or (end == best_end and [s.attempt for s in path] < [s.attempt for s in best]):
            best = list(path)
        for s in segments:
            if follows(s, path[-1]) and all(s is not p for p in path):
                walk([*path, s])

    for s in segments:
        if s.first_step == 0:
            walk([s])
    return best, [s for s in segments if all(s is not b for b in best)]


def ids(chain: list[Segment]) -> list[int]:
    return [id(s) for s in chain]


ATTEMPTS = ["a", "b", "c"]
small_logs = st.lists(st.tuples(st.integers(0, 5), st.integers(1, 3), st.sampled_from(ATTEMPTS),
                                st.sampled_from([None, *ATTEMPTS])), max_size=9)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_logs)
def test_the_iterative_chain_is_the_recursive_walks(log):
    """On generated logs (ties, zombie attempts, duplicates, gaps, orphans) both pick the same segments, in order."""
    segments = [seg(*t) for t in log]
    chain, rest = resume_path(segments)
    want_chain, want_rest = reference(segments)
    assert ids(chain) == ids(want_chain)
    assert ids(rest) == ids(want_rest)


def test_a_20000_segment_log_resolves_to_the_chain_whose_attempts_sort_first():
    """Two attempts each wrote 10,000 one-step segments from step 0 (a zombie): listed in any order, the log
    resolves (no recursion limit) to one attempt's chain whole, in step order, the other's in the rest."""
    segments = [seg(k, 1, attempt) for attempt in ("b", "a") for k in range(10_000)]
    random.Random(0).shuffle(segments)
    chain, rest = resume_path(segments)
    assert [(s.attempt, s.first_step) for s in chain] == [("a", k) for k in range(10_000)]
    assert len(rest) == 10_000 and {s.attempt for s in rest} == {"b"}


def test_the_longer_of_two_long_chains_wins_whatever_its_attempt():
    """A chain one step longer wins over one whose attempt sorts first."""
    segments = [*(seg(k, 1, "b") for k in range(5_001)), *(seg(k, 1, "a") for k in range(5_000))]
    chain, rest = resume_path(segments)
    assert {s.attempt for s in chain} == {"b"} and len(chain) == 5_001 and len(rest) == 5_000


def test_a_segment_of_no_steps_is_never_on_a_chain():
    """An empty segment starts where it ends, so it could follow itself: it is left in the rest."""
    head, empty, tail = seg(0, 2, "a"), seg(2, 0, "b", parent="a"), seg(2, 1, "b")
    chain, rest = resume_path([head, empty, tail])
    assert ids(chain) == ids([head]) and ids(rest) == ids([empty, tail])


def test_a_log_past_the_old_recursion_limit_resumes_whole(tmp_path):
    """1,500 one-step segments on disk (``--checkpoint-every-steps 1``; the recursive walk failed at ~1,100) resume
    to the last state through ``resume_args``, and a reload finds every file still on the chain."""
    n = 1_500
    log = CheckpointLog(str(tmp_path / "out"), None, every_steps=1, every_s=3600.0)
    steps = tuple(Step(step=k, kind="memory", chunk_index=k, char_start=k, char_end=k + 1, memory=f"m{k}",
                       prompt_tokens=1, completion_tokens=1, finish_reason="stop", seconds=0.0) for k in range(n))
    states = [ReadState(next_chunk=k + 1, char_offset=k + 1, memory=f"m{k}", steps=steps[:k + 1]) for k in range(n)]
    for k, state in enumerate(states):
        log.write("r", "fp", state, k, attempt="a")
    args = log.resume_args("r", "fp")
    assert args["resume"] == states[-1] and args["checkpoint_ignored"] is None
    assert log.load("r", "fp") == (states[-1], None)
