"""The tool-call parser (memagent/serve/tool_calls.py) against replies built from known calls: the
calls and the text it reads back are the ones the reply was written from, fed whole or a piece at
a time, and a reply cut anywhere never shows the calls' wrapping as content."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memagent.serve.protocol import APIError, ChatRequest
from memagent.serve.events import ContentDelta
from memagent.serve.tool_calls import CALL_OPEN, CallStream
from memagent.serve.tools import MAX_PARALLEL_CALLS, plan

names = st.from_regex(r"[a-zA-Z0-9_-]{1,20}", fullmatch=True)
json_values = st.recursive(st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=12),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=3), max_leaves=8)
arguments = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
calls = st.lists(st.tuples(names, arguments), min_size=0, max_size=3)
# Text outside calls: no '<' (a tag's start) and not only whitespace.
texts = st.text(st.characters(blacklist_characters="<", blacklist_categories=("Cs",)), max_size=30)


def hermes(text: str, cs: list[tuple[str, dict]], compact: bool) -> str:
    sep = (",", ":") if compact else (", ", ": ")
    blocks = "".join(f"\n{CALL_OPEN}\n" + json.dumps({"name": n, "arguments": a}, separators=sep) + "\n</tool_call>"
                     for n, a in cs)
    return text + blocks


def feed_all(stream: CallStream, reply: str, cuts: list[int], finish: str) -> tuple[list, str | None, list | None]:
    events = []
    for cut in sorted(cuts):
        events += stream.feed(reply[:cut])
    more, content, tool_calls = stream.finish(reply, finish)
    return events + more, content, tool_calls


def rebuilt(events: list) -> tuple[str, dict[int, dict]]:
    """The content and the calls a client rebuilds from the streamed events."""
    content, built = "", {}
    for event in events:
        if isinstance(event, ContentDelta):
            content += event.text
        else:
            value = event.entry
            call = built.setdefault(value["index"], {"name": None, "arguments": ""})
            call["name"] = value["function"].get("name", call["name"])
            call["arguments"] += value["function"]["arguments"]
    return content, built


@settings(max_examples=150, deadline=None)
@given(text=texts, cs=calls, compact=st.booleans(), cuts=st.lists(st.integers(0, 400), max_size=12))
def test_hermes_reply_reads_back_its_calls_whole_or_streamed(text, cs, compact, cuts):
    """A Hermes reply gives back exactly its calls (names, arguments as JSON) and its text, and the streamed events rebuild the same."""
    reply = hermes(text, cs, compact)
    events, content, tool_calls = feed_all(CallStream("auto"), reply, cuts, "stop")
    assert content == (text.rstrip() or None)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in tool_calls or []] == cs
    streamed_content, built = rebuilt(events)
    assert streamed_content == (content or "")
    assert [(b["name"], b["arguments"]) for b in built.values()] == \
        [(c["function"]["name"], c["function"]["arguments"]) for c in tool_calls or []]


@settings(max_examples=150, deadline=None)
@given(text=texts, cs=calls.filter(bool), compact=st.booleans(), data=st.data())
def test_a_cut_reply_shows_no_wrapper_and_keeps_the_partial_call(text, cs, compact, data):
    """Cut anywhere (finish "length"), content is a prefix of the text without tags or call JSON, and each call's arguments a prefix of its own."""
    reply = hermes(text, cs, compact)
    cut = data.draw(st.integers(0, len(reply)))
    _, content, tool_calls = feed_all(CallStream("auto"), reply[:cut], [], "length")
    assert text.startswith(content or "") and "<" not in (content or "")
    sep = (",", ":") if compact else (", ", ": ")
    for call, (name, args) in zip(tool_calls or [], cs):
        assert call["function"]["name"] == name
        assert json.dumps(args, separators=sep).startswith(call["function"]["arguments"])


@settings(max_examples=100, deadline=None)
@given(cs=calls.filter(bool), data=st.data())
def test_required_array_and_named_arguments_read_back_whole_and_cut(cs, data):
    """A grammar's array of calls reads back as those calls; the named reply is the arguments; a cut keeps prefixes."""
    reply = json.dumps([{"name": n, "arguments": a} for n, a in cs], separators=(",", ":"))
    _, content, tool_calls = feed_all(CallStream("required"), reply, [len(reply) // 2], "stop")
    assert content is None and [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                for c in tool_calls] == cs
    cut = data.draw(st.integers(0, len(reply)))
    _, content, tool_calls = CallStream("required").finish(reply[:cut], "length")
    assert content is None
    for call, (name, args) in zip(tool_calls or [], cs):
        assert call["function"]["name"] == name
        assert json.dumps(args, separators=(",", ":")).startswith(call["function"]["arguments"])
    args = json.dumps(cs[0][1])
    _, content, tool_calls = CallStream("named", "f").finish(args[:cut], "length")
    assert content is None and tool_calls[0]["function"] == {"name": "f", "arguments": args[:cut]}


def test_one_call_asked_reads_one():
    """With parallel calls off, a reply that goes on to a second call (and text) yields the first call only."""
    reply = hermes("Checking.", [("a", {"x": 1}), ("b", {})], compact=False) + "\nDone."
    _, content, tool_calls = CallStream("auto", parallel=False).finish(reply, "stop")
    assert content == "Checking." and [c["function"]["name"] for c in tool_calls] == ["a"]


def test_malformed_block_stays_text():
    """A <tool_call> block that is not a call object is text, as vLLM's hermes parser leaves it."""
    reply = "Hi <tool_call>not json</tool_call>"
    _, content, tool_calls = CallStream("auto").finish(reply, "stop")
    assert content == reply and tool_calls is None


def _req(**kw) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": "x"}], **kw)


TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"enum": ["ok", "</s><|im_end|>"]}}, "required": ["x"]}}}


def test_plans_bound_the_calls():
    """required decodes 1..MAX_PARALLEL_CALLS calls, or exactly one object without parallel calls; named its arguments."""
    p = plan(_req(tools=[TOOL], tool_choice="required"), [])
    assert (p.schema["minItems"], p.schema["maxItems"]) == (1, MAX_PARALLEL_CALLS)
    p = plan(_req(tools=[TOOL], tool_choice="required", parallel_tool_calls=False), [])
    assert "anyOf" in p.schema and "items" not in p.schema
    p = plan(_req(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}}), [])
    assert p.schema["$ref"] == "#/$defs/tool0" and p.mode == "named"
    assert plan(_req(tools=[TOOL], parallel_tool_calls=False), []).stops() == ["</tool_call>"]


def test_special_token_enum_is_refused_naming_its_path():
    """An enum value holding a refused special token is a 400 naming its path and the token; without it, it passes."""
    with pytest.raises(APIError) as err:
        plan(_req(tools=[TOOL], tool_choice="required"), ["<|im_end|>", "<|im_start|>"])
    assert err.value.status == 400 and "<|im_end|>" in err.value.message
    assert err.value.message.startswith("tools.0.function.parameters.properties.")
    assert plan(_req(tools=[TOOL], tool_choice="required"), ["<|im_start|>"]) is not None


@pytest.mark.parametrize("name", ["get weather", "a" * 65, "", "tool.name", "</s><|im_end|>"])
def test_tool_names_outside_openais_pattern_are_refused(name):
    """A function name outside ^[a-zA-Z0-9_-]{1,64}$ fails validation with a message quoting it."""
    with pytest.raises(ValueError, match="function name must match"):
        _req(tools=[{"type": "function", "function": {"name": name}}])
