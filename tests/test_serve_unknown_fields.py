"""An unknown request field is a 400 naming it on every surface (Chat Completions, Responses, Messages,
count_tokens, Batches), as OpenAI's and Anthropic's servers answer, never accepted and dropped; sent the way
a user sends one through the official clients (``extra_body``), while the clients' own calls, which send no
extra field, still pass."""

from __future__ import annotations

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient

from pipelines.openai_batch import BatchRunConfig
from pipelines.openai_batch_api import BatchService, batch_router

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def http(tiny_engine, tmp_path_factory):
    from memagent.serve import create_app

    service = BatchService(str(tmp_path_factory.mktemp("batches")), BatchRunConfig(), engine=tiny_engine)
    with TestClient(create_app(tiny_engine, close_engine=False, extra_routers=[batch_router(service)])) as c:
        yield c


@pytest.fixture
def oai(http):
    return openai.OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)


@pytest.fixture
def claude(http):
    return anthropic.Anthropic(base_url="http://testserver", api_key="none", http_client=http, max_retries=0)


CALLS = {  # surface -> (a call with extra_body, the error body's path to the field's name)
    "chat": lambda oai, claude, extra: oai.chat.completions.create(model="tiny-llama", messages=HI, max_tokens=1,
                                                                   extra_body=extra),
    "chat-memagent": lambda oai, claude, extra: oai.chat.completions.create(
        model="memagent", messages=HI, max_tokens=1, extra_body=extra),
    "responses": lambda oai, claude, extra: oai.responses.create(model="tiny-llama", input="hi",
                                                                 max_output_tokens=1, extra_body=extra),
    "messages": lambda oai, claude, extra: claude.messages.create(model="tiny-llama", messages=HI, max_tokens=1,
                                                                  extra_body=extra),
    "count_tokens": lambda oai, claude, extra: claude.messages.count_tokens(model="tiny-llama", messages=HI,
                                                                            extra_body=extra),
    "batches": lambda oai, claude, extra: oai.batches.create(input_file_id="file-x", endpoint="/v1/chat/completions",
                                                             completion_window="24h", extra_body=extra),
}


@pytest.mark.parametrize("surface", sorted(CALLS))
@pytest.mark.parametrize("field", ["bogus", "frequency_penalty", "presence_penalty", "logit_bias"])
def test_an_unknown_field_is_a_400_naming_it(oai, claude, surface, field):
    """The field the server does not take is named in the 400's message (and, on OpenAI's surfaces, its param)."""
    with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as exc:
        CALLS[surface](oai, claude, {field: 0.5})
    error = exc.value.body["error"] if surface in ("messages", "count_tokens") else exc.value.body
    assert error["message"].startswith(f"{field}: "), error
    if surface not in ("messages", "count_tokens"):
        assert error["param"] == field


@pytest.mark.parametrize("surface", ["chat", "responses", "messages", "count_tokens"])
def test_the_clients_own_calls_send_no_unknown_field(oai, claude, surface):
    """Without extra_body each official client's call is answered (the clients add no field by default)."""
    result = CALLS[surface](oai, claude, None)
    assert result is not None
