"""Evidence attribution on hand-made traces: found at step k, lost at step m, never found, errors."""

from __future__ import annotations

import pyarrow as pa

from memagent.agent import Result, Step
from memagent.attribution import COLUMNS, answer_spans, attribute, contains, holds
from memagent.batch import RESULT_SCHEMA, error_record, result_record
from memagent.config import AgentConfig

CONTEXT = "aaaa The number is 4417. bbbb cccc The capital is Paris. dddd"
SPANS = [(0, 10), (10, 25), (25, 40), (40, len(CONTEXT))]


def trace(memories: list[str], answer_memory: str | None = None) -> list[dict]:
    steps = [{"step": i, "kind": "memory", "chunk_index": i, "char_start": a, "char_end": b, "memory": m}
             for i, ((a, b), m) in enumerate(zip(SPANS, memories))]
    last = memories[-1] if answer_memory is None else answer_memory
    return steps + [{"step": len(memories), "kind": "answer", "chunk_index": None, "char_start": None,
                     "char_end": None, "memory": last}]


def test_found_at_step_k_and_kept():
    a = attribute(trace(["nothing yet", "The number is 4417.", "number 4417", "4417 kept"]),
                  "4417", ["4417"], CONTEXT)
    assert (a.evidence_step, a.evidence_char_start, a.evidence_char_end) == (1, 10, 25)
    assert a.answer_found_step == 1 and a.answer_lost_step is None
    assert a.answer_spans == [{"char_start": 19, "char_end": 23}]
    assert CONTEXT[19:23] == "4417"
    assert a.held == [False, True, True, True]


def test_lost_at_step_m():
    a = attribute(trace(["x", "Paris is the capital", "the capital: Paris.", "nothing useful"]),
                  "London", ["Paris"], CONTEXT)
    assert a.answer_found_step == 1 and a.answer_lost_step == 3
    assert a.evidence_step is None and a.evidence_char_start is None  # prediction never in memory


def test_never_found():
    a = attribute(trace(["a", "b", "c", "d"]), "d", ["Paris"], CONTEXT)
    assert a.answer_found_step is None and a.answer_lost_step is None
    assert a.evidence_step == 3 and a.evidence_char_start == 40  # the prediction came from the last memory
    assert a.answer_spans == [{"char_start": CONTEXT.index("Paris"), "char_end": CONTEXT.index("Paris") + 5}]


def test_without_answers_only_evidence():
    a = attribute(trace(["the Paris thing", "b"]), "paris", None, CONTEXT)
    assert a.evidence_step == 0 and a.answer_spans is None and a.answer_found_step is None


def test_matching_follows_metric():
    # SQuAD normalisation at word boundaries: articles/punctuation/case folded, no partial words.
    assert contains("sub_em", "It is THE Eiffel-tower.", "eiffeltower")  # punctuation dropped, as the metric does
    assert contains("sub_em", "It is THE Eiffel tower.", "the eiffel tower")
    assert not contains("sub_em", "in 14417 years", "4417")
    assert contains("string_match_all", "in 14417 years", "4417")  # RULER: plain lowercase substring
    assert not contains("sub_em", "anything", "the")  # normalises to nothing: never attributed
    # string_match_all needs every reference; sub_em only the first one.
    assert not holds("string_match_all", "keys 11 and 22", ["11", "33"])
    assert holds("string_match_all", "keys 11, 22 and 33", ["11", "33"])
    assert holds("sub_em", "alpha", ["alpha", "beta"]) and not holds("sub_em", "beta", ["alpha", "beta"])
    assert holds("em", "beta", ["alpha", "beta"])


def test_answer_spans_case_insensitive_and_capped():
    text = "Paris paris PARIS " * 20
    spans = answer_spans(text, ["paris"], limit=5)
    assert len(spans) == 5 and spans[0] == {"char_start": 0, "char_end": 5}
    assert answer_spans(text, [""]) == [] and answer_spans(None, ["x"]) == []


def _result(memories: list[str], prediction: str) -> Result:
    steps = [Step(**{**s, "prompt_tokens": 1, "completion_tokens": 1, "finish_reason": "stop", "seconds": 0.0})
             for s in trace(memories)]
    return Result(prediction=prediction, response=prediction, memory=memories[-1], steps=steps,
                  n_chunks=len(memories), context_tokens=20, truncated=False)


def test_batch_records_carry_the_columns():
    row = {"id": "r1", "question": "Number?", "context": CONTEXT, "answers": ["4417"]}
    rec = result_record(row, _result(["x", "4417", "lost"], "4417"), AgentConfig(), "m", "sub_em", 0.1)
    assert rec["evidence_step"] == 1 and rec["answer_found_step"] == 1 and rec["answer_lost_step"] == 2
    assert rec["evidence_char_start"] == 10 and rec["answer_spans"][0]["char_start"] == 19
    err = error_record(row, "input: broken", AgentConfig(), "m")
    assert all(err[c] is None for c in COLUMNS)
    schema = pa.schema([pa.field("id", pa.string()), pa.field("question", pa.string()),
                        pa.field("context", pa.string()), pa.field("answers", pa.list_(pa.string())), *RESULT_SCHEMA])
    table = pa.Table.from_pylist([rec, err], schema=schema)  # both fit the output schema
    assert table.column("answer_lost_step").to_pylist() == [2, None]
    assert set(COLUMNS) <= set(RESULT_SCHEMA.names)
