"""The same request gets the same reply under the default flags: greedy, and sampled with a seed.

The adaptive draft length once followed measured forward times, so the verification forwards'
shapes, and with them bf16 rounding at a near-tie, depended on the wall clock: 4 identical greedy
requests got 2 or 3 replies. Now each step's draft length is a function of the row's drafts and
acceptance: the clock here is made erratic, and the forwards and the replies must still repeat.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import random
from dataclasses import replace

import pytest

from memagent.engines import SamplingParams
from memagent.engines import hf_decode

pytestmark = pytest.mark.slow  # reads with the packaged model (tests/conftest.py's rule)

STORY = [{"role": "user", "content": "Write a short story about a robot who learns to paint. "
                                     "Then list five colors it loves."}]


@pytest.fixture
def erratic_clock(monkeypatch):
    """The decode loop's clock jumps by 1 ms to 2 s between readings: timing-driven choices scatter."""
    rng, now = random.Random(0), itertools.count()
    monkeypatch.setattr(hf_decode.time, "perf_counter", lambda: next(now) + rng.uniform(0.001, 2.0))


def repeat(engine, params: SamplingParams, n: int, caplog) -> tuple[set, set]:
    """Distinct replies and distinct draft-length sequences (k of every decode forward) of ``n`` requests,
    one at a time."""
    replies, shapes = set(), set()
    for _ in range(n):
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger=hf_decode.__name__):
            reply = asyncio.run(engine.chat(STORY, params))
        replies.add(tuple(reply.token_ids))
        shapes.add(tuple(r.decode_forward[0] for r in caplog.records if hasattr(r, "decode_forward")))
    return replies, shapes


def test_identical_greedy_requests_get_one_reply(smollm2_engine, erratic_clock, caplog):
    replies, shapes = repeat(smollm2_engine, SamplingParams(max_tokens=40), 6, caplog)
    assert len(shapes) == 1 and any(k > 0 for k in next(iter(shapes)))  # it speculated, the same way each time
    assert len(replies) == 1


def test_learning_the_draft_length_from_the_clock_changes_the_forwards(smollm2_engine, erratic_clock, caplog):
    """What the test above guards against: --draft-learning refits its cost from the (erratic) clock."""
    learner = copy.copy(smollm2_engine)  # the model shared; its own cost model and acceptance
    learner.speculation = replace(smollm2_engine.speculation, learn=True)
    learner.cost, learner.acceptance = type(smollm2_engine.cost)(), {}
    _, shapes = repeat(learner, SamplingParams(max_tokens=40), 3, caplog)
    assert len(shapes) > 1


def test_a_seeded_sampled_request_repeats(smollm2_engine, erratic_clock, caplog):
    replies, _ = repeat(smollm2_engine, SamplingParams(max_tokens=40, temperature=1.0, seed=11), 3, caplog)
    assert len(replies) == 1
