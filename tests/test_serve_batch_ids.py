"""Batch API details (pipelines/openai_batch_api.py, openai_batch.py): an id holding anything but letters,
digits, ``-`` and ``_`` is refused (before, its other characters were stripped, so ``file-a.b`` and
``file-ab`` named one file); a query parameter FastAPI cannot parse is a 400 in OpenAI's shape, not a 422;
a ``memagent`` line's field the batch job would not honour is an error line naming it (before: dropped); a
file repeating a ``custom_id`` fails validation naming the lines (before: the id was in both result files)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from pipelines.openai_batch import BatchRunConfig, parse_requests
from pipelines.openai_batch_api import BatchService, batch_router


@pytest.fixture
def service(tiny_engine, tmp_path):
    return BatchService(str(tmp_path), BatchRunConfig(), engine=tiny_engine)


@pytest.fixture
def client(tiny_engine, service):
    from memagent.serve import create_app

    with TestClient(create_app(tiny_engine, close_engine=False, extra_routers=[batch_router(service)])) as c:
        yield c


def test_a_repeated_custom_id_fails_the_batch_naming_the_lines(client, service):
    """A file whose lines 3 and 4 repeat line 1's and 2's custom_ids: the batch is failed with one
    duplicate_custom_id error per repeated line, and no line is answered."""
    line = lambda cid: json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",  # noqa: E731
                                   "body": {"messages": [{"role": "user", "content": "hi"}]}})
    data = "\n".join(line(c) for c in ("a", "b", "a", "b", "c")).encode()
    up = client.post("/v1/files", files={"file": ("r.jsonl", data)}, data={"purpose": "batch"}).json()
    batch = client.post("/v1/batches", json={"input_file_id": up["id"], "endpoint": "/v1/chat/completions",
                                             "completion_window": "24h"}).json()
    service.run(batch["id"])  # what the service's thread does (not started here)
    done = client.get(f"/v1/batches/{batch['id']}").json()
    assert done["status"] == "failed" and done["output_file_id"] is None and done["error_file_id"] is None
    errors = done["errors"]["data"]
    assert [(e["code"], e["line"]) for e in errors] == [("duplicate_custom_id", 3), ("duplicate_custom_id", 4)]
    assert "line 1" in errors[0]["message"] and "line 2" in errors[1]["message"]


def test_unsafe_ids_are_refused_and_safe_ones_never_alias(client):
    """An uploaded file is found by its id; the same id with a dot, a tilde or a non-ASCII letter is a 400
    naming the id, never the file under the stripped name."""
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


def test_a_memagent_lines_fields_the_job_does_not_take_are_error_lines():
    """Only model and messages (and the batch's own temperature) pass; any other field is an error line naming it."""
    messages = [{"role": "system", "content": "The doc."}, {"role": "user", "content": "Q?"}]
    bodies = {"plain": {}, "greedy": {"temperature": 0}, "warm": {"temperature": 0.7}, "cap": {"max_tokens": 9},
              "json": {"response_format": {"type": "json_object"}}, "stops": {"stop": ["\n"]}}
    data = "\n".join(json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
                                 "body": {"model": "memagent", "messages": messages, **extra}})
                      for cid, extra in bodies.items()).encode()
    parsed = parse_requests(data, BatchRunConfig(), "tiny-llama")
    assert [r["id"] for r in parsed.rows] == ["plain", "greedy"]
    errors = {e["custom_id"]: e["error"] for e in parsed.errors}
    assert set(errors) == {"warm", "cap", "json", "stops"}
    for cid, field in (("warm", "temperature"), ("cap", "max_tokens"), ("json", "response_format"),
                       ("stops", "stop")):
        assert errors[cid]["code"] == "unsupported_in_batch" and f"body.{field}:" in errors[cid]["message"]


def test_run_batch_refuses_a_repeated_custom_id_before_any_model_loads(tmp_path, capsys, monkeypatch):
    """`memagent run-batch` on a file repeating a custom_id exits 2 naming the line, and writes nothing."""
    from memagent_cli.main import main

    def no_engine(*a, **k):
        raise AssertionError("an engine was built")

    monkeypatch.setattr("memagent.engines.make_engine", no_engine)
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": "hi"}]}})
    requests = tmp_path / "requests.jsonl"
    requests.write_text(f"{line}\n{line}\n")
    assert main(["run-batch", "-i", str(requests), "-o", str(tmp_path / "out.jsonl"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "line 2: custom_id 'a' is already the custom_id of line 1" in err
    assert not (tmp_path / "out.jsonl").exists()
