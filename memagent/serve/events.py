"""What a served model yields while it answers (:class:`memagent.serve.chat.ServedModel.events`).

Pieces as they are decoded, any number of times: :class:`ReasoningDelta` (the memagent model's memory
updates), :class:`ContentDelta` (the reply's text) and, when the consumer asked for them,
:class:`ToolCallDelta` (a tool call's OpenAI delta entry); then exactly one :class:`Done` with the
whole :class:`Reply`. Every surface (Chat Completions, Responses, Messages; whole or streamed) is
written from these events, so the surfaces cannot disagree about a reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memagent.serve.protocol import usage


@dataclass
class Reply:
    """One answer, before it is written as a completion or as chunks."""

    content: str | None
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    tool_calls: list[dict[str, Any]] | None = None
    logprobs: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # top-level extension fields (the memagent trace)
    reasoning: str | None = None  # the memagent model's memory updates
    stop_sequence: str | None = None  # the stop string that ended it (Anthropic's stop_sequence), when one did

    def message(self, reasoning_field: str = "reasoning_content") -> dict[str, Any]:
        """The completion's message; the reasoning (memory updates) under ``reasoning_field`` only."""
        message = {"role": "assistant", "content": self.content, "tool_calls": self.tool_calls}
        if self.reasoning is not None:
            message[reasoning_field] = self.reasoning
        return message

    def usage(self) -> dict[str, int]:
        return usage(self.prompt_tokens, self.completion_tokens)


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """A memory update's note, as the read writes it."""

    text: str


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """The next piece of the reply's text (the text so far is a prefix of the final content)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One OpenAI ``delta.tool_calls`` entry: ``index`` always; ``id``, ``type`` and ``function.name`` on a
    call's first entry; ``function.arguments`` pieces that join to the call's arguments."""

    entry: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Done:
    """The whole reply; the last event."""

    reply: Reply


Event = ReasoningDelta | ContentDelta | ToolCallDelta | Done
