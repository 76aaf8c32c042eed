"""Function calling: the tools in the prompt, a grammar from their parameter schemas, the reply as ``tool_calls``.

The model answers in JSON under a grammar built from the tools' schemas (the same
``SamplingParams.json_schema`` path ``response_format`` takes, so every engine constrains it):

- ``tool_choice`` a named function: one object ``{"name": NAME, "arguments": {...}}``;
- ``"required"``: an array of one or more such objects, each of any tool (parallel calls);
- ``"auto"`` (the default with tools): either such an object or ``{"content": TEXT}``, a plain reply;
  the model chooses;
- ``"none"``: the tools are left out of the prompt and nothing is constrained.

Earlier calls in the conversation (assistant ``tool_calls``) are shown to the model in the same
JSON, and ``tool`` messages keep their role, so the chat template renders a round trip as the
model will continue it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from memagent.serve.guard import check_schema
from memagent.serve.protocol import APIError, ChatMessage, ChatRequest, NamedToolChoice, Tool, call_id

MAX_TEXT_CHARS = 64 * 1024  # the "auto" text branch: max_tokens bounds it first


@dataclass(frozen=True)
class ToolPlan:
    """How one request uses its tools: ``mode`` is "named", "required" or "auto"."""

    mode: str
    tools: list[Tool]
    schema: dict[str, Any]


def plan(req: ChatRequest) -> ToolPlan | None:
    """The request's tool plan, or None when it decodes without tools (none given, or "none")."""
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
    defs = {f"tool{i}": _parameters(t, i) for i, t in enumerate(req.tools)}
    calls = [_call_schema(t.function.name, i) for i, t in enumerate(req.tools)]
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise APIError(400, f"tool_choice names function {choice.function.name!r}, which is not in tools "
                           f"({', '.join(names)})", param="tool_choice")
        root = calls[names.index(choice.function.name)]
        return ToolPlan("named", req.tools, {**root, "$defs": defs})
    if choice == "required":
        return ToolPlan("required", req.tools, {"type": "array", "minItems": 1, "items": {"anyOf": calls},
                                                "$defs": defs})
    text = {"type": "object", "properties": {"content": {"type": "string", "maxLength": MAX_TEXT_CHARS}},
            "required": ["content"]}
    return ToolPlan("auto", req.tools, {"anyOf": [*calls, text], "$defs": defs})


def _parameters(tool: Tool, i: int) -> dict[str, Any]:
    """The function's parameter schema, checked, its ``$ref`` s re-rooted under ``#/$defs/tool{i}``."""
    params = tool.function.parameters or {"type": "object", "properties": {}}
    params = check_schema(params, f"tools.{i}.function.parameters", param="tools")
    params.setdefault("type", "object")
    stack: list[Any] = [params]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                node["$ref"] = f"#/$defs/tool{i}" + node["$ref"][1:]
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return params


def _call_schema(name: str, i: int) -> dict[str, Any]:
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": {"$ref": f"#/$defs/tool{i}"}},
            "required": ["name", "arguments"]}


def system_prompt(tools: list[Tool], mode: str) -> str:
    """The instruction that tells the model its functions and the JSON it answers in."""
    listed = json.dumps([{"name": t.function.name, "description": t.function.description or "",
                          "parameters": t.function.parameters} for t in tools])
    how = {"named": 'Call the function: reply with JSON {"name": NAME, "arguments": {...}}.',
           "required": 'Call one or more functions: reply with a JSON array of {"name": NAME, "arguments": {...}}.',
           "auto": 'To call a function, reply with JSON {"name": NAME, "arguments": {...}}; to answer without '
                   'one, reply with JSON {"content": YOUR ANSWER}.'}[mode]
    return f"You have these functions:\n{listed}\n{how}"


def render_messages(messages: list[ChatMessage], tool_plan: ToolPlan | None) -> list[dict[str, str]]:
    """The conversation as chat-template messages: developer as system, earlier calls as their JSON,
    and the tools' instruction in the system message."""
    out = []
    for m in messages:
        text = m.text()
        if m.tool_calls:
            calls = [{"name": c.function.name, "arguments": _arguments(c.function.arguments)} for c in m.tool_calls]
            shown = json.dumps(calls[0] if len(calls) == 1 else calls)
            text = f"{text}\n{shown}" if text else shown
        out.append({"role": "system" if m.role == "developer" else m.role, "content": text})
    if tool_plan is not None:
        prompt = system_prompt(tool_plan.tools, tool_plan.mode)
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


def parse_reply(text: str, tool_plan: ToolPlan) -> tuple[str | None, list[dict[str, Any]] | None]:
    """(content, tool_calls) of a reply decoded under the plan's grammar; a reply cut short (not
    JSON) stays text."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text, None
    if isinstance(value, dict) and "content" in value and "name" not in value:
        return str(value["content"]), None
    calls = value if isinstance(value, list) else [value]
    if not all(isinstance(c, dict) and "name" in c for c in calls):
        return text, None
    return None, [{"id": call_id(), "type": "function",
                   "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}))}} for c in calls]
