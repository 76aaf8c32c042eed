"""Evaluation: the full-context baseline, per-row metrics, intervals, the report, the whole job."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys

import pandas as pd
import pyarrow.dataset as pads
import pytest

from memagent.batch import answer_rows
from memagent.config import AgentConfig
from memagent.evaluate import plot_accuracy_vs_length, plot_heatmap, results_markdown, summarize, wilson_interval
from memagent.full_context import read_full_context, truncate_middle
from tests.test_batch_records import ScriptedEngine

CFG = AgentConfig(chunk_tokens=64, memory_tokens=8, answer_tokens=8, query_tokens=64)


def test_wilson_interval_is_sane_at_the_extremes_and_shrinks_with_n():
    lo, hi = wilson_interval(0.0, 4)
    assert lo == 0.0 and 0.45 < hi < 0.5  # not zero-width at 0%
    assert wilson_interval(1.0, 4) == pytest.approx((0.510, 1.0), abs=1e-3)
    assert wilson_interval(0.5, 100)[1] - wilson_interval(0.5, 100)[0] < wilson_interval(0.5, 10)[1] - wilson_interval(0.5, 10)[0]
    assert all(math.isnan(x) for x in wilson_interval(0.5, 0))  # no items, no interval


def test_summarize_counts_errors_as_wrong_and_keeps_every_cell():
    records = [
        {"method": "memagent", "task": "vt", "length": 4096, "score": 1.0, "error": None},
        {"method": "memagent", "task": "vt", "length": 4096, "score": None, "error": "agent: boom"},
        {"method": "memagent", "task": "vt", "length": 8192, "score": 0.5, "error": None},
        {"method": "full-context", "task": "vt", "length": 4096, "score": 0.0, "error": None},
    ]
    s = summarize(records)
    cell = s[(s.method == "memagent") & (s.length == 4096)].iloc[0]
    assert (cell.n, cell.errors, cell.accuracy) == (2, 1, 0.5)  # the error row is in the denominator
    assert len(s) == 3 and list(s.columns)[:3] == ["method", "task", "length"]
    md = results_markdown(s, ["window 8192"])
    assert "### memagent" in md and "| Variable tracking | 50 [" in md and "(n=2, 1 err)" in md and "–" in md


def test_plots_are_written(tmp_path):
    rows = [{"method": m, "task": t, "length": n, "score": float((n + i) % 3 == 0), "error": None}
            for m in ("memagent", "full-context") for t in ("vt", "qa_2") for n in (4096, 8192, 16384) for i in range(3)]
    s = summarize(rows)
    for path in (plot_heatmap(s, tmp_path / "h.png"), plot_accuracy_vs_length(s, tmp_path / "l.png")):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_truncate_middle_keeps_verbatim_head_and_tail(tiny_engine):
    tok = tiny_engine.tokenizer
    text = " ".join(f"word{i}" for i in range(400))
    n = len(tok(text, add_special_tokens=False)["input_ids"])
    kept = truncate_middle(tok, text, 101)
    assert kept.truncated and kept.context_tokens == n and kept.kept_tokens == 101
    assert text.startswith(kept.text[: kept.head_end]) and text.endswith(text[kept.tail_start:])
    assert kept.text == text[: kept.head_end] + text[kept.tail_start:]
    assert abs(len(tok(kept.text, add_special_tokens=False)["input_ids"]) - 101) <= 2
    assert truncate_middle(tok, text, n).text == text and not truncate_middle(tok, text, n).truncated


def test_full_context_reads_in_one_prompt_within_the_window(tiny_engine):
    text = "Filler sentence about nothing. " * 300 + "The code is 4242. " + "More filler here. " * 300
    res = asyncio.run(read_full_context(tiny_engine, "What is the code?", text, CFG, window=512))
    [step] = res.steps
    assert step.kind == "answer" and res.n_chunks == 0 and res.truncated and res.memory == ""
    assert step.prompt_tokens + CFG.answer_tokens <= 512  # the prompt fits the stated window
    assert res.context_tokens > 1500 and (step.char_start, step.char_end) == (0, len(text))
    short = asyncio.run(read_full_context(tiny_engine, "What is the code?", "The code is 7.", CFG, window=512))
    assert not short.truncated and short.context_tokens < 10


def test_method_and_per_row_metric_in_batch_records(tiny_engine):
    seen = []

    def reply(prompt: str) -> str:
        seen.append(prompt)
        return "Therefore, the answer is alpha beta"

    engine = ScriptedEngine(tiny_engine.tokenizer, reply)
    rows = [
        {"id": "a", "question": "Which words?", "context": "alpha and beta " * 40, "answers": ["alpha", "gamma"],
         "metric": "string_match_all"},
        {"id": "b", "question": "Which word?", "context": "alpha", "answers": ["alpha"], "metric": None},
        {"id": "c", "question": "Which word?", "context": "alpha", "answers": ["alpha"], "metric": "bleu"},
    ]
    a, b, c = asyncio.run(answer_rows(engine, rows, CFG, method="full-context"))
    assert len(seen) == 2 and all("<document>" in p for p in seen)  # one prompt per row, no memory steps
    assert a["method"] == "full-context" and a["score"] == 0.5 and a["n_chunks"] == 0  # 1 of 2 words matched
    assert b["score"] == 1.0  # job metric (sub_em) when the row has none
    assert c["error"].startswith("input: metric 'bleu' is not one of") and c["method"] == "full-context"
    [m] = asyncio.run(answer_rows(engine, rows[:1], CFG))
    assert m["method"] == "memagent" and m["n_chunks"] >= 1


@pytest.mark.slow
def test_eval_cli_end_to_end_and_rerun(tiny_llama_dir, tmp_path):
    """`memagent eval` on generated NIAH and VT items with both methods; a rerun reuses everything."""
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "memagent_cli", "eval", "--tasks", "niah_single_1,vt", "--lengths", "512,1K",
           "--samples", "2", "--out", str(out), "--model", str(tiny_llama_dir), "--context-window", "768",
           "--chunk-tokens", "128", "--memory-tokens", "8", "--answer-tokens", "8", "--batch-size", "8",
           "--no-progress"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    results = pd.read_csv(out / "results.csv")
    assert len(results) == 2 * 2 * 2 and set(results["n"]) == {2}  # methods × tasks × lengths, every item
    assert set(results["method"]) == {"memagent", "full-context"} and set(results["length"]) == {512, 1024}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["full_context_window"] == 768 and summary["items"] == 8
    assert "768 tokens" in (out / "results.md").read_text() and "### full-context" in run.stdout
    for name in ("heatmap.png", "accuracy_vs_length.png"):
        assert (out / name).stat().st_size > 5000
    preds = pads.dataset(out / "predictions" / "full-context", format="parquet").to_table().to_pylist()
    long = [p for p in preds if p["length"] == 1024]
    assert all(p["truncated"] and p["steps"][0]["prompt_tokens"] <= 768 for p in long)  # window respected
    mem = pads.dataset(out / "predictions" / "memagent", format="parquet").to_table().to_pylist()
    assert all(p["n_chunks"] >= 4 for p in mem if p["length"] == 1024)
    # Known evidence (the needles) per row and per (task, length); vt has none.
    assert all(p["evidence_read"] == 1 for p in mem if p["task"] == "niah_single_1")
    assert all(p["evidence_read"] is None for p in mem if p["task"] == "vt")
    retention = pd.read_csv(out / "retention.csv")
    assert set(retention["task"]) == {"niah_single_1"} and list(retention["needles_read"]) == [2, 2]
    assert "## Evidence kept in memory" in (out / "results.md").read_text()

    files = sorted(p.name for p in (out / "predictions").rglob("*.parquet"))
    stamp = (out / "items.parquet").stat().st_mtime_ns
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "items.parquet").stat().st_mtime_ns == stamp  # the same items, not regenerated
    assert sorted(p.name for p in (out / "predictions").rglob("*.parquet")) == files  # nothing redone
    assert pd.read_csv(out / "results.csv").equals(results)
    # Another selection of the same generator reuses the predictions of the items it shares.
    narrower = subprocess.run(cmd[:7] + ["512"] + cmd[8:], capture_output=True, text=True, timeout=600)
    assert narrower.returncode == 0, narrower.stderr[-3000:]
    assert sorted(p.name for p in (out / "predictions").rglob("*.parquet")) == files
    narrow = pd.read_csv(out / "results.csv")
    assert set(narrow["length"]) == {512} and narrow.equals(results[results["length"] == 512].reset_index(drop=True))
    other = subprocess.run(cmd + ["--seed", "7"], capture_output=True, text=True, timeout=300)
    assert other.returncode == 2 and "use a new --out" in other.stderr


def test_given_item_sets_are_checked_and_reused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.evaluate import EvalConfig, build_items

    rows = [{"id": f"x{i}", "task": "vt", "length": 512, "question": "Q?", "context": "c", "answers": ["a"],
             "metric": "string_match_all"} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "items.parquet")
    pq.write_table(pa.Table.from_pylist([{k: v for k, v in r.items() if k != "metric"} for r in rows]),
                   tmp_path / "bad.parquet")
    cfg = EvalConfig(out=str(tmp_path / "run"), items_file=str(tmp_path / "items.parquet"))
    assert build_items(cfg, tmp_path / "run" / "items.parquet") == 3
    assert build_items(cfg, tmp_path / "run" / "items.parquet") == 3  # reused
    bad = EvalConfig(out=str(tmp_path / "run2"), items_file=str(tmp_path / "bad.parquet"))
    with pytest.raises(ValueError, match=r"missing columns \['metric'\]"):
        build_items(bad, tmp_path / "run2" / "items.parquet")
    with pytest.raises(ValueError, match="give tasks and lengths"):
        EvalConfig(out=str(tmp_path / "run3"))  # neither items nor an items file
