"""The ``memagent`` model takes the schemas clients send: the OpenAI SDK's ``parse(response_format=Model)``
with nested models ($defs, strict Optional), instructor's JSON_SCHEMA mode, and ``json_object``.

A real server on loopback over a perfect reader (memagent_testing/oracle/servers.py: it honours the schema and
``max_tokens`` like a structured-outputs server) that states a gold object's values: the memory update,
each record type's per-chunk records and the final object. The invariant: what the client's own
library parses from the reply equals the gold object.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Optional

import pytest
from pydantic import BaseModel

from memagent.extraction import schema_from
from memagent_testing.oracle.servers import OracleEngine
from memagent_testing.wide_schemas import group_keys
from tests.test_schema_resolve import flatten
from tests.test_serve_guard import running

pytestmark = pytest.mark.slow  # a real server


class Party(BaseModel):
    name: str
    role: Optional[str] = None


class Line(BaseModel):
    item: str
    amount: float


class Invoice(BaseModel):
    number: str
    issued: dt.date
    lines: list[Line]


class Filing(BaseModel):
    lender: Party
    borrowers: list[Party]
    invoices: list[Invoice]
    total: Optional[float]


GOLD = {"lender": {"name": "Acme Bank", "role": "agent"}, "borrowers": [{"name": "Bo Ltd", "role": None}],
        "invoices": [{"number": "A-1", "issued": "2024-01-02", "lines": [{"item": "bolts", "amount": 2.5}]},
                     {"number": "A-2", "issued": "2024-02-03", "lines": []}], "total": 2.5}
DOC = ("Acme Bank acts as agent. Bo Ltd borrows. Invoice A-1 was issued on 2024-01-02 for bolts at 2.5. "
       "Invoice A-2 was issued on 2024-02-03. The total is 2.5.")


def perfect_reader(schema_json: dict, gold: dict):
    """Replies of a reader that read ``gold`` in the one chunk: the memory, records per type, the object."""
    schema = schema_from(schema_json)
    doc, records = flatten(schema, gold)

    def reply(prompt: str) -> str:
        asked = re.search(r"Reply with a JSON array of the (\S+) records", prompt)
        if asked:
            return json.dumps(records[asked.group(1)])
        if "Reply with a JSON object of record lists" in prompt:  # record types read together
            return json.dumps({key: records_of(key) for key in group_keys(prompt)})
        if "Reply with one JSON object" in prompt:
            return json.dumps({k: v for k, v in doc.items() if v is not None})
        return "Acme Bank is the agent lender; invoices A-1 and A-2."

    def records_of(key: str) -> list:
        names = [n for n in records if n == key or n.rsplit(".", 1)[-1] == key]
        return records[names[0]] if names else []
    return reply


@pytest.fixture
def serve(tiny_llama_dir):
    from transformers import AutoTokenizer

    from memagent.config import AgentConfig
    from memagent.serve import create_app

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
    agent = AgentConfig(chunk_tokens=400, memory_tokens=600, answer_tokens=400, query_tokens=1000)

    def start(reply):
        return running(create_app(OracleEngine(reply, tokenizer), close_engine=False, agent=agent))
    return start


def test_openai_sdk_parse_with_nested_models(serve):
    """``chat.completions.parse(response_format=Filing)``: the SDK's strict schema is accepted and its parsed
    model equals the gold one, invoices' lines nested under their invoice."""
    from openai import OpenAI
    from openai.lib._pydantic import to_strict_json_schema

    with serve(perfect_reader(to_strict_json_schema(Filing), GOLD)) as url:
        client = OpenAI(base_url=url + "/v1", api_key="x")
        done = client.chat.completions.parse(model="memagent", response_format=Filing, max_tokens=400, messages=[
            {"role": "system", "content": DOC}, {"role": "user", "content": "Extract the filing."}])
    assert done.choices[0].message.parsed == Filing.model_validate(GOLD)


def test_instructor_json_schema_mode(serve):
    """instructor's JSON_SCHEMA mode sends ``response_format`` json_schema and validates the reply itself."""
    import instructor
    from openai import OpenAI

    with serve(perfect_reader(Filing.model_json_schema(), GOLD)) as url:
        client = instructor.from_openai(OpenAI(base_url=url + "/v1", api_key="x"), mode=instructor.Mode.JSON_SCHEMA)
        got = client.chat.completions.create(model="memagent", response_model=Filing, max_tokens=400, max_retries=0,
                                             messages=[{"role": "system", "content": DOC},
                                                       {"role": "user", "content": "Extract the filing."}])
    assert got.model_dump() == Filing.model_validate(GOLD).model_dump()  # instructor returns its own subclass


def test_json_object_answers_one_object(serve):
    """``json_object``: the answer, asked of the engine's model under its JSON-object grammar, comes back as the
    object the perfect model writes."""
    import httpx

    answer = '{"total": 2.5}'
    with serve(lambda prompt: answer if "Question" in prompt or "answer" in prompt.lower() else "total 2.5") as url:
        r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
            "model": "memagent", "response_format": {"type": "json_object"}, "max_tokens": 50,
            "messages": [{"role": "system", "content": DOC}, {"role": "user", "content": "What is the total?"}]})
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["choices"][0]["message"]["content"]) == {"total": 2.5}
