"""The Batch API's ids and query parameters (pipelines/openai_batch_api.py): an id holding anything but
letters, digits, ``-`` and ``_`` is refused (before, its other characters were stripped, so ``file-a.b`` and
``file-ab`` named one file), and a query parameter FastAPI cannot parse is a 400 in OpenAI's shape, not a 422."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from pipelines.openai_batch import BatchRunConfig
from pipelines.openai_batch_api import BatchService, batch_router


@pytest.fixture
def client(tiny_engine, tmp_path):
    from memagent.serve import create_app

    service = BatchService(str(tmp_path), BatchRunConfig(), engine=tiny_engine)
    with TestClient(create_app(tiny_engine, close_engine=False, extra_routers=[batch_router(service)])) as c:
        yield c


def test_unsafe_ids_are_refused_and_safe_ones_never_alias(client):
    """An uploaded file is found by its id; the same id with a dot, a tilde or a non-ASCII letter is a 400 naming the id,
    never the file under the stripped name."""
    up = client.post("/v1/files", files={"file": ("r.jsonl", b"{}\n")}, data={"purpose": "batch"}).json()
    assert client.get(f"/v1/files/{up['id']}").json()["id"] == up["id"]
    for alias in (up["id"][:6] + "." + up["id"][6:], up["id"] + "~", up["id"] + "%C3%A9"):
        r = client.get(f"/v1/files/{alias}")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_id", (alias, r.text)
    r = client.get("/v1/batches/batch_x.y")
    assert r.status_code == 400 and r.json()["error"]["param"] == "batch_id"


def test_a_query_parameter_that_does_not_parse_is_a_400_naming_it(client):
    """?limit=abc is a 400 in OpenAI's error shape with param limit; limit out of range too."""
    for limit in ("abc", "0"):
        r = client.get(f"/v1/batches?limit={limit}")
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "limit" and error["message"].startswith("limit: "), r.text
    assert client.get("/v1/batches?limit=5").json()["object"] == "list"
