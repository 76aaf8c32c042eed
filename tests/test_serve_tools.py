"""Function calling through `memagent serve`, driven by the clients people use: the openai SDK,
instructor (TOOLS and JSON_SCHEMA modes), langchain-openai (``with_structured_output`` both
methods, ``.stream()``) and LangExtract's OpenAI provider. Before: ``tools`` were dropped (200,
prose, ``tool_calls`` null) and a tool round trip was a 400.

Real servers on loopback over the tiny random Llama (SmolLM2's tokenizer and chat template): the
replies are random words, so each test asserts the protocol (a call of the named function whose
arguments parse and validate), never the wording.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from pydantic import BaseModel

from tests.serve_helpers import engine, url  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow  # real servers (tests/conftest.py's rule)

CHAT = "/v1/chat/completions"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                                       "required": ["zone"]}}}


class City(BaseModel):
    """A city and its country."""

    name: str
    country: str
    population: int




@pytest.fixture
def client(url):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def _args(call, tool: dict) -> dict:
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, tool["function"]["parameters"])
    return args


def test_named_and_required_tool_choice_always_call(client):
    """With tool_choice a named function or "required", the reply is tool_calls whose arguments validate."""
    messages = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
    for seed in range(3):
        r = client.chat.completions.create(model="tiny-llama", messages=messages, tools=[WEATHER, TIME], seed=seed,
                                           tool_choice={"type": "function", "function": {"name": "get_time"}},
                                           max_tokens=256)
        (call,) = r.choices[0].message.tool_calls
        assert call.type == "function" and call.function.name == "get_time" and call.id
        _args(call, TIME)
        r = client.chat.completions.create(model="tiny-llama", messages=messages, tools=[WEATHER, TIME], seed=seed,
                                           tool_choice="required", max_tokens=512)
        assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content is None
        for call in r.choices[0].message.tool_calls:
            _args(call, {"get_weather": WEATHER, "get_time": TIME}[call.function.name])


def test_auto_is_a_call_or_text_and_none_ignores_tools(client):
    """tool_choice "auto" shows the tools and answers a valid call or text that never holds a call's wrapping; "none" answers text without them."""
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    for seed in range(2):
        for max_tokens in (128, 5):  # whole, and cut short
            r = client.chat.completions.create(model="tiny-llama", messages=messages, tools=[WEATHER], seed=seed,
                                               tool_choice="auto", max_tokens=max_tokens)
            m = r.choices[0].message
            assert m.tool_calls or "<tool_call>" not in (m.content or ""), m
            if m.tool_calls and r.choices[0].finish_reason != "length":
                _args(m.tool_calls[0], WEATHER)
    shown = r.usage.prompt_tokens
    r = client.chat.completions.create(model="tiny-llama", messages=messages, tools=[WEATHER], tool_choice="none",
                                       max_tokens=8)
    assert r.choices[0].message.tool_calls is None and isinstance(r.choices[0].message.content, str)
    assert r.usage.prompt_tokens < shown  # "auto" shows the model its tools, "none" leaves them out


def test_parallel_tool_calls_false_and_required_end(client):
    """Random models: parallel_tool_calls false gives exactly one call; "required" ends (finish tool_calls) within the call limit."""
    from memagent.serve.tools import MAX_PARALLEL_CALLS

    messages = [{"role": "user", "content": "Weather in Paris and time in CET?"}]
    for seed in range(3):
        r = client.chat.completions.create(model="tiny-llama", messages=messages, tools=[WEATHER, TIME], seed=seed,
                                           tool_choice="required", parallel_tool_calls=False, max_tokens=512)
        assert len(r.choices[0].message.tool_calls) == 1 and r.choices[0].finish_reason == "tool_calls"
        r = client.chat.completions.create(model="tiny-llama", messages=messages, tools=[WEATHER, TIME], seed=seed,
                                           tool_choice="required", max_tokens=1024)
        assert r.choices[0].finish_reason == "tool_calls"
        assert 1 <= len(r.choices[0].message.tool_calls) <= MAX_PARALLEL_CALLS


def test_tool_round_trip_is_accepted(client):
    """An assistant message with content null and tool_calls, then a tool message, is answered (was a 400)."""
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Paris", "days": 1}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'}]
    r = client.chat.completions.create(model="tiny-llama", messages=messages, tools=[WEATHER], max_tokens=8,
                                       tool_choice="none")
    assert r.choices[0].message.role == "assistant" and r.usage.prompt_tokens > 0


def test_streamed_tool_call_deltas_rebuild_the_call(client):
    """Streamed, the tool call arrives as OpenAI sends it: id and name first, then argument pieces that join to JSON."""
    stream = client.chat.completions.create(model="tiny-llama", tools=[WEATHER], tool_choice="required", stream=True,
                                            messages=[{"role": "user", "content": "Weather?"}], max_tokens=256)
    calls: dict[int, dict] = {}  # index -> id, name, arguments, as a client rebuilds them
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"ids": [], "names": [], "args": ""})
                call["ids"] += [d.id] if d.id else []
                call["names"] += [d.function.name] if d.function and d.function.name else []
                call["args"] += (d.function.arguments or "") if d.function else ""
            finish = choice.finish_reason or finish
    assert calls and sorted(calls) == list(range(len(calls))) and finish == "tool_calls"
    for call in calls.values():
        assert call["names"] == ["get_weather"] and len(call["ids"]) == 1
        jsonschema.validate(json.loads(call["args"]), WEATHER["function"]["parameters"])


def test_tool_errors_are_openai_shaped(url):
    """A named function that is not among the tools, or a recursive parameter schema, is a 400 naming it."""
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER],
            "tool_choice": {"type": "function", "function": {"name": "nope"}}}
    r = httpx.post(url + CHAT, json=body, timeout=30)
    assert r.status_code == 400 and "nope" in r.json()["error"]["message"] and r.json()["error"]["param"] == "tool_choice"
    loop = {"type": "object", "properties": {"x": {"$ref": "#"}}}
    body = {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": loop}}]}
    r = httpx.post(url + CHAT, json=body, timeout=30)
    assert r.status_code == 400 and "recursive $ref" in r.json()["error"]["message"]


def test_instructor_tools_and_json_schema_modes(url):
    """instructor's default mode (TOOLS) and JSON_SCHEMA both return a validated model on the first attempt."""
    import instructor
    from openai import OpenAI

    raw = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(raw, mode=mode)
        city = client.chat.completions.create(model="tiny-llama", response_model=City, max_retries=0, max_tokens=1024,
                                              messages=[{"role": "user", "content": "Paris"}])
        assert isinstance(city, City), mode


def test_langchain_structured_output_both_methods_and_stream(url):
    """langchain-openai's with_structured_output (function_calling, json_schema) returns the model; .stream() yields chunks."""
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="tiny-llama", base_url=f"{url}/v1", api_key="unused", max_retries=0, max_tokens=1024,
                     timeout=120)
    for method in ("function_calling", "json_schema"):
        city = llm.with_structured_output(City, method=method).invoke("Paris")
        assert isinstance(city, City), method
    chunks = list(llm.bind(max_tokens=8).stream("Say hi"))
    assert len(chunks) >= 2 and all(isinstance(c.content, str) for c in chunks)


@pytest.mark.filterwarnings("ignore:'use_schema_constraints' is ignored")
def test_langextract_openai_provider(url):
    """LangExtract's OpenAI provider gets JSON it parses into an annotated document."""
    import langextract as lx
    from langextract.providers.openai import OpenAILanguageModel

    examples = [lx.data.ExampleData(text="Alice met Bob.", extractions=[
        lx.data.Extraction(extraction_class="person", extraction_text="Alice")])]
    model = OpenAILanguageModel(model_id="tiny-llama", api_key="unused", base_url=f"{url}/v1", max_workers=1)
    doc = lx.extract(  # with a model given, LangExtract asks for JSON mode (response_format json_object)
        "Carol met Dave in Rome.", prompt_description="Extract people.", examples=examples,
                     model=model, show_progress=False, max_char_buffer=200)
    assert doc.text == "Carol met Dave in Rome." and isinstance(doc.extractions, list)
