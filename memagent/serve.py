"""``memagent serve``: any local engine behind an OpenAI-compatible HTTP API.

Clients that speak the OpenAI chat API (``--engine openai`` of another memagent process, a Ray
job on other nodes, curl, the ``openai`` SDK) then share one loaded model. Each request is a
coroutine awaiting ``engine.chat``, so requests from concurrent clients reach the engine
together and it batches them (the transformers engine into one ``generate``, vLLM natively).

Endpoints: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions`` (non-streaming,
``n=1``). Errors use OpenAI's body ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from memagent.engines.base import Completion, Engine, SamplingParams

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.5  # how often a waiting request checks that its client is still there


class APIError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def response(self) -> JSONResponse:
        body = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return JSONResponse({"error": body}, status_code=self.status)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


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


def _check_supported(req: ChatRequest) -> None:
    if req.stream:
        raise APIError(400, "stream=true is not supported by this server", param="stream")
    if req.stop:
        raise APIError(400, "stop sequences are not supported by this server", param="stop")


def _sampling(req: ChatRequest, prompt_tokens: int, context_window: int) -> SamplingParams:
    """Decoding settings; 400 in OpenAI's words when prompt + reply exceed the window."""
    asked = req.max_completion_tokens or req.max_tokens
    max_tokens = asked or context_window - prompt_tokens  # default: the rest of the window
    if prompt_tokens + max(max_tokens, 1) > context_window:
        raise APIError(
            400,
            f"This model's maximum context length is {context_window} tokens. However, you requested "
            f"{prompt_tokens + max(max_tokens, 1)} tokens ({prompt_tokens} in the messages, {max_tokens} in "
            "the completion). Please reduce the length of the messages or completion.",
            param="messages",
            code="context_length_exceeded",
        )
    return SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p, logprobs=req.logprobs)


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


def create_app(engine: Engine, *, close_engine: bool = True) -> FastAPI:
    """The FastAPI app serving ``engine``; it closes the engine on shutdown unless told not to."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if close_engine:
            await engine.close()

    app = FastAPI(title="memagent OpenAI-compatible server", lifespan=lifespan)
    app.state.engine = engine

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return APIError(400, message, param=param).response()

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
        _check_supported(req)
        if req.model is not None and req.model != engine.name:
            raise APIError(404, f"The model `{req.model}` does not exist; this server serves `{engine.name}`.",
                           param="model", code="model_not_found")
        # "developer" is OpenAI's newer name for "system"; chat templates know only the latter.
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                    for m in req.messages]
        params = _sampling(req, engine.count_chat_tokens(messages), engine.context_window)
        try:
            completion = await _unless_disconnected(request, engine.chat(messages, params))
        except APIError:
            raise
        except ValueError as exc:  # the engine rejected this input
            raise APIError(400, str(exc)) from None
        except Exception as exc:  # a failed request must not stop the server
            log.exception("chat completion failed")
            raise APIError(500, f"{type(exc).__name__}: {exc}", type="server_error") from None
        return _completion_body(engine, completion)

    return app


def serve(engine: Engine, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info") -> None:
    """Serve ``engine`` with uvicorn until interrupted."""
    import uvicorn

    uvicorn.run(create_app(engine), host=host, port=port, log_level=log_level)
