"""`memagent serve` can require a key, bounds what a client may ask, and stays
responsive: a multi-MB prompt is tokenised off the event loop, so ``/health`` keeps answering.

Real servers on loopback (uvicorn in a thread, or the ``memagent serve`` command) over the tiny
random Llama: the engine runs for real; nothing is mocked.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.reliability_helpers import free_port, serve_on

pytestmark = pytest.mark.slow  # servers and a subprocess (tests/conftest.py's rule)

KEY_ENV = "MEMAGENT_TEST_SERVE_KEY"
KEY = "sk-test-0123456789abcdef-never-logged"
CHAT = "/v1/chat/completions"


def chat_body(text: str = "Say hi.", **kw) -> dict:
    return {"messages": [{"role": "user", "content": text}], **kw}


def bound_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextmanager
def running(app) -> Iterator[str]:
    with serve_on(app, bound_socket()) as url:
        yield url


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine

    return TransformersEngine.from_config(EngineConfig(model=str(tiny_llama_dir)), batch_wait_s=0.02, name="tiny-llama")


@pytest.fixture
def guarded(engine, monkeypatch) -> Iterator[str]:
    from memagent.serve import ServeConfig, create_app

    monkeypatch.setenv(KEY_ENV, KEY)
    config = ServeConfig(auth_key_env=KEY_ENV, max_body_bytes=64 * 1024, max_tokens=8)
    with running(create_app(engine, config, close_engine=False)) as url:
        yield url


def error_of(r: httpx.Response) -> dict:
    assert r.headers["content-type"].startswith("application/json"), r.text[:200]
    return r.json()["error"]


def test_key_required_except_health(guarded, caplog):
    caplog.set_level(logging.DEBUG)
    with httpx.Client(base_url=guarded, timeout=60) as c:
        assert c.get("/health").json() == {"status": "ok"}  # open: probes need no secret
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                        {"Authorization": f"Basic {KEY}"}, {"Authorization": f"Bearer {KEY}x"}):
            for r in (c.post(CHAT, json=chat_body(max_tokens=2), headers=headers), c.get("/v1/models", headers=headers),
                      c.get("/docs", headers=headers)):
                assert r.status_code == 401, (headers, r.status_code)
                assert error_of(r)["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
                assert KEY not in r.text
        ok = c.post(CHAT, json=chat_body(max_tokens=2), headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] <= 2
        assert c.get("/v1/models", headers={"authorization": f"bearer {KEY}"}).status_code == 200
    assert KEY not in caplog.text


def test_unset_key_variable_is_refused(engine, monkeypatch):
    from memagent.serve import ServeConfig, create_app

    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(ValueError, match=f"--auth-key-env {KEY_ENV}: .* unset or empty"):
        create_app(engine, ServeConfig(auth_key_env=KEY_ENV))


def test_body_limit_and_max_tokens_cap(guarded):
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=guarded, timeout=60, headers=auth) as c:
        big = c.post(CHAT, json=chat_body("x" * 70_000))  # Content-Length over 64 KiB: refused unread
        assert big.status_code == 413 and error_of(big)["code"] == "request_too_large"
        assert "65536" in error_of(big)["message"]

        def chunks():  # no Content-Length (chunked): counted as it arrives
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(20):
                yield b"y" * 8192
            yield b'"}]}'

        streamed = c.post(CHAT, content=chunks(), headers={"content-type": "application/json"})
        assert streamed.status_code == 413 and error_of(streamed)["code"] == "request_too_large"
        over = c.post(CHAT, json=chat_body(max_tokens=9))
        assert over.status_code == 400 and error_of(over)["param"] == "max_tokens"
        assert "limit of 8" in error_of(over)["message"]
        over = c.post(CHAT, json=chat_body(max_completion_tokens=100))
        assert over.status_code == 400 and error_of(over)["param"] == "max_completion_tokens"
        default = c.post(CHAT, json=chat_body())  # no max_tokens: the cap, not the rest of the window
        assert default.status_code == 200 and default.json()["usage"]["completion_tokens"] <= 8
        near = c.post(CHAT, json=chat_body("z" * 60_000, max_tokens=2))  # under the limit: reaches the model
        assert near.status_code == 400 and error_of(near)["code"] == "context_length_exceeded"


def assert_responsive(latencies: list[float], busy_s: float) -> None:
    """/health answered within 1 s throughout (the issue's bound). On a machine oversubscribed more
    than 4x by other work, an absolute bound measures the machine, not the server; there the worst
    answer must stay under a tenth of the time the server was busy with the prompts (before the fix,
    /health waited for the whole tokenisation: ~0.9 of it)."""
    assert len(latencies) >= 3, latencies
    worst, load, cores = max(latencies), os.getloadavg()[0], os.cpu_count() or 1
    bound = 1.0 if load <= 4 * cores else max(1.0, 0.1 * busy_s)
    print(f"\n/health: {len(latencies)} polls, worst {worst:.3f}s, bound {bound:.2f}s (load {load:.1f}, "
          f"{cores} cores, busy {busy_s:.1f}s)")
    assert worst < bound, f"/health stalled: {sorted(latencies)[-3:]} (bound {bound:.2f}s)"


def poll_health(url: str, stop: threading.Event, out: list[float]) -> None:
    with httpx.Client(base_url=url, timeout=30) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            assert c.get("/health").status_code == 200
            out.append(time.perf_counter() - t0)
            time.sleep(0.05)


def test_huge_prompt_does_not_stall_health(engine):
    """The reported case: a multi-MB body (under the default body limit) used to be tokenised on
    the event loop, stalling /health for seconds; now it is tokenised in a thread."""
    from memagent.serve import create_app

    body = json.dumps(chat_body("lorem ipsum dolor sit amet " * 130_000, max_tokens=2)).encode()  # ~3.5 MB
    with running(create_app(engine, close_engine=False)) as url:
        stop, latencies = threading.Event(), []
        poller = threading.Thread(target=poll_health, args=(url, stop, latencies), daemon=True)
        poller.start()
        try:
            time.sleep(0.3)
            t0 = time.perf_counter()
            r = httpx.post(url + CHAT, content=body, headers={"content-type": "application/json"}, timeout=300)
            busy = time.perf_counter() - t0
        finally:
            stop.set()
            poller.join(timeout=30)
    assert r.status_code == 400 and error_of(r)["code"] == "context_length_exceeded"
    assert_responsive(latencies, busy)


# -- load: 20 concurrent requests against a bounded `memagent serve` process ---------------------


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@pytest.fixture
def served_process(tiny_llama_dir, tmp_path) -> Iterator[tuple[str, subprocess.Popen, Path]]:
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, KEY_ENV: KEY, "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "memagent_cli", "serve", "--model", str(tiny_llama_dir), "--port", str(port),
           "--auth-key-env", KEY_ENV, "--max-tokens", "8", "--max-body-bytes", "4096K", "--log-level", "debug"]
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "memagent serve did not start"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        yield url, proc, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_twenty_concurrent_requests_against_a_bounded_server(served_process):
    url, proc, log = served_process
    auth = {"Authorization": f"Bearer {KEY}", "content-type": "application/json"}
    # What each request is, and the answers it may get (every one a JSON body).
    huge = json.dumps(chat_body("lorem ipsum dolor sit amet " * 130_000, max_tokens=4)).encode()  # 3.5 MB
    over = json.dumps(chat_body("x" * 5_000_000)).encode()  # 5 MB: over the 4 MiB limit
    plan = ([("small", json.dumps(chat_body(f"Question {i}?", max_tokens=8)).encode(), auth, {200})
             for i in range(12)]
            + [("huge", huge, auth, {400})] * 3 + [("over", over, auth, {413})] * 2
            + [("nokey", json.dumps(chat_body()).encode(), {"content-type": "application/json"}, {401})] * 2
            + [("cap", json.dumps(chat_body(max_tokens=1000)).encode(), auth, {400})])
    assert len(plan) == 20
    baseline = rss_bytes(proc.pid)

    async def run() -> tuple[list[httpx.Response], list[float], int]:
        health, peak, done = [], baseline, asyncio.Event()
        async with httpx.AsyncClient(base_url=url, timeout=240,
                                     limits=httpx.Limits(max_connections=40)) as c:
            async def poll() -> None:
                nonlocal peak
                while not done.is_set():
                    t0 = time.perf_counter()
                    r = await c.get("/health")
                    health.append(time.perf_counter() - t0)
                    assert r.status_code == 200
                    peak = max(peak, rss_bytes(proc.pid))
                    await asyncio.sleep(0.1)

            poller = asyncio.create_task(poll())
            await asyncio.sleep(0.3)
            t0 = time.perf_counter()
            try:
                responses = await asyncio.wait_for(
                    asyncio.gather(*(c.post(CHAT, content=body, headers=h) for _, body, h, _ in plan)), 300)
            finally:
                busy = time.perf_counter() - t0
                done.set()
                await poller
        return responses, health, peak, busy

    responses, health, peak, busy = asyncio.run(run())
    for (kind, _, _, allowed), r in zip(plan, responses):
        assert r.status_code in allowed, (kind, r.status_code, r.text[:300])
        body = r.json()  # every answer is JSON, refusals in OpenAI's error shape
        assert ("choices" in body) if r.status_code == 200 else body["error"]["message"], (kind, body)
    growth = peak - baseline
    print(f"\nRSS {baseline / 2**20:.0f} MiB -> peak {peak / 2**20:.0f} MiB (+{growth / 2**20:.0f})")
    assert_responsive(health, busy)
    assert growth < 1.5 * 2**30, f"RSS grew by {growth / 2**20:.0f} MiB"  # generous: 3 huge prompts in flight
    proc.terminate()
    proc.wait(timeout=30)
    assert KEY not in log.read_text(errors="replace")  # debug logging on: the key is still never written
