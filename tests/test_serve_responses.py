"""OpenAI's Responses API (`POST /v1/responses`) on `memagent serve`, driven by the openai SDK
(`responses.create` whole and streamed, `responses.parse`) and the OpenAI Agents SDK on its default
Responses model. Before: `/v1/responses` was a 404, so Codex CLI and the Agents SDK could not reach
the server.

Real servers on loopback over the tiny random Llama: the replies are random words, so each test
asserts the protocol as the client library parsed it (items, events, calls whose arguments
validate, usage), never the wording.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.serve_helpers import engine, url  # noqa: F401 (fixtures)
from tests.test_serve_guard import running

pytestmark = pytest.mark.slow  # real servers (tests/conftest.py's rule)

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                           "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                          "required": ["city", "days"], "additionalProperties": False}}
DOC = " ".join(f"Line {i}: the key of box {i} is {i * 7 % 13}." for i in range(60))


class City(BaseModel):
    """Bounded, and asked greedily, so the random model's reply always closes within 128 tokens (a free string may
    run to 200 characters, more tokens than that)."""

    name: str = Field(max_length=16)
    population: int = Field(ge=0, le=10**9)


@pytest.fixture
def client(url):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def memagent_url(engine):
    from memagent.config import AgentConfig
    from memagent.serve import create_app

    agent = AgentConfig(chunk_tokens=200, memory_tokens=48, answer_tokens=12, query_tokens=64)
    with running(create_app(engine, close_engine=False, agent=agent)) as url:
        yield url


def test_text_reply_and_the_max_output_tokens_cut(client, engine):
    """A text response is one completed message whose usage counts the prompt the chat template renders;
    cut by max_output_tokens it is incomplete with reason max_output_tokens."""
    r = client.responses.create(model="tiny-llama", instructions="Answer briefly.", input="Hello there",
                                max_output_tokens=12, temperature=0)
    assert r.object == "response" and r.output[-1].type == "message" and r.output[-1].role == "assistant"
    prompt = engine.count_chat_tokens([{"role": "system", "content": "Answer briefly."},
                                       {"role": "user", "content": "Hello there"}])
    assert r.usage.input_tokens == prompt and r.usage.total_tokens == prompt + r.usage.output_tokens
    assert r.output_text == r.output[-1].content[0].text
    assert (r.status == "incomplete") == (r.usage.output_tokens == 12)
    cut = client.responses.create(model="tiny-llama", input="Tell me a long story", max_output_tokens=1)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 1


def test_stream_follows_the_documented_event_sequence(client):
    """Streamed, the events come in OpenAI's order with consecutive sequence numbers, and the deltas spell the final text."""
    with client.responses.create(model="tiny-llama", input="Say something", max_output_tokens=24, stream=True) as s:
        got = list(s)
    kinds = [e.type for e in got]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed" if got[-1].response.status == "completed" else "response.incomplete"]
    assert set(kinds[4:-4]) <= {"response.output_text.delta"}
    assert [e.sequence_number for e in got] == list(range(len(got)))
    text = "".join(e.delta for e in got if e.type == "response.output_text.delta")
    assert text == got[-4].text == got[-1].response.output_text


def test_function_tool_calls_validate_whole_and_streamed(client):
    """With a required or named function tool the output is function_call items whose arguments validate; streamed,
    the argument deltas spell the done arguments and the SDK's final response holds the same call."""
    r = client.responses.create(model="tiny-llama", input="Weather in Paris for 3 days?", tools=[WEATHER],
                                tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=256)
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    with client.responses.stream(model="tiny-llama", input="Weather in Rome?", tools=[WEATHER],
                                 tool_choice="required", max_output_tokens=256) as s:
        events = list(s)
        final = s.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done and deltas == "".join(e.arguments for e in done)
    calls = [o for o in final.output if o.type == "function_call"]
    assert [c.arguments for c in calls] == [e.arguments for e in done]
    for c in calls:
        jsonschema.validate(json.loads(c.arguments), WEATHER["parameters"])


def test_round_trip_items_and_skipped_hosted_tools(client):
    """A conversation of message, function_call, function_call_output and reasoning items is answered; a hosted tool
    (web_search) is skipped; an empty input probe gets a response, not an error."""
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
             {"type": "reasoning", "id": "rs_1", "summary": []},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
              "arguments": json.dumps({"city": "Paris", "days": 1})},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 24 C"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
             {"role": "user", "content": "And tomorrow?"}]
    r = client.responses.create(model="tiny-llama", input=items, tools=[WEATHER, {"type": "web_search"}],
                                max_output_tokens=64)
    assert r.status in ("completed", "incomplete") and r.output
    assert all(o.type in ("message", "function_call") for o in r.output)
    probe = client.responses.create(model="tiny-llama", input="", max_output_tokens=1)
    assert probe.usage.output_tokens == 1


def test_text_format_json_schema_parses_into_the_model(client):
    """responses.parse with a Pydantic model gets output_parsed, an instance of it (text.format json_schema); a
    json_object format answers one JSON object."""
    r = client.responses.parse(model="tiny-llama", input="A city?", text_format=City, max_output_tokens=128,
                               temperature=0)
    assert isinstance(r.output_parsed, City)
    r = client.responses.create(model="tiny-llama", input="A JSON object please", max_output_tokens=128,
                                text={"format": {"type": "json_object"}})
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict)


def test_stateless_server_refuses_previous_response_id_in_openai_shape(client, url):
    """previous_response_id is a 400 in OpenAI's error shape naming the field (store false is served); an image part
    is a 400 naming the item."""
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny-llama", input="more", previous_response_id="resp_123", store=False)
    assert err.value.body["param"] == "previous_response_id" and "stateless" in err.value.body["message"]
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]
    r = httpx.post(f"{url}/v1/responses", json={"input": image}, timeout=60)
    assert r.status_code == 400 and "input.0.content.0" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/v1/responses", json={"input": "x", "model": "gpt-9"}, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_agents_sdk_runs_a_function_tool_to_its_final_output(url):
    """The OpenAI Agents SDK on its Responses model calls the agent's function tool with arguments that validate and
    ends with the tool's output (stop_on_first_tool), and an output_type agent ends with an instance of it."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    seen: list[dict] = []

    @function_tool
    def get_weather(city: Annotated[str, Field(max_length=12)]) -> str:
        """Weather of a city."""
        seen.append({"city": city})
        return f"sunny in {city}"

    model = OpenAIResponsesModel("tiny-llama", AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0))
    agent = Agent(name="weather", instructions="Use the tool.", model=model, tools=[get_weather],
                  tool_use_behavior="stop_on_first_tool",
                  model_settings=ModelSettings(tool_choice="required", max_tokens=128, temperature=0))
    typed = Agent(name="cities", instructions="Name a city.", model=model, output_type=City,
                  model_settings=ModelSettings(max_tokens=128, temperature=0))

    async def both():  # one event loop: the client's connections belong to it
        return await Runner.run(agent, "Weather in Paris?", max_turns=2), await Runner.run(typed, "A city?", max_turns=1)

    result, city = asyncio.run(both())
    assert len(seen) >= 1 and isinstance(seen[0]["city"], str)
    assert result.final_output == f"sunny in {seen[0]['city']}"
    assert isinstance(city.final_output, City)


def test_memagent_memory_updates_are_a_reasoning_item(memagent_url):
    """The memagent model's response holds one reasoning item, one summary part per chunk read, before the message
    (reasoning.summary omitted or asked, and echoed); streamed, each update is a reasoning_summary_text delta before
    any output_text delta; a summary asked of the engine's model, which does not reason, is a 400."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{memagent_url}/v1", api_key="unused", max_retries=0, timeout=300)
    r = client.responses.create(model="memagent", instructions=DOC, input="What is the key of box 5?")
    assert r.reasoning.summary is None and r.store is False  # summaries are the memagent model's default
    n = r.model_extra["memagent"]["n_chunks"]
    assert [o.type for o in r.output] == ["reasoning", "message"] and len(r.output[0].summary) == n > 1
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    with client.responses.create(model="memagent", instructions=DOC, input="Key of box 9?", stream=True) as s:
        kinds = [e.type for e in s]
    thinking = [i for i, k in enumerate(kinds) if k == "response.reasoning_summary_text.delta"]
    text = [i for i, k in enumerate(kinds) if k == "response.output_text.delta"]
    assert len(thinking) == n and (not text or max(thinking) < min(text))
    r = client.responses.create(model="memagent", instructions=DOC, input="Key of box 2?", max_output_tokens=8,
                                reasoning={"summary": "detailed"})
    assert r.reasoning.summary == "detailed" and r.output[0].type == "reasoning" and r.output[0].summary
    with pytest.raises(openai.BadRequestError, match="reasoning.summary: the model `tiny-llama` does not reason"):
        client.responses.create(model="tiny-llama", input="Hi", reasoning={"summary": "auto"})


@pytest.mark.parametrize("fields, error", [
    ({"reasoning": {"effort": "low"}}, "reasoning.effort: not served"),
    ({"reasoning": {"summary": "brief"}}, "reasoning.summary"),
    ({"store": True}, "store: .*stores no responses"),
    ({"user": "u" * 257}, "user"),
])
def test_fields_that_are_not_served_are_a_400_naming_them(fields, error):
    """A Responses field this server cannot honour as sent is a 400 naming its path; store false is served (it is
    what the server does)."""
    from memagent.serve.handling import validated
    from memagent.serve.protocol import APIError
    from memagent.serve.responses import to_chat
    from memagent.serve.responses_request import ResponsesRequest

    with pytest.raises(APIError, match=error):
        to_chat(validated(ResponsesRequest, {"model": "m", "input": "hi", **fields}))
    assert to_chat(validated(ResponsesRequest, {"model": "m", "input": "hi", "store": False})).messages
