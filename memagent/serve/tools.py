"""Function calling: the tools in the prompt, how the reply is decoded, and the reply as ``tool_calls``.

As vLLM serves them (``--enable-auto-tool-choice --tool-call-parser hermes``, and its structured
outputs for the forced choices):

- ``"auto"`` (the default with tools): the model is shown its tools in the Hermes format (Qwen,
  Hermes and SmolLM2 are trained on it) and decodes freely; a call is the text
  ``<tool_call>{"name": NAME, "arguments": {...}}</tool_call>``, which the parser
  (:mod:`memagent.serve.tool_calls`) takes out of the reply, live. Nothing is constrained, so
  a text reply decodes (and speculates) as any other; with ``parallel_tool_calls: false`` the decode
  stops at the first call's closing tag;
- ``tool_choice`` a named function: the reply is that function's arguments, under a grammar of its
  parameter schema (the ``SamplingParams.json_schema`` path ``response_format`` takes, so every
  engine constrains it);
- ``"required"``: a JSON array of 1 to MAX_PARALLEL_CALLS ``{"name": NAME, "arguments": {...}}``
  objects of any tool under a grammar; with ``parallel_tool_calls: false`` exactly one such object;
- ``"none"``: the tools are left out of the prompt and nothing is constrained.

Tool names must match OpenAI's ``^[a-zA-Z0-9_-]{1,64}$`` (:mod:`memagent.serve.protocol`). A
string the grammar would force into the reply (an ``enum`` or ``const`` value, a property name, a
pattern) that holds one of the tokenizer's special tokens (``<|im_end|>``) is written as text by an
engine that masks special tokens (hf), and refused with its path by one that cannot: its grammar
would have the model write the special token, which ends the reply mid-call. In the prompt, the tools'
JSON writes ``<`` as ``\\u003c``, so their text never turns into special tokens there.

Earlier calls in the conversation (assistant ``tool_calls``) are shown to the model in the same
Hermes format, and ``tool`` messages keep their role, so the chat template renders a round trip as
the model will continue it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memagent.json_walk import walk_json
from memagent.serve.guard import check_schema, refuse_special_literals
from memagent.serve.protocol import APIError, ChatMessage, ChatRequest, NamedToolChoice, Tool
from memagent.serve.tool_calls import CALL_CLOSE, CALL_OPEN, CallStream

# "required": at most this many calls in one reply, so that the array ends (a small model repeats
# the same call until max_tokens cuts it: three calls for one question, a fourth cut).
MAX_PARALLEL_CALLS = 8


@dataclass(frozen=True)
class ToolPlan:
    """How one request uses its tools: ``mode`` is "named", "required" or "auto"; ``schema`` the
    grammar of the reply (None for "auto": free text, parsed); ``name`` the function of "named"."""

    mode: str
    tools: list[Tool]
    schema: dict[str, Any] | None
    parallel: bool = True
    name: str | None = None

    def stops(self) -> list[str]:
        """Stop strings the decode needs: one call asked for ends at its closing tag."""
        return [CALL_CLOSE] if self.mode == "auto" and not self.parallel else []

    def reader(self) -> CallStream:
        """A parser of one reply decoded under this plan."""
        return CallStream(self.mode, self.name, self.parallel)


def plan(req: ChatRequest, special_tokens: Sequence[str] = ()) -> ToolPlan | None:
    """The request's tool plan, or None when it decodes without tools (none given, or "none").
    ``special_tokens``: the special-token texts refused in strings the grammar forces (none for an engine
    whose grammar keeps them out)."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none", "auto"):
            raise APIError(400, "tool_choice needs tools: send the functions in `tools`", param="tool_choice")
        return None
    if choice == "none":
        return None
    if req.response_format is not None and req.response_format.type != "text":
        raise APIError(400, "tools and a response_format of json_schema/json_object cannot be combined: the reply "
                       "is either a tool call or the formatted JSON", param="response_format")
    names = [t.function.name for t in req.tools]
    if len(set(names)) != len(names):
        raise APIError(400, f"tools: function names must be unique, got {names}", param="tools")
    parallel = req.parallel_tool_calls is not False
    if choice in (None, "auto"):
        return ToolPlan("auto", req.tools, None, parallel)
    defs = {f"tool{i}": _parameters(t, i, special_tokens) for i, t in enumerate(req.tools)}
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise APIError(400, f"tool_choice names function {choice.function.name!r}, which is not in tools "
                           f"({', '.join(names)})", param="tool_choice")
        i = names.index(choice.function.name)
        return ToolPlan("named", req.tools, {"$ref": f"#/$defs/tool{i}", "$defs": defs}, False, choice.function.name)
    one = {"anyOf": [_call_schema(t.function.name, i) for i, t in enumerate(req.tools)]}
    if not parallel:
        return ToolPlan("required", req.tools, {**one, "$defs": defs}, False)
    return ToolPlan("required", req.tools, {"type": "array", "minItems": 1, "maxItems": MAX_PARALLEL_CALLS,
                                            "items": one, "$defs": defs})


def _parameters(tool: Tool, i: int, special_tokens: Sequence[str]) -> dict[str, Any]:
    """The function's parameter schema, checked, its ``$ref`` s re-rooted under ``#/$defs/tool{i}``."""
    params = tool.function.parameters or {"type": "object", "properties": {}}
    params = check_schema(params, f"tools.{i}.function.parameters", param="tools")
    params.setdefault("type", "object")
    refuse_special_literals(params, list(special_tokens), f"tools.{i}.function.parameters", "tools")
    for _, node in walk_json(params):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            node["$ref"] = f"#/$defs/tool{i}" + node["$ref"][1:]
    return params


def _call_schema(name: str, i: int) -> dict[str, Any]:
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": {"$ref": f"#/$defs/tool{i}"}},
            "required": ["name", "arguments"]}


def _json_for_prompt(value: Any) -> str:
    """JSON whose ``<`` are written ``\\u003c`` (the same value): no special token forms in the prompt."""
    return json.dumps(value).replace("<", "\\u003c")


def system_prompt(tools: list[Tool], mode: str, parallel: bool = True, name: str | None = None) -> str:
    """The instruction that tells the model its functions and how it calls them."""
    listed = "\n".join(_json_for_prompt({"type": "function", "function": {
        "name": t.function.name, "description": t.function.description or "", "parameters": t.function.parameters}})
        for t in tools)
    head = ("You are a function calling AI model. You are provided with function signatures within <tools></tools> "
            f"XML tags:\n<tools>\n{listed}\n</tools>\n")
    if mode == "named":
        return head + f"Call the function {name}: reply with its arguments as a JSON object."
    if mode == "required":
        if not parallel:
            return head + 'Call one function: reply with JSON {"name": NAME, "arguments": {...}}.'
        return head + 'Call one or more functions: reply with a JSON array of {"name": NAME, "arguments": {...}}.'
    many = "one or more functions" if parallel else "at most one function"
    return head + (f"You may call {many} to assist with the user query. For each function call, return a json "
                   "object with function name and arguments within <tool_call></tool_call> XML tags:\n"
                   '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


def render_messages(messages: list[ChatMessage], tool_plan: ToolPlan | None) -> list[dict[str, str]]:
    """The conversation as chat-template messages: developer as system, earlier calls in the Hermes
    format, and the tools' instruction in the system message."""
    out = []
    for m in messages:
        text = m.text()
        if m.tool_calls:
            shown = "\n".join(f"{CALL_OPEN}\n" + _json_for_prompt(
                {"name": c.function.name, "arguments": _arguments(c.function.arguments)}) + f"\n{CALL_CLOSE}"
                for c in m.tool_calls)
            text = f"{text}\n{shown}" if text else shown
        out.append({"role": "system" if m.role == "developer" else m.role, "content": text})
    if tool_plan is not None:
        prompt = system_prompt(tool_plan.tools, tool_plan.mode, tool_plan.parallel, tool_plan.name)
        if out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_reply(text: str, tool_plan: ToolPlan, finish_reason: str = "stop") -> tuple[str | None, list[dict[str, Any]] | None]:
    """(content, tool_calls) of a whole reply decoded under the plan (:class:`CallStream`)."""
    _, content, calls = tool_plan.reader().finish(text, finish_reason)
    return content, calls
