"""A literal holding special-token text (``<|im_end|>``, ``<|endoftext|>``, added vocabulary) in any
grammar: the reply still parses (memagent/engines/grammar.py masks special tokens inside values), or,
on an engine whose grammar cannot guarantee it, the request is a 400 naming the literal's JSON path.

Before: the grammar offered the special token as the literal's spelling, so a schema with ``const:
"x<|im_end|>"`` answered 200 with content ``{"a":"x`` (decoding stopped at the token).
The first tests walk the grammar with an adversary that takes a special token whenever one is allowed
(the worst a model can do); the server tests go through every surface, ``memagent`` included.
"""

from __future__ import annotations

import json
import random
import re
import string

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent.engines.grammar import added_token_ids, make_constraint
from tests.serve_helpers import engine  # noqa: F401 (fixture)
from tests.test_serve_guard import running

TEXT = st.text(alphabet=string.ascii_letters + " -_<|>.", max_size=6)
MAX_STEPS = 400


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def literals(tokenizer) -> st.SearchStrategy[str]:
    """Text around one or two of the tokenizer's special tokens or added vocabulary."""
    added = sorted(t.content for t in tokenizer.added_tokens_decoder.values())
    token = st.sampled_from(added)
    return st.tuples(TEXT, token, TEXT, st.one_of(st.just(""), token)).map("".join)


def schema_with(literal: str, where: str) -> dict:
    """A one-field object schema whose grammar must write ``literal`` at ``where``."""
    if where == "property":
        return {"type": "object", "properties": {literal: {"type": "boolean"}}, "required": [literal]}
    field = {"const": {"const": literal}, "enum": {"enum": [literal, literal + "!"]},
             "pattern": {"type": "string", "pattern": f"^{re.escape(literal)}$"}}[where]
    return {"type": "object", "properties": {"a": field}, "required": ["a"]}


def adversary(schema: dict, tokenizer, seed: int) -> list[int]:
    """The tokens of a reply decoded under ``schema`` by a model that takes a special token whenever the
    mask allows one (else a random allowed token), until the grammar ends the value."""
    specials = set(added_token_ids(tokenizer))
    c, rng, out = make_constraint(json.dumps(schema), tokenizer, len(tokenizer)), random.Random(seed), []
    for _ in range(MAX_STEPS):
        allowed = c.allowed().nonzero().flatten().tolist()
        assert allowed, f"the mask allows nothing after {tokenizer.decode(out)!r}"
        worst = [t for t in allowed if t in specials]
        token = worst[0] if worst else rng.choice(allowed)
        assert c.accept(token)
        out.append(token)
        if c.is_finished():
            return out
    raise AssertionError(f"no complete value in {MAX_STEPS} tokens: {tokenizer.decode(out)!r}")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), where=st.sampled_from(["const", "enum", "pattern", "property"]), seed=st.integers(0, 99))
def test_a_special_token_literal_is_written_as_text_and_parses(tokenizer, data, where, seed):
    """Whatever special tokens a literal holds, the grammar never lets one be decoded: the reply's text parses
    and validates, and its tokens hold no special or added token."""
    literal = data.draw(literals(tokenizer))
    schema = schema_with(literal, where)
    tokens = adversary(schema, tokenizer, seed)
    assert not set(tokens) & set(added_token_ids(tokenizer))
    jsonschema.validate(json.loads(tokenizer.decode(tokens, skip_special_tokens=True)), schema)


def test_eos_still_ends_a_complete_value(tokenizer):
    """EOS (a special token too) is refused inside a value and accepted once the value is complete."""
    c = make_constraint(json.dumps(schema_with("<|im_end|>", "const")), tokenizer, len(tokenizer))
    eos = tokenizer.eos_token_id
    for token in tokenizer('{"a":"<|im_end|>"}', add_special_tokens=False, split_special_tokens=True)["input_ids"]:
        assert not c.allowed()[eos] and not c.accept(eos)
        assert c.accept(token)
    assert c.is_finished()


# -- every surface of `memagent serve` (real servers: slow) --------------------------------------------------


@pytest.fixture(scope="module")
def url(engine):  # noqa: F811 - the memagent model reads with budgets that fit the tiny model's window
    from memagent.config import AgentConfig
    from memagent.serve import create_app

    agent = AgentConfig(chunk_tokens=200, memory_tokens=48, answer_tokens=64, query_tokens=64)
    with running(create_app(engine, close_engine=False, agent=agent)) as url:
        yield url


LITERAL = "x<|im_end|><|endoftext|>"
SCHEMA = {"type": "object", "properties": {"a": {"const": LITERAL}}, "required": ["a"], "additionalProperties": False}
USER = [{"role": "user", "content": "Fill it in."}]
TOOL = {"name": "pick", "description": "Pick one", "parameters": {
    "type": "object", "properties": {"<|im_start|>k": {"enum": [LITERAL, "y<|im_end|>"]}},
    "required": ["<|im_start|>k"]}}


def surface_replies(url: str) -> dict[str, object]:
    """The parsed reply of one request per surface whose grammar writes a special-token literal."""
    chat = f"{url}/v1/chat/completions"
    rf = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}
    out: dict[str, object] = {}
    for model in ("tiny-llama", "memagent"):
        r = httpx.post(chat, json={"model": model, "messages": USER, "response_format": rf, "max_tokens": 64},
                       timeout=120)
        out[f"chat {model}"] = r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else r
    r = httpx.post(chat, json={"model": "tiny-llama", "messages": USER, "max_tokens": 64, "tool_choice": "required",
                               "tools": [{"type": "function", "function": TOOL}]}, timeout=120)
    out["chat tools"] = r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] \
        if r.status_code == 200 else r
    r = httpx.post(f"{url}/v1/responses", json={"model": "tiny-llama", "input": "Fill it in.", "max_output_tokens": 64,
                                                "text": {"format": {"type": "json_schema", "name": "s",
                                                                    "schema": SCHEMA}}}, timeout=120)
    out["responses"] = r.json()["output"][-1]["content"][0]["text"] if r.status_code == 200 else r
    anthropic_tool = {"name": TOOL["name"], "input_schema": TOOL["parameters"]}
    r = httpx.post(f"{url}/v1/messages", json={"model": "tiny-llama", "max_tokens": 64, "messages": USER,
                                               "tools": [anthropic_tool],
                                               "tool_choice": {"type": "tool", "name": "pick"}}, timeout=120)
    out["messages"] = json.dumps(r.json()["content"][-1]["input"]) if r.status_code == 200 else r
    return out


@pytest.mark.slow
def test_every_surface_writes_a_special_token_literal_and_parses(url):
    """On an engine that masks special tokens, every surface's constrained reply holds the literal as text and
    parses: response_format (chat, memagent's extraction), tools' enums and property names, text.format,
    Messages' tool input."""
    for surface, reply in surface_replies(url).items():
        assert isinstance(reply, str), f"{surface}: {reply.status_code} {reply.text[:300]}"
        value = json.loads(reply)
        if "tool" in surface or surface == "messages":
            assert value["<|im_start|>k"] in (LITERAL, "y<|im_end|>"), surface
        else:
            assert value == {"a": LITERAL}, surface


@pytest.mark.slow
def test_an_engine_that_cannot_mask_refuses_naming_the_path(url, engine, monkeypatch):
    """On an engine whose grammar cannot keep special tokens out, every such request is a 400 naming the
    literal's JSON path, before any decoding."""
    monkeypatch.setattr(engine, "masks_special_tokens", False)
    paths = {"chat tiny-llama": "response_format.json_schema.schema.properties.a.const",
             "chat memagent": "response_format.json_schema.schema.properties.a.const",
             "chat tools": "tools.0.function.parameters.properties.<|im_start|>k",
             "responses": "text.format.schema.properties.a.const",
             "messages": "tools.0.input_schema.properties.<|im_start|>k"}
    for surface, reply in surface_replies(url).items():
        assert isinstance(reply, httpx.Response) and reply.status_code == 400, surface
        body = reply.json()
        message = body["error"]["message"]
        assert message.startswith(paths[surface] + ":") and "special token" in message, (surface, message)
