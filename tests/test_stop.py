"""Stop strings: where a reply ends, the tokens it keeps, and what a stream may send before the end."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memagent.engines import SamplingParams
from memagent.engines.stop import StopStrings, cut_at_stop, final_text, find_stop, held_back


def test_the_earliest_stop_string_wins():
    assert find_stop("abc\nObservation: x", ["Observation:", "\n"]) == 3
    assert find_stop("no stop here", ["\n"]) is None
    assert cut_at_stop("Thought: go\nObservation: 4", ["Observation:"]) == "Thought: go\n"
    assert cut_at_stop("plain", ["zz"]) == "plain"


def test_a_tail_that_could_begin_a_stop_string_is_held_back():
    assert held_back("Thought: go\nObs", ["Observation:"]) == 3
    assert held_back("Thought: go\nO", ["Observation:", "\n\n"]) == 1
    assert held_back("abc", ["Observation:"]) == 0
    assert held_back("ab\n", ["\n\n", "b\nX"]) == 2  # the longest prefix of any stop string
    assert final_text("Thought: go\nObs", ["Observation:"]) == "Thought: go\n"
    assert final_text("Thought: go\nObservation: 4", ["Observation:"]) == "Thought: go\n"


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab\nO:", max_size=40),
       stops=st.lists(st.text(alphabet="ab\nO:", min_size=1, max_size=4), min_size=1, max_size=3))
def test_what_streams_is_always_a_prefix_of_the_reply(text, stops):
    """Growing one character at a time, the reply ends at the first prefix holding a stop string (as a
    decode does); every earlier prefix's final text is a prefix of that reply's, and they grow in order."""
    end = next((e for e in range(len(text) + 1) if find_stop(text[:e], stops) is not None), len(text))
    reply = cut_at_stop(text[:end], stops)
    sent = ""
    for e in range(end + 1):
        now = final_text(text[:e], stops)
        assert reply.startswith(now) and now.startswith(sent)
        sent = now
    assert sent == reply or find_stop(text, stops) is None


def test_scan_keeps_the_tokens_up_to_the_one_that_completed_the_stop(tiny_llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    ids = tok("Thought: I should look.\nAction: search\nObservation: it rains", add_special_tokens=False)["input_ids"]
    matcher = StopStrings(["Observation:"], lambda t: tok.decode(t, skip_special_tokens=True))
    keep = None
    for n in range(1, len(ids) + 1):  # one token a step, as a decode without drafts grows
        keep = matcher.scan(ids[:n], 1)
        if keep is not None:
            break
    text = tok.decode(ids[:keep])
    assert "Observation:" in text and "Observation:" not in tok.decode(ids[: keep - 1])
    # Many tokens in one step (accepted drafts): the same cut.
    assert StopStrings(["Observation:"], lambda t: tok.decode(t)).scan(ids, len(ids)) == keep


def test_sampling_params_take_stop_lists_and_refuse_empty_strings():
    p = SamplingParams(max_tokens=4, stop=["\n", "Observation:"], stop_token_ids=[7])
    assert p.stop == ("\n", "Observation:") and p.stop_token_ids == (7,)
    hash(p)  # still hashable
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(max_tokens=4, stop=[""])
