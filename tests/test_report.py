"""The HTML run report: row views and diffs, batch/eval/old/S3 outputs, and the page in headless Chromium."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memagent.report.html import diff_ops, error_pattern, group_errors, row_view, word_diff
from pipelines.report import build_report
from infra.report_browser import find_chromium, open_page

CONTEXT = "Filler text here. The special magic number is 4417. More filler text follows after it."


def step(i: int, a: int | None, b: int | None, memory: str, kind: str = "memory") -> dict:
    return {"step": i, "kind": kind, "chunk_index": i if kind == "memory" else None, "char_start": a, "char_end": b,
            "memory": memory, "prompt_tokens": 10, "completion_tokens": 5, "finish_reason": "stop", "seconds": 0.1}


def old_row(rid: str = "r1", **kw) -> dict:
    """A batch output row as written before the attribution columns existed."""
    steps = [step(0, 0, 30, "nothing yet"), step(1, 30, 55, "the number is 4417"), step(2, 55, len(CONTEXT), "lost it"),
             step(3, None, None, "lost it", "answer")]
    row = {"id": rid, "question": "What is the number?", "context": CONTEXT, "answers": ["4417"],
           "prediction": "4417", "response": "4417", "memory": "lost it", "n_chunks": 3, "context_tokens": 20,
           "truncated": False, "steps": steps, "score": 1.0, "error": None, "model": "m", "config": "{}",
           "seconds": 0.5, "method": "memagent"}
    row.update(kw)
    return row


def error_row(rid: str, message: str) -> dict:
    return {**{k: None for k in old_row()}, "id": rid, "question": "Q?", "context": None, "answers": ["x"],
            "error": message, "model": "m", "config": "{}", "method": "memagent"}


def data_of(html: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
                      .group(1).replace("<\\/", "</"))


def test_word_diff_and_ops_rebuild_the_memory():
    before, after = "the cat sat on the mat", "the dog sat on the red mat today"
    ops = word_diff(before, after)
    assert "".join(o for o in ops if isinstance(o, str)) + "" != after  # additions are marked, not plain
    assert "".join(o if isinstance(o, str) else o[1] for o in ops if isinstance(o, str) or o[0] > 0) == after
    assert [1, "dog"] in ops and [-1, "cat"] in ops
    flat = diff_ops(before, after)
    assert len(flat) % 4 == 0 and flat[:4] == [2, 3, 2, 3]  # word 1 ("cat") -> word 1 ("dog"), tokens incl. spaces


def test_row_view_of_old_output_computes_attribution_and_snippets():
    v = row_view(old_row())
    assert v["ev"] == [1, 30, 55] and v["f"] == 1 and v["l"] == 2 and v["h"] == "010"
    assert v["as"] == [[CONTEXT.index("4417"), CONTEXT.index("4417") + 4]] and v["cl"] == len(CONTEXT)
    label, offset, text, marks = v["sn"][0]
    assert "gold answer" in label and text[marks[0][0]:marks[0][1]] == "4417"
    assert "context" not in json.dumps(v) or CONTEXT not in json.dumps(v)  # never the whole context
    assert [s[1] for s in v["st"]] == ["m", "m", "m", "a"] and len(v["st"][3]) == 6  # answer step: no repeat


def test_error_groups_mask_numbers():
    views = [row_view(error_row(f"e{i}", f"input: question is {100 + i} tokens, over query_tokens=64"))
             for i in range(3)]
    views.append(row_view(error_row("z", "agent: RuntimeError: boom")))
    groups = group_errors(views)
    assert [g["count"] for g in groups] == [3, 1] and groups[0]["ids"] == ["e0", "e1", "e2"]
    assert error_pattern("x 12 'a b' 3.5") == "x N '…' N" and views[3]["eg"] == 1


def write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_report_of_old_batch_output_is_self_contained(tmp_path):
    write(tmp_path / "out" / "a.parquet", [old_row("r1"), old_row("r2", score=0.0, prediction="9")])
    write(tmp_path / "out" / "b.parquet", [error_row("r3", "input: context is empty")])
    (tmp_path / "out" / "c.parquet").write_bytes(b"PAR1 partial")  # a writer killed mid-file: skipped
    path = build_report(str(tmp_path / "out"))
    assert path == str(tmp_path / "out" / "_report.html")  # "_": Parquet readers of the dir skip it
    assert len(pq.read_table(str(tmp_path / "out" / "a.parquet"))) == 2
    html = Path(path).read_text()
    assert not re.search(r'(src|href)="(https?:)?//', html) and "<link" not in html  # no network
    d = data_of(html)
    assert [r["id"] for r in d["rows"]] == ["r1", "r2", "r3"]
    assert d["rows"][2]["e"] == "input: context is empty" and "st" not in d["rows"][2]
    assert "33.3% [" in html and "(95% Wilson, n=3)" in html and "input: context is empty" in html
    assert (tmp_path / "out" / "c.parquet").exists()  # reading never moves files


def make_eval_run(root: Path) -> Path:
    from memagent.evaluate import plot_accuracy_vs_length, plot_heatmap, summarize

    records = []
    for method in ("memagent", "full-context"):
        rows = [old_row(f"q{i}", method=method, task="niah_single_1", length=length, metric="string_match_all",
                        score=float(i % 2 == 0 or method == "memagent"))
                for i, length in enumerate([1024, 1024, 2048, 2048])]
        for r in rows:
            r["id"] = f"{r['task']}-{r['length']}-{r['id']}"
        write(root / "predictions" / method / "part-0.parquet", rows)
        records += rows
    table = summarize(records)
    table.to_csv(root / "results.csv", index=False)
    plot_heatmap(table, root / "heatmap.png")
    plot_accuracy_vs_length(table, root / "accuracy_vs_length.png")
    write(root / "items.parquet", [{"id": "x"}])
    (root / "summary.json").write_text(json.dumps({"seconds_per_method": {"memagent": 2.0, "full-context": 1.0},
                                                   "config": {"samples": 2}, "notes": ["a note"]}))
    return root


def test_report_of_eval_run_has_plots_and_linked_cells(tmp_path):
    run = make_eval_run(tmp_path / "eval")
    html = Path(build_report(str(run), str(tmp_path / "elsewhere" / "r.html"))).read_text()
    assert html.count('src="data:image/png;base64,') == 2
    png = base64.b64decode(re.search(r'src="data:image/png;base64,([^"]+)"', html).group(1))
    assert png.startswith(b"\x89PNG")
    assert 'href="#filter=method=memagent&amp;task=niah_single_1&amp;length=2048"' in html
    d = data_of(html)
    assert len(d["rows"]) == 8 and d["facets"]["method"] == ["full-context", "memagent"]
    assert {r["k"].split("/")[0] for r in d["rows"]} == {"memagent", "full-context"}
    assert "accuracy · memagent" in html and "tokens/s · full-context" in html and "a note" in html


@pytest.mark.slow
def test_report_on_s3(tmp_path, monkeypatch):
    import pyarrow.fs as pafs

    from infra.local_s3 import CREDENTIALS, s3_server
    from pipelines.storage import S3Options

    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    with s3_server(buckets=("lake",)) as endpoint:
        fs = pafs.S3FileSystem(endpoint_override=endpoint.split("://")[1], scheme="http", region="us-east-1")
        local = write(tmp_path / "a.parquet", [old_row()])
        pafs.copy_files(str(local), "lake/out/a.parquet", destination_filesystem=fs)
        path = build_report("s3://lake/out", None, S3Options(endpoint_url=endpoint))
        assert path == "s3://lake/out/_report.html"
        with fs.open_input_stream("lake/out/_report.html") as f:
            assert b'"id":"r1"' in f.read()


@pytest.mark.slow
def test_publish_report_artifacts(tmp_path):
    from prefect import flow
    from prefect.testing.utilities import prefect_test_harness

    from flows.report import publish_report
    from tests.flows_helpers import artifacts_of

    write(tmp_path / "out" / "a.parquet", [old_row()])

    @flow
    def publish(run: str, missing: str) -> tuple:
        return publish_report(run, key="test-report"), publish_report(missing, key="test-missing")

    with prefect_test_harness(server_startup_timeout=120):
        state = publish(str(tmp_path / "out"), str(tmp_path / "nowhere"), return_state=True)
        assert state.is_completed(), state.message  # a report that cannot be written does not fail the flow
        path, missing = state.result()
        arts = artifacts_of(state.state_details.flow_run_id)
    assert path == str(tmp_path / "out" / "_report.html") and missing is None
    assert "file://" in arts["test-report"].data  # a link artifact (Prefect stores it as Markdown)
    assert path in arts["test-report-md"].data and "test-missing" not in arts


# -- a real batch job, and the page in a real browser ---------------------------------------------

CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed and `make browser` could not "
                                    "install it (apt-get install chromium): the page cannot be opened")


def check_page(page: Path, row_id: str, shot: Path) -> str:
    """Open ``page#row=ID``: summary, row table and that row's timeline render; save a screenshot."""
    dom = open_page(page, fragment=f"row={row_id}").dom
    assert 'data-ready="1"' in dom, "the page's script did not finish"
    assert '<section id="summary"><h2>Run summary</h2>' in dom and "error rows" in dom
    table = re.search(r'<table id="rows">.*?</table>', dom, re.S).group(0)
    assert table.count("<tr data-k=") >= 2 and "<th" in table
    detail = re.search(r'<section id="detail">(.*)</section>', dom, re.S).group(1)
    assert f"Timeline of row <code>{row_id.rsplit('/', 1)[-1]}</code>" in detail and 'class="step' in detail
    assert 'class="bar"' in detail and "Memory after each step" in detail
    open_page(page, fragment=f"row={row_id}", screenshot=shot, window=(1280, 900))
    assert shot.stat().st_size > 10_000
    return detail


@pytest.mark.slow
@needs_chromium
def test_eval_page_in_chromium(tmp_path):
    run = make_eval_run(tmp_path / "eval")
    page = Path(build_report(str(run)))
    detail = check_page(page, "memagent/niah_single_1-1024-q0", tmp_path / "eval.png")
    assert "gold answer found" in detail and "gold answer lost" in detail and "<mark" in detail
    assert "<ins>lost it</ins>" in detail and "<del>the number is" in detail  # word diff vs the previous memory
    dom = open_page(page, fragment="filter=method=memagent&task=niah_single_1&length=2048").dom
    assert "2 of 8 rows" in dom


@pytest.fixture(scope="module")
def batch_output(tmp_path_factory, tiny_llama_dir) -> Path:
    """A real small Ray Data batch job (tiny random Llama): good rows and error rows."""
    import ray

    from memagent.engines import EngineConfig
    from pipelines.batch_qa import BatchQAConfig, run_batch_qa
    from pipelines.job import JobConfig
    from tests.pipeline_helpers import FAST_AGENT, good_rows, write_rows

    tmp = tmp_path_factory.mktemp("report-batch")
    rows = good_rows(5)
    rows[1]["context"] = "  "
    rows[2]["question"] = None
    write_rows(tmp / "in" / "part-0.parquet", rows)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        run_batch_qa(BatchQAConfig(input=str(tmp / "in"), output=str(tmp / "out"),
                                   engine=EngineConfig(model=str(tiny_llama_dir)), agent=FAST_AGENT,
                                   job=JobConfig(batch_size=3, progress=False)))
    finally:
        ray.shutdown()
    return tmp / "out"


@pytest.mark.slow
def test_batch_output_has_attribution_columns(batch_output):
    import pyarrow.dataset as pads

    table = pads.dataset(str(batch_output), format="parquet").to_table()
    for col in ("evidence_step", "evidence_char_start", "answer_spans", "answer_found_step", "answer_lost_step"):
        assert col in table.column_names
    rows = {r["id"]: r for r in table.to_pylist()}
    assert rows["doc-001"]["error"] and rows["doc-001"]["answer_spans"] is None
    good = rows["doc-000"]
    spans = good["answer_spans"]
    assert spans and all(good["context"][s["char_start"]:s["char_end"]] == good["answers"][0] for s in spans)


@pytest.mark.slow
@needs_chromium
def test_batch_report_in_chromium(batch_output, tmp_path):
    page = Path(build_report(str(batch_output), str(tmp_path / "report.html")))
    d = data_of(page.read_text())
    assert len(d["rows"]) == 5 and sum(1 for r in d["rows"] if r.get("e")) == 2
    detail = check_page(page, "doc-000", tmp_path / "timeline.png")
    assert "gold answer" in detail
