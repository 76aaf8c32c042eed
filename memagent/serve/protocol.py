"""The OpenAI chat protocol as this server reads and writes it: request models, errors, reply bodies.

An unknown request field is a 400 naming it (``foo: Extra inputs are not permitted``), as OpenAI's and
Anthropic's servers answer, never silently dropped; unsupported values of known ones are a 400 in
OpenAI's error shape naming the field. (Inside a message, a tool or a format, extra keys are still
ignored: the SDKs send back what they received, e.g. an assistant message's ``refusal``.)
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class APIError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def payload(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body(self) -> bytes:
        # ensure_ascii: a message quoting client text with a lone surrogate still encodes.
        return json.dumps(self.payload()).encode()

    def response(self) -> JSONResponse:
        return JSONBytes(self.body(), status_code=self.status)


class JSONBytes(JSONResponse):
    """A JSON response of bytes already encoded."""

    def render(self, content: Any) -> bytes:
        return content


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str = "{}"


class ToolCall(BaseModel):
    id: str = Field(default_factory=lambda: call_id())
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            for i, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                if kind != "text":
                    raise ValueError(f"content part {i} is of type {kind!r}: this server's models read text only "
                                     "(no images, audio or files); send parts of type 'text'")
        return value

    @model_validator(mode="after")
    def _content_or_calls(self) -> ChatMessage:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(f"a {self.role} message needs content (only an assistant message with tool_calls "
                             "may have content null)")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
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


def not_served(field: str, why: str, *, allowed: tuple[Any, ...] = (None,)) -> Any:
    """A validator of a request model's ``field`` refusing any value but ``allowed`` with ``why``: a field taken only
    so that a value this server cannot honour is a 400 naming it, never accepted and ignored."""

    def refuse(cls: type, value: Any) -> Any:
        if value not in allowed:
            raise ValueError(why)
        return value

    return field_validator(field)(refuse)


TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule for function names


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    @field_validator("name")
    @classmethod
    def _openai_name(cls, name: str) -> str:
        if not TOOL_NAME.fullmatch(name):
            raise ValueError(f"tool {name[:80]!r}: a function name must match ^[a-zA-Z0-9_-]{{1,64}}$ (letters, "
                             "digits, _ and -, at most 64), as OpenAI requires")
        return name


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class ChatRequest(BaseModel):
    """The subset of the OpenAI chat request the engines support; any other field is a 400 naming it."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, gt=0)
    max_completion_tokens: int | None = Field(None, gt=0)
    temperature: float = Field(1.0, ge=0)  # OpenAI's default
    top_p: float = Field(1.0, gt=0, le=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=0, description="only 0: the engines return chosen-token log-probs")
    n: int = Field(1, ge=1, le=1, description="one choice per request")
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    response_format: ResponseFormat | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def stops(self) -> list[str]:
        """The stop sequences, empty ones dropped."""
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return [s for s in stop if s]


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion_body(model: str, message: dict[str, Any], finish_reason: str, use: dict[str, int],
                    logprobs: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A ``chat.completion`` object of one choice; ``extra`` adds top-level extension fields."""
    return {"id": completion_id(), "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish_reason}],
            "usage": use, **extra}


def chunk(cid: str, model: str, created: int, delta: dict[str, Any] | None, finish_reason: str | None = None,
          use: dict[str, int] | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``delta`` None is the usage-only chunk (empty choices)."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    body: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                            "choices": choices}
    if use is not None or delta is None:
        body["usage"] = use
    return body
