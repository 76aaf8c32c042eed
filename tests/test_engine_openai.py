"""The OpenAI-compatible engine against real HTTP servers on loopback.

- ``memagent serve``'s app under uvicorn, wrapping the tiny random Llama (completions, logprobs,
  batching of concurrent clients, the agent and the Ray batch job end to end, 4xx errors);
- small FastAPI apps that fail on purpose (503/429 then success, 401, slow replies) for the
  retry, timeout and auth behaviour: real HTTP, never a mocked client;
- BatchQAConfig's GPU rules per engine (the flags -> EngineConfig tests are in test_cli.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from memagent.agent import check_config, read_document
from memagent.data.demo import niah_row
from memagent.engines import (
    Engine,
    EngineConfig,
    EngineStats,
    SamplingParams,
    make_engine,
)
from memagent.engines.openai import EndpointError, OpenAIEngine
from memagent.serve import create_app
from tests.pipeline_helpers import FAST_AGENT, good_rows, read_output, write_rows

SERVED = "tiny-llama"
HELLO = [{"role": "user", "content": "Say hello."}]


# -- servers on loopback ------------------------------------------------------------------------

def bound_socket() -> socket.socket:
    """A listening-ready socket on a free loopback port (handed to uvicorn: no port race)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextmanager
def running(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread; yields its base URL."""
    from tests.reliability_helpers import serve_on

    with serve_on(app, bound_socket()) as url:
        yield url


@pytest.fixture(scope="module")
def served_engine(tiny_llama_dir):
    """The engine behind the server; its own instance, so its stats are the server's alone."""
    from memagent.engines.hf import TransformersEngine

    return TransformersEngine.from_config(EngineConfig(model=str(tiny_llama_dir)), batch_wait_s=0.05, name=SERVED)


@pytest.fixture(scope="module")
def server_url(served_engine) -> Iterator[str]:
    with running(create_app(served_engine, close_engine=False)) as url:
        yield f"{url}/v1"


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_llama_dir))


def client(url: str, tokenizer, **kw) -> OpenAIEngine:
    kw.setdefault("backoff_s", 0.01)
    return OpenAIEngine(url, kw.pop("served_model", SERVED), tokenizer, kw.pop("context_window", 4096), **kw)


def chat(engine, messages=HELLO, **params):
    async def go():
        try:
            return await engine.chat(messages, SamplingParams(**{"max_tokens": 5, **params}))
        finally:
            await engine.close()

    return asyncio.run(go())


# -- against `memagent serve` -------------------------------------------------------------------

def test_from_config_completion_matches_local_engine(server_url, tiny_llama_dir, tiny_engine):
    engine = make_engine(EngineConfig(engine="openai", endpoint=server_url, model=str(tiny_llama_dir),
                                      served_model=SERVED))
    assert isinstance(engine, OpenAIEngine) and engine.name == SERVED
    assert engine.context_window == 4096  # the local model config's max_position_embeddings
    remote = chat(engine, max_tokens=4)
    local = asyncio.run(tiny_engine.chat(HELLO, SamplingParams(max_tokens=4)))
    assert remote.text == local.text  # greedy, same weights: the server really ran the model
    assert remote.prompt_tokens == local.prompt_tokens == engine.count_chat_tokens(HELLO)
    assert remote.completion_tokens == 4 and remote.finish_reason == "length"  # max_tokens respected
    assert remote.token_ids is None and remote.logprobs is None
    assert engine.stats.requests == 1 and engine.stats.completion_tokens == 4


def test_logprobs_come_back_when_asked(server_url, tokenizer, tiny_engine):
    remote = chat(client(server_url, tokenizer), max_tokens=3, logprobs=True)
    local = asyncio.run(tiny_engine.chat(HELLO, SamplingParams(max_tokens=3, logprobs=True)))
    assert remote.logprobs is not None and len(remote.logprobs) == remote.completion_tokens == 3
    assert remote.logprobs == pytest.approx(local.logprobs, abs=1e-4)


def test_stop_strings_end_the_remote_decode(server_url, tokenizer, tiny_engine):
    """``stop`` goes to the server, which ends the decode there: the text before it, far fewer tokens."""
    full = asyncio.run(tiny_engine.chat(HELLO, SamplingParams(max_tokens=200)))
    stop = full.text[30:34]
    remote = chat(client(server_url, tokenizer), max_tokens=200, stop=[stop])
    assert remote.text == full.text[: full.text.index(stop)] and remote.finish_reason == "stop"
    assert remote.completion_tokens < 40
    body = client(server_url, tokenizer)._request_body(HELLO, SamplingParams(max_tokens=4, stop_token_ids=[7]))
    assert body["stop_token_ids"] == [7] and "stop" not in body  # vLLM's extension, only when asked for


def test_concurrent_clients_are_batched_by_the_server(server_url, tokenizer, served_engine):
    before = served_engine.stats.batch_sizes.copy()
    engine = client(server_url, tokenizer, max_concurrency=8)

    async def many():
        prompts = [[{"role": "user", "content": f"Count to {i}."}] for i in range(8)]
        try:
            return await asyncio.gather(*(engine.chat(p, SamplingParams(max_tokens=3)) for p in prompts))
        finally:
            await engine.close()

    replies = asyncio.run(many())
    assert all(r.completion_tokens <= 3 for r in replies)
    batches = served_engine.stats.batch_sizes - before  # {batch size: forwards}
    assert sum(size * n for size, n in batches.items()) == 8 and max(batches) > 1, batches


def test_read_document_through_the_endpoint(server_url, tokenizer, served_engine):
    engine = client(server_url, tokenizer)
    check_config(engine, FAST_AGENT)
    row = niah_row(0, 200, depth=0.5, seed=3)
    before = served_engine.stats.requests

    async def read():
        try:
            return await read_document(engine, row["question"], row["context"], FAST_AGENT)
        finally:
            await engine.close()

    result = asyncio.run(read())
    memory = [s for s in result.steps if s.kind == "memory"]
    assert len(memory) == result.n_chunks >= 2 and result.steps[-1].kind == "answer"
    assert memory[0].char_start == 0 and memory[-1].char_end == len(row["context"])
    assert all(s.prompt_tokens > 0 and s.finish_reason in ("stop", "length") for s in result.steps)
    assert served_engine.stats.requests - before == len(result.steps)


def test_prompt_over_the_window_is_a_clear_4xx_without_retry(server_url, tokenizer):
    engine = client(server_url, tokenizer, context_window=100_000)  # the server's window decides
    long = [{"role": "user", "content": "word " * 5000}]
    with pytest.raises(EndpointError) as err:
        chat(engine, long, max_tokens=8)
    assert err.value.status == 400 and engine.retries == 0
    assert "HTTP 400" in str(err.value) and "maximum context length is 4096 tokens" in str(err.value)
    with pytest.raises(EndpointError, match="model `nope` does not exist"):
        chat(client(server_url, tokenizer, served_model="nope"))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": HELLO, "n": 2}, "n: Input should be less than or equal to 1"),
        ({"messages": HELLO, "top_logprobs": 2}, "top_logprobs: Input should be less than or equal to 0"),
        ({"messages": []}, "messages: List should have at least 1 item"),
        ({"messages": HELLO, "max_tokens": 0}, "max_tokens: Input should be greater than 0"),
        ({"messages": HELLO, "response_format": {"type": "json_schema"}}, "needs json_schema"),
        ({"messages": HELLO, "response_format": {"type": "xml"}}, "response_format.type"),
        ({"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {
            "name": "r", "schema": {"type": "object", "properties": {"x": {"type": "string", "format": "nope"}}}}}},
         "cannot be compiled"),
    ],
)
def test_server_rejects_unsupported_requests_openai_style(server_url, body, message):
    r = httpx.post(f"{server_url}/chat/completions", json=body, timeout=30)
    assert r.status_code == 400
    assert message in r.json()["error"]["message"] and r.json()["error"]["type"] == "invalid_request_error"


EXTRACT = {"type": "object", "properties": {
    "party": {"type": "string", "description": "counterparty"},
    "effective_date": {"type": "string", "format": "date"},
    "amount": {"type": "number"}, "currency": {"enum": ["USD", "EUR"]}},
    "required": ["party", "effective_date", "amount", "currency"]}


def test_json_schema_is_sent_as_response_format(tokenizer):
    from memagent.engines.json_schema import render_schema

    engine = OpenAIEngine("http://127.0.0.1:9/v1", "m", tokenizer, 512)
    body = engine._request_body(HELLO, SamplingParams(max_tokens=40, json_schema=json.dumps(EXTRACT)))
    # The body vLLM's server and llama.cpp's server read (response_format.json_schema.schema).
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "reply", "schema": render_schema(EXTRACT), "strict": True}}
    titled = engine._request_body(HELLO, SamplingParams(max_tokens=4, json_schema=json.dumps({**EXTRACT, "title": "Contract"})))
    assert titled["response_format"]["json_schema"]["name"] == "Contract"
    assert "response_format" not in engine._request_body(HELLO, SamplingParams(max_tokens=4))


def test_seed_is_sent_and_a_special_token_literal_refused(tokenizer):
    """A request's seed goes upstream; a schema literal holding a special token is a ValueError naming its path
    (the upstream's grammar could decode it as the token)."""
    engine = OpenAIEngine("http://127.0.0.1:9/v1", "m", tokenizer, 512)
    assert engine._request_body(HELLO, SamplingParams(max_tokens=4, seed=5))["seed"] == 5
    assert "seed" not in engine._request_body(HELLO, SamplingParams(max_tokens=4))
    schema = {**EXTRACT, "properties": {**EXTRACT["properties"], "currency": {"const": "<|endoftext|>"}}}
    with pytest.raises(ValueError, match=r"json_schema\.properties\.currency\.const: .*special token"):
        engine._request_body(HELLO, SamplingParams(max_tokens=4, json_schema=json.dumps(schema)))


def test_json_schema_constrains_the_reply_through_memagent_serve(server_url, tokenizer, tiny_engine):
    import jsonschema

    schema = json.dumps(EXTRACT)
    remote = chat(client(server_url, tokenizer), max_tokens=400, json_schema=schema)
    # A random model writes JSON only under the grammar: the server passed the schema to its engine.
    value = json.loads(remote.text)
    jsonschema.validate(value, EXTRACT, format_checker=jsonschema.FormatChecker())
    assert remote.finish_reason == "stop"
    local = asyncio.run(tiny_engine.chat(HELLO, SamplingParams(max_tokens=400, json_schema=schema)))
    assert remote.text == local.text  # greedy, same weights, same constraint


def test_server_models_health_and_response_shape(server_url):
    base = server_url.removesuffix("/v1")
    assert httpx.get(f"{base}/health", timeout=10).json() == {"status": "ok"}
    models = httpx.get(f"{server_url}/models", timeout=10).json()
    assert models["data"][0]["id"] == SERVED and models["data"][0]["max_model_len"] == 4096
    r = httpx.post(f"{server_url}/chat/completions", timeout=60, json={
        "model": SERVED, "messages": [{"role": "developer", "content": "Be brief."}, *HELLO],
        "max_completion_tokens": 2, "temperature": 0, "logprobs": True})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["role"] == "assistant"
    assert len(choice["logprobs"]["content"]) == 2 == body["usage"]["completion_tokens"]
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 2


class StuckEngine(Engine):
    """Never answers; records whether the server cancelled the request."""

    def __init__(self, tokenizer) -> None:
        self.name, self.context_window, self.tokenizer, self.stats = "stuck", 4096, tokenizer, EngineStats()
        self.started, self.cancelled = 0, 0

    async def chat(self, messages, params):
        self.started += 1
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        raise AssertionError("unreachable")


def test_server_drops_requests_whose_client_went_away(tokenizer):
    stuck = StuckEngine(tokenizer)
    with running(create_app(stuck)) as url:
        engine = client(f"{url}/v1", tokenizer, served_model="stuck", request_timeout_s=0.3, max_retries=1)
        with pytest.raises(EndpointError, match="timeout"):
            chat(engine)
        deadline = time.monotonic() + 5
        while stuck.cancelled < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert stuck.started == stuck.cancelled == 2  # both abandoned copies stopped, none left generating


# -- against servers that fail on purpose -------------------------------------------------------

class Faults:
    """What the fault server does on each call: an HTTP status, 'slow', 'no-usage' or 'ok'."""

    def __init__(self) -> None:
        self.plan: list[int | str] = []
        self.calls = 0
        self.auth: list[str | None] = []
        self.slow_s = 1.0


def fault_app(faults: Faults) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> JSONResponse:
        faults.calls += 1
        faults.auth.append(request.headers.get("authorization"))
        action = faults.plan.pop(0) if faults.plan else "ok"
        if isinstance(action, int):
            headers = {"Retry-After": "0.3"} if action == 429 else {}
            error = {"message": f"injected {action}", "type": "test", "param": None, "code": None}
            return JSONResponse({"error": error}, status_code=action, headers=headers)
        if action == "slow":
            await asyncio.sleep(faults.slow_s)
        body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hello there"},
                             "finish_reason": "stop"}]}
        if action != "no-usage":
            body["usage"] = {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}
        return JSONResponse(body)

    return app


@pytest.fixture(scope="module")
def fault_server() -> Iterator[tuple[str, Faults]]:
    faults = Faults()
    with running(fault_app(faults)) as url:
        yield f"{url}/v1", faults


@pytest.fixture
def faults(fault_server) -> Iterator[tuple[str, Faults]]:
    url, f = fault_server
    f.plan, f.calls, f.auth = [], 0, []
    yield url, f


def test_retries_on_503_and_429_then_succeeds_honouring_retry_after(faults, tokenizer):
    url, f = faults
    f.plan = [503, 429]
    engine = client(url, tokenizer, max_retries=3)
    t0 = time.perf_counter()
    reply = chat(engine)
    assert reply.text == "hello there" and reply.finish_reason == "stop" and reply.prompt_tokens == 11
    assert f.calls == 3 and engine.retries == 2
    assert time.perf_counter() - t0 >= 0.3  # the 429's Retry-After, not the 10 ms backoff


def test_gives_up_after_max_retries_naming_the_last_failure(faults, tokenizer):
    url, f = faults
    f.plan = [503] * 5
    engine = client(url, tokenizer, max_retries=2)
    with pytest.raises(EndpointError, match=r"after 3 attempt\(s\); last: HTTP 503: injected 503") as err:
        chat(engine)
    assert err.value.status == 503 and f.calls == 3


def test_client_errors_are_not_retried(faults, tokenizer):
    url, f = faults
    f.plan = [401]
    with pytest.raises(EndpointError, match="failed with HTTP 401: injected 401") as err:
        chat(client(url, tokenizer, max_retries=3))
    assert err.value.status == 401 and f.calls == 1


def test_api_key_env_is_sent_as_bearer(faults, tiny_llama_dir, monkeypatch):
    url, f = faults
    cfg = {"engine": "openai", "endpoint": url, "model": str(tiny_llama_dir), "api_key_env": "MEMAGENT_TEST_KEY"}
    monkeypatch.setenv("MEMAGENT_TEST_KEY", "sekret")
    chat(OpenAIEngine.from_config(EngineConfig(**cfg)))
    monkeypatch.delenv("MEMAGENT_TEST_KEY")
    chat(OpenAIEngine.from_config(EngineConfig(**cfg)))  # unset: no header at all
    assert f.auth == ["Bearer sekret", None]


def test_timeouts_raise_after_retries(faults, tokenizer):
    url, f = faults
    f.plan, f.slow_s = ["slow", "slow"], 3.0
    engine = client(url, tokenizer, request_timeout_s=0.2, max_retries=1)
    t0 = time.perf_counter()
    with pytest.raises(EndpointError, match=r"after 2 attempt\(s\); last: no reply within 0.2 s \(timeout\)"):
        chat(engine)
    assert f.calls == 2 and time.perf_counter() - t0 < 2.5  # did not wait for the 3 s replies


def test_connection_refused_is_retried_then_clear(tokenizer):
    sock = bound_socket()  # bound, never listening: connections are refused
    try:
        engine = client(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", tokenizer, max_retries=2)
        with pytest.raises(EndpointError, match=r"after 3 attempt\(s\); last: connection failed: ConnectError"):
            chat(engine)
        assert engine.retries == 2
    finally:
        sock.close()


def test_missing_usage_is_counted_locally(faults, tokenizer):
    url, f = faults
    f.plan = ["no-usage"]
    engine = client(url, tokenizer)
    reply = chat(engine)
    assert reply.prompt_tokens == engine.count_chat_tokens(HELLO)
    assert reply.completion_tokens == len(tokenizer("hello there", add_special_tokens=False)["input_ids"])


# -- batch jobs: GPUs per engine ---------------------------------------------------------------

def test_priority_is_sent_only_when_the_server_schedules_by_it(tokenizer):
    params = SamplingParams(max_tokens=4, priority=-7)
    plain = OpenAIEngine("http://127.0.0.1:9/v1", "m", tokenizer, 512)
    assert "priority" not in plain._request_body([{"role": "user", "content": "hi"}], params)
    cfg = EngineConfig(engine="openai", endpoint="http://127.0.0.1:9/v1", model="m", priority_scheduling=True)
    assert cfg.priority_scheduling and OpenAIEngine("http://127.0.0.1:9/v1", "m", tokenizer, 512,
                                                    send_priority=True)._request_body([{"role": "user", "content": "hi"}], params)["priority"] == -7
    with pytest.raises(ValueError, match="priority_scheduling: apply only to engine vllm or openai"):
        EngineConfig(priority_scheduling=True)


def test_batch_config_gpu_rules():
    from pipelines.batch_qa import BatchQAConfig
    from pipelines.job import JobConfig

    remote = EngineConfig(engine="openai", endpoint="http://h/v1")
    assert BatchQAConfig(input="/i", output="/o", engine=remote).job.num_gpus == 0
    with pytest.raises(ValueError, match="engine 'openai': the actors only call the endpoint"):
        BatchQAConfig(input="/i", output="/o", engine=remote, job=JobConfig(num_gpus=1))
    with pytest.raises(ValueError, match="engine 'vllm' needs num_gpus > 0"):
        BatchQAConfig(input="/i", output="/o", engine=EngineConfig(engine="vllm"))
    BatchQAConfig(input="/i", output="/o", engine=EngineConfig(engine="vllm"), job=JobConfig(num_gpus=1))
    BatchQAConfig(input="/i", output="/o", engine=EngineConfig(engine="vllm", device="cpu"))


# -- end to end: the CLI ------------------------------------------------------------------------

@pytest.mark.slow
def test_memagent_batch_with_engine_openai(server_url, served_engine, tiny_llama_dir, tmp_path):
    """`memagent batch --engine openai`: Ray actors hold only a tokenizer and call the server."""
    import ray

    from memagent_cli.main import main

    rows = good_rows(4)
    write_rows(tmp_path / "in" / "part-0.parquet", rows)
    before = served_engine.stats.requests
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        rc = main(["batch", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"),
                   "--engine", "openai", "--endpoint", server_url, "--model", str(tiny_llama_dir),
                   "--served-model", SERVED, "--preset", "tiny", "--chunk-tokens", "64", "--memory-tokens", "8",
                   "--answer-tokens", "6", "--batch-size", "2", "--no-progress"])
    finally:
        ray.shutdown()
    assert rc == 0
    out = read_output(tmp_path / "out")
    assert sorted(r["id"] for r in out) == [r["id"] for r in rows]  # one answer row per input id
    assert all(r["error"] is None and r["model"] == SERVED for r in out), [r["error"] for r in out]
    assert served_engine.stats.requests - before == sum(len(r["steps"]) for r in out)


@pytest.mark.slow
def test_memagent_serve_command(tiny_llama_dir, tokenizer, tmp_path):
    """The real `memagent serve` process: loads the model, answers, shuts down on SIGINT."""
    sock = bound_socket()
    port = sock.getsockname()[1]
    sock.close()  # the server binds it again (a tiny race with other processes; fine on loopback)
    proc = subprocess.Popen([sys.executable, "-m", "memagent_cli", "serve", "--model", str(tiny_llama_dir),
                             "--served-model", "tiny", "--port", str(port), "--device", "cpu",
                             "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "memagent serve did not come up"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.25)
        reply = chat(client(f"http://127.0.0.1:{port}/v1", tokenizer, served_model="tiny"), max_tokens=3)
        assert reply.completion_tokens == 3 and reply.finish_reason == "length"
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert f"serving 'tiny' (hf, context window 4096 tokens) at http://127.0.0.1:{port}/v1" in out
