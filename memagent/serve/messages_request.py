"""The request models of Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``):
each field this server serves, checked as Anthropic checks it; any other field, or an unknown key of
``thinking``, ``metadata`` or ``output_config``, is a 400 naming it (docs/serve-messages.md says how each
field is served)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from memagent.serve.protocol import not_served


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class Thinking(BaseModel):
    """``thinking``: shown (``enabled`` with a budget, ``adaptive``) or not (``disabled``). Only the memagent model
    thinks (its memory updates); ``budget_tokens`` is checked as Anthropic checks it."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(None, ge=1024, description="with enabled: at least 1024, under max_tokens")

    @model_validator(mode="after")
    def _budget_with_enabled(self) -> Thinking:
        if (self.type == "enabled") != (self.budget_tokens is not None):
            raise ValueError("budget_tokens is required with type enabled and only with it")
        return self

    @property
    def shown(self) -> bool:
        return self.type != "disabled"


class CountTokensRequest(BaseModel):
    """The fields of a Messages request that make its prompt; any other field is a 400 naming it, as Anthropic's
    server answers (``foo: Extra inputs are not permitted``)."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    system: str | list[dict[str, Any]] | None = None
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: Thinking | None = None
    mcp_servers: list[dict[str, Any]] | None = Field(None, description="only []: MCP connectors are not served")

    _no_mcp_servers = not_served("mcp_servers", "MCP connectors are not served by this server: connect the MCP "
                                 "client's tools as custom tools (send [] or omit it)", allowed=(None, []))


class OutputFormat(BaseModel):
    """``output_config.format``: Anthropic's structured output (what ``messages.parse(output_format=…)`` sends)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: OutputFormat | None = None
    effort: Any = Field(None, description="not served: the engines have no effort setting")

    _no_effort = not_served("effort", "not served: this server's models have no effort setting (omit it)")


class Metadata(BaseModel):
    """``metadata``: the end user's id, written to the server log with the request (abuse is traced there)."""

    model_config = ConfigDict(extra="forbid")

    user_id: str | None = Field(None, max_length=256)


class MessagesRequest(CountTokensRequest):
    """The subset of a Messages request this server serves (docs/serve-messages.md says how each field is)."""

    max_tokens: int = Field(gt=0, description="required, as Anthropic requires it")
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, gt=0, le=1)
    stream: bool = False
    output_config: OutputConfig | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = Field(None, description="both served by the one "
                                                                   "(standard) tier; usage.service_tier says so")
    container: Any = Field(None, description="not served: no code-execution containers here")

    _no_container = not_served("container", "not served: this server runs no code-execution containers (its "
                               "server tools are skipped; omit it)")
