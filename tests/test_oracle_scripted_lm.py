"""The scripted perfect model (memagent_testing/oracle/scripted_lm.py) behind the real hf engine: its replies
come back through the chat template, batching, KV cache, speculation, grammar and max_tokens."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from memagent.engines.base import SamplingParams
from memagent.engines.config import EngineConfig
from memagent_testing.oracle.scripted_lm import MODEL, in_json_string, scripted_engine

SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
USER = "<|im_start|>user\n"
SCRIPT: dict[str, str] = {}  # user message -> the reply the oracle gives
_ids = itertools.count()

# No control characters but newline and tab (the tokenizer drops them) nor unassigned code points
# (it cannot write them back): no model could write those.
texts = st.text(st.characters(exclude_categories=("Cs", "Cc", "Cn"), include_characters="\n\t"), min_size=1, max_size=60)


def oracle(prompt: str) -> str:
    """The reply scripted for the prompt's (last) user message, found by its number."""
    start = prompt.rindex(USER) + len(USER)
    return SCRIPT[prompt[start: prompt.index(" ", start)]]


def ask(message: str, reply: str) -> list[dict[str, str]]:
    """Messages for a fresh prompt (a unique number: the model caches each prompt's reply)."""
    key = f"#{next(_ids)}"
    SCRIPT[key] = reply
    return [{"role": "user", "content": f"{key} {message}"}]


def writable(engine, text: str) -> bool:
    """Whether the tokenizer can write ``text`` at all (it normalises a few characters away)."""
    ids = engine.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
    return engine.tokenizer.decode(ids, skip_special_tokens=True) == text


def run(engine, *chats):
    async def go():
        return await asyncio.gather(*(engine.chat(m, p) for m, p in chats))
    return asyncio.run(go())


@pytest.fixture(scope="module")
def engine():
    e = scripted_engine(oracle, EngineConfig(engine="hf", model=MODEL, device="cpu", speculate=True))
    yield e
    asyncio.run(e.close())


@pytest.fixture(scope="module")
def plain_engine():
    e = scripted_engine(oracle, EngineConfig(engine="hf", model=MODEL, device="cpu", speculate=False))
    yield e
    asyncio.run(e.close())


@SETTINGS
@given(message=texts, reply=texts)
def test_unconstrained_reply_comes_back_exactly(engine, message, reply):
    """Without a schema or a binding max_tokens the engine returns the scripted reply verbatim, finish_reason 'stop'."""
    assume(writable(engine, reply))
    [c] = run(engine, (ask(message, reply), SamplingParams(max_tokens=512)))
    assert (c.text, c.finish_reason) == (reply, "stop")


@SETTINGS
@given(reply=texts, cut=st.integers(1, 40))
def test_max_tokens_cuts_the_reply_with_length(engine, reply, cut):
    """With max_tokens under the reply's token count the text is the reply's first max_tokens tokens, finish_reason 'length'."""
    ids = engine.tokenizer.encode(reply, add_special_tokens=False, split_special_tokens=True)
    cut = min(cut, len(ids))  # the reply's own tokens, its EOS not reached
    [c] = run(engine, (ask("cut", reply), SamplingParams(max_tokens=cut)))
    assert c.finish_reason == "length"
    assert c.token_ids == ids[:cut]
    assert c.text == engine.tokenizer.decode(ids[:cut], skip_special_tokens=True)


ITEM = {"type": "object", "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["name", "n"]}
names = st.text(st.characters(codec="ascii", min_codepoint=32, max_codepoint=126), max_size=12)


@SETTINGS
@given(pairs=st.lists(st.tuples(names, st.integers(-10**6, 10**6)), min_size=4, max_size=10))
def test_grammar_cuts_an_array_at_max_items(engine, pairs):
    """Under a schema with maxItems 3 a scripted array of more items comes back as valid JSON holding its first 3."""
    items = [{"name": name, "n": n} for name, n in pairs]  # keys in the schema's order, as the grammar writes them
    schema = json.dumps({"type": "array", "items": ITEM, "maxItems": 3})
    reply = json.dumps(items, separators=(",", ":"))
    [c] = run(engine, (ask("list", reply), SamplingParams(max_tokens=400, json_schema=schema)))
    assert c.finish_reason == "stop"
    assert json.loads(c.text) == items[:3]


@SETTINGS
@given(pairs=st.lists(st.tuples(texts, texts), min_size=2, max_size=6))
def test_concurrent_chats_each_get_their_own_reply(engine, pairs):
    """Chats sent together (one batch, prompts of any lengths) each get the reply scripted for their own prompt."""
    before = dict(engine.stats.batch_sizes)  # batch size -> forwards of that size
    assume(all(writable(engine, r) for _, r in pairs))
    chats = [(ask(m, r), SamplingParams(max_tokens=512)) for m, r in pairs]
    out = run(engine, *chats)
    assert [c.text for c in out] == [r for _, r in pairs]
    assert any(n > before.get(size, 0) for size, n in engine.stats.batch_sizes.items() if size > 1)  # one batch


@SETTINGS
@given(name=names, n=st.integers(-10**6, 10**6), seed=st.integers(0, 2**32 - 1), constrained=st.booleans())
def test_sampling_at_temperature_one_decodes_the_greedy_tokens(engine, name, n, seed, constrained):
    """Sampled at temperature 1 (any seed), with or without a grammar, a reply is the tokens greedy decodes
    (never a shorter split of the script's token, which a max_tokens cut would end earlier in the text)."""
    reply = json.dumps({"name": name, "n": n}, separators=(",", ":"))  # ITEM's keys in its order
    schema = json.dumps(ITEM) if constrained else None
    greedy, sampled = run(engine, (ask("greedy", reply), SamplingParams(max_tokens=400, json_schema=schema)),
                          (ask("sampled", reply), SamplingParams(max_tokens=400, json_schema=schema,
                                                                 temperature=1.0, seed=seed)))
    assert greedy.text == reply
    assert sampled.token_ids == greedy.token_ids


words = st.lists(st.sampled_from(["alpha", "beta", "gamma", "delta", "memory", "the", "of", "42", ","]),
                 min_size=3, max_size=40).map(" ".join)


@SETTINGS
@given(memory=words, edit=words)
def test_speculation_changes_no_text(engine, plain_engine, memory, edit):
    """The speculating engine (drafts from the prompt) returns the same texts as the plain one, alone and batched."""
    replies = [f"{memory} {edit}", memory, f"{edit}. {memory}"]
    outs = []
    for e in (engine, plain_engine):
        chats = [(ask(f"Memory: {memory}", r), SamplingParams(max_tokens=512)) for r in replies]
        outs.append([c.text for c in run(e, *chats)])
    assert outs[0] == outs[1] == replies


def test_speculation_really_drafts(engine):
    """A reply copied from the prompt is drafted and its drafts accepted (the speculative path runs)."""
    memory = " ".join(f"fact {i} is true;" for i in range(30))
    [c] = run(engine, (ask(memory, memory), SamplingParams(max_tokens=512)))
    assert c.text == memory
    assert c.accepted_tokens > 0


def test_off_script_fallback_closes_the_json_quickly(engine):
    """A scripted object missing required keys still ends as schema-valid JSON, the missing values minimal."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"},
                                                "c": {"type": "array", "items": {"type": "string"}}},
              "required": ["a", "b", "c"]}
    [c] = run(engine, (ask("obj", '{"a":"x"}'), SamplingParams(max_tokens=60, json_schema=json.dumps(schema))))
    assert c.finish_reason == "stop"
    assert json.loads(c.text) == {"a": "x", "b": 0, "c": []}


def test_fallback_closes_a_string_cut_at_max_length(engine):
    """A scripted string longer than the schema's maxLength comes back cut at maxLength and closed, the JSON valid."""
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}, "b": {"type": "integer"}},
              "required": ["a", "b"]}
    [c] = run(engine, (ask("long", '{"a":"abcdefghij","b":7}'),
                       SamplingParams(max_tokens=60, json_schema=json.dumps(schema))))
    assert c.finish_reason == "stop"
    assert json.loads(c.text) == {"a": "abcde", "b": 0}  # off the script after the cut: b minimal


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(),
                           lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=8)


@given(value=json_values, s=st.text())
def test_in_json_string_tracks_quotes(value, s):
    """A whole JSON value ends outside any string; a JSON string cut before its closing quote ends inside one."""
    assert not in_json_string(json.dumps(value))
    assert in_json_string(json.dumps(s)[:-1])
