"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) on `memagent serve`,
driven by the `anthropic` SDK (`messages.create` whole, `messages.stream`, tools, `count_tokens`).
Before: both paths were a 404, so Claude Code and Anthropic's clients could not reach the server.

Real servers on loopback over the tiny random Llama: the replies are random words, so each test
asserts the protocol as the SDK parsed it (blocks, events, tool inputs that validate, usage, stop
reasons, errors), never the wording.
"""

from __future__ import annotations

import anthropic
import httpx
import jsonschema
import pytest

from tests.serve_helpers import engine, url  # noqa: F401 (fixtures)
from tests.test_serve_guard import running

pytestmark = pytest.mark.slow  # real servers (tests/conftest.py's rule)

WEATHER = {"name": "get_weather", "description": "Weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                             "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                            "required": ["city", "days"], "additionalProperties": False}}
DOC = " ".join(f"Line {i}: the key of box {i} is {i * 7 % 13}." for i in range(60))
ASK = [{"role": "user", "content": "Weather in Paris for 3 days?"}]


@pytest.fixture
def client(url):
    from anthropic import Anthropic

    return Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)


def test_text_reply_usage_and_max_tokens(client, engine):
    """A text message counts the prompt the chat template renders (system included); cut at max_tokens its
    stop_reason is max_tokens with that many output tokens."""
    m = client.messages.create(model="tiny-llama", max_tokens=12, system=[{"type": "text", "text": "Be brief."}],
                               messages=[{"role": "user", "content": [{"type": "text", "text": "Hello"}]}])
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    prompt = engine.count_chat_tokens([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}])
    assert m.usage.input_tokens == prompt
    assert m.stop_reason in ("end_turn", "max_tokens") and (m.stop_reason == "max_tokens") == (m.usage.output_tokens == 12)
    cut = client.messages.create(model="tiny-llama", max_tokens=1, messages=[{"role": "user", "content": "A story"}])
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 1


def test_stop_sequences_end_the_reply_and_are_named(client):
    """A reply that a stop sequence ended has stop_reason stop_sequence, names which one, and its text holds none;
    one that ended otherwise names none."""
    stops = [" ", "e", "a", "o"]
    seen = set()
    for i in range(3):
        m = client.messages.create(model="tiny-llama", max_tokens=64, stop_sequences=stops,
                                   messages=[{"role": "user", "content": f"Say a few words {i}"}])
        seen.add(m.stop_reason)
        if m.stop_reason == "stop_sequence":
            assert m.stop_sequence in stops and not any(s in m.content[0].text for s in stops)
        else:
            assert m.stop_sequence is None
    assert "stop_sequence" in seen


def test_tools_give_tool_use_blocks_whose_input_validates(client):
    """tool_choice tool and any give tool_use blocks (stop_reason tool_use) whose input validates the tool's
    input_schema; a round trip of tool_use and tool_result blocks is answered; none answers text."""
    m = client.messages.create(model="tiny-llama", max_tokens=256, messages=ASK, tools=[WEATHER],
                               tool_choice={"type": "tool", "name": "get_weather"})
    assert m.content[0].type == "tool_use" and m.content[0].name == "get_weather" and m.stop_reason == "tool_use"
    jsonschema.validate(m.content[0].input, WEATHER["input_schema"])
    m = client.messages.create(model="tiny-llama", max_tokens=256, messages=ASK, tools=[WEATHER],
                               tool_choice={"type": "any"})
    assert m.stop_reason == "tool_use" and all(b.type == "tool_use" for b in m.content)
    for b in m.content:
        jsonschema.validate(b.input, WEATHER["input_schema"])
    turn = [*ASK, {"role": "assistant", "content": [{"type": "text", "text": "Let me look."}, {
                "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "days": 3}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                         {"type": "text", "text": "Thanks, summarise."}]}]
    m = client.messages.create(model="tiny-llama", max_tokens=16, messages=turn, tools=[WEATHER, {
        "type": "web_search_20250305", "name": "web_search"}], tool_choice={"type": "none"})
    assert m.content[0].type == "text" and m.stop_reason in ("end_turn", "max_tokens")


def test_output_config_format_is_honoured(client):
    """messages.parse(output_format=Model) (output_config.format) gets a text block that parses as the model, whole
    and streamed; before, the field was dropped and prose came back."""
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        population: int

    m = client.messages.parse(model="tiny-llama", max_tokens=200, output_format=City,
                              messages=[{"role": "user", "content": "A city, as JSON."}])
    assert isinstance(m.parsed_output, City) and m.stop_reason == "end_turn"
    with client.messages.stream(model="tiny-llama", max_tokens=200, output_format=City,
                                messages=[{"role": "user", "content": "A city, as JSON."}]) as s:
        City.model_validate_json(s.get_final_message().content[0].text)


def test_stream_follows_anthropics_event_sequence(client, url):
    """Streamed, events come as message_start, ping, content blocks, message_delta, message_stop; the text deltas
    spell the final message's text and a streamed tool_use's input validates."""
    with client.messages.stream(model="tiny-llama", max_tokens=24, messages=[{"role": "user", "content": "Hi"}]) as s:
        events = list(s)
        final = s.get_final_message()
    kinds = [e.type for e in events]  # the SDK drops the ping
    assert kinds[:2] == ["message_start", "content_block_start"] and kinds[-2:] == ["message_delta", "message_stop"]
    with httpx.stream("POST", f"{url}/v1/messages", json={"model": "tiny-llama", "max_tokens": 4, "stream": True,
                                                         "messages": ASK}, timeout=60) as r:
        names = [line.removeprefix("event: ") for line in r.iter_lines() if line.startswith("event: ")]
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-1] == "message_stop"
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert final.content[0].text == text and final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens > 0 and final.usage.input_tokens > 0
    with client.messages.stream(model="tiny-llama", max_tokens=256, messages=ASK, tools=[WEATHER],
                                tool_choice={"type": "tool", "name": "get_weather"}) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].type == "tool_use"
    jsonschema.validate(final.content[0].input, WEATHER["input_schema"])


def test_count_tokens_matches_the_prompt_a_message_reads(client, engine):
    """count_tokens equals the chat template's count of the same conversation and the usage.input_tokens of the
    message it would make; tools add their instruction's tokens."""
    system, messages = "Be brief.", [{"role": "user", "content": "Hello there"}]
    counted = client.messages.count_tokens(model="tiny-llama", system=system, messages=messages)
    oracle = engine.count_chat_tokens([{"role": "system", "content": system}, *messages])
    assert counted.input_tokens == oracle
    made = client.messages.create(model="tiny-llama", max_tokens=1, system=system, messages=messages)
    assert made.usage.input_tokens == oracle
    with_tools = client.messages.count_tokens(model="tiny-llama", system=system, messages=messages, tools=[WEATHER])
    assert with_tools.input_tokens > oracle


def test_errors_are_in_anthropics_shape(client, url):
    """A missing max_tokens, an unknown model and an image block answer {"type": "error", "error": {type, message}}
    naming the problem; with a key configured x-api-key is accepted and a wrong one is an authentication_error."""
    import anthropic

    r = httpx.post(f"{url}/v1/messages", json={"model": "tiny-llama", "messages": ASK}, timeout=60)
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error" and "max_tokens" in r.json()["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="claude-9", max_tokens=4, messages=ASK)
    assert err.value.body["error"]["type"] == "not_found_error" and "claude-9" in err.value.body["error"]["message"]
    image = [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": ""}}]}]
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="tiny-llama", max_tokens=4, messages=image)
    assert "messages.0.content.0" in err.value.body["error"]["message"]


def test_x_api_key_is_the_key_on_a_guarded_server(engine, monkeypatch):
    """With --auth-key-env the anthropic SDK's x-api-key header is accepted; a wrong key is a 401 in Anthropic's shape."""
    import anthropic

    from memagent.serve import ServeConfig, create_app

    monkeypatch.setenv("MEMAGENT_TEST_KEY", "s3cret-key")
    config = ServeConfig(auth_key_env="MEMAGENT_TEST_KEY", max_tokens=8)
    with running(create_app(engine, config, close_engine=False)) as url:
        good = anthropic.Anthropic(base_url=url, api_key="s3cret-key", max_retries=0, timeout=60)
        assert good.messages.create(model="tiny-llama", max_tokens=2, messages=ASK).usage.output_tokens >= 1
        bad = anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0, timeout=60)
        with pytest.raises(anthropic.AuthenticationError) as err:
            bad.messages.create(model="tiny-llama", max_tokens=2, messages=ASK)
        assert err.value.body["error"]["type"] == "authentication_error"


def test_memagent_memory_updates_are_a_thinking_block(engine):
    """The memagent model's message starts with a thinking block holding every memory update (thinking omitted or
    enabled); streamed, one thinking_delta per chunk read comes before any text_delta; thinking disabled, no
    thinking block, whole or streamed; thinking asked of the engine's model, which does not think, is a 400."""
    from anthropic import Anthropic

    from memagent.config import AgentConfig
    from memagent.serve import create_app

    agent = AgentConfig(chunk_tokens=200, memory_tokens=48, answer_tokens=12, query_tokens=64)
    with running(create_app(engine, close_engine=False, agent=agent)) as url:
        client = Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=300)
        ask = [{"role": "user", "content": "What is the key of box 5?"}]
        m = client.messages.create(model="memagent", max_tokens=12, system=DOC, messages=ask)
        n = m.model_extra["memagent"]["n_chunks"]
        assert [b.type for b in m.content] == ["thinking", "text"] and n > 1
        assert m.content[0].thinking.count("[memory after chunk") == n
        with client.messages.stream(model="memagent", max_tokens=12, system=DOC, messages=ask) as s:
            deltas = [e.delta.type for e in s if e.type == "content_block_delta"]
        enabled = {"type": "enabled", "budget_tokens": 1024}
        m = client.messages.create(model="memagent", max_tokens=1100, system=DOC, messages=ask, thinking=enabled)
        assert [b.type for b in m.content] == ["thinking", "text"]
        off = {"type": "disabled"}
        assert [b.type for b in client.messages.create(model="memagent", max_tokens=12, system=DOC, messages=ask,
                                                       thinking=off).content] == ["text"]
        with client.messages.stream(model="memagent", max_tokens=12, system=DOC, messages=ask, thinking=off) as s:
            assert {e.content_block.type for e in s if e.type == "content_block_start"} == {"text"}
        with pytest.raises(anthropic.BadRequestError, match="thinking: the model `tiny-llama` does not reason"):
            client.messages.create(model="tiny-llama", max_tokens=1100, messages=ask, thinking=enabled)
    thinking = [i for i, d in enumerate(deltas) if d == "thinking_delta"]
    text = [i for i, d in enumerate(deltas) if d == "text_delta"]
    assert len(thinking) == n and (not text or max(thinking) < min(text))


@pytest.mark.parametrize("fields, error", [
    ({"thinking": {"type": "enabled", "budget_tokens": 1024}, "max_tokens": 1024}, "thinking.budget_tokens: 1024 must "
     "be less than max_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled"}}, "thinking: budget_tokens is required with type enabled"),
    ({"thinking": {"type": "disabled", "budget_tokens": 2048}}, "thinking: .*only with it"),
    ({"output_config": {"effort": "low"}}, "output_config.effort: not served"),
    ({"container": "c1"}, "container: not served"),
    ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers: MCP connectors"),
    ({"metadata": {"user_id": "u", "plan": "pro"}}, "metadata.plan"),
    ({"service_tier": "priority"}, "service_tier:"),
    ({"tools": [WEATHER], "tool_choice": {"type": "auto", "parallel": False}}, "tool_choice.parallel"),
])
def test_fields_that_are_not_served_are_a_400_naming_them(fields, error):
    """A Messages field this server cannot honour as sent is a 400 naming its path, never accepted and ignored."""
    from memagent.serve.handling import validated
    from memagent.serve.messages import check_thinking, to_chat
    from memagent.serve.messages_request import MessagesRequest
    from memagent.serve.protocol import APIError

    body = {"model": "m", "max_tokens": 2048, "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(APIError, match=error) as err:
        req = validated(MessagesRequest, body)
        check_thinking(req, {}, "m")  # as the route checks it, before the translation
        to_chat(req)
    assert err.value.status == 400 and err.value.param == error.split(".")[0].split(":")[0], err.value.param


def test_disable_parallel_tool_use_is_one_call_at_most():
    """``tool_choice.disable_parallel_tool_use`` is the chat's ``parallel_tool_calls: false`` (at most one tool_use)."""
    from memagent.serve.messages import to_chat
    from memagent.serve.messages_request import MessagesRequest

    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    assert to_chat(MessagesRequest(**body)).parallel_tool_calls is None
    for kind in ("auto", "any"):
        choice = {"type": kind, "disable_parallel_tool_use": True}
        assert to_chat(MessagesRequest(**body, tool_choice=choice)).parallel_tool_calls is False


@pytest.mark.parametrize("top_k, temperature", [(1, 0.0), (None, 0.7)])
def test_top_k_one_is_greedy_and_any_other_is_refused_naming_it(top_k, temperature):
    """``top_k: 1`` is served as greedy (``temperature: 0``), no ``top_k`` leaves the temperature as sent, and any
    other ``top_k`` is a 400 naming it: never accepted and ignored."""
    from memagent.serve.messages import to_chat
    from memagent.serve.messages_request import MessagesRequest
    from memagent.serve.protocol import APIError

    body = {"model": "m", "max_tokens": 8, "temperature": 0.7, "messages": [{"role": "user", "content": "hi"}]}
    assert to_chat(MessagesRequest(**body, top_k=top_k)).temperature == temperature
    with pytest.raises(APIError, match="top_k: 5 is not served") as err:
        to_chat(MessagesRequest(**body, top_k=5))
    assert err.value.param == "top_k"
