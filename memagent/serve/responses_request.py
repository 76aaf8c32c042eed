"""The request models of OpenAI's Responses API (``POST /v1/responses``): each field this server serves,
checked as OpenAI checks it; any other field, or an unknown key of ``reasoning``, is a 400 naming it
(docs/serve-responses.md says how each field is served)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from memagent.serve.protocol import not_served


class TextFormat(BaseModel):
    """``text.format``: plain text, any JSON object, or JSON under ``schema``."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    type: Literal["text", "json_schema", "json_object"] = "text"
    name: str = "reply"
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat = Field(default_factory=TextFormat)


class Reasoning(BaseModel):
    """``reasoning``: only the memagent model reasons (its memory updates, each one summary part)."""

    model_config = ConfigDict(extra="forbid")

    effort: Any = None
    summary: Literal["auto", "concise", "detailed"] | None = None

    _no_effort = not_served("effort", "not served: the memagent model reads by its server's agent config (chunk "
                            "and memory tokens), not by effort; omit it")


class ResponsesRequest(BaseModel):
    """The subset of a Responses request this server serves; any other field is a 400 naming it."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str | list[dict[str, Any]] = ""
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, gt=0)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    parallel_tool_calls: bool | None = None
    stream: bool = False
    store: bool | None = Field(None, description="only false: nothing is stored (omitted, the reply says false)")
    previous_response_id: str | None = None
    conversation: str | dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None  # echoed
    reasoning: Reasoning | None = None
    user: str | None = Field(None, max_length=256, description="the end user's id, written to the server log")
    include: list[str] | None = Field(None, max_length=0, description="nothing extra to include: only []")
    truncation: Literal["disabled"] | None = None  # a prompt over the window is a 400, never cut

    _not_stored = not_served("store", "this server stores no responses (it is stateless): send store false or omit "
                             "it", allowed=(None, False))
