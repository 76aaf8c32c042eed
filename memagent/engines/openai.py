"""OpenAI-compatible engine: any ``/v1/chat/completions`` endpoint (``vllm serve``, ``memagent serve``, ...).

The model runs elsewhere; this process keeps only the tokenizer, because chunking and budget
checks must count tokens exactly as the served model does. Many coroutines call :meth:`chat`
at once; a semaphore bounds the requests in flight and the server batches them.

Failures are split the way a caller can act on them:
- 429, 5xx, connection errors and timeouts are transient: retried with exponential backoff and
  jitter (``Retry-After`` honoured), then :class:`EndpointError` naming the last failure;
- other 4xx (a prompt over the context window, an unknown model, a bad key) will fail the same
  way again: raised at once as :class:`EndpointError` with the status and the server's message.

A ``json_schema`` goes as OpenAI's ``response_format`` ``{"type": "json_schema", "json_schema":
{"name", "schema", "strict": true}}``, which vLLM's server (structured outputs) and llama.cpp's
server (a grammar from the schema) read; the schema is :func:`~memagent.engines.json_schema.render_schema`'s,
as on the other engines. Speculative decoding is the server's business (docs/engines.md).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import os
import random
import re
import time
from typing import Any

import httpx

from memagent.engines.base import (
    Completion,
    EndpointError,
    Engine,
    EngineStats,
    Messages,
    SamplingParams,
)
from memagent.engines.config import EngineConfig
from memagent.engines.json_schema import render_schema
from memagent.redact import redact_url

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 30.0  # cap of one exponential-backoff wait
MAX_RETRY_AFTER_S = 120.0  # cap on a server's Retry-After; beyond it a retry is pointless


def _retryable(status: int) -> bool:
    return status == 429 or status >= 500


def _server_message(response: httpx.Response) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the raw body (shortened)."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict) and err.get("message"):
        return str(err["message"])
    if isinstance(err, str):
        return err
    if isinstance(body, dict) and body.get("detail"):
        return str(body["detail"])
    return str(body)[:500]


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds the server asks us to wait (``Retry-After``: seconds or an HTTP date), if any."""
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


class OpenAIEngine(Engine):
    """Chat completions from a remote OpenAI-compatible server.

    Args:
        endpoint: base URL of the API, e.g. ``http://127.0.0.1:8000/v1``.
        served_model: model name sent in each request.
        tokenizer: the served model's HF tokenizer (chunking, budgets, local token counts).
        context_window: prompt + reply tokens the server accepts.
        api_key: sent as ``Authorization: Bearer``; None sends no header.
        max_concurrency: most requests in flight at once.
        request_timeout_s: timeout of one HTTP request (connect, read, write each).
        max_retries: retries of a transient failure (so up to ``max_retries + 1`` attempts).
        backoff_s: first backoff wait; doubled per retry, capped, with full jitter.
        send_priority: send each request's ``priority`` (vLLM's server extension; it must run with
            ``--scheduling-policy priority``, and other servers may reject the field).
    """

    def __init__(
        self,
        endpoint: str,
        served_model: str,
        tokenizer: Any,
        context_window: int,
        *,
        api_key: str | None = None,
        max_concurrency: int = EngineConfig.default("max_concurrency"),
        request_timeout_s: float = EngineConfig.default("request_timeout_s"),
        max_retries: int = EngineConfig.default("max_retries"),
        backoff_s: float = 0.5,
        send_priority: bool = False,
    ):
        self.endpoint = endpoint.rstrip("/")
        self.name = served_model
        self.tokenizer = tokenizer
        self.context_window = context_window
        self.api_key = api_key
        self.max_concurrency = max_concurrency
        self.request_timeout_s = request_timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.send_priority = send_priority
        self.stats = EngineStats()
        self.retries = 0  # transient failures retried so far (monitoring, tests)
        # An httpx client and a semaphore belong to one event loop; Ray actors and asyncio.run
        # use fresh loops, so both are (re)made lazily for the running loop.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None

    @classmethod
    def from_config(cls, config: EngineConfig, **kwargs: Any) -> OpenAIEngine:
        """The engine ``config`` describes; loads the tokenizer locally (``kwargs`` go to ``__init__``)."""
        from memagent.models import load_tokenizer, model_context_window

        if config.engine != "openai" or not config.endpoint:
            raise ValueError("OpenAIEngine needs an EngineConfig with engine='openai' and an endpoint")
        tokenizer_name = config.tokenizer or config.model
        tokenizer = load_tokenizer(tokenizer_name)
        window = config.context_window or model_context_window(tokenizer_name)
        return cls(
            config.endpoint,
            config.served_model or config.model,
            tokenizer,
            window,
            api_key=os.environ.get(config.api_key_env) or None,
            max_concurrency=config.max_concurrency,
            request_timeout_s=config.request_timeout_s,
            max_retries=config.max_retries,
            send_priority=config.priority_scheduling,
            **kwargs,
        )

    # -- public API -------------------------------------------------------------------------

    async def chat(self, messages: Messages, params: SamplingParams) -> Completion:
        body = self._request_body(messages, params)
        client, slots = self._client_for_loop()
        async with slots:
            data = await self._post_with_retries(client, "/chat/completions", body)
        return self.stats.count(self._completion(data, messages, params))

    async def close(self) -> None:
        client, loop = self._client, self._loop
        self._client = self._slots = self._loop = None
        if client is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:  # a client of another (likely closed) loop cannot be closed from here
            await client.aclose()

    # -- request / response -----------------------------------------------------------------

    def _request_body(self, messages: Messages, params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.name,
            "messages": messages,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "n": 1,
        }
        if params.logprobs:
            body["logprobs"] = True
        if self.send_priority:
            body["priority"] = params.priority
        if params.seed is not None:
            body["seed"] = params.seed
        if params.json_schema is not None:  # the upstream's grammar may decode a literal as a special token
            self.check_literals(json.loads(params.json_schema))
            body["response_format"] = response_format(params.json_schema)
        if params.stop:  # the server ends the decode there (OpenAI: at most 4 strings)
            body["stop"] = list(params.stop)
        if params.stop_token_ids:  # vLLM's extension of the protocol; other servers may reject it
            body["stop_token_ids"] = list(params.stop_token_ids)
        return body

    def _completion(self, data: dict[str, Any], messages: Messages, params: SamplingParams) -> Completion:
        """Map an OpenAI response body; count tokens locally where the server gave no usage."""
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError):
            raise EndpointError(f"{self.endpoint}: response is not a chat completion: {str(data)[:300]}") from None
        usage = data.get("usage") or {}
        prompt_tokens = usage.get("prompt_tokens")
        if prompt_tokens is None:
            prompt_tokens = self.count_chat_tokens(messages)
        completion_tokens = usage.get("completion_tokens")
        if completion_tokens is None:
            completion_tokens = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        logprobs = None
        if params.logprobs:
            content = (choice.get("logprobs") or {}).get("content")
            if content is None:
                raise EndpointError(f"{self.endpoint}: logprobs were asked for but the response has none")
            logprobs = [float(t["logprob"]) for t in content]
        return Completion(
            text=text,
            prompt_tokens=int(prompt_tokens),
            completion_tokens=int(completion_tokens),
            finish_reason="length" if choice.get("finish_reason") == "length" else "stop",
            logprobs=logprobs,
            # Servers with a prompt cache say how much of the prompt it held (vLLM, OpenAI; llama.cpp does not).
            cached_prompt_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
        )

    # -- transport --------------------------------------------------------------------------

    def _client_for_loop(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            limits = httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency)
            self._client = httpx.AsyncClient(base_url=self.endpoint, headers=headers, limits=limits,
                                             timeout=httpx.Timeout(self.request_timeout_s))
            self._slots = asyncio.Semaphore(self.max_concurrency)
            self._loop = loop
        assert self._slots is not None
        return self._client, self._slots

    async def _post_with_retries(self, client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = redact_url(f"{self.endpoint}{path}")  # for messages and logs: no password or key in them
        attempts = self.max_retries + 1
        failure, status = "", None
        for attempt in range(attempts):
            wait = None
            try:
                response = await client.post(path, json=body)
            except httpx.TimeoutException:
                failure, status = f"no reply within {self.request_timeout_s:g} s (timeout)", None
            except httpx.TransportError as exc:
                failure, status = f"connection failed: {type(exc).__name__}: {exc}", None
            else:
                status = response.status_code
                if response.is_success:
                    return self._json(response, url)
                failure = f"HTTP {status}: {_server_message(response)}"
                if not _retryable(status):
                    raise EndpointError(f"POST {url} failed with {failure}", status)
                wait = _retry_after(response)
            if attempt + 1 == attempts:
                break
            delay = wait if wait is not None else self._backoff(attempt)
            self.retries += 1
            log.warning("POST %s: %s; retry %d/%d in %.2f s", url, failure, attempt + 1, self.max_retries, delay)
            await asyncio.sleep(delay)
        raise EndpointError(f"POST {url} failed after {attempts} attempt(s); last: {failure}", status)

    @staticmethod
    def _json(response: httpx.Response, url: str) -> dict[str, Any]:
        try:
            return response.json()
        except ValueError:
            raise EndpointError(f"POST {url}: response is not JSON: {response.text[:300]!r}",
                                response.status_code) from None

    def _backoff(self, attempt: int) -> float:
        """Full jitter: uniform in [0, min(cap, base * 2**attempt)] (spreads retries of many clients)."""
        return random.uniform(0, min(MAX_BACKOFF_S, self.backoff_s * 2**attempt))


def response_format(json_schema: str) -> dict[str, Any]:
    """OpenAI's ``response_format`` constraining a reply to ``json_schema`` (JSON Schema text).

    The name is the schema's ``title`` when it is a valid OpenAI name, else "reply".
    """
    schema = render_schema(json_schema)
    title = schema.get("title")
    name = title if isinstance(title, str) and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", title) else "reply"
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
