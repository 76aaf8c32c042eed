"""Helpers of the reliability tests: a real `memagent serve` app on a chosen loopback
port (so an endpoint can be down and come back on the same URL), and a local Ray that inherits
the test's environment."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request

SERVED = "tiny-llama"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(app: FastAPI, port: int) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1:``port`` in a thread; yields the API base URL (``.../v1``)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    with serve_on(app, sock) as url:
        yield f"{url}/v1"


@contextmanager
def serve_on(app: FastAPI, sock: socket.socket) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on a bound socket; yields ``http://127.0.0.1:PORT``."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def served_app(tiny_llama_dir: Path, seen_auth: list[str] | None = None) -> FastAPI:
    """`memagent serve`'s app over the tiny random Llama; records each request's Authorization header."""
    from memagent.engines import EngineConfig
    from memagent.engines.hf import TransformersEngine
    from memagent.serve import create_app

    engine = TransformersEngine.from_config(EngineConfig(model=str(tiny_llama_dir)), batch_wait_s=0.05, name=SERVED)
    app = create_app(engine)
    if seen_auth is not None:
        @app.middleware("http")
        async def record(request: Request, call_next):
            seen_auth.append(request.headers.get("authorization", ""))
            return await call_next(request)
    return app


def files_containing(root: Path, needles: list[str]) -> list[str]:
    """Every file under ``root`` whose bytes contain one of ``needles`` (sockets and the like skipped)."""
    hits = []
    for path in root.rglob("*"):
        try:
            if not path.is_file() or path.is_symlink():
                continue
            data = path.read_bytes()
        except OSError:
            continue
        hits += [f"{path}: {n}" for n in needles if n.encode() in data]
    return hits


def ray_sessions_of_this_process(since: float) -> list[Path]:
    """Ray session directories that this process started after ``since`` (their names end in our pid)."""
    import os

    root = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / "ray"
    return [p for p in root.glob(f"session_*_{os.getpid()}") if p.is_dir() and p.stat().st_mtime >= since - 1]
