"""What stands between a client and the engine: the key, the body size, and hostile input.

:class:`Guard` (ASGI, outermost) checks the key and the body size before anything is parsed;
:class:`AccessLogRedactor` keeps keys out of the access log; :func:`check_unicode` and
:func:`check_schema` turn text no tokenizer can encode and schemas no grammar can hold into a 400.
"""

from __future__ import annotations

import hmac
import json
import logging
from typing import Any
from urllib.parse import quote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memagent.engines.special_literals import special_literal
from memagent.json_refs import local_refs, ref_cycle, resolve_refs
from memagent.json_walk import dotted, walk_json
from memagent.serve.protocol import APIError

OPEN_PATHS = frozenset({"/health"})  # answered without a key
MAX_SCHEMA_DEPTH = 64  # schemas nested deeper than this are refused (no real schema is)
MASK = "***"


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
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").partition(b" ")
        # compare_digest: the time taken says nothing about how much of the key was right.
        if scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._key):
            return True
        return b"x-api-key" in headers and hmac.compare_digest(headers[b"x-api-key"].strip(), self._key)  # Anthropic's

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self._key is not None and scope["path"] not in OPEN_PATHS and not self._authorized(scope):
            return await send_error(send, APIError(401, "missing or incorrect API key: send `Authorization: Bearer "
                                                   "KEY` (or `x-api-key: KEY`)", code="invalid_api_key"),
                                    {b"www-authenticate": b"Bearer"}, scope["path"])
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return await send_error(send, self._too_large(length.decode("latin-1")), path=scope["path"])
        body = await self._read(receive, send, scope["path"])
        if body is None:
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # the disconnect, when the client goes away

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive, send: Send, path: str) -> bytes | None:
        """The whole body, or None (a disconnect, or a 413 already sent)."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                await send_error(send, self._too_large(f"more than {size}"), path=path)
                return None
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_large(self, size: str) -> APIError:
        return APIError(413, f"request body of {size} bytes is over this server's limit of {self.max_body_bytes} "
                        "bytes (--max-body-bytes)", code="request_too_large")


# Anthropic's error types by status (https://docs.anthropic.com/en/api/errors).
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}


def anthropic_body(error: APIError) -> bytes:
    """``error`` in Anthropic's shape, which the Messages API's clients read."""
    kind = ANTHROPIC_ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return json.dumps({"type": "error", "error": {"type": kind, "message": error.message}}).encode()


async def send_error(send: Send, error: APIError, headers: dict[bytes, bytes] | None = None, path: str = "") -> None:
    """The error in OpenAI's shape, or in Anthropic's on the Messages API's paths."""
    body = anthropic_body(error) if path.startswith("/v1/messages") else error.body()
    head = {b"content-type": b"application/json", b"content-length": str(len(body)).encode(), **(headers or {})}
    await send({"type": "http.response.start", "status": error.status, "headers": list(head.items())})
    await send({"type": "http.response.body", "body": body})


def check_unicode(body: dict[str, Any]) -> None:
    """400 for text that is not valid Unicode: JSON's ``\\ud800`` escape (or raw surrogate bytes,
    which Python's JSON decoder lets through) is a lone surrogate that no tokenizer can encode."""
    for path, node in walk_json(body):
        keys = [((*path, k), k) for k in node] if isinstance(node, dict) else []  # keys are text too
        for at, value in [(path, node), *keys]:
            if not isinstance(value, str) or value.isascii():
                continue
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                where = dotted(at)[1:]
                raise APIError(400, f"{where}: not valid Unicode text: a lone surrogate (\\u{ord(value[exc.start]):04x})"
                               f" at character {exc.start}; send UTF-8 text", param=where.split(".")[0],
                               code="invalid_unicode") from None


def check_schema(schema: Any, where: str, param: str = "response_format") -> dict[str, Any]:
    """The schema with every ``$ref`` a local pointer (:func:`resolve_refs`); 400 for one nested
    deeper than MAX_SCHEMA_DEPTH, with a ``$ref`` outside it, or with a recursive ``$ref`` (a
    definition that reaches itself through references: the grammar of its replies would be
    infinite, and an unsatisfiable one makes the grammar parser fail mid-reply)."""
    try:
        local_refs(schema, MAX_SCHEMA_DEPTH)  # the depth first: resolve_refs walks the whole schema
        schema = resolve_refs(schema)
    except ValueError as exc:
        raise APIError(400, f"{where}: {exc}", param=param, code="invalid_schema") from None
    cycle = ref_cycle(schema)
    if cycle:
        shown = " -> ".join("#" + n for n in cycle)
        raise APIError(400, f"{where}: recursive $ref ({shown}) is not supported: constrained decoding needs a "
                       "schema of finite depth", param=param, code="invalid_schema")
    return schema


def refuse_special_literals(schema: Any, specials: list[str], where: str, param: str) -> None:
    """400 naming the literal's path when a literal of ``schema`` holds one of ``specials`` (the special
    tokens of an engine whose grammar could decode it as the token: :meth:`Engine.check_literals`)."""
    hit = special_literal(schema, specials)
    if hit is not None:
        path, text, token = hit
        raise APIError(400, f"{dotted(path, where)}: the literal {text!r} holds the model's special token {token!r}, "
                       "which this engine cannot keep out of a constrained reply (decoded, it would end the reply "
                       "unparsed); leave the token out of the schema's literals", param=param, code="invalid_schema")
