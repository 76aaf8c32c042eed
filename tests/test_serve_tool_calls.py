"""Tool calls through `memagent serve` with a model that writes what the test scripts
(memagent_testing/oracle/scripted_lm.py behind the real hf engine, served on loopback): the expected calls are
the scripted ones, so each test checks the server's reading of them, whole and streamed, through
the openai SDK and openai-agents' default path; cut calls, one call without parallel calls, and
the "required" array's end."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from memagent.engines.config import EngineConfig
from memagent.serve.tools import MAX_PARALLEL_CALLS
from memagent_testing.oracle.scripted_lm import MODEL, scripted_engine
from tests.test_serve_guard import running

pytestmark = pytest.mark.slow  # real servers (tests/conftest.py's rule)

CHAT = "/v1/chat/completions"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}
ARGS = {"city": "Paris", "days": 3}
COMPACT = json.dumps(ARGS, separators=(",", ":"))
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
ANSWER = "It is 21 degrees in Paris."
SCRIPT: dict[str, str] = {}  # the user's key -> the reply; a tool result is answered with ANSWER


def oracle(prompt: str) -> str:
    """The scripted reply: ANSWER after a tool result, else the reply scripted for the user's key."""
    last = prompt.rsplit("<|im_start|>", 2)[-2]
    if last.startswith("tool\n") or "temp_c" in last:
        return ANSWER
    key = re.search(r"#(\w+)", prompt.rsplit("<|im_start|>user\n", 1)[-1])
    return SCRIPT.get(key.group(1), "No script.") if key else "No script."


def ask(key: str, reply: str) -> list[dict[str, str]]:
    SCRIPT[key] = reply
    return [{"role": "user", "content": f"#{key} What is the weather in Paris for 3 days?"}]


@pytest.fixture(scope="module")
def engine():
    # No speculation: one token per step, so a stream's pieces are the decode's steps.
    return scripted_engine(oracle, EngineConfig(engine="hf", model=MODEL, device="cpu", speculate=False),
                           batch_wait_s=0.01)


@pytest.fixture(scope="module")
def url(engine):
    from memagent.serve import create_app

    with running(create_app(engine, close_engine=False)) as url:
        yield url


@pytest.fixture
def client(url):
    from openai import OpenAI

    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


def streamed(client, **kw) -> tuple[str, list[dict], str, int]:
    """(content, calls as a client rebuilds them, finish_reason, argument deltas) of a streamed request."""
    content, calls, finish, arg_deltas = "", {}, None, 0
    for chunk in client.chat.completions.create(model=MODEL, stream=True, **kw):
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": d.id, "name": d.function.name, "arguments": ""})
                assert d.id is None or d.id == call["id"]
                call["arguments"] += d.function.arguments or ""
                arg_deltas += bool(d.function.arguments)
            finish = choice.finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish, arg_deltas


def tokens(engine, text: str) -> int:
    return len(engine.tokenizer.encode(text, add_special_tokens=False))


def test_auto_reads_the_models_tool_call_whole_and_streamed_live(client, engine):
    """tool_choice auto: the call the model writes in its <tool_call> format comes back as tool_calls, whole and as live argument deltas."""
    messages = ask("auto1", CALL)
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == ARGS
    content, calls, finish, arg_deltas = streamed(client, messages=messages, tools=[WEATHER], max_tokens=200)
    assert (content, finish) == ("", "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", ARGS)]
    # Live: one piece per decoded token of the arguments (collected, 16-character pieces would be 2).
    assert arg_deltas >= tokens(engine, json.dumps(ARGS)) - 1
    messages = ask("auto2", ANSWER)  # the model answers in text: no call
    r = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=200)
    assert (r.choices[0].message.content, r.choices[0].message.tool_calls) == (ANSWER, None)


@pytest.mark.parametrize("mode", ["auto", "named", "required"])
def test_a_call_cut_by_max_tokens_is_a_partial_call_with_length(client, engine, mode):
    """A call cut by max_tokens ends finish_reason "length" with the call's partial arguments in tool_calls, no wrapper in content, whole and streamed."""
    choice, reply, full = {
        "auto": ("auto", CALL, json.dumps(ARGS)),
        "named": ({"type": "function", "function": {"name": "get_weather"}}, COMPACT, COMPACT),
        "required": ("required", json.dumps([{"name": "get_weather", "arguments": ARGS}], separators=(",", ":")),
                     COMPACT)}[mode]
    cut = tokens(engine, reply[:reply.index('"Paris"') + 3])  # inside the city's value
    kw = {"messages": ask(f"cut{mode}", reply), "tools": [WEATHER], "tool_choice": choice, "max_tokens": cut,
          "temperature": 0}  # greedy: the whole and the streamed request decode the same tokens
    r = client.chat.completions.create(model=MODEL, **kw)
    m = r.choices[0].message
    assert r.choices[0].finish_reason == "length" and m.content is None
    [call] = m.tool_calls
    assert call.function.name == "get_weather"
    assert full.startswith(call.function.arguments) and '"city"' in call.function.arguments
    assert len(call.function.arguments) < len(full)
    content, calls, finish, _ = streamed(client, **kw)
    assert (content, finish) == ("", "length")
    assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", call.function.arguments)]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_cut_call_on_messages_and_responses_is_their_partial_call_never_a_500(url, engine, stream):
    """A call cut by max_tokens is, through the anthropic SDK, a tool_use holding the arguments decoded so far
    with stop_reason max_tokens, and, through the openai SDK's Responses, an incomplete response whose
    function_call holds them: never a 500 or an error event."""
    from anthropic import Anthropic
    from openai import OpenAI

    cut = tokens(engine, COMPACT[:COMPACT.index('"Paris"') + 3])  # inside the city's value
    fn = WEATHER["function"]
    kw = {"model": MODEL, "max_tokens": cut, "messages": ask(f"cutm{stream}", COMPACT),
          "tools": [{"name": fn["name"], "description": fn["description"], "input_schema": fn["parameters"]}],
          "tool_choice": {"type": "tool", "name": "get_weather"}}
    claude = Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    if stream:
        with claude.messages.stream(**kw) as s:
            m = s.get_final_message()
    else:
        m = claude.messages.create(**kw)
    assert m.stop_reason == "max_tokens" and [b.type for b in m.content] == ["tool_use"]
    [(key, city)] = m.content[0].input.items()  # cut inside the city's value: what was decoded of it
    assert m.content[0].name == "get_weather" and key == "city" and "Paris".startswith(city)
    oai = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    rkw = {"model": MODEL, "input": ask(f"cutr{stream}", COMPACT)[0]["content"], "max_output_tokens": cut,
           "temperature": 0, "tools": [{"type": "function", **fn}],
           "tool_choice": {"type": "function", "name": "get_weather"}}
    if stream:
        events = list(oai.responses.create(stream=True, **rkw))
        assert not [e for e in events if e.type == "error"]
        r = events[-1].response
    else:
        r = oai.responses.create(**rkw)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    [call] = r.output
    assert call.type == "function_call" and COMPACT.startswith(call.arguments) and '"city"' in call.arguments


def test_parallel_tool_calls_false_gives_exactly_one_call(client, engine):
    """With parallel_tool_calls false one call comes back: auto stops decoding at the first call's end, required decodes one object."""
    two = CALL + "\n" + CALL.replace("Paris", "Rome")
    r = client.chat.completions.create(model=MODEL, messages=ask("par1", two), tools=[WEATHER], max_tokens=200,
                                       parallel_tool_calls=False)
    [call] = r.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == ARGS and r.choices[0].finish_reason == "tool_calls"
    assert r.usage.completion_tokens < tokens(engine, two)  # the decode ended at </tool_call>
    r = client.chat.completions.create(model=MODEL, messages=ask("par2", json.dumps(
        {"name": "get_weather", "arguments": ARGS}, separators=(",", ":"))), tools=[WEATHER],
        tool_choice="required", parallel_tool_calls=False, max_tokens=200)
    [call] = r.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == ARGS


def test_required_array_ends_at_the_call_limit(client):
    """"required" with a model that would call on and on ends after MAX_PARALLEL_CALLS calls, finish_reason tool_calls."""
    many = json.dumps([{"name": "get_weather", "arguments": ARGS}] * (MAX_PARALLEL_CALLS + 4), separators=(",", ":"))
    r = client.chat.completions.create(model=MODEL, messages=ask("many", many), tools=[WEATHER],
                                       tool_choice="required", max_tokens=1000)
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and len(calls) == MAX_PARALLEL_CALLS
    assert all(json.loads(c.function.arguments) == ARGS for c in calls)


def test_openai_agents_default_path_calls_the_tool_and_answers(url):
    """openai-agents' default path (Responses API) runs the tool the model calls with "auto" and returns the model's answer."""
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    seen = []

    @agents.function_tool
    def get_weather(city: str, days: int) -> str:
        """Weather of a city."""
        seen.append((city, days))
        return json.dumps({"temp_c": 21})

    agents.set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    SCRIPT["agent"] = CALL
    agent = agents.Agent(name="weather", instructions="Answer about weather.", tools=[get_weather],
                         model=agents.OpenAIResponsesModel(MODEL, client))
    result = agents.Runner.run_sync(agent, "#agent What is the weather in Paris for 3 days?")
    assert seen == [("Paris", 3)] and result.final_output == ANSWER


def test_a_bad_tool_name_is_a_400(url):
    """A tool name outside OpenAI's pattern is a 400 naming the tool (special-token literals:
    tests/test_serve_special_tokens.py)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "get weather"}}]}
    r = httpx.post(url + CHAT, json=body, timeout=30)
    assert r.status_code == 400 and "get weather" in r.json()["error"]["message"]
