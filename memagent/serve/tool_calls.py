"""Tool calls read out of a reply as it is decoded (vLLM's tool-call parser, run incrementally).

:class:`CallStream` is fed the reply's text so far (each time a longer prefix of it) and answers
what a stream sends next: a ``ContentDelta`` for text outside calls, and ``ToolCallDelta`` s
(:mod:`memagent.serve.events`) with OpenAI's tool-call delta entries: ``{"index", "id", "type", "function": {"name", "arguments": ""}}``
once a call's name is known, then ``{"index", "function": {"arguments": piece}}`` as its arguments
are decoded. :meth:`CallStream.finish` closes the reply: a call cut by ``max_tokens`` keeps its
partial ``arguments``; nothing of the calls' wrapping (``<tool_call>``, the ``{"name": ...}`` object,
the array) is ever content. The whole reply is read by the same code (one feed, then finish), so a
streamed reply and a whole one agree.

The reply's shape depends on the plan's mode (:mod:`memagent.serve.tools`):

- ``auto``: free text in the Hermes format (Qwen, Hermes, SmolLM2): text, and calls written as
  ``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>``; a block that is not such a call
  stays text (as vLLM's ``hermes`` parser leaves it);
- ``named``: the reply is the arguments object itself (decoded under the function's schema);
- ``required``: a JSON array of ``{"name": NAME, "arguments": {...}}`` (under a grammar).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from memagent.engines.stop import held_back
from memagent.serve.events import ContentDelta, Event, ToolCallDelta
from memagent.serve.protocol import call_id

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# A call object's start up to its arguments value (which must have begun: the lookahead).
_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')
_NAMED = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')  # a cut call whose name is whole
_BETWEEN = re.compile(r"[\s\[\],}]*")  # required: what stands between the array's call objects


class _ValueEnd:
    """Where a JSON value ends, read a piece at a time (strings, escapes and nesting followed)."""

    def __init__(self) -> None:
        self.depth, self.in_string, self.escaped, self.started, self.scalar = 0, False, False, False, False

    def scan(self, text: str, start: int) -> int | None:
        """The end (exclusive) of the value once ``text[start:]`` completes it, else None (state kept)."""
        for j in range(start, len(text)):
            ch = text[j]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return j + 1
            elif not self.started:
                self.started = True
                self.in_string = ch == '"'
                self.depth = 1 if ch in "{[" else 0
                self.scalar = ch not in '"{['
            elif self.scalar:
                if ch in ",}] \t\r\n":
                    return j
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return j + 1
        return None


@dataclass
class _Call:
    id: str
    name: str
    arguments: str = ""

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _unquote(name: str) -> str:
    try:
        return json.loads(f'"{name}"')
    except json.JSONDecodeError:  # an escape JSON does not know: the name as written
        return name


def _call_of(block: str) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a whole ``{"name": ..., "arguments": ...}`` block, else None."""
    try:
        value = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", {})
    return value["name"], args if isinstance(args, str) else json.dumps(args)


class CallStream:
    """One reply's tool calls and content, as its text grows (see the module docstring).

    ``mode``: "auto", "named" or "required"; ``name``: the function of "named"; ``parallel``:
    False reads one call only (the decode is also stopped or constrained to one).
    """

    def __init__(self, mode: str, name: str | None = None, parallel: bool = True):
        if mode not in ("auto", "named", "required"):
            raise ValueError(f"tool mode must be auto, named or required, got {mode!r}")
        self.mode, self.parallel = mode, parallel
        self.calls: list[_Call] = []
        self.content: list[str] = []
        self._pending_space = ""  # trailing whitespace (before a call, at the end): content once text follows
        self._pos = 0
        self._value = _ValueEnd()
        self._events: list[Event] = []
        self._state = {"auto": "text", "required": "between", "named": "args"}[mode]
        if mode == "named":
            self._open(name or "")

    # -- feeding -------------------------------------------------------------------------------

    def feed(self, text: str) -> list[Event]:
        """The events that ``text`` (the reply so far; it extends what was fed before) adds."""
        step = {"text": self._text_state, "head": self._head_state, "args": self._args_state,
                "tail": self._tail_state, "between": self._between_state}
        while self._state in step and step[self._state](text):
            pass
        events, self._events = self._events, []
        return events

    def finish(self, text: str, finish_reason: str) -> tuple[list[Event], str | None, list[dict[str, Any]] | None]:
        """After the last :meth:`feed` of the whole ``text``: the events left to send, the reply's
        content (None when it has none) and its tool calls (None when it has none). ``finish_reason``
        "length": a cut call keeps its partial arguments, and a call whose name was not yet decoded,
        or a cut ``<tool_call>`` tag, is left out."""
        fed = self.feed(text)
        rest = text[self._pos:]
        if self._state == "text" and (finish_reason != "length" or not CALL_OPEN.startswith(rest)):
            self._say(rest)
        elif self._state == "head" and finish_reason == "length":
            named = _NAMED.match(text, self._pos)
            if named:  # cut before its arguments began: the call, its arguments empty
                self._open(_unquote(named.group(1)))
        elif self._state == "head" and self.mode == "auto":
            found = _call_of(rest)  # a call the model ended without its closing tag
            if found:
                self._open(found[0])
                self._args(found[1])
            else:
                self._say(CALL_OPEN + rest)
        self._state = "done"
        events, self._events = fed + self._events, []
        content = "".join(self.content) or None
        return events, content, [c.as_openai() for c in self.calls] or None

    # -- states: each consumes what it can and says whether another step may follow -----------

    def _text_state(self, text: str) -> bool:
        at = text.find(CALL_OPEN, self._pos)
        if at < 0:
            end = len(text) - held_back(text[self._pos:], [CALL_OPEN])
            self._say(text[self._pos:end])
            self._pos = end
            return False
        self._say(text[self._pos:at])
        self._pos, self._state = at + len(CALL_OPEN), "head"
        return True

    def _head_state(self, text: str) -> bool:
        if self._enough():
            self._state = "done"
            return False
        m = _HEAD.match(text, self._pos)
        if m:
            self._open(_unquote(m.group(1)))
            self._pos, self._state, self._value = m.end(), "args", _ValueEnd()
            return True
        close = text.find(CALL_CLOSE, self._pos) if self.mode == "auto" else -1
        if close < 0:
            return False
        found = _call_of(text[self._pos:close])  # a call whose keys come in another order
        if found:
            self._open(found[0])
            self._args(found[1])
        else:
            self._say(text[self._pos - len(CALL_OPEN):close + len(CALL_CLOSE)])
        self._pos, self._state = close + len(CALL_CLOSE), "text"
        return True

    def _args_state(self, text: str) -> bool:
        end = self._value.scan(text, self._pos)
        stop = len(text) if end is None else end
        self._args(text[self._pos:stop])
        self._pos = stop
        if end is None:
            return False
        self._state = {"auto": "tail", "required": "between", "named": "done"}[self.mode]
        return True

    def _tail_state(self, text: str) -> bool:
        close = text.find(CALL_CLOSE, self._pos)
        if close < 0:
            return False
        self._pos, self._state = close + len(CALL_CLOSE), "text"
        return True

    def _between_state(self, text: str) -> bool:
        m = _BETWEEN.match(text, self._pos)
        moved = m.end() > self._pos
        self._pos = m.end()
        if self._pos < len(text) and text[self._pos] == "{":
            self._state = "head"
            return True
        return moved and self._pos < len(text)

    # -- output --------------------------------------------------------------------------------

    def _enough(self) -> bool:
        return not self.parallel and len(self.calls) >= 1

    def _open(self, name: str) -> None:
        call = _Call(call_id(), name)
        self.calls.append(call)
        self._events.append(ToolCallDelta({"index": len(self.calls) - 1, "id": call.id, "type": "function",
                                            "function": {"name": name, "arguments": ""}}))

    def _args(self, piece: str) -> None:
        if piece:
            self.calls[-1].arguments += piece
            self._events.append(ToolCallDelta({"index": len(self.calls) - 1, "function": {"arguments": piece}}))

    def _say(self, text: str) -> None:
        if self._enough():  # one call asked for: what follows it is not the reply
            return
        text = self._pending_space + text
        said = text.rstrip()  # trailing whitespace waits: it is content only if text follows it
        self._pending_space = text[len(said):]
        if said:
            self.content.append(said)
            self._events.append(ContentDelta(said))
