"""The perfect reader (records_oracle) behind two engine paths, replying as a constrained server does.

- :class:`OracleEngine`: in process, behind the :class:`~memagent.engines.base.Engine` interface;
- :func:`oracle_app`: an OpenAI-compatible ``/v1/chat/completions`` server (FastAPI) for the real
  :class:`~memagent.engines.openai.OpenAIEngine` over HTTP on loopback.

Both honour the request as a structured-outputs server does: a reply under ``json_schema`` /
``response_format`` is closed at the schema's ``maxItems`` (:func:`constrain`), and a reply over
``max_tokens`` (counted with the served tokenizer) is cut there with finish reason ``length``.
"""

from __future__ import annotations

import json
from typing import Any, Callable

from fastapi import FastAPI, Request

from memagent.engines.base import Completion, Engine, EngineStats, SamplingParams

from memagent_testing.oracle.records_oracle import constrain

ReplyFn = Callable[[str], str]


def respond(reply: str, schema_json: str | None, max_tokens: int, tokenizer: Any) -> tuple[str, str, int]:
    """``(text, finish_reason, completion_tokens)`` of a perfect model's ``reply`` under the request's limits."""
    if schema_json is not None:
        reply = json.dumps(constrain(json.loads(reply), json.loads(schema_json)), ensure_ascii=False)
    ids = tokenizer(reply, add_special_tokens=False)["input_ids"]
    if len(ids) > max_tokens:
        return tokenizer.decode(ids[:max_tokens]), "length", max_tokens
    return reply, "stop", len(ids)


def prompt_text(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages)


class OracleEngine(Engine):
    """A perfect model in process (``reply``: prompt text -> the unconstrained reply); ``calls`` counts chats."""

    def __init__(self, reply: ReplyFn, tokenizer: Any, context_window: int = 65536, name: str = "oracle"):
        self.reply, self.tokenizer, self.context_window, self.name = reply, tokenizer, context_window, name
        self.stats = EngineStats()
        self.calls = 0

    async def chat(self, messages, params: SamplingParams) -> Completion:
        self.calls += 1
        text, finish, n = respond(self.reply(prompt_text(messages)), params.json_schema, params.max_tokens,
                                  self.tokenizer)
        return Completion(text=text, prompt_tokens=0, completion_tokens=n, finish_reason=finish)


def oracle_app(reply: ReplyFn, tokenizer: Any, served: str = "oracle") -> FastAPI:
    """An OpenAI-compatible chat-completions app answering with ``reply`` (see the module docstring)."""
    app = FastAPI()
    app.state.calls = 0

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        app.state.calls += 1
        fmt = body.get("response_format") or {}
        schema = json.dumps(fmt["json_schema"]["schema"]) if fmt.get("type") == "json_schema" else None
        text, finish, n = respond(reply(prompt_text(body["messages"])), schema, int(body["max_tokens"]), tokenizer)
        return {"id": "x", "object": "chat.completion", "model": served, "created": 0,
                "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 0, "completion_tokens": n, "total_tokens": n}}

    return app


def oracle_engine(reply: ReplyFn, tokenizer_dir: str, engine_config: Any = None) -> OracleEngine:
    """Bound with functools.partial: a batch job's ``build_engine`` (it runs inside the Ray actor)."""
    from transformers import AutoTokenizer

    return OracleEngine(reply, AutoTokenizer.from_pretrained(tokenizer_dir))
