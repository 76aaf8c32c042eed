"""Output records of memagent.batch: scores, JSON answers, and errors isolated per row."""

from __future__ import annotations

import asyncio
import json

import pyarrow as pa

from memagent.batch import RESULT_SCHEMA, answer_rows
from memagent.config import AgentConfig
from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams

CFG = AgentConfig(chunk_tokens=64, memory_tokens=8, answer_tokens=8, query_tokens=64)


class ScriptedEngine(Engine):
    """Replies from a function of the prompt; a unit-test stand-in for the logic around engines."""

    def __init__(self, tokenizer, reply):
        self.name, self.context_window, self.tokenizer, self.stats = "scripted", 4096, tokenizer, EngineStats()
        self.reply = reply

    async def chat(self, messages, params: SamplingParams) -> Completion:
        text = self.reply(messages[0]["content"])
        return Completion(text=text, prompt_tokens=10, completion_tokens=3, finish_reason="stop")


def rows():
    return [
        {"id": "ok", "question": "What is the code?", "context": "The code is 42. " * 30, "answers": ["42"], "x": 1},
        {"id": "boom", "question": "Explode?", "context": "text " * 10, "answers": ["y"], "x": 2},
        {"id": "empty", "question": "Q?", "context": "", "answers": None, "x": 3},
    ]


def reply(prompt: str) -> str:
    if "Explode?" in prompt:
        raise RuntimeError("engine fell over")
    return "Memory: code 42" if "Updated memory" in prompt else "I checked. So the answer is 42."


def test_records_keep_order_passthrough_and_isolate_errors(tiny_engine):
    out = asyncio.run(answer_rows(ScriptedEngine(tiny_engine.tokenizer, reply), rows(), CFG))
    assert [r["id"] for r in out] == ["ok", "boom", "empty"] and [r["x"] for r in out] == [1, 2, 3]
    ok, boom, empty = out
    assert ok["error"] is None and ok["prediction"] == "42" and ok["score"] == 1.0
    assert ok["memory"] == "Memory: code 42" and ok["n_chunks"] == len(ok["steps"]) - 1
    assert boom["error"] == "agent: RuntimeError: engine fell over" and boom["prediction"] is None
    assert empty["error"].startswith("input: context is empty") and empty["score"] is None
    table = pa.Table.from_pylist(out)  # records are Arrow-ready
    assert set(RESULT_SCHEMA.names) <= set(table.column_names)


def test_json_answers_are_parsed_or_flagged(tiny_engine):
    cfg = CFG.with_overrides(answer_style="json")
    good = ScriptedEngine(tiny_engine.tokenizer, lambda p: "mem" if "Updated memory" in p else '{"code": 42}')
    bad = ScriptedEngine(tiny_engine.tokenizer, lambda p: "mem" if "Updated memory" in p else "not json at all")
    row = [{"id": "a", "question": None, "context": "The code is 42."}]
    [g] = asyncio.run(answer_rows(good, row, cfg, question="Which code?"))
    assert json.loads(g["prediction"]) == {"code": 42} and g["error"] is None
    [b] = asyncio.run(answer_rows(bad, row, cfg, question="Which code?"))
    assert b["prediction"] is None and b["response"] == "not json at all"
    assert b["error"].startswith("answer: reply is not valid JSON") and b["steps"]


def test_records_left_unread_are_a_column_and_a_summary_line(tiny_engine):
    """A piece whose records reply never fits, even at the smallest split, loses its records: the row says
    how many pieces (``record_failed_pieces``) and the job's summary says so in words."""
    from pipelines.summary import BatchSummary
    from memagent_testing.records_helpers import CONFIG, RecordsEngine, document, payment

    text = document([payment("Acme Ltd", 100, "2021-03-14")], [payment("Birch Ltd", 7, "2021-04-01")])
    row = [{"id": "d", "question": "", "context": text}]
    fits = asyncio.run(answer_rows(RecordsEngine(tiny_engine.tokenizer), row, CONFIG))[0]
    never = asyncio.run(answer_rows(RecordsEngine(tiny_engine.tokenizer, max_records=0), row, CONFIG))[0]
    assert fits["record_failed_pieces"] == 0 and fits["record_splits"] == 0 and fits["n_records_payments"] == 2
    assert never["n_records_payments"] == 0
    assert never["record_failed_pieces"] >= 2 and never["record_splits"] >= never["record_failed_pieces"]
    table = pa.Table.from_pylist([fits, never])
    summary = BatchSummary.from_rows(table, rows_in=2, skipped=0, seconds=1.0, output="out")
    assert summary.record_failed_pieces == never["record_failed_pieces"]
    assert summary.record_splits == never["record_splits"]
    overflow = next(line for line in summary.lines() if line.lstrip().startswith("overflow:"))
    assert f"{never['record_failed_pieces']} piece(s) left (partly) unread" in overflow
    assert summary.record()["record_failed_pieces"] == never["record_failed_pieces"]
