"""Capture and retention against scripted chains whose captures and losses are known."""

from __future__ import annotations

from memagent.data.records_corpus import statement
from memagent.retention import KnownEvidence, hotpot_evidence, item_outcomes, memory_steps, records_evidence, \
    ruler_evidence, summarise, timeline

TEXT = "aaaa NEEDLE-ONE bbbb 4821 cccc Paris dddd"
EV = [KnownEvidence("one", "needle-one", 5, 15), KnownEvidence("num", 4821, 21, 25, "number"), KnownEvidence("city", "Paris", 31, 36)]


def test_known_capture_and_loss():
    # Step 0 reads the first item and keeps it; step 1 reads the number and keeps both; step 2 reads the
    # city, drops the first item and never writes the city.
    steps = [(16, "Needle-One"), (26, "NEEDLE-ONE and 4,821"), (len(TEXT), "the number: 4821.00")]
    out = item_outcomes(EV, steps)
    assert [o.read_at for o in out] == [0, 1, 2]
    assert [o.held_at for o in out] == [(0, 1), (1, 2), ()]
    assert [(o.captured, o.retained) for o in out] == [(True, False), (True, True), (False, False)]
    s = summarise(out)
    assert (s["n_read"], s["n_captured"], s["n_retained"]) == (3, 2, 1)
    assert s["capture"] == 2 / 3 and s["retention"] == 1 / 2 and s["end_to_end"] == 1 / 3


def test_held_before_read_is_no_capture_and_matching_is_bounded():
    # The memory names the city before the chain reads it (a guess), then forgets; "48210" is not 4821.
    steps = [(10, "Paris? 48210"), (len(TEXT), "nothing")]
    out = item_outcomes(EV, steps)
    assert out[2].held_at == (0,) and not out[2].captured
    assert out[1].held_at == ()
    assert timeline(EV, steps)[0] == [(False, False), (False, False), (False, True)]


def test_unread_items_and_empty_chains():
    out = item_outcomes(EV, [(16, "needle-one")])  # centre truncation: the rest never read
    assert [o.read_at for o in out] == [0, None, None]
    assert summarise(out)["retention"] == 1.0 and summarise(out)["end_to_end"] == 1.0
    assert summarise(item_outcomes(EV, []))["capture"] is None


def test_trace_dicts_and_answer_steps():
    steps = [{"kind": "memory", "char_end": 16, "memory": "needle-one"},
             {"kind": "memory", "char_end": len(TEXT), "memory": "Paris"},
             {"kind": "answer", "char_end": None, "memory": "Paris"}]
    out = item_outcomes(EV, memory_steps(steps))
    r = summarise(out)
    assert (r["n_captured"], r["n_retained"]) == (2, 1)
    assert (out[0].read_at, out[0].held_at, out[0].captured, out[0].retained) == (0, (0,), True, False)


def test_ruler_hotpot_and_records_evidence_point_at_their_values():
    row = {"context": "x One of the special magic numbers for a-b is: 1234567. y", "answers": ["1234567"]}
    (e,) = ruler_evidence(row)
    assert row["context"][e.start:e.end] == "1234567"
    ctx = "Document 1:\nFoo\nfoo text.\n\nDocument 2:\nBar Baz\nbar text."
    (h,) = hotpot_evidence({"context": ctx, "gold_positions": [2], "id": "q"})
    assert h.value == "Bar Baz" and ctx[h.start:h.end] == "Bar Baz\nbar text."
    doc = statement("d", 3000, 4)
    ev = records_evidence(doc)
    assert len(ev) == len(doc["gold"]) > 0
    for item in ev:
        assert f"{item.value}" in doc["text"][item.start:item.end]


def test_rows_summarised_per_length_in_the_evaluation(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memagent.evaluate import retention_markdown, summarize_retention
    from pipelines.evaluate import read_retention

    ctx = "aaaa 1234567 bbbb 7654321 cccc"
    def row(i, length, memories, task="niah_multivalue"):
        ends = [13, len(ctx)][: len(memories)]
        steps = [{"kind": "memory", "char_end": e, "memory": m} for e, m in zip(ends, memories)]
        return {"id": f"r{i}", "method": "memagent", "task": task, "length": length, "steps": steps, "context": ctx,
                "answers": ["1234567", "7654321"], "gold_positions": []}
    rows = [row(0, 4096, ["1234567", "1234567 7654321"]),  # both kept
            row(1, 4096, ["1234567", "7654321"]),          # the first lost
            row(2, 8192, ["nothing", "nothing"]),          # none captured
            row(3, 8192, ["x", "1234567 7654321"], task="vt"),  # no evidence for vt
            row(4, 8192, ["1234567", "7654321"])]          # not a current item
    out = tmp_path / "predictions" / "memagent"
    out.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), out / "part.parquet")
    records = read_retention(tmp_path, {"r0", "r1", "r2", "r3"})
    assert [(r["length"], r["n_read"], r["n_captured"], r["n_retained"]) for r in records] == \
        [(4096, 2, 2, 2), (4096, 2, 2, 1), (8192, 2, 0, 0)]
    table = summarize_retention(records)
    assert table[["length", "n", "needles_read", "capture", "retention", "end_to_end"]].fillna(-1).values.tolist() == \
        [[4096, 2, 4, 1.0, 0.75, 0.75], [8192, 1, 2, 0.0, -1, 0.0]]
    md = retention_markdown(table)
    assert "| NIAH multivalue |" in md
    assert "100 / 75 (read 4)" in md and "0 / – (read 2)" in md


def test_timeline_drawing(tmp_path):
    from memagent.retention import plot_timeline

    steps = [(16, "Needle-One"), (26, "NEEDLE-ONE and 4,821"), (len(TEXT), "the number: 4821.00")]
    path = plot_timeline(EV, steps, tmp_path / "t.png", title="scripted")
    assert path.stat().st_size > 2000


def test_batch_rows_carry_the_evidence_counts(tiny_engine):
    import asyncio
    import re

    from memagent.batch import answer_row
    from memagent.config import AgentConfig
    from memagent.engines.base import Completion, Engine, EngineStats

    class Copier(Engine):  # keeps the needle numbers of each section, forgets the rest
        def __init__(self, tokenizer):
            self.name, self.context_window, self.tokenizer, self.stats = "copier", 4096, tokenizer, EngineStats()

        async def chat(self, messages, params):
            content = messages[-1]["content"]
            section = content.split("<section>", 1)[-1] if "<section>" in content else content
            text = " ".join(re.findall(r"\b\d{7}\b", section)) or "none"
            return Completion(text=text, prompt_tokens=1, completion_tokens=1, finish_reason="stop")

    filler = "The grass is green and the sky is blue. " * 40
    context = f"{filler}The magic number is: 1234567. {filler}The magic number is: 7654321. {filler}{filler}"
    row = {"id": "r", "question": "What are the magic numbers?", "context": context, "task": "niah_multivalue",
           "answers": ["1234567", "7654321"], "metric": "string_match_all"}
    cfg = AgentConfig(chunk_tokens=128, memory_tokens=16, answer_tokens=8, query_tokens=64)
    record = asyncio.run(answer_row(Copier(tiny_engine.tokenizer), row, cfg))
    assert record["error"] is None
    assert (record["evidence_read"], record["evidence_captured"], record["evidence_retained"]) == (2, 2, 0)
    plain = asyncio.run(answer_row(Copier(tiny_engine.tokenizer), {**row, "task": None}, cfg))
    assert plain["evidence_read"] is None


def test_job_summary_line_sums_the_evidence():
    import pyarrow as pa

    from pipelines.summary import BatchSummary

    table = pa.table({"id": ["a", "b", "c"], "error": [None, None, None], "score": [1.0, 0.0, None],
                      "context_tokens": [10, 10, 10], "evidence_read": pa.array([4, 4, None], pa.int32()),
                      "evidence_captured": pa.array([4, 2, None], pa.int32()),
                      "evidence_retained": pa.array([3, 1, None], pa.int32())})
    s = BatchSummary.from_rows(table, rows_in=3, skipped=0, seconds=1.0, output="out")
    assert (s.evidence_read, s.evidence_captured, s.evidence_retained) == (8, 6, 4)
    assert "evidence:       8 known item(s) read, 6 captured by the memory (75%), 4 still held at the answer " \
        "(67% of those captured)" in s.lines()
