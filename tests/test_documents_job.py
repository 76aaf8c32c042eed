"""Batch QA over a folder, glob or S3 prefix of documents: one row per file (id = path under the
root), bad files as error rows naming file and reason, pages in the output, conversion paid once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from memagent.engines import EngineConfig
from pipelines.batch_qa import BatchQAConfig, run_batch_qa
from pipelines.documents_cache import CACHE_DIR
from pipelines.job import JobConfig
from memagent_testing.document_files import (
    SAMPLE_TABLE, render_docx, render_encrypted_pdf, render_html, render_pdf, render_scanned_pdf, sample_paragraphs,
)
from tests.pipeline_helpers import FAST_AGENT, read_output

pytestmark = pytest.mark.slow


def mixed_folder(root: Path) -> dict[str, bytes]:
    """A folder of good and bad documents in sub-folders; relative path -> bytes."""
    files = {
        "filings/a.pdf": render_pdf(sample_paragraphs(12), [SAMPLE_TABLE], page_break_every=4).data,
        "pages/b.html": render_html(sample_paragraphs(3), [SAMPLE_TABLE]).data,
        "reports/c.docx": render_docx(sample_paragraphs(4), [SAMPLE_TABLE], page_break_after=2).data,
        "notes.md": b"# Notes\n\nThe freight contract closed at 1,200 units.\n",
        "bad/scan.pdf": render_scanned_pdf(),
        "bad/locked.pdf": render_encrypted_pdf(),
        "bad/empty.txt": b"",
        "bad/picture.png": b"\x89PNG\r\n",
        "_SUCCESS": b"",  # a job marker: skipped as in Parquet inputs
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


BAD = {"bad/scan.pdf": "input: bad/scan.pdf: no text layer: scanned PDF, OCR is not built in",
       "bad/locked.pdf": "input: bad/locked.pdf: encrypted:", "bad/empty.txt": "input: bad/empty.txt: empty:",
       "bad/picture.png": "input: bad/picture.png: unsupported:"}


def cache_entries(cache: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in cache.rglob("*.json")}


def job(tiny_llama_dir, input: str, output: str, **kw) -> BatchQAConfig:
    return BatchQAConfig(input=input, output=output, engine=EngineConfig(model=str(tiny_llama_dir)), agent=FAST_AGENT,
                         job=JobConfig(batch_size=4, progress=False), **kw)


def test_mixed_folder_rows_errors_pages_and_no_reconversion(ray_local_s3, tiny_llama_dir, tmp_path):
    """Every document is one row under its relative path, bad files are input: error rows with the
    reason, good rows carry their page map, nothing is staged (an earlier version's staged rows are swept);
    a rerun skips all and converts nothing; a changed file is refused, then redone with redo_changed; a
    second output beside the first (another question) reuses the conversions."""
    files = mixed_folder(tmp_path / "lake")
    cfg = job(tiny_llama_dir, str(tmp_path / "lake"), str(tmp_path / "runs" / "out"), question="How many units?")
    left = tmp_path / "runs" / CACHE_DIR / "staged" / "0f3a9c" / "part-0.parquet"  # an earlier version's killed run
    left.parent.mkdir(parents=True)
    left.write_bytes(b"PAR1")
    summary = run_batch_qa(cfg)
    out = {r["id"]: r for r in read_output(cfg.output)}
    assert sorted(out) == sorted(f for f in files if f != "_SUCCESS") and summary.rows_out == 8
    for rel, reason in BAD.items():
        assert out[rel]["error"].startswith(reason) and out[rel]["context"] is None
    for rel in ("filings/a.pdf", "pages/b.html", "reports/c.docx", "notes.md"):
        row = out[rel]
        assert row["error"] is None, row["error"]
        assert row["pages"][0]["char_start"] == 0 and row["pages"][-1]["char_end"] == len(row["context"])
    assert [p["page"] for p in out["filings/a.pdf"]["pages"]] == [1, 2, 3]
    assert out["filings/a.pdf"]["pages"][0]["box"][2] > 500
    assert "North | 48,250 | 1,200" in out["filings/a.pdf"]["context"]
    spans = {e["span"]: e for e in out["filings/a.pdf"]["evidence_pages"]}
    memory = [s for s in out["filings/a.pdf"]["steps"] if s["kind"] == "memory"]
    assert len(memory) > 1 and all(spans[f"steps[{i}]"]["pages"] for i in range(len(memory)))
    assert spans["steps[0]"]["pages"][0] == 1 and spans[f"steps[{len(memory) - 1}]"]["pages"][-1] == 3
    assert out["bad/scan.pdf"]["evidence_pages"] is None
    cache = tmp_path / "runs" / CACHE_DIR
    entries = cache_entries(cache)
    assert len(entries) == 8 and not (cache / "staged").exists()  # nothing staged (the rows stream), the old swept

    again = run_batch_qa(cfg)
    assert again.rows_out == 0 and again.skipped == 8
    assert cache_entries(cache) == entries  # nothing converted again

    (tmp_path / "lake" / "bad" / "empty.txt").write_text("Now it has text: 7 units.")
    with pytest.raises(ValueError, match=r"1 id\(s\) already in .* were answered from a different input.*bad/empty.txt"):
        run_batch_qa(cfg)
    changed = run_batch_qa(cfg.model_copy(update={"redo_changed": True}))
    assert changed.rows_out == 1
    assert {r["id"]: r for r in read_output(cfg.output)}["bad/empty.txt"]["error"] is None
    assert len(cache_entries(cache)) == 9

    questions = tmp_path / "questions.jsonl"
    questions.write_text("\n".join(json.dumps({"id": rel, "question": f"What is in {rel}?"}) for rel in files))
    second = job(tiny_llama_dir, str(tmp_path / "lake" / "**" / "*.pdf"), str(tmp_path / "runs" / "out2"),
                 questions=str(questions))
    run_batch_qa(second)
    rows = {r["id"]: r for r in read_output(second.output)}
    assert sorted(rows) == ["bad/locked.pdf", "bad/scan.pdf", "filings/a.pdf"]
    assert rows["filings/a.pdf"]["question"] == "What is in filings/a.pdf?"
    assert len(cache_entries(cache)) == 9  # the glob's files were all converted before


def test_s3_prefix_on_loopback_server(ray_local_s3, tiny_llama_dir, tmp_path, monkeypatch):
    """An S3 prefix of documents reads as a local folder does: ids relative to the prefix, the cache beside the output."""
    from infra.local_s3 import CREDENTIALS, s3_server

    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    files = mixed_folder(tmp_path / "lake")
    with s3_server(buckets=("lake",)) as endpoint:
        fs = pafs.S3FileSystem(endpoint_override=endpoint.split("://")[1], scheme="http", region="us-east-1")
        for rel in files:
            pafs.copy_files(str(tmp_path / "lake" / rel), f"lake/docs/{rel}", destination_filesystem=fs)
        from pipelines.storage import S3Options

        cfg = job(tiny_llama_dir, "s3://lake/docs", "s3://lake/runs/out", question="How many units?",
                  s3=S3Options(endpoint_url=endpoint))
        assert run_batch_qa(cfg).rows_out == 8
        out = {r["id"]: r for r in read_output("lake/runs/out", filesystem=fs)}
        assert out["bad/scan.pdf"]["error"].startswith(BAD["bad/scan.pdf"]) and out["notes.md"]["error"] is None
        cached = [i for i in fs.get_file_info(pafs.FileSelector(f"lake/runs/{CACHE_DIR}", recursive=True))
                  if i.path.endswith(".json")]
        assert len(cached) == 8
    assert os.environ["AWS_ACCESS_KEY_ID"] == "test"


def test_batch_cli_over_a_folder_with_the_packaged_model(tmp_path):
    """`memagent batch --input <folder>` with the packaged model: one row per file, the scanned PDF an
    error row, the PDF's evidence on page 1; the same command again skips all and converts nothing."""
    import subprocess
    import sys

    lake = tmp_path / "lake"
    lake.mkdir()
    (lake / "memo.pdf").write_bytes(render_pdf(["The freight contract closed at 1,200 units in March."]).data)
    (lake / "scan.pdf").write_bytes(render_scanned_pdf(1))
    cmd = [sys.executable, "-m", "memagent_cli", "batch", "--input", str(lake), "--output", str(tmp_path / "out"),
           "--model", "smollm2-135m", "--preset", "tiny", "--question", "How many units?", "--no-progress"]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "rows out:       2 this run" in first.stdout
    out = {r["id"]: r for r in read_output(tmp_path / "out")}
    assert out["scan.pdf"]["error"] == "input: scan.pdf: no text layer: scanned PDF, OCR is not built in"
    assert out["memo.pdf"]["error"] is None
    assert {e["span"]: e["pages"] for e in out["memo.pdf"]["evidence_pages"]}["steps[0]"] == [1]
    entries = cache_entries(tmp_path / CACHE_DIR)
    assert len(entries) == 2
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "rows out:       0 this run" in again.stdout and cache_entries(tmp_path / CACHE_DIR) == entries


def test_empty_folder_and_output_inside_the_input_are_refused(ray_local_s3, tiny_llama_dir, tmp_path):
    """A folder with no documents names what it looked for; an output inside a documents folder is refused
    before anything is converted, as for Parquet inputs."""
    (tmp_path / "lake" / "empty_sub").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"input .*lake: no files found \(documents: \.pdf, \.html"):
        run_batch_qa(job(tiny_llama_dir, str(tmp_path / "lake"), str(tmp_path / "out"), question="q?"))
    (tmp_path / "lake" / "a.txt").write_text("Some text.")
    with pytest.raises(ValueError, match="is inside the input directory"):
        run_batch_qa(job(tiny_llama_dir, str(tmp_path / "lake"), str(tmp_path / "lake" / "out"), question="q?"))
    assert not (tmp_path / CACHE_DIR).exists() and not (tmp_path / "lake" / CACHE_DIR).exists()
