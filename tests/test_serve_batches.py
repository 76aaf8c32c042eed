"""OpenAI's Batch API (/v1/files, /v1/batches) and ``memagent run-batch`` through the real openai SDK, a real
server process killed mid-batch, and S3 (a loopback server)."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from memagent.engines import EngineConfig
from pipelines.openai_batch import BatchRunConfig
from tests.pipeline_helpers import FAST_AGENT, good_rows
from tests.test_serve_guard import running

pytestmark = pytest.mark.slow  # servers, subprocesses
ROOT = Path(__file__).resolve().parents[1]


def run_config(model_dir: Path) -> BatchRunConfig:
    return BatchRunConfig(engine=EngineConfig(model=str(model_dir)), agent=FAST_AGENT, engine_model="tiny-llama",
                          max_tokens=16, concurrency=2)


def request_lines(n_docs: int = 2, n_chats: int = 2, tokens: int = 150) -> list[dict]:
    lines = []
    for r in good_rows(n_docs, tokens=tokens):
        lines.append({"custom_id": r["id"], "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "memagent", "temperature": 0,  # greedy: a rerun's answers repeat
                               "messages": [{"role": "user", "content": r["context"]},
                                            {"role": "user", "content": r["question"]}]}})
    for i in range(n_chats):
        lines.append({"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "tiny-llama", "max_tokens": 5, "temperature": 0,
                               "messages": [{"role": "user", "content": f"Say {i}"}]}})
    return lines


BAD_LINES = [  # (raw line, line field the error names)
    ("{not json", "not JSON"),
    (json.dumps({"custom_id": "bad-url", "method": "POST", "url": "/v1/embeddings", "body": {}}), "url"),
    (json.dumps({"custom_id": "bad-body", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": "tiny-llama"}}), "body.messages"),
    (json.dumps({"custom_id": "bad-method", "method": "GET", "url": "/v1/chat/completions", "body": {}}), "method"),
]


def jsonl_bytes(lines: list[dict], bad: list[str] = ()) -> bytes:
    return "".join(json.dumps(x) + "\n" for x in lines).encode() + "".join(b + "\n" for b in bad).encode()


def parse_jsonl(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


@pytest.fixture(scope="module")
def client(engine, tiny_llama_dir, tmp_path_factory):
    from memagent.serve import create_app
    from pipelines.openai_batch_api import BatchService, batch_router

    service = BatchService(str(tmp_path_factory.mktemp("batch-root")), run_config(tiny_llama_dir)).start()
    with running(create_app(engine, close_engine=False, extra_routers=[batch_router(service)])) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    service.stop()


def wait_done(client: openai.OpenAI, batch_id: str, timeout: float = 240) -> object:
    seen, deadline = [], time.time() + timeout
    while time.time() < deadline:
        try:
            batch = client.batches.retrieve(batch_id)
        except openai.APITimeoutError:  # a loaded 2-core machine: the runner's decode can starve the loop a while
            continue
        if not seen or seen[-1] != batch.status:
            seen.append(batch.status)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.3)
    raise AssertionError(f"batch {batch_id} still {seen} after {timeout}s")


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    from memagent.engines.hf import TransformersEngine

    return TransformersEngine.from_config(EngineConfig(model=str(tiny_llama_dir)), batch_wait_s=0.02, name="tiny-llama")


def test_batch_round_trip_with_bad_lines(client):
    """Every custom_id lands exactly once in output ∪ error; bad lines are error lines naming line and field."""
    good = request_lines()
    f = client.files.create(file=("requests.jsonl", io.BytesIO(jsonl_bytes(good, [b for b, _ in BAD_LINES]))),
                            purpose="batch")
    assert f.id.startswith("file-") and f.object == "file" and f.purpose == "batch" and f.bytes > 0
    assert client.files.retrieve(f.id).filename == "requests.jsonl"
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"job": "test"})
    assert batch.status == "validating" and batch.metadata == {"job": "test"}
    done = wait_done(client, batch.id)
    assert done.status == "completed", done
    assert done.in_progress_at and done.finalizing_at and done.completed_at >= done.created_at
    out = parse_jsonl(client.files.content(done.output_file_id).text)
    err = parse_jsonl(client.files.content(done.error_file_id).text)
    assert done.request_counts.completed == len(out) and done.request_counts.failed == len(err)
    assert done.request_counts.total == len(good) + len(BAD_LINES)
    assert sorted(x["custom_id"] for x in out) == sorted(x["custom_id"] for x in good)  # exactly once each
    for x in out:
        body = x["response"]["body"]
        assert x["id"].startswith("batch_req_") and x["error"] is None and x["response"]["status_code"] == 200
        assert body["object"] == "chat.completion" and isinstance(body["choices"][0]["message"]["content"], str)
        assert body["model"] == ("memagent" if x["custom_id"].startswith("doc-") else "tiny-llama")
        assert body["usage"]["total_tokens"] > 0
    messages = [e["error"]["message"] for e in err]
    for n, (_, field) in enumerate(BAD_LINES, start=len(good) + 1):
        assert any(m.startswith(f"line {n}: ") and field in m for m in messages), (n, field, messages)
    listed = client.batches.list(limit=5)
    assert batch.id in [b.id for b in listed.data]


def test_refusals_name_the_field(client):
    """An endpoint other than chat completions, a window other than 24h and an unknown file are 400/404s naming it."""
    f = client.files.create(file=("r.jsonl", io.BytesIO(jsonl_bytes(request_lines(0, 1)))), purpose="batch")
    with pytest.raises(openai.BadRequestError) as exc:
        client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    assert exc.value.body["param"] == "endpoint"
    with pytest.raises(openai.BadRequestError) as exc:
        client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="1h")
    assert exc.value.body["param"] == "completion_window"
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    assert client.files.delete(f.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(f.id)


def test_cancel(client):
    """A batch cancelled before it ends is cancelled, and never lists a custom_id twice."""
    f = client.files.create(file=("r.jsonl", io.BytesIO(jsonl_bytes(request_lines(2, 4)))), purpose="batch")
    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert client.batches.cancel(batch.id).status == "cancelling"
    done = wait_done(client, batch.id)
    assert done.status == "cancelled" and done.cancelling_at and done.cancelled_at
    ids = [x["custom_id"] for fid in (done.output_file_id, done.error_file_id) if fid
           for x in parse_jsonl(client.files.content(fid).text)]
    assert len(ids) == len(set(ids))
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(batch.id)


def test_batch_state_on_s3(tiny_llama_dir, monkeypatch):
    """With an s3:// batch root the files, the batch's state and its answered lines live on S3; a rerun there
    redoes nothing."""
    from infra.local_s3 import CREDENTIALS, s3_server
    from pipelines.openai_batch import jsonl, run_requests
    from pipelines.openai_batch_api import BatchService
    from pipelines.storage import S3Options

    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    with s3_server(buckets=("lake",)) as endpoint:
        cfg = run_config(tiny_llama_dir).model_copy(update={"s3": S3Options(endpoint_url=endpoint)})
        service = BatchService("s3://lake/batches", cfg)
        lines = request_lines(1, 1)
        f = service.add_file(jsonl(lines), "r.jsonl", "batch")
        batch = service.create({"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                                "completion_window": "24h"})
        service.run(batch["id"])
        done = service.batch(batch["id"])
        assert done["status"] == "completed" and done["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
        out = parse_jsonl(service.content(done["output_file_id"]).decode())
        assert sorted(x["custom_id"] for x in out) == ["chat-0", "doc-000"]
        assert len(service.store.names(f"batches/{batch['id']}/lines")) == 2 and service.store.exists(
            f"batches/{batch['id']}/input.jsonl")
        again, err = run_requests(jsonl(lines), service.store, f"batches/{batch['id']}", cfg,
                                  build_engine=_no_engine)
        assert not err and [x["response"]["body"]["choices"] for x in again] == [
            x["response"]["body"]["choices"] for x in out]


def _no_engine(config):
    raise AssertionError("a rerun of a finished batch loads no engine")


# --- a real server process, killed mid-batch -------------------------------------------------------------------

SERVER = """
import sys, uvicorn
from memagent.engines import EngineConfig
from memagent.engines.hf import TransformersEngine
from memagent.serve import create_app
from pipelines.openai_batch import BatchRunConfig
from pipelines.openai_batch_api import BatchService, batch_router
cfg = BatchRunConfig.model_validate_json(sys.argv[3])
engine = TransformersEngine.from_config(EngineConfig(model=sys.argv[4]), name="tiny-llama")
def no_second_engine(config):
    raise AssertionError("the batch built an engine of its own beside the server's")
# As `memagent serve --batch-root` runs it: the runner starts on the server's loop, its lines on the server's engine.
service = BatchService(sys.argv[1], cfg, engine=engine, build_engine=no_second_engine)
uvicorn.run(create_app(engine, extra_routers=[batch_router(service)], on_startup=[service.start]), host="127.0.0.1",
            port=int(sys.argv[2]), log_level="warning")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(root: Path, cfg: BatchRunConfig, model_dir: Path) -> tuple[subprocess.Popen, openai.OpenAI]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(root), str(port), cfg.model_dump_json(),
                             str(model_dir)], cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            client.models.list()
            return proc, client
        except openai.APIConnectionError:
            assert proc.poll() is None, "the server exited"
            time.sleep(0.5)
    raise AssertionError("the server did not start")


def answers(client: openai.OpenAI, batch) -> dict[str, object]:
    lines = [x for fid in (batch.output_file_id, batch.error_file_id) if fid
             for x in parse_jsonl(client.files.content(fid).text)]
    ids = [x["custom_id"] for x in lines]
    assert len(ids) == len(set(ids)), ids  # exactly once
    return {x["custom_id"]: (x["response"]["body"]["choices"][0]["message"]["content"] if x["response"]
                             else x["error"]["code"]) for x in lines}


def test_server_killed_mid_batch_resumes(tiny_llama_dir, tmp_path):
    """A server SIGKILLed mid-batch and restarted finishes the batch with each custom_id once, the lines answered
    before the kill not answered again, and the answers of a batch of the same requests never killed (greedy
    decoding; run next on the restarted server)."""
    cfg = run_config(tiny_llama_dir).model_copy(update={"concurrency": 1})  # a line at a time: the kill lands mid-batch
    data = jsonl_bytes(request_lines(n_docs=2, n_chats=3, tokens=1200))
    root = tmp_path / "state"
    proc, client = start_server(root, cfg, tiny_llama_dir)
    try:
        f = client.files.create(file=("r.jsonl", io.BytesIO(data)), purpose="batch")
        killed = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.time() + 180  # kill once a line is answered, i.e. mid-batch
        while not list(root.glob("batches/*/lines/*.json")) and time.time() < deadline:
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        answered = {p: p.stat().st_mtime_ns for p in root.glob("batches/*/lines/*.json")}
        assert 0 < len(answered) < 5, answered  # killed mid-batch
        proc, client = start_server(root, cfg, tiny_llama_dir)
        killed = wait_done(client, killed.id)
        assert killed.status == "completed"
        assert {p: p.stat().st_mtime_ns for p in answered} == answered  # not answered again
        clean = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
        clean = wait_done(client, clean.id)
        assert clean.status == "completed"
        reference = answers(client, clean)
        assert answers(client, killed) == reference and len(reference) == 5
        assert killed.request_counts.model_dump() == clean.request_counts.model_dump()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_run_batch_cli_resumes(tiny_llama_dir, tmp_path):
    """`memagent run-batch` answers every line once; a rerun redoes nothing and writes the same answers."""
    requests = tmp_path / "requests.jsonl"
    requests.write_bytes(jsonl_bytes(request_lines(2, 2), [BAD_LINES[1][0]]))
    out = tmp_path / "results.jsonl"
    cmd = [sys.executable, "-m", "memagent_cli", "run-batch", "-i", str(requests), "-o", str(out), "-q",
           "--model", str(tiny_llama_dir), "--served-model", "tiny-llama", "--chunk-tokens", "64", "--memory-tokens",
           "8", "--answer-tokens", "6", "--query-tokens", "64", "--concurrency", "2"]
    first = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    lines = parse_jsonl(out.read_text())
    assert sorted(x["custom_id"] for x in lines) == ["bad-url", "chat-0", "chat-1", "doc-000", "doc-001"]
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "results.jsonl.work").rglob("*") if p.is_file()
              and "lines" in p.parts}
    assert len(stamps) == 4
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # no line answered again
    again = parse_jsonl(out.read_text())
    content = lambda ls: {x["custom_id"]: x["response"] and x["response"]["body"]["choices"][0]["message"]["content"]
                          for x in ls}
    assert content(again) == content(lines)


def test_serve_with_a_batch_root_answers_lines_with_its_own_engine(tiny_llama_dir, tmp_path, monkeypatch):
    """`memagent serve --batch-root` gives the Batch API the engine it serves and starts the runner on the
    server's loop (one copy of the model), with the lines' models, limits and reasoning field the server's."""
    import memagent.serve
    from memagent_cli.main import main

    seen: dict = {}
    monkeypatch.setattr(memagent.serve, "serve", lambda engine, server, agent, **kw: seen.update(engine=engine, **kw))
    assert main(["serve", "--model", str(tiny_llama_dir), "--served-model", "tiny-llama", "--max-tokens", "64",
                 "--batch-root", str(tmp_path / "batches")]) == 0
    [hook] = seen["on_startup"]
    service = hook.__self__
    assert hook == service.start and service.engine is seen["engine"] and len(seen["extra_routers"]) == 1
    assert (service.cfg.engine_model, service.cfg.max_tokens, service.cfg.memagent_model) == ("tiny-llama", 64,
                                                                                            "memagent")
