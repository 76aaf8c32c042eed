"""The budget error's advice is a value that works, or says that no chunk size can fit.

Found when tried with a 300-field schema: its instructions made the template larger than the
window, and the error advised "lower chunk_tokens to -9270".
"""

from __future__ import annotations

import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from memagent.config import AgentConfig


def advice_of(cfg: AgentConfig, window: int, template: int) -> str:
    with pytest.raises(ValueError) as info:
        cfg.check_fits(window, template)
    return str(info.value)


def fits(cfg: AgentConfig, window: int, template: int, chunk: int) -> bool:
    try:
        cfg.with_overrides(chunk_tokens=chunk).check_fits(window, template)  # the validators run too
    except ValueError:
        return False
    return True


def test_the_reported_case_says_no_chunk_fits():
    cfg = AgentConfig(chunk_tokens=1024, memory_tokens=1200, answer_tokens=1500, query_tokens=400)
    message = advice_of(cfg, 8192, 14000)  # a template of 14,000 tokens: over the window by itself
    assert not re.search(r"-\d", message.split("=")[-1]), message  # was "lower chunk_tokens to -9270"
    assert "no chunk_tokens can make it fit" in message and "larger context window" in message


@settings(max_examples=150, deadline=None)
@given(memory=st.integers(8, 4096), answer=st.integers(8, 4096), query=st.integers(8, 2048),
       template=st.integers(0, 16384), window=st.sampled_from([2048, 8192, 32768, 131072]),
       chunk=st.integers(256, 20000))
def test_advice_is_a_value_that_works(memory, answer, query, template, window, chunk):
    """A budget that fits still fits with a smaller chunk; one that does not is told the largest chunk_tokens that
    fits, or that none does (and then the smallest allowed chunk does not fit either)."""
    assume(memory <= 4 * chunk)
    cfg = AgentConfig(chunk_tokens=chunk, memory_tokens=memory, answer_tokens=answer, query_tokens=query)
    if fits(cfg, window, template, chunk):
        smaller = max(-(-memory // 4), chunk // 2)
        assert fits(cfg, window, template, smaller)  # what fits stays fitting when chunks shrink
        return
    message = advice_of(cfg, window, template)
    advised = re.search(r"lower chunk_tokens to (\d+) or less", message)
    if advised:
        value = int(advised.group(1))
        assert value < chunk and fits(cfg, window, template, value), message
        assert not fits(cfg, window, template, value + 1), message  # and it is the largest that does
    else:
        assert "no chunk_tokens can make it fit" in message, message
        least = -(-memory // 4)
        assert not fits(cfg, window, template, least) and not fits(cfg, window, template, 1), message
