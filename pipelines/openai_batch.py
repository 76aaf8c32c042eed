"""OpenAI Batch API request files run by the batch job: parse, run (resumably), write output and error files.

A request file (JSONL of ``custom_id``, ``method``, ``url``, ``body``) becomes, under a work prefix:

    requests.jsonl ─► parse ─┬─► memagent model's rows ─► job_input/ ─► run_batch_qa ─► job_output/
                             ├─► the engine's model's lines ─► one chat completion each ─► chat/<key>.json
                             └─► bad lines (not JSON, unknown url, refused body) ─► error lines
    then the output and error lines, in OpenAI's line format.

Every piece of state is a file under the prefix (local or s3://), written whole or not at all
(:func:`pipelines.storage.atomic_put`): a rerun on the same prefix skips chat lines already answered, and
the batch job (:func:`pipelines.batch_qa.run_batch_qa`) skips its written rows and resumes unfinished
documents from their checkpoints; so each ``custom_id`` lands exactly once in output ∪ error. A file
whose lines repeat a ``custom_id`` fails validation before any of this (:func:`duplicate_ids`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memagent.config import AgentConfig
from memagent.engines import EngineConfig
from memagent.serve.protocol import APIError, ChatRequest, completion_body, usage
from pipelines import storage
from pipelines.job import JobConfig
from pipelines.storage import S3Options

ENDPOINT = "/v1/chat/completions"
Progress = Callable[[int, int], None]  # (lines finished, lines in all)


class BatchRunConfig(BaseModel):
    """How the request lines of a batch are answered: the engine, the memory agent's budgets and the Ray job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: EngineConfig = Field(default_factory=EngineConfig, description="The engine every line runs on.")
    agent: AgentConfig = Field(default_factory=AgentConfig, description="Budgets of the memagent model's reads.")
    job: JobConfig = Field(default_factory=lambda: JobConfig(progress=False), description="The Ray Data job.")
    s3: S3Options = Field(default_factory=S3Options)
    memagent_model: str = Field("memagent", min_length=1, description="Lines whose body.model is this are read by "
                                "the memory agent (document = messages before the last user message).")
    engine_model: str | None = Field(None, description="The engine's own model id (default: the engine's name); "
                                     "lines naming it, or no model, are one chat completion each.")
    max_tokens: int = Field(4096, gt=0, description="Most completion tokens a line may ask for.")
    chat_concurrency: int = Field(8, gt=0, description="Chat lines decoding at once.")


@dataclass
class Parsed:
    """A request file, sorted into the three ways its lines go."""

    rows: list[dict] = field(default_factory=list)  # memagent rows: id, question, context, line
    chats: list[tuple[str, int, ChatRequest]] = field(default_factory=list)  # (custom_id, line, request)
    errors: list[dict] = field(default_factory=list)  # error lines, already in OpenAI's shape
    order: list[str] = field(default_factory=list)  # custom_ids in file order (first occurrence)

    @property
    def total(self) -> int:
        return len(self.rows) + len(self.chats) + len(self.errors)


def request_id(custom_id: str) -> str:
    """A stable id per custom_id: a resumed batch writes the same ``batch_req_`` ids as one never killed."""
    return "batch_req_" + hashlib.sha256(custom_id.encode()).hexdigest()[:24]


def error_line(custom_id: str | None, code: str, message: str, line: int | None = None) -> dict:
    where = f"line {line}: " if line is not None else ""
    return {"id": request_id(f"{custom_id}#{line}"), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": where + message}}


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
    """Sort the lines of ``data``; a bad line becomes an error line naming its number and field."""
    from memagent.serve.memagent_model import split_conversation

    parsed, seen = Parsed(), set()
    engine_model = cfg.engine_model or engine_name
    for n, raw in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except json.JSONDecodeError as exc:
            parsed.errors.append(error_line(None, "invalid_json", f"not JSON ({exc.msg})", n))
            continue
        cid = line.get("custom_id") if isinstance(line, dict) else None
        problem = _line_problem(line, cid, seen)
        if problem:
            parsed.errors.append(error_line(cid if isinstance(cid, str) else None, problem[0], problem[1], n))
            continue
        seen.add(cid)
        parsed.order.append(cid)
        try:
            req = ChatRequest.model_validate(line["body"])
            model = req.model or engine_model
            if req.stream:
                raise APIError(400, "body.stream: a batch line cannot stream", param="stream")
            if model == cfg.memagent_model:
                _memagent_fields(req, cfg)
                document, question = split_conversation(req)
                parsed.rows.append({"id": cid, "question": question, "context": document, "line": n})
            elif model == engine_model:
                parsed.chats.append((cid, n, req))
            else:
                raise APIError(404, f"body.model: `{model}` is not served here (`{engine_model}`, "
                               f"`{cfg.memagent_model}`)", param="model", code="model_not_found")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            parsed.errors.append(error_line(cid, "invalid_request", f"body.{where}: {first.get('msg')}", n))
        except APIError as exc:
            msg = exc.payload()["error"]["message"]
            parsed.errors.append(error_line(cid, exc.payload()["error"].get("code") or "invalid_request", msg, n))
    return parsed


# What a memagent line may send: the batch job reads it with the run's agent config, so a field it would not
# honour is refused (a 400 naming it), never dropped; temperature and top_p only as the config has them.
MEMAGENT_LINE_FIELDS = frozenset({"model", "messages", "stream", "n"})


def _memagent_fields(req: ChatRequest, cfg: BatchRunConfig) -> None:
    for name in sorted(req.model_fields_set - MEMAGENT_LINE_FIELDS):
        if name in ("temperature", "top_p") and getattr(req, name) == getattr(cfg.agent, name):
            continue
        said = f" (this batch reads with {name}={getattr(cfg.agent, name)})" if name in ("temperature", "top_p") else ""
        raise APIError(400, f"body.{name}: a `{cfg.memagent_model}` line is read by the batch job, which does not "
                       f"take {name}{said}; leave it out, or send the request to /v1/chat/completions",
                       param=name, code="unsupported_in_batch")


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
                 cancelled: Callable[[], bool] = lambda: False) -> tuple[list[dict], list[dict]]:
    """Answer every line of ``data`` under ``prefix`` of ``store``; (output lines, error lines) in file order.

    ``engine`` answers the chat lines in this process (default: one built from ``cfg.engine``); the
    memagent rows go through the batch job, whose actors build theirs (``build_engine``, as
    :func:`pipelines.batch_qa.run_batch_qa`). ``cancelled`` is asked between the two parts.
    """
    from memagent.engines import make_engine

    engine_name = (engine.name if engine is not None else None) or cfg.engine_model or cfg.engine.model
    parsed = parse_requests(data, cfg, engine_name)
    done = _Counter(parsed, progress)
    done.add(len(parsed.errors))
    pending = [c for c in parsed.chats if not store.exists(_chat_key(prefix, c[0]))]  # answered before: kept
    done.add(len(parsed.chats) - len(pending))
    if pending and not cancelled():
        own = engine is None  # loaded only when some chat line is left to answer
        engine = engine if engine is not None else (build_engine or make_engine)(cfg.engine)
        try:
            asyncio.run(_run_chats(pending, store, prefix, cfg, engine, done))
        finally:
            if own:
                asyncio.run(engine.close())
    if parsed.rows and not cancelled():
        _run_rows(parsed.rows, store, prefix, cfg, build_engine)
    done.add(len(parsed.rows))
    return collect(parsed, store, prefix, cfg)


class _Counter:
    def __init__(self, parsed: Parsed, progress: Progress | None):
        self.n, self.total, self.progress = 0, parsed.total, progress

    def add(self, k: int) -> None:
        self.n += k
        if self.progress and k:
            self.progress(self.n, self.total)


def _chat_key(prefix: str, cid: str) -> str:
    return f"{prefix}/chat/{storage.row_key(cid)}.json"


async def _run_chats(chats: list, store: Store, prefix: str, cfg: BatchRunConfig, engine: Any,
                     done: _Counter) -> None:
    """Each chat line not answered yet: one completion through the served chat path, committed as it ends."""
    from memagent.serve.chat import EngineModel
    from memagent.serve.handling import answer
    from memagent.serve.streaming import ChatWriter

    name = cfg.engine_model or engine.name
    models, gate = {name: EngineModel(engine, cfg.max_tokens)}, asyncio.Semaphore(cfg.chat_concurrency)

    async def one(cid: str, n: int, req: ChatRequest) -> None:
        key = _chat_key(prefix, cid)
        async with gate:
            try:  # the chat route's own handling and writer
                body = ChatWriter().whole(name, (await answer(req.model_copy(update={"model": name}), models, name))[1])
                body["id"] = "chatcmpl-" + request_id(cid)[10:]
                line = output_line(cid, body)
            except APIError as exc:
                err = exc.payload()["error"]
                line = error_line(cid, err.get("code") or "invalid_request", err["message"], n)
        await asyncio.to_thread(store.put, key, json.dumps(line).encode())
        done.add(1)

    await asyncio.gather(*(one(*c) for c in chats))


def _run_rows(rows: list[dict], store: Store, prefix: str, cfg: BatchRunConfig, build_engine: Any) -> None:
    """The memagent rows through the batch job: it skips written rows and resumes from checkpoints."""
    from pipelines.batch_qa import BatchQAConfig, run_batch_qa

    table = pa.Table.from_pylist([{k: r[k] for k in ("id", "question", "context")} for r in rows])
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    store.put(f"{prefix}/job_input/part-0.parquet", sink.getvalue().to_pybytes())
    job = BatchQAConfig(input=store.uri(f"{prefix}/job_input"), output=store.uri(f"{prefix}/job_output"), s3=cfg.s3,
                        engine=cfg.engine, agent=cfg.agent, job=cfg.job)
    run_batch_qa(job, build_engine=build_engine)


def collect(parsed: Parsed, store: Store, prefix: str, cfg: BatchRunConfig) -> tuple[list[dict], list[dict]]:
    """Output and error lines of every line answered so far, in the request file's order."""
    by_id: dict[str, dict] = {}
    for cid, _, _ in parsed.chats:
        raw = store.get(_chat_key(prefix, cid))
        if raw is not None:
            by_id[cid] = json.loads(raw)
    lines = {r["id"]: r["line"] for r in parsed.rows}
    for row in _job_rows(store, prefix, cfg):
        if row["id"] in lines:
            by_id[row["id"]] = memagent_line(row, cfg, lines[row["id"]])
    out, err = [], [e for e in parsed.errors if e["custom_id"] is None or e["custom_id"] not in parsed.order]
    for cid in parsed.order:
        line = by_id.get(cid)
        if line is not None:
            (out if line["error"] is None else err).append(line)
    err += [e for e in parsed.errors if e["custom_id"] in parsed.order]  # a bad line of a valid one's id
    return out, err


def _job_rows(store: Store, prefix: str, cfg: BatchRunConfig) -> list[dict]:
    out_fs, out_path = storage.filesystem(store.uri(f"{prefix}/job_output"), cfg.s3)
    if out_fs.get_file_info(out_path).type == pafs.FileType.NotFound:
        return []
    files = storage.complete_parquet_files(out_fs, out_path)
    cols = ["id", "response", "error", "steps", "n_chunks", "context_tokens", "resumed_at_chunk", "model"]
    return storage.read_columns(out_fs, files, cols).to_pylist() if files else []


def memagent_line(row: dict, cfg: BatchRunConfig, n: int) -> dict:
    """A batch job's output row as an output line (a ``chat.completion``) or, for an error row, an error line."""
    if row["error"]:
        kind = row["error"].split(":", 1)[0] if ":" in row["error"][:30] else "agent"
        return error_line(row["id"], kind, row["error"], n)
    steps = row["steps"] or []
    message = {"role": "assistant", "content": row["response"], "tool_calls": None}
    use = usage(sum(s["prompt_tokens"] or 0 for s in steps), sum(s["completion_tokens"] or 0 for s in steps))
    finish = (steps[-1]["finish_reason"] if steps else None) or "stop"
    body = completion_body(cfg.memagent_model, message, "length" if finish == "length" else "stop", use,
                           memagent={"n_chunks": row["n_chunks"], "context_tokens": row["context_tokens"],
                                     "resumed_at_chunk": row["resumed_at_chunk"]})
    body["id"] = "chatcmpl-" + request_id(row["id"])[10:]
    return output_line(row["id"], body)


def jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode()


def now() -> int:
    return int(time.time())
