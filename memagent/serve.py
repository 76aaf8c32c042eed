"""``memagent serve``: any local engine behind an OpenAI-compatible HTTP API.

Clients that speak the OpenAI chat API (``--engine openai`` of another memagent process, a Ray
job on other nodes, curl, the ``openai`` SDK) then share one loaded model. Each request is a
coroutine awaiting ``engine.chat``, so requests from concurrent clients reach the engine
together and it batches them (the transformers engine into one ``generate``, vLLM natively).

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions`` (non-streaming,
``n=1``). Errors use OpenAI's body ``{"error": {"message", "type", "param", "code"}}``.

Guards (:class:`ServeConfig`): with ``auth_key_env`` every path but ``/health`` needs
``Authorization: Bearer KEY`` (401 otherwise; compared in constant time, never logged or echoed);
``/health`` stays open, as vLLM's does, so that probes and load balancers need no secret and learn
nothing from it. A body over ``max_body_bytes`` is a 413 before it is read whole, a ``max_tokens``
over the cap a 400; the chat template and tokenizer run in a thread, so a huge prompt never stalls
the event loop (``/health`` and other requests go on being answered).

Hostile input is a 400 in OpenAI's shape, never a plain-text 500 or an echo of internals: text
that is not valid Unicode (a lone surrogate such as ``\\ud800``), a ``response_format`` schema
with a recursive ``$ref`` (the grammar would have to be infinite) or nested too deep. A failure
inside the engine is a 500 whose details go to the server log only. Keys are never logged: the
access log masks every query-string value (``?api_key=***``) and the configured key anywhere.

``response_format`` may be ``text``, ``json_schema`` (the reply follows the schema) or
``json_object`` (OpenAI's JSON mode: the reply is some JSON object; the engines get a generic,
bounded object schema through the same json_schema path).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import asynccontextmanager
from typing import Any, Literal
from urllib.parse import quote, unquote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memagent.engines.base import Completion, Engine, SamplingParams
from memagent.engines.json_schema import MAX_ARRAY_ITEMS, MAX_MAGNITUDE, MAX_STRING_CHARS, NUMBER_STEP

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.5  # how often a waiting request checks that its client is still there
OPEN_PATHS = frozenset({"/health"})  # answered without a key
LARGE_PROMPT_CHARS = 256 * 1024  # prompts longer than this are tokenised one at a time
MAX_SCHEMA_DEPTH = 64  # response_format schemas nested deeper than this are refused (no real schema is)
MASK = "***"

# OpenAI's JSON mode as a schema: any JSON object, its keys and values bounded like render_schema's
# (keys of at most MAX_KEY_CHARS, strings, arrays, number digits), so that a model caught in a loop
# cannot spend the whole budget inside one key or value. The $defs recursion is optional (an
# object may be empty), so the grammar is finite. (llguidance has no propertyNames; a pattern
# property with additionalProperties false bounds the keys.)
MAX_KEY_CHARS = 64
_MEMBERS = {"patternProperties": {f"^.{{0,{MAX_KEY_CHARS}}}$": {"$ref": "#/$defs/value"}}, "additionalProperties": False}
_VALUE = {"anyOf": [
    {"type": "string", "maxLength": MAX_STRING_CHARS},
    {"type": "number", "minimum": -MAX_MAGNITUDE, "maximum": MAX_MAGNITUDE, "multipleOf": NUMBER_STEP},
    {"type": "boolean"}, {"type": "null"},
    {"type": "array", "items": {"$ref": "#/$defs/value"}, "maxItems": MAX_ARRAY_ITEMS},
    {"type": "object", **_MEMBERS}]}
JSON_OBJECT_SCHEMA = {"type": "object", **_MEMBERS, "$defs": {"value": _VALUE}}


class ServeConfig(BaseModel):
    """Where ``memagent serve`` listens and what it accepts from a client."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field("127.0.0.1", description="Interface to listen on (127.0.0.1: this machine only; 0.0.0.0: "
                      "every interface, so set --auth-key-env)")
    port: int = Field(8000, gt=0, le=65535, description="TCP port.")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="uvicorn's log level.")
    auth_key_env: str | None = Field(
        None, description="Environment variable holding the key clients must send as `Authorization: Bearer KEY` "
        "(every path but /health; unset: no key asked). Not --api-key-env, the key the openai engine sends upstream")
    max_body_bytes: int = Field(4 * 1024 * 1024, gt=0, description="Largest request body in bytes (a larger one is "
                                "a 413); a prompt filling a 128K-token window is about 0.5-1 MB of JSON.")
    max_tokens: int = Field(4096, gt=0, description="Most completion tokens a request may ask for (max_tokens above "
                            "it is a 400); also the default when it asks none (within the context window).")

    def auth_key(self) -> str | None:
        """The key clients must send, read from the environment once; unset or empty is an error."""
        if self.auth_key_env is None:
            return None
        key = os.environ.get(self.auth_key_env, "")
        if not key.strip():
            raise ValueError(f"--auth-key-env {self.auth_key_env}: that environment variable is unset or empty")
        return key


class APIError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> bytes:
        # ensure_ascii: a message quoting client text with a lone surrogate still encodes.
        return json.dumps({"error": {"message": self.message, "type": self.type, "param": self.param,
                                     "code": self.code}}).encode()

    def response(self) -> JSONResponse:
        return _JSONBytes(self.body(), status_code=self.status)


class _JSONBytes(JSONResponse):
    """A JSON response of bytes already encoded."""

    def render(self, content: Any) -> bytes:
        return content


class AccessLogRedactor(logging.Filter):
    """Masks keys in uvicorn's access log lines: every query-string value (a key sent as
    ``?api_key=...`` is refused, but the line would still be written) and the configured key,
    raw or percent-encoded, wherever it stands."""

    def __init__(self, key: str | None = None):
        super().__init__()
        self._secrets = sorted({s for s in (key, quote(key or "", safe=""), quote(key or "")) if s}, key=len,
                               reverse=True)

    def redact(self, text: str) -> str:
        path, sep, query = text.partition("?")
        if sep:
            query = "&".join(f"{p.partition('=')[0]}={MASK}" if "=" in p else MASK for p in query.split("&"))
            text = f"{path}?{query}"
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self.redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.msg, str):
            record.msg = self.redact(record.msg)
        return True


class Guard:
    """ASGI middleware in front of the app: the key, then the body size, before anything is parsed.

    The body is read here (at most ``max_body_bytes``) and replayed to the app; a client that
    announces or sends more gets a 413 at once, without the server holding the rest.
    """

    def __init__(self, app: ASGIApp, *, key: str | None, max_body_bytes: int):
        self.app, self.max_body_bytes = app, max_body_bytes
        self._key = key.encode() if key is not None else None

    def _authorized(self, scope: Scope) -> bool:
        header = dict(scope.get("headers") or []).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        # compare_digest: the time taken says nothing about how much of the key was right.
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self._key is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
            return await _send_error(send, APIError(401, "missing or incorrect API key: send `Authorization: Bearer "
                                                    "KEY`", code="invalid_api_key"), {b"www-authenticate": b"Bearer"})
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return await _send_error(send, self._too_large(length.decode("latin-1")))
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return await _send_error(send, self._too_large(f"more than {size}"))
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # the disconnect, when the client goes away

        await self.app(scope, replay, send)

    def _too_large(self, size: str) -> APIError:
        return APIError(413, f"request body of {size} bytes is over this server's limit of {self.max_body_bytes} "
                        "bytes (--max-body-bytes)", code="request_too_large")


async def _send_error(send: Send, error: APIError, headers: dict[bytes, bytes] | None = None) -> None:
    body = error.body()
    head = {b"content-type": b"application/json", b"content-length": str(len(body)).encode(), **(headers or {})}
    await send({"type": "http.response.start", "status": error.status, "headers": list(head.items())})
    await send({"type": "http.response.body", "body": body})


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class JsonSchemaFormat(BaseModel):
    """``response_format.json_schema``: the reply is constrained to ``schema`` (SamplingParams.json_schema)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = "reply"
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    type: Literal["text", "json_schema", "json_object"]
    json_schema: JsonSchemaFormat | None = None


class ChatRequest(BaseModel):
    """The subset of the OpenAI chat request the engines support; unknown fields are ignored
    (as OpenAI-compatible servers do), unsupported values of known ones are a 400."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, gt=0)
    max_completion_tokens: int | None = Field(None, gt=0)
    temperature: float = Field(1.0, ge=0)  # OpenAI's default
    top_p: float = Field(1.0, gt=0, le=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=0, description="only 0: the engines return chosen-token log-probs")
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    stream: bool = Field(False, description="streaming is not supported")
    stop: str | list[str] | None = None
    response_format: ResponseFormat | None = None


def _check_supported(req: ChatRequest) -> None:
    if req.stream:
        raise APIError(400, "stream=true is not supported by this server", param="stream")
    if req.stop:
        raise APIError(400, "stop sequences are not supported by this server", param="stop")
    rf = req.response_format
    if rf and rf.type == "json_schema":
        if not rf.json_schema:
            raise APIError(400, "response_format of type json_schema needs json_schema: {name, schema}",
                           param="response_format")
        _check_schema(rf.json_schema.schema_, "response_format.json_schema.schema")


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every (path, value) of a JSON value, iteratively (a deeply nested one cannot overflow the stack)."""
    stack = [(path, value)]
    while stack:
        path, value = stack.pop()
        yield path, value
        if isinstance(value, dict):
            for k, v in value.items():
                yield f"{path}.{k}", k  # keys are text too
                stack.append((f"{path}.{k}", v))
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}", v) for i, v in enumerate(value))


def _check_unicode(req: ChatRequest) -> None:
    """400 for text that is not valid Unicode: JSON's ``\\ud800`` escape (or raw surrogate bytes,
    which Python's JSON decoder lets through) is a lone surrogate that no tokenizer can encode."""
    for path, value in _walk(req.model_dump(by_alias=True, exclude_none=True), "body"):
        if isinstance(value, str) and not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                where = path.removeprefix("body.")
                raise APIError(400, f"{where}: not valid Unicode text: a lone surrogate (\\u{ord(value[exc.start]):04x})"
                               f" at character {exc.start}; send UTF-8 text", param=where.split(".")[0],
                               code="invalid_unicode") from None


def _pointer(ref: str) -> str | None:
    """The JSON pointer of a local ``$ref`` (``#/$defs/a`` -> ``/$defs/a``; ``#`` -> ``""``), else None;
    ``~0``/``~1`` stay escaped, as in the locations :func:`_check_schema` builds."""
    if not ref.startswith("#"):
        return None
    return unquote(ref[1:])


def _check_schema(schema: Any, param: str) -> None:
    """400 for a schema nested deeper than MAX_SCHEMA_DEPTH or with a recursive ``$ref`` (a
    definition that reaches itself through references: the grammar of its replies would be
    infinite, and an unsatisfiable one makes the grammar parser fail mid-reply)."""
    refs: list[tuple[str, str]] = []  # (where the $ref is, as a JSON pointer; the pointer it names)
    stack = [("", schema, 0)]
    while stack:
        at, node, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            raise APIError(400, f"{param}: nested deeper than {MAX_SCHEMA_DEPTH} levels", param="response_format",
                           code="invalid_schema")
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and (target := _pointer(ref)) is not None:
                refs.append((at, target))
            stack.extend((f"{at}/{str(k).replace('~', '~0').replace('/', '~1')}", v, depth + 1) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((f"{at}/{i}", v, depth + 1) for i, v in enumerate(node))
    # Definition T leads to U when a $ref to U stands inside T; a cycle is a recursive $ref.
    edges = {t: sorted({u for where, u in refs if where == t or where.startswith(t + "/")}) for _, t in refs}
    cycle = _cycle(edges)
    if cycle:
        shown = " -> ".join("#" + n for n in cycle)
        raise APIError(400, f"{param}: recursive $ref ({shown}) is not supported: constrained decoding needs a "
                       "schema of finite depth", param="response_format", code="invalid_schema")


def _cycle(edges: dict[str, list[str]]) -> list[str] | None:
    """A cycle of the graph ``edges`` (node -> successors) as [a, b, ..., a], or None (iterative DFS)."""
    done: set[str] = set()
    for start in edges:
        if start in done:
            continue
        path, nexts = [start], [iter(edges[start])]
        while path:
            nxt = next(nexts[-1], None)
            if nxt is None:
                done.add(path.pop())
                nexts.pop()
            elif nxt in path:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in done:
                path.append(nxt)
                nexts.append(iter(edges.get(nxt, ())))
    return None


def _check_max_tokens(req: ChatRequest, cap: int) -> None:
    """400 when the request asks for more completion tokens than the server's cap."""
    for name in ("max_completion_tokens", "max_tokens"):
        asked = getattr(req, name)
        if asked is not None and asked > cap:
            raise APIError(400, f"{name} {asked} is over this server's limit of {cap} tokens (--max-tokens)",
                           param=name, code="max_tokens_too_large")


def _sampling(req: ChatRequest, prompt_tokens: int, context_window: int, cap: int | None = None) -> SamplingParams:
    """Decoding settings; 400 in OpenAI's words when prompt + reply exceed the window."""
    asked = req.max_completion_tokens or req.max_tokens
    max_tokens = asked or context_window - prompt_tokens  # default: the rest of the window (within the cap)
    if not asked and cap is not None:
        max_tokens = min(max_tokens, cap)
    if asked and prompt_tokens + asked > context_window:
        raise APIError(
            400,
            f"This model's maximum context length is {context_window} tokens. However, you requested "
            f"{prompt_tokens + asked} tokens ({prompt_tokens} in the messages, {asked} in "
            "the completion). Please reduce the length of the messages or completion.",
            param="messages",
            code="context_length_exceeded",
        )
    if max_tokens < 1:  # no max_tokens asked, and the messages leave no room for even one token
        raise APIError(
            400,
            f"This model's maximum context length is {context_window} tokens. However, your messages resulted "
            f"in {prompt_tokens} tokens, which leaves no room for the completion. Please reduce the length of "
            "the messages.",
            param="messages",
            code="context_length_exceeded",
        )
    rf = req.response_format
    schema = None
    if rf and rf.type == "json_schema" and rf.json_schema:
        schema = json.dumps(rf.json_schema.schema_)
    elif rf and rf.type == "json_object":
        schema = json.dumps(JSON_OBJECT_SCHEMA)
    return SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, logprobs=req.logprobs,
                          json_schema=schema)


def _first_line(text: str, limit: int = 500) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "invalid request"
    return line if len(line) <= limit else line[:limit] + " …"


def _logprobs_body(engine: Engine, c: Completion) -> dict[str, Any] | None:
    if c.logprobs is None:
        return None
    ids = c.token_ids or []
    tokens = [engine.tokenizer.decode([t]) for t in ids] if len(ids) == len(c.logprobs) else [""] * len(c.logprobs)
    return {"content": [{"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8")), "top_logprobs": []}
                        for tok, lp in zip(tokens, c.logprobs)]}


def _completion_body(engine: Engine, c: Completion) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": engine.name,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": c.text},
            "logprobs": _logprobs_body(engine, c),
            "finish_reason": c.finish_reason,
        }],
        "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                  "total_tokens": c.prompt_tokens + c.completion_tokens},
    }


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    return f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid value')}", (loc[0] if loc else None)


async def _unless_disconnected(request: Request, work: Awaitable[Completion]) -> Completion:
    """Await ``work``, cancelling it when the client goes away (a timed-out client retries: without
    this, an overloaded server would go on generating every abandoned copy)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise APIError(499, "client closed the request", code="client_closed_request")
    except asyncio.CancelledError:
        task.cancel()
        raise


def create_app(engine: Engine, config: ServeConfig | None = None, *, close_engine: bool = True) -> FastAPI:
    """The FastAPI app serving ``engine`` behind ``config``'s guards (key, body size, max_tokens cap);
    it closes the engine on shutdown unless told not to. An unset ``auth_key_env`` variable is a ValueError."""
    config = config or ServeConfig()
    key = config.auth_key()
    one_large_prompt = asyncio.Semaphore(1)

    redactor = AccessLogRedactor(key)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Added once the server has configured logging (uvicorn sets its loggers up before this).
        access = logging.getLogger("uvicorn.access")
        access.addFilter(redactor)
        try:
            yield
        finally:
            access.removeFilter(redactor)
            if close_engine:
                await engine.close()

    app = FastAPI(title="memagent OpenAI-compatible server", lifespan=lifespan)
    app.state.engine = engine
    app.add_middleware(Guard, key=key, max_body_bytes=config.max_body_bytes)  # outermost: before parsing

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return APIError(400, message, param=param).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Still JSON in OpenAI's shape; the details (a traceback, a parser's state) stay in the server log.
        if isinstance(exc, RecursionError):  # a body nested too deep for the JSON decoder
            return APIError(400, "request body nested too deeply", code="invalid_request").response()
        log.error("request failed: %s", type(exc).__name__, exc_info=exc)
        return APIError(500, "internal server error (details in the server log)", type="server_error").response()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": engine.name, "object": "model", "created": 0, "owned_by": "memagent",
                "max_model_len": engine.context_window}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request) -> dict[str, Any]:
        _check_unicode(req)
        _check_supported(req)
        if req.model is not None and req.model != engine.name:
            raise APIError(404, f"The model `{req.model}` does not exist; this server serves `{engine.name}`.",
                           param="model", code="model_not_found")
        # "developer" is OpenAI's newer name for "system"; chat templates know only the latter.
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                    for m in req.messages]
        _check_max_tokens(req, config.max_tokens)
        # In a thread: the template and tokenizer over a multi-MB prompt take seconds. Large prompts
        # one at a time, so that many of them hold one core, not every core the event loop needs too.
        if sum(len(m["content"]) for m in messages) > LARGE_PROMPT_CHARS:
            async with one_large_prompt:
                prompt_tokens = await asyncio.to_thread(engine.count_chat_tokens, messages)
        else:
            prompt_tokens = await asyncio.to_thread(engine.count_chat_tokens, messages)
        params = _sampling(req, prompt_tokens, engine.context_window, config.max_tokens)
        try:
            completion = await _unless_disconnected(request, engine.chat(messages, params))
        except APIError:
            raise
        except ValueError as exc:  # the engine rejected this input: its first line, not a parser dump
            raise APIError(400, _first_line(str(exc))) from None
        except Exception:  # a failed request must not stop the server, nor show the client its internals
            log.exception("chat completion failed")
            hint = (" while decoding under response_format (a schema too complex for the grammar?)"
                    if params.json_schema else "")
            raise APIError(500, f"the engine failed{hint}; details are in the server log",
                           type="server_error") from None
        return _completion_body(engine, completion)

    return app


def serve(engine: Engine, config: ServeConfig | None = None) -> None:
    """Serve ``engine`` with uvicorn until interrupted."""
    import uvicorn

    config = config or ServeConfig()
    uvicorn.run(create_app(engine, config), host=config.host, port=config.port, log_level=config.log_level)
