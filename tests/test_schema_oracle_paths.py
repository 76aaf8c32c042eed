"""Generated Pydantic models read end to end by the memory agent over a perfect reader, on two engine paths:
the real OpenAI engine over HTTP to a constrained perfect server, and the real hf engine (chat template,
the JSON-Schema grammar of the derived schema, ``max_tokens``) over a scripted perfect causal LM.

Invariant: for every model the strategy draws (nested models, lists of models inside lists, Optional,
Literal, unions, constraints, aliases), the read's document values and merged records, assembled into
the user's shape, validate through the model and equal the gold object, with no ``schema_errors``.
"""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from memagent.agent import read_document
from memagent.config import AgentConfig
from memagent.engines.json_schema import CHARS_PER_ITEM, longest_bytes, text_bounded
from memagent.engines.openai import OpenAIEngine
from memagent.extraction import schema_from
from memagent.extraction.output import conform_reply, parse_reply
from memagent.extraction.resolve import without_nulls
from memagent_testing.oracle.servers import oracle_app
from memagent_testing.wide_schemas import group_keys
from tests.pydantic_models import instances, models
from tests.reliability_helpers import free_port, serving
from tests.test_schema_resolve import flatten

pytestmark = pytest.mark.slow  # a server, and the packaged model's tokenizer behind the scripted LM


class Reader:
    """A perfect reader of one gold object stated in a one-chunk document (swapped per example)."""

    def __init__(self) -> None:
        self.doc: dict = {}
        self.gold: dict = {}
        self.records: dict[str, list] = {}

    def load(self, schema, gold: dict) -> None:
        self.gold = gold
        doc, records = flatten(schema, gold)
        self.doc = grammar_keys(without_nulls(doc), json.loads(schema.decoding_schema_json()))
        self.records = {t: [without_nulls(r) for r in rs] for t, rs in records.items()}

    def fits(self, tokenizer, budget: int) -> bool:
        """Every reply within ``budget`` tokens: a records reply over the memory budget is split and the
        pieces re-read, and a document over one chunk is read in two, which this reader (it states every
        record whatever the piece) cannot follow."""
        replies = [compact(self.doc), *(compact(r) for r in self.records.values()), statement(self.gold),
                   self.memory()]
        return all(len(tokenizer(r, add_special_tokens=False)["input_ids"]) <= budget for r in replies)

    def reply(self, prompt: str) -> str:
        asked = re.search(r"Reply with a JSON array of the (\S+) records", prompt)
        if asked:
            return compact(self.records[asked.group(1)])
        if "Reply with a JSON object of record lists" in prompt:  # record types read together: each one's records
            return compact({key: self._records_of(key) for key in group_keys(prompt)})
        if "Reply with one JSON object" in prompt:
            return compact(self.doc)
        return self.memory()

    def _records_of(self, key: str) -> list:
        """The gold records of the type a group reply's key names (its name, or its name's last segment)."""
        names = [n for n in self.records if n == key or n.rsplit(".", 1)[-1] == key]
        return self.records[names[0]] if names else []

    def memory(self) -> str:
        """The memory it writes names the gold object: the scripted LM answers each distinct prompt once, so
        a memory two examples share would replay the first example's answer to the second."""
        return "The memory holds: " + json.dumps(self.gold, ensure_ascii=False)


def grammar_keys(value, node: dict):
    """``value`` with only the keys the decoding schema has (an object that holds only record types, e.g.
    ``{"a": {}}``, is no key of the document reply: its records come from the records calls)."""
    if not isinstance(value, dict) or "properties" not in node:
        return value
    return {k: grammar_keys(v, node["properties"][k]) for k, v in value.items() if k in node["properties"]}


def compact(value) -> str:
    """JSON as a constrained server writes it (no spaces: the hf grammar's separators)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def statement(gold: dict) -> str:
    """A document that states the gold object (one chunk): what is read matters less than the plumbing."""
    return "The filing states: " + json.dumps(gold, ensure_ascii=False) + "."


def config(schema) -> AgentConfig:
    """Budgets for any drawn model; the answer's bounds leave every gold value whole (texts of at most 12
    characters, lists of at most 3: :func:`tests.pydantic_models.instances`)."""
    room = longest_bytes(text_bounded(schema.decoding_schema()), 3 * CHARS_PER_ITEM, 3) if schema.fields else 0
    return AgentConfig(chunk_tokens=1500, memory_tokens=1500, answer_tokens=max(1500, room), query_tokens=3000,
                       extraction=schema)


def check(model, schema, gold: dict, result) -> None:
    doc, dropped = conform_reply(schema, parse_reply(schema, result.response))
    records = {t: [r.values for r in rs] for t, rs in (result.records or {}).items()}
    whole = schema.assemble(doc, records)
    assert dropped == [] and schema.errors(whole) == []
    got, want = model.model_validate(whole).model_dump(mode="json"), model.model_validate(gold).model_dump(mode="json")
    assert got == want, _diff(got, want)


def _diff(got, want, path="") -> str:
    """The first path where the read and the gold object differ (a readable failure)."""
    if isinstance(got, dict) and isinstance(want, dict):
        for k in sorted(set(got) | set(want)):
            if got.get(k) != want.get(k):
                return _diff(got.get(k), want.get(k), f"{path}.{k}")
    if isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        for i, (a, b) in enumerate(zip(got, want)):
            if a != b:
                return _diff(a, b, f"{path}[{i}]")
    if isinstance(got, list) and isinstance(want, list):
        return f"{path}: read {len(got)} items, gold {len(want)}: read {json.dumps(got)[-300:]}, gold {json.dumps(want)[-300:]}"
    return f"{path}: read {json.dumps(got)[:300]}, gold {json.dumps(want)[:300]}"


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture(scope="module")
def server(tokenizer):
    reader = Reader()
    with serving(oracle_app(reader.reply, tokenizer), free_port()) as url:
        yield reader, url


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                                  HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_openai_engine_reads_generated_models_back(server, tokenizer, data):
    """Over HTTP: a perfect server's replies under the derived schema assemble into the gold object."""
    reader, url = server
    model, fields = data.draw(models())
    gold = data.draw(instances(fields))
    schema = schema_from(model)
    reader.load(schema, gold)
    assume(reader.fits(tokenizer, 1200))
    engine = OpenAIEngine(url, "oracle", tokenizer, 65536)
    check(model, schema, gold, asyncio.run(read_document(engine, None, statement(gold), config(schema))))


@pytest.fixture(scope="module")
def hf_engine():
    from memagent_testing.oracle.scripted_lm import scripted_engine

    reader = Reader()
    return reader, scripted_engine(reader.reply)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hf_grammar_reads_generated_models_back(hf_engine, tokenizer, data):
    """Through the hf engine's grammar of the derived schema: the scripted reader's replies decode whole
    and assemble into the gold object."""
    reader, engine = hf_engine
    model, fields = data.draw(models())
    gold = data.draw(instances(fields))
    schema = schema_from(model)
    reader.load(schema, gold)
    assume(reader.fits(tokenizer, 1200) and config(schema).answer_tokens <= 1500)  # the 8K window, one final call
    check(model, schema, gold, asyncio.run(read_document(engine, None, statement(gold), config(schema))))
