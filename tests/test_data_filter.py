"""The no-context filter: logic on a scripted engine, batching on the tiny model, one real check."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memagent.data.filter import NO_CONTEXT_PROMPT, filter_no_context, no_context_messages, output_schema
from memagent.engines.base import Completion, Engine, EngineStats, Messages, SamplingParams


class ScriptedEngine(Engine):
    """Replies from a script: question -> list of replies, one per successive call (cycled)."""

    def __init__(self, name: str, script: dict[str, list[str]], fail_on: str | None = None):
        self.name, self.script, self.fail_on = name, script, fail_on
        self.context_window, self.tokenizer, self.stats = 4096, None, EngineStats()
        self.calls: dict[str, int] = {}
        self.params: list[SamplingParams] = []
        self.in_flight = self.max_in_flight = 0

    async def chat(self, messages: Messages, params: SamplingParams) -> Completion:
        text = messages[-1]["content"]
        question = text.split("\n\n")[0]
        self.params.append(params)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(0.001)
        self.in_flight -= 1
        if self.fail_on and self.fail_on in question:
            raise RuntimeError("backend exploded")
        n = self.calls.get(question, 0)
        self.calls[question] = n + 1
        replies = self.script.get(question, ["I am not sure."])
        return Completion(replies[n % len(replies)], 10, 5, "stop")


ROWS = [
    {"id": "a", "question": "What is the capital of France?", "answers": ["Paris"], "extra": 1},
    {"id": "b", "question": "Who wrote the Zorblat memo?", "answers": ["Quintus Vell"], "extra": 2},
    {"id": "c", "question": "What colour is the sky?", "answers": ["blue"], "extra": 3},
    {"id": "d", "question": "Which river is longest?", "answers": ["Nile"], "extra": 4},
]


def run(rows, engines, **kw):
    return asyncio.run(filter_no_context(rows, engines, **kw))


def test_keeps_unanswerable_and_drops_answerable():
    eng = ScriptedEngine("m1", {
        ROWS[0]["question"]: ["The answer is \\boxed{Paris}."],           # boxed and contains
        ROWS[2]["question"]: ["It is usually blue, I think. \\boxed{azure}"],  # contains only
        ROWS[3]["question"]: ["\\boxed{ nile }"],                          # boxed (case/space folded)
    })
    result = run(ROWS, [eng], k=2)
    assert [r["id"] for r in result.kept] == ["b"]
    assert [r["id"] for r in result.dropped] == ["a", "c", "d"]
    by_id = {r["id"]: r for r in result.dropped}
    assert by_id["a"]["filter_hits"] == ["m1#0:boxed+contains", "m1#1:boxed+contains"]
    assert by_id["c"]["filter_hits"] == ["m1#0:contains", "m1#1:contains"]
    assert by_id["d"]["filter_hits"][0] == "m1#0:boxed+contains"
    assert by_id["a"]["filter_reason"].startswith("answered without context (m1#0")
    kept = result.kept[0]
    assert kept["filter_reason"] is None and kept["filter_hits"] == [] and kept["extra"] == 2
    assert result.summary() == {"rows": 4, "kept": 1, "dropped": 3, "errors": 0, "drop_rate": 0.75}
    # Paper sampling: k requests per question, temperature 1.0, top-p 0.7, 512 tokens.
    assert len(eng.params) == 8 and eng.params[0] == SamplingParams(512, 1.0, 0.7)
    assert eng.max_in_flight > 1  # requests are concurrent, so an engine can batch them


def test_best_of_k_and_several_engines():
    late = {ROWS[1]["question"]: ["no idea", "Maybe Quintus Vell?"]}  # right only on the 2nd sample
    assert [r["id"] for r in run(ROWS[1:2], [ScriptedEngine("m", late)], k=1).kept] == ["b"]
    assert [r["id"] for r in run(ROWS[1:2], [ScriptedEngine("m", late)], k=2).dropped] == ["b"]
    quiet, knows = ScriptedEngine("base", {}), ScriptedEngine("inst", late)
    result = run(ROWS[1:2], [quiet, knows], k=2)
    assert result.dropped[0]["filter_hits"] == ["inst#1:contains"]
    assert quiet.calls == {ROWS[1]["question"]: 2}


def test_duplicate_questions_are_asked_once_and_errors_become_rows():
    rows = [dict(ROWS[0], id="a1"), dict(ROWS[0], id="a2"), ROWS[1]]
    eng = ScriptedEngine("m", {ROWS[0]["question"]: ["Paris"]}, fail_on="Zorblat")
    result = run(rows, [eng], k=3, keep_responses=True)
    assert eng.calls == {ROWS[0]["question"]: 3}
    assert [r["id"] for r in result.dropped] == ["a1", "a2", "b"]
    err = result.dropped[2]
    assert err["filter_reason"] == "error: RuntimeError: backend exploded" and err["filter_responses"] == []
    assert result.dropped[0]["filter_responses"] == ["Paris"] * 3
    assert result.errors == 1


def test_bad_rows_and_settings():
    eng = ScriptedEngine("m", {})
    with pytest.raises(ValueError, match=r"row 1 \(id='x'\): field 'question'"):
        run([ROWS[0], {"id": "x", "answers": ["a"]}], [eng])
    with pytest.raises(ValueError, match="row 0 .*field 'answers'"):
        run([{"id": "y", "question": "q?", "answers": []}], [eng])
    with pytest.raises(ValueError, match="at least one engine"):
        run(ROWS, [])
    with pytest.raises(ValueError, match="k must be positive"):
        run(ROWS, [eng], k=0)
    # A plain string answer is accepted as a one-element list.
    assert run([{"id": "z", "question": "q?", "answers": "zz"}], [eng]).kept[0]["id"] == "z"


def test_prompt_is_the_bare_question():
    msgs = no_context_messages("Who?")
    assert msgs == [{"role": "user", "content": NO_CONTEXT_PROMPT.format(question="Who?")}]
    assert msgs[0]["content"].startswith("Who?\n\n") and "\\boxed{}" in msgs[0]["content"]
    schema = output_schema(pa.schema([("id", pa.string()), ("filter_reason", pa.string())]), keep_responses=True)
    assert schema.names == ["id", "filter_hits", "filter_reason", "filter_responses"]


def test_tiny_model_batches_and_cli(tmp_path, tiny_engine, tiny_llama_dir: Path):
    rows = [{"id": f"r{i}", "question": f"What is the code word number {i}?", "answers": [f"qzx{i}vv"]} for i in range(6)]
    before = tiny_engine.stats.batch_sizes.copy()
    result = run(rows, [tiny_engine], k=2, max_tokens=4)
    assert len(result.kept) + len(result.dropped) == 6 and result.errors == 0
    assert max(tiny_engine.stats.batch_sizes - before) > 1  # the engine batched concurrent probes

    from memagent_cli.main import main

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in.parquet")
    out = tmp_path / "kept.parquet"
    assert main(["filter", "--input", str(tmp_path / "in.parquet"), "--output", str(out), "--model",
                 str(tiny_llama_dir), "--max-tokens", "3", "--device", "cpu", "--limit", "4"]) == 0
    kept, dropped = pq.read_table(out), pq.read_table(tmp_path / "kept.dropped.parquet")
    assert kept.num_rows + dropped.num_rows == 4
    assert kept.schema.names == ["id", "question", "answers", "filter_hits", "filter_reason"]
    assert dropped.schema.equals(kept.schema)


@pytest.mark.slow
def test_packaged_model_drops_known_and_keeps_unknown(smollm2_engine):
    rows = [
        {"id": "known", "question": "What is the capital city of France?", "answers": ["Paris"]},
        {"id": "unknown", "question": "What was the password of the Vellmoor archive in 1841?", "answers": ["quorvath-ninety"]},
    ]
    # Greedy: at the paper's temperature 1.0 this 135M model mostly rambles (in French, even).
    result = run(rows, [smollm2_engine], k=1, max_tokens=24, temperature=0.0)
    assert [r["id"] for r in result.dropped] == ["known"]
    assert [r["id"] for r in result.kept] == ["unknown"]
