"""Batch API details (pipelines/openai_batch_api.py, openai_batch.py): an id holding anything but letters,
digits, ``-`` and ``_`` is refused (before, its other characters were stripped, so ``file-a.b`` and
``file-ab`` named one file); a query parameter FastAPI cannot parse is a 400 in OpenAI's shape, not a 422;
a file repeating a ``custom_id`` fails validation naming the lines (before: the id was in both result files);
an input file deleted under a batch changes nothing, before a restart or after (before: the batch completed,
or after a restart failed, losing the lines answered)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from pipelines.openai_batch import BatchRunConfig
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


def _chat_batch(client, n: int) -> tuple[str, str]:
    """(file id, batch id) of a new batch of ``n`` chat lines to the engine's model."""
    data = "\n".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions",
                                 "body": {"max_tokens": 3, "temperature": 0,
                                          "messages": [{"role": "user", "content": f"Say {i}"}]}})
                      for i in range(n)).encode()
    up = client.post("/v1/files", files={"file": ("r.jsonl", data)}, data={"purpose": "batch"}).json()
    batch = client.post("/v1/batches", json={"input_file_id": up["id"], "endpoint": "/v1/chat/completions",
                                             "completion_window": "24h"}).json()
    return up["id"], batch["id"]


@pytest.mark.parametrize("restart", [False, True])
def test_an_input_deleted_under_a_batch_changes_nothing(client, service, tiny_engine, tmp_path, restart):
    """A batch whose input file is deleted after its creation completes with every line answered, whether it
    runs in the server that took it or in one started again on the same root after a kill mid-batch (the
    lines answered before the kill kept, not answered again)."""
    from pipelines.openai_batch import run_requests

    file_id, batch_id = _chat_batch(client, 3)
    if restart:  # one line answered, then the server is gone: a new service on the same root runs the rest
        data = service.store.get(f"batches/{batch_id}/input.jsonl")
        run_requests(data.split(b"\n", 1)[0], service.store, f"batches/{batch_id}", service.cfg, engine=tiny_engine)
        first = service.store.get(f"batches/{batch_id}/lines/" + service.store.names(f"batches/{batch_id}/lines")[0])
    assert client.delete(f"/v1/files/{file_id}").json()["deleted"]
    runner = BatchService(str(tmp_path), BatchRunConfig(), engine=tiny_engine) if restart else service
    runner.run(batch_id)
    done = client.get(f"/v1/batches/{batch_id}").json()
    assert done["status"] == "completed" and done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    lines = [json.loads(x) for x in client.get(f"/v1/files/{done['output_file_id']}/content").text.splitlines()]
    assert [x["custom_id"] for x in lines] == ["c0", "c1", "c2"]
    if restart:
        assert json.loads(first) == lines[0]  # the line answered before the restart, as it was written


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


def test_an_engine_failure_is_an_error_line_that_a_rerun_answers_again(tiny_engine, tmp_path, monkeypatch):
    """A line whose engine raised is a server_error line (the batch goes on); a rerun on the same state answers
    it, while the line answered the first time is not answered again."""
    from memagent.serve.chat import EngineModel
    from pipelines.openai_batch import Store, run_requests

    line = lambda cid, text: json.dumps({"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",  # noqa: E731
                                         "body": {"max_tokens": 2, "messages": [{"role": "user", "content": text}]}})
    data = f"{line('ok', 'hi')}\n{line('boom', 'BOOM')}".encode()
    prepare = EngineModel.prepare

    async def fails_on_boom(self, req):
        if "BOOM" in req.messages[-1].text():
            raise RuntimeError("the engine died")
        return await prepare(self, req)

    monkeypatch.setattr(EngineModel, "prepare", fails_on_boom)
    store = Store(str(tmp_path))
    out, err = run_requests(data, store, "run", BatchRunConfig(), engine=tiny_engine)
    assert [x["custom_id"] for x in out] == ["ok"] and [(x["custom_id"], x["error"]["code"]) for x in err] == [
        ("boom", "server_error")]
    monkeypatch.setattr(EngineModel, "prepare", prepare)
    again, err = run_requests(data, store, "run", BatchRunConfig(), engine=tiny_engine)
    assert not err and [x["custom_id"] for x in again] == ["ok", "boom"] and again[0] == out[0]
