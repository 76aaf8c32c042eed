"""What a served model yields while it answers (:class:`memagent.serve.chat.ServedModel.events`).

Pieces as they are decoded, any number of times: :class:`ReasoningDelta` (the memagent model's memory
updates), :class:`ContentDelta` (the reply's text) and, when the consumer asked for them,
:class:`ToolCallDelta` (a tool call's OpenAI delta entry); then exactly one :class:`Done` with the
whole :class:`~memagent.serve.chat.Reply`. Every surface (Chat Completions, Responses, Messages; whole
or streamed) is written from these events, so the surfaces cannot disagree about a reply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memagent.serve.chat import Reply


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """A memory update's note, as the chain writes it."""

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
