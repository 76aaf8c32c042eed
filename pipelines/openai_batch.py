"""OpenAI Batch API request files: parse, answer each line through the served models' one handler
(resumably, line by line), and write the output and error files.

A request file (JSONL of ``custom_id``, ``method``, ``url``, ``body``) becomes, under a work prefix:

    requests.jsonl ─► parse ─┬─► each request line ─► memagent.serve.handling.respond ─► lines/<key>.json
                             └─► bad lines (not JSON, unknown url, refused body) ─► error lines
    then the output and error lines, in OpenAI's line format, in the file's order.

A line is answered exactly as ``POST /v1/chat/completions`` answers its body: the same request model,
the same served models (:func:`memagent.serve.handling.served_models`: the engine's model and the
``memagent`` model), the same handler and the chat writer's whole reply, so every field is honoured or
refused alike. Each answer (or error) is written whole as it ends (:func:`pipelines.storage.atomic_put`),
so a rerun on the same prefix answers only the lines not written yet and each ``custom_id`` lands exactly
once in output ∪ error; a document the ``memagent`` model was reading when the process died is read again
from its start (no within-document checkpoints here, unlike ``memagent batch``). A file whose lines repeat
a ``custom_id`` fails validation before any of this (:func:`duplicate_ids`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow.fs as pafs
from pydantic import BaseModel, ConfigDict, Field

from memagent.config import AgentConfig
from memagent.engines import EngineConfig
from memagent.serve.handling import respond, served_models, unknown_model, validated
from memagent.serve.protocol import APIError, ChatRequest
from memagent.serve.streaming import ChatWriter
from pipelines import storage
from pipelines.storage import S3Options

log = logging.getLogger(__name__)

ENDPOINT = "/v1/chat/completions"
SERVER_ERROR = "server_error"  # a line the engine failed on: answered again by a rerun
Progress = Callable[[int, int], None]  # (lines finished, lines in all)


class BatchRunConfig(BaseModel):
    """How the request lines of a batch are answered: the engine, the memory agent's budgets, how many at once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: EngineConfig = Field(default_factory=EngineConfig, description="The engine every line runs on.")
    agent: AgentConfig = Field(default_factory=AgentConfig, description="Budgets of the memagent model's reads.")
    s3: S3Options = Field(default_factory=S3Options)
    memagent_model: str | None = Field("memagent", min_length=1, description="Lines whose body.model is this are "
                                       "read by the memory agent, as `memagent serve` serves it (None: not served).")
    engine_model: str | None = Field(None, description="The engine's own model id (default: the engine's name); "
                                     "lines naming it, or no model, are one chat completion each.")
    max_tokens: int = Field(4096, gt=0, description="Most completion tokens a line may ask for.")
    concurrency: int = Field(8, gt=0, description="Lines answered at once (their decodes batch together).")
    reasoning_field: Literal["reasoning_content", "reasoning"] = Field(
        "reasoning_content", description="The message field the memagent model's memory updates are written "
        "under (as serve's --reasoning-field).")


@dataclass
class Parsed:
    """A request file, sorted into request lines and error lines."""

    requests: list[tuple[str, int, ChatRequest]] = field(default_factory=list)  # (custom_id, line, request)
    errors: list[dict] = field(default_factory=list)  # error lines, already in OpenAI's shape
    order: list[str] = field(default_factory=list)  # custom_ids in file order (first occurrence)

    @property
    def total(self) -> int:
        return len(self.requests) + len(self.errors)


def request_id(custom_id: str) -> str:
    """A stable id per custom_id: a resumed batch writes the same ``batch_req_`` ids as one never killed."""
    return "batch_req_" + hashlib.sha256(custom_id.encode()).hexdigest()[:24]


def error_line(custom_id: str | None, code: str, message: str, line: int | None = None) -> dict:
    where = f"line {line}: " if line is not None else ""
    return {"id": request_id(f"{custom_id}#{line}"), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": where + message}}


def api_error_line(custom_id: str | None, exc: APIError, line: int) -> dict:
    """The error line of what the chat route would answer with ``exc`` (its code, else its type); a field
    it names is ``body.FIELD``."""
    err = exc.payload()["error"]
    message = err["message"]
    if exc.param and message.startswith(exc.param):
        message = "body." + message
    return error_line(custom_id, err.get("code") or err["type"], message, line)


def output_line(custom_id: str, body: dict, status: int = 200) -> dict:
    return {"id": request_id(custom_id), "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id(custom_id)[10:], "body": body}, "error": None}


def duplicate_ids(data: bytes) -> list[dict]:
    """OpenAI's validation errors (``code``, ``message``, ``param``, ``line``) of each line whose ``custom_id``
    an earlier line holds: such a file fails validation as a whole, as OpenAI's Batch API fails it."""
    seen: dict[str, int] = {}
    errors = []
    for n, raw in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        try:
            cid = json.loads(raw).get("custom_id") if raw.strip() else None
        except (ValueError, AttributeError):
            continue  # not a JSON object: its own error line
        if not isinstance(cid, str):
            continue
        if cid in seen:
            errors.append({"code": "duplicate_custom_id", "param": "custom_id", "line": n,
                           "message": f"line {n}: custom_id {cid!r} is already the custom_id of line {seen[cid]}; "
                           "each request of a batch needs its own"})
        else:
            seen[cid] = n
    return errors


def parse_requests(data: bytes, cfg: BatchRunConfig, engine_name: str) -> Parsed:
    """Sort the lines of ``data``; a bad line becomes an error line naming its number and field (a body
    refused as the chat route refuses it, an unknown model with the route's 404)."""
    parsed, seen = Parsed(), set()
    models = dict.fromkeys(m for m in (cfg.engine_model or engine_name, cfg.memagent_model) if m)
    for n, raw in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as exc:
            parsed.errors.append(error_line(None, "invalid_json", f"not JSON ({exc.msg})", n))
            continue
        cid = line.get("custom_id") if isinstance(line, dict) else None
        if problem := _line_problem(line, cid, seen):
            parsed.errors.append(error_line(cid if isinstance(cid, str) else None, problem[0], problem[1], n))
            continue
        seen.add(cid)
        parsed.order.append(cid)
        try:
            req = validated(ChatRequest, line["body"])
            if req.stream:
                raise APIError(400, "stream: a batch line cannot stream", param="stream")
            if (req.model or cfg.engine_model or engine_name) not in models:
                raise unknown_model(str(req.model), models)
        except APIError as exc:
            parsed.errors.append(api_error_line(cid, exc, n))
            continue
        parsed.requests.append((cid, n, req))
    return parsed


def _line_problem(line: Any, cid: Any, seen: set[str]) -> tuple[str, str] | None:
    if not isinstance(line, dict):
        return "invalid_request", f"a line must be a JSON object, got {type(line).__name__}"
    if not isinstance(cid, str) or not cid:
        return "invalid_request", "custom_id: expected a non-empty string"
    if cid in seen:
        return "duplicate_custom_id", f"custom_id: {cid!r} already appeared on an earlier line"
    if line.get("method") != "POST":
        return "invalid_request", f"method: expected \"POST\", got {line.get('method')!r}"
    if line.get("url") != ENDPOINT:
        return "invalid_url", f"url: expected {ENDPOINT!r} (the batch's endpoint), got {line.get('url')!r}"
    if not isinstance(line.get("body"), dict):
        return "invalid_request", "body: expected a JSON object"
    return None


class Store:
    """Files under a storage root (local path or s3://), each written whole or not at all."""

    def __init__(self, root: str, s3: S3Options | None = None):
        storage.check_uri(root, "storage root")
        self.root, self.s3 = root.rstrip("/"), s3 or S3Options()
        self.fs, self.path = storage.filesystem(self.root, self.s3)

    def uri(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def put(self, rel: str, data: bytes) -> None:
        def write(target: str) -> None:
            with self.fs.open_output_stream(target) as f:
                f.write(data)

        storage.atomic_put(self.fs, f"{self.path}/{rel}", write, uuid.uuid4().hex)

    def get(self, rel: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(f"{self.path}/{rel}") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def exists(self, rel: str) -> bool:
        return self.fs.get_file_info(f"{self.path}/{rel}").type != pafs.FileType.NotFound

    def names(self, rel: str) -> list[str]:
        """Base names directly under ``rel`` (none when it does not exist)."""
        sel = pafs.FileSelector(f"{self.path}/{rel}", allow_not_found=True)
        return sorted(i.base_name for i in self.fs.get_file_info(sel) if not i.base_name.startswith("."))

    def delete(self, rel: str) -> None:
        try:
            self.fs.delete_file(f"{self.path}/{rel}")
        except FileNotFoundError:
            pass


def run_requests(data: bytes, store: Store, prefix: str, cfg: BatchRunConfig, *, engine: Any = None,
                 build_engine: Any = None, progress: Progress | None = None,
                 cancelled: Callable[[], bool] = lambda: False,
                 run: Callable[[Coroutine[Any, Any, None]], Any] = asyncio.run) -> tuple[list[dict], list[dict]]:
    """Answer every line of ``data`` not answered yet under ``prefix`` of ``store``; (output lines, error
    lines) in file order. ``engine`` answers them (default: one built from ``cfg.engine`` by ``build_engine``,
    only when a line is left), on the event loop ``run`` runs them on (``engine``'s own, for an engine a server
    drives); ``cancelled`` is asked before each line starts (a cancelled batch's lines not started are in
    neither file)."""
    from memagent.engines import make_engine

    engine_name = (engine.name if engine is not None else None) or cfg.engine_model or cfg.engine.model
    parsed = parse_requests(data, cfg, engine_name)
    done = _Counter(parsed, progress)
    done.add(len(parsed.errors))
    pending = [r for r in parsed.requests if not _answered(store, _line_key(prefix, r[0]))]
    done.add(len(parsed.requests) - len(pending))
    if pending and not cancelled():
        own = engine is None  # loaded only when some line is left to answer
        engine = engine if engine is not None else (build_engine or make_engine)(cfg.engine)
        try:
            run(_answer_lines(pending, store, prefix, cfg, engine, done, cancelled))
        finally:
            if own:
                run(engine.close())
    return collect(parsed, store, prefix)


class _Counter:
    def __init__(self, parsed: Parsed, progress: Progress | None):
        self.n, self.total, self.progress = 0, parsed.total, progress

    def add(self, k: int) -> None:
        self.n += k
        if self.progress and k:
            self.progress(self.n, self.total)


def _line_key(prefix: str, cid: str) -> str:
    return f"{prefix}/lines/{storage.row_key(cid)}.json"


def _answered(store: Store, key: str) -> bool:
    """Whether a line's answer is written for good: an answer or a refusal is kept; an engine failure
    (``server_error``, the infrastructure's, not the line's) is answered again by a rerun, as the batch job
    redoes its ``infra:`` rows."""
    raw = store.get(key)
    return raw is not None and (json.loads(raw).get("error") or {}).get("code") != SERVER_ERROR


async def answer_line(cid: str, n: int, req: ChatRequest, models: dict, default_model: str,
                      writer: ChatWriter) -> dict:
    """One line's output line: the chat route's answer to its body (the one handler, the chat writer's whole
    reply), or the error line of what the route would refuse it with; an engine failure is a ``server_error``
    line, as the route's 500, and the batch goes on (a rerun answers it again)."""
    try:
        body = await respond(lambda: req, models, default_model, writer)
    except APIError as exc:
        return api_error_line(cid, exc, n)
    except Exception as exc:  # noqa: BLE001 - one line's failure is its error line, never the batch's
        log.error("batch line %s failed: %s", cid, type(exc).__name__, exc_info=exc)
        return error_line(cid, SERVER_ERROR, "the engine failed; details are in the server log", n)
    body["id"] = "chatcmpl-" + request_id(cid)[10:]  # stable: a resumed batch writes the ids of one never killed
    return output_line(cid, body)


async def _answer_lines(requests: list, store: Store, prefix: str, cfg: BatchRunConfig, engine: Any,
                        done: _Counter, cancelled: Callable[[], bool]) -> None:
    """Each line not answered yet, ``cfg.concurrency`` at once, each written as it ends."""
    name = cfg.engine_model or engine.name
    models = served_models(engine, cfg.max_tokens, cfg.agent, memagent_model=cfg.memagent_model, engine_model=name)
    gate, writer = asyncio.Semaphore(cfg.concurrency), ChatWriter(cfg.reasoning_field)

    async def one(cid: str, n: int, req: ChatRequest) -> None:
        async with gate:
            if await asyncio.to_thread(cancelled):
                return
            line = await answer_line(cid, n, req, models, name, writer)
            await asyncio.to_thread(store.put, _line_key(prefix, cid), json.dumps(line).encode())
        done.add(1)

    await asyncio.gather(*(one(*r) for r in requests))


def collect(parsed: Parsed, store: Store, prefix: str) -> tuple[list[dict], list[dict]]:
    """Output and error lines of every line answered so far, in the request file's order."""
    by_id: dict[str, dict] = {}
    for cid, _, _ in parsed.requests:
        raw = store.get(_line_key(prefix, cid))
        if raw is not None:
            by_id[cid] = json.loads(raw)
    out, err = [], [e for e in parsed.errors if e["custom_id"] is None or e["custom_id"] not in parsed.order]
    for cid in parsed.order:
        line = by_id.get(cid)
        if line is not None:
            (out if line["error"] is None else err).append(line)
    err += [e for e in parsed.errors if e["custom_id"] in parsed.order]  # a bad line of a valid one's id
    return out, err


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()


def now() -> int:
    return int(time.time())
