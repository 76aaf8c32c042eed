"""A model reply the memagent model's read cannot use (JSON that does not parse, as a malformed reply to a
grouped records call was) is never a client error: every surface answers 200 in its own shape, the answer
empty and ``memagent.error`` naming the failure (before: a 400 ``invalid_request_error`` "Expecting value").

The failure is injected where the read raises it (the read's own function, replaced in the served model's
module), since a constrained engine never writes such a reply on its own."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient

from memagent.config import AgentConfig

DOC = [{"role": "user", "content": "The report."}, {"role": "user", "content": "What does it say?"}]


@pytest.fixture
def http(tiny_engine, monkeypatch):
    from memagent.serve import create_app

    async def malformed_reply(*args, **kwargs):
        json.loads('{"records": [')  # what the read does with a reply cut mid-object

    monkeypatch.setattr("memagent.serve.memagent_model.read_memory", malformed_reply)
    agent = AgentConfig(chunk_tokens=64, memory_tokens=32, answer_tokens=16, query_tokens=64)  # fits the window
    with TestClient(create_app(tiny_engine, close_engine=False, agent=agent)) as c:
        yield c


def test_every_surface_answers_200_with_the_error_in_the_extension(http):
    """Chat (whole and streamed), Responses and Messages: 200, no answer text, memagent.error names the failure."""
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
    chat = oai.chat.completions.create(model="memagent", messages=DOC, max_tokens=8).model_dump()
    assert chat["choices"][0]["message"]["content"] == "" and chat["choices"][0]["finish_reason"] == "stop"
    assert chat["memagent"]["error"].startswith("agent: Expecting value")
    chunks = list(oai.chat.completions.create(model="memagent", messages=DOC, max_tokens=8, stream=True))
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].model_dump()["memagent"]["error"].startswith("agent: ")
    resp = oai.responses.create(model="memagent", input=DOC, max_output_tokens=8).model_dump()
    assert resp["status"] == "completed" and resp["memagent"]["error"].startswith("agent: ")
    claude = anthropic.Anthropic(base_url="http://testserver", api_key="none", http_client=http, max_retries=0)
    msg = claude.messages.create(model="memagent", messages=DOC, max_tokens=8).model_dump()
    assert msg["stop_reason"] == "end_turn" and msg["memagent"]["error"].startswith("agent: ")
