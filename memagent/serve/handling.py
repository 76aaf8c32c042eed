"""What every route does with a request, whichever API it speaks (chat, Responses, Messages):
read the body, name a bad field, find the model, and stop the work when the client goes away."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from fastapi import Request
from pydantic import ValidationError

from memagent.serve.guard import check_unicode
from memagent.serve.protocol import APIError

DISCONNECT_POLL_S = 0.5  # how often a waiting request checks that its client is still there


def validation_message(exc: ValidationError) -> tuple[str, str | None]:
    """(``field.path: what is wrong``, the top-level field) of a request model's first error."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{'.'.join(loc) or 'body'}: {msg}", (loc[0] if loc else None)


def load_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 naming what is wrong with it (not UTF-8, not JSON, too deep)."""
    try:
        body = json.loads(raw.decode("utf-8", errors="surrogatepass"))
    except UnicodeDecodeError as exc:
        raise APIError(400, f"request body is not UTF-8 (byte {exc.start})", code="invalid_body") from None
    except json.JSONDecodeError as exc:
        raise APIError(400, f"request body is not JSON: {exc}", code="invalid_body") from None
    except RecursionError:
        raise APIError(400, "request body nested too deeply", code="invalid_body") from None
    if not isinstance(body, dict):
        raise APIError(400, f"request body must be a JSON object, got {type(body).__name__}", code="invalid_body")
    check_unicode(body)
    return body


async def unless_disconnected(request: Request, work: Any) -> Any:
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


def unknown_model(name: str, models: Mapping[str, object]) -> APIError:
    return APIError(404, f"The model `{name}` does not exist; this server serves "
                    f"{', '.join(f'`{m}`' for m in models)}.", param="model", code="model_not_found")
