"""The FastAPI app of ``memagent serve``: its routes, its error shape, and :func:`serve`."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from memagent.config import AgentConfig
from memagent.engines.base import Engine
from memagent.serve import messages, responses
from memagent.serve.chat import ServedModel
from memagent.serve.guard import AccessLogRedactor, Guard
from memagent.serve.handling import handle, load_body, served_models, validated
from memagent.serve.handling import unknown_model as _unknown_model
from memagent.serve.protocol import APIError, ChatRequest
from memagent.serve.streaming import ChatWriter

log = logging.getLogger(__name__)

ROUTES = ("GET /health, GET /v1/models, GET /v1/models/{id}, POST /v1/chat/completions, POST /v1/responses, "
          "POST /v1/messages, POST /v1/messages/count_tokens")


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
    reasoning_field: Literal["reasoning_content", "reasoning"] = Field(
        "reasoning_content", description="The message and delta field the memagent model's memory updates are "
        "sent under: reasoning_content (DeepSeek's name, read by LiteLLM, openai-agents, pydantic-ai) or reasoning "
        "(vLLM's and OpenRouter's newer name). One field, so that no client shows them twice.")
    memagent_model: str | None = Field(
        "memagent", description="Also serve the memory agent under this model id: the conversation before the last "
        "user message is the document, the last user message the question (any length). Empty: not served.")

    def auth_key(self) -> str | None:
        """The key clients must send, read from the environment once; unset or empty is an error."""
        if self.auth_key_env is None:
            return None
        key = os.environ.get(self.auth_key_env, "")
        if not key.strip():
            raise ValueError(f"--auth-key-env {self.auth_key_env}: that environment variable is unset or empty")
        return key

    def exposure_warning(self) -> str | None:
        """A warning when the server listens beyond this machine without a key, else None."""
        if self.auth_key_env is not None or self.host == "localhost":
            return None
        try:
            if ipaddress.ip_address(self.host).is_loopback:
                return None
        except ValueError:
            pass
        return (f"warning: serving on {self.host} without --auth-key-env: anyone who can reach this port can use "
                "the model; set --auth-key-env or listen on 127.0.0.1")


def _install_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # A route's query or path parameter that FastAPI parses (?limit=abc): a 400 in OpenAI's shape, not a 422.
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("query", "path", "body", "form")]
        where = ".".join(loc) or "request"
        return APIError(400, f"{where}: {first.get('msg', 'invalid value')}", param=loc[0] if loc else None).response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return APIError(404, f"{request.method} {request.url.path} is not an endpoint of this server ({ROUTES})",
                            code="unknown_endpoint").response()
        if exc.status_code == 405:
            return APIError(405, f"{request.method} is not allowed on {request.url.path} ({ROUTES})",
                            code="method_not_allowed").response()
        return APIError(exc.status_code, str(exc.detail)).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Still JSON in OpenAI's shape; the details (a traceback, a parser's state) stay in the server log.
        log.error("request failed: %s", type(exc).__name__, exc_info=exc)
        return APIError(500, "the engine failed; details are in the server log", type="server_error").response()


def create_app(engine: Engine, config: ServeConfig | None = None, *, close_engine: bool = True,
               agent: AgentConfig | None = None, extra_routers: Sequence[APIRouter] = (),
               on_startup: Sequence[Callable[[asyncio.AbstractEventLoop], Any]] = ()) -> FastAPI:
    """The FastAPI app serving ``engine`` (and the memory agent over it, reading with ``agent``:
    default the paper's budgets) behind ``config``'s guards; it closes the engine on shutdown
    unless told not to. Each of ``on_startup`` is called with the server's event loop once it runs (work
    outside a request that drives ``engine`` must run there). An unset ``auth_key_env`` variable is a ValueError."""
    config = config or ServeConfig()
    key = config.auth_key()
    redactor = AccessLogRedactor(key)
    models = served_models(engine, config.max_tokens, agent, memagent_model=config.memagent_model)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Added once the server has configured logging (uvicorn sets its loggers up before this).
        access = logging.getLogger("uvicorn.access")
        access.addFilter(redactor)
        for hook in on_startup:
            hook(asyncio.get_running_loop())
        try:
            yield
        finally:
            access.removeFilter(redactor)
            if close_engine:
                await engine.close()

    app = FastAPI(title="memagent OpenAI-compatible server", lifespan=lifespan)
    app.state.engine = engine
    app.add_middleware(Guard, key=key, max_body_bytes=config.max_body_bytes)  # outermost: before parsing
    _install_handlers(app)
    _routes(app, engine, models, config.reasoning_field)
    for router in extra_routers:  # routes built outside memagent/ (the Batch API lives in pipelines/)
        app.include_router(router)
    return app


def _card(name: str, engine: Engine) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "memagent", "max_model_len": engine.context_window}


def _routes(app: FastAPI, engine: Engine, models: dict[str, ServedModel], reasoning_field: str) -> None:
    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [_card(name, engine) for name in models]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        if model_id not in models:
            raise _unknown_model(model_id, models)
        return _card(model_id, engine)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        req = validated(ChatRequest, load_body(await request.body()))
        include = bool(req.stream_options and req.stream_options.include_usage)
        return await handle(request, lambda: req, models, engine.name, ChatWriter(reasoning_field, include))

    # The Responses and Messages surfaces: translations onto the same models' runs.
    responses.add_routes(app, engine.name, models)
    messages.add_routes(app, engine.name, models)


def serve(engine: Engine, config: ServeConfig | None = None, agent: AgentConfig | None = None,
          extra_routers: Sequence[APIRouter] = (),
          on_startup: Sequence[Callable[[asyncio.AbstractEventLoop], Any]] = ()) -> None:
    """Serve ``engine`` (and the memory agent reading with ``agent``) with uvicorn until interrupted."""
    import uvicorn

    config = config or ServeConfig()
    if warning := config.exposure_warning():
        log.warning(warning)
    app = create_app(engine, config, agent=agent, extra_routers=extra_routers, on_startup=on_startup)
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level)
