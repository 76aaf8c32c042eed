"""No secret in a Ray runtime env, a log, a trace, an artifact or the output.

The failing case as reported: ``OPENAI_API_KEY=… memagent batch --engine openai …`` wrote the key
to Ray's ``logs/runtime_env_agent.log``, and every ``AWS_*`` variable (the secret key included)
went the same way for S3 jobs. Now local actors inherit the driver's environment, the config
carries only the variable's name, and what is logged or stored is redacted.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from memagent.redact import MASK, is_secret_key, redact, redact_text, redact_url
from tests.pipeline_helpers import good_rows, read_output, write_rows
from tests.reliability_helpers import (
    SERVED, files_containing, free_port, ray_sessions_of_this_process, served_app, serving,
)

OPENAI_CANARY = "sk-canary-openai-5e1f0c7d9b"
AWS_CANARY = "canary-aws-secret-0b9d2e4f7a"
TOKEN_CANARY = "canary-aws-session-token-3c8a1d"


def test_redaction_rules():
    assert is_secret_key("api_key") and is_secret_key("AWS_SECRET_ACCESS_KEY") and is_secret_key("session_token")
    assert not is_secret_key("api_key_env") and not is_secret_key("memory_tokens") and not is_secret_key("endpoint")
    url = "http://bob:hunter22@h:8000/v1?api_key=abc&x=1"
    assert redact_url(url) == f"http://bob:{MASK}@h:8000/v1?api_key={MASK}&x=1"
    assert redact_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/v1"
    cfg = {"engine": {"api_key_env": "OPENAI_API_KEY", "endpoint": "https://u:p4ss@h/v1", "api_key": "sk-1"},
           "agent": {"memory_tokens": 8}}
    out = redact(cfg)
    assert out["engine"]["api_key_env"] == "OPENAI_API_KEY" and out["engine"]["api_key"] == MASK
    assert "p4ss" not in str(out) and out["agent"]["memory_tokens"] == 8
    masked = redact_text(f"failed with key {OPENAI_CANARY}", {"OPENAI_API_KEY": OPENAI_CANARY})
    assert masked == f"failed with key {MASK}"


def test_nothing_secret_travels_to_actors(monkeypatch):
    from memagent.engines import EngineConfig
    from memagent.redact import redact
    from pipelines.batch_qa import BatchQAConfig

    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_CANARY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_CANARY)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN_CANARY)
    cfg = BatchQAConfig(input="s3://lake/in", output="/tmp/o", engine=EngineConfig(
        engine="openai", endpoint="http://user:pw-secret@h/v1"))
    assert "pw-secret" not in str(redact(cfg.model_dump(mode="json")))  # a config dump, as evaluate.py writes one


def test_filesystem_handed_to_ray_holds_no_credentials(monkeypatch):
    import pickle

    from memagent.data.io import filesystem

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIACANARY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_CANARY)
    fs, _ = filesystem("s3://lake/x")
    assert AWS_CANARY.encode() not in pickle.dumps(fs)  # Ray pickles it into every read/write task


@pytest.mark.slow
def test_openai_s3_batch_job_leaks_no_canary(tiny_llama_dir, tmp_path, monkeypatch, capsys, caplog):
    """The reported case end to end: engine openai (a real `memagent serve` app), S3 (moto server),
    canaries in OPENAI_API_KEY and the AWS secret key; grep everything Ray and the job wrote."""
    import boto3
    import pyarrow.fs as pafs
    import ray

    from infra.local_s3 import s3_server
    from memagent_cli.main import main

    canaries = [OPENAI_CANARY, AWS_CANARY, TOKEN_CANARY]
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_CANARY)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIACANARYID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_CANARY)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN_CANARY)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    caplog.set_level(logging.DEBUG)
    seen_auth: list[str] = []
    rows = good_rows(3)
    assert not ray.is_initialized()
    with s3_server(buckets=("lake",)) as s3_endpoint, serving(served_app(tiny_llama_dir, seen_auth),
                                                              free_port()) as url:
        fs = pafs.S3FileSystem(endpoint_override=s3_endpoint.split("://")[1], scheme="http", region="us-east-1")
        pafs.copy_files(str(write_rows(tmp_path / "in.parquet", rows)), "lake/in/part-0.parquet",
                        destination_filesystem=fs)
        try:
            rc = main(["batch", "--input", "s3://lake/in", "--output", "s3://lake/out", "--s3-endpoint", s3_endpoint,
                       "--engine", "openai", "--endpoint", url, "--model", str(tiny_llama_dir),
                       "--served-model", SERVED, "--chunk-tokens", "64", "--memory-tokens", "8",
                       "--answer-tokens", "6", "--batch-size", "2", "--no-progress", "--verbose"])
            session = Path(ray._private.worker._global_node.get_session_dir_path())
        finally:
            ray.shutdown()
        job_log = caplog.text  # what the job logged at DEBUG (the test's own boto3 client below logs its token)
        leaking = [r.name for r in caplog.records if any(c in r.getMessage() for c in canaries)]
        out = read_output("lake/out", filesystem=fs)
        client = boto3.client("s3", endpoint_url=s3_endpoint)
        objects = {o["Key"]: client.get_object(Bucket="lake", Key=o["Key"])["Body"].read()
                   for o in client.list_objects_v2(Bucket="lake")["Contents"]}
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    assert sorted(r["id"] for r in out) == [r["id"] for r in rows]
    assert all(r["error"] is None for r in out), [r["error"] for r in out]
    # The actors had the key (inherited from this process, not shipped in a runtime env).
    assert seen_auth and all(a == f"Bearer {OPENAI_CANARY}" for a in seen_auth)
    assert (session / "logs").is_dir() and any((session / "logs").iterdir())
    assert files_containing(session, canaries) == []
    assert [k for k, body in objects.items() if any(c.encode() in body for c in canaries)] == []
    text = captured.out + captured.err + job_log
    assert [c for c in canaries if c in text] == [], leaking
    assert files_containing(tmp_path, canaries) == []


@pytest.mark.slow
def test_prefect_batch_flow_leaks_no_canary(tiny_llama_dir, tmp_path, monkeypatch):
    """The same through the Prefect flow: its database (runs, parameters, logs, artifacts) holds no canary."""
    import ray
    from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, PREFECT_HOME
    from prefect.testing.utilities import prefect_test_harness

    from flows.batch_qa import batch_qa
    from tests.flows_helpers import TINY_AGENT

    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_CANARY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_CANARY)
    write_rows(tmp_path / "in" / "part-0.parquet", good_rows(2))
    seen_auth: list[str] = []
    assert not ray.is_initialized()
    with prefect_test_harness(server_startup_timeout=120), serving(served_app(tiny_llama_dir, seen_auth),
                                                                   free_port()) as url:
        database = Path(PREFECT_API_DATABASE_CONNECTION_URL.value().split("///", 1)[-1]).parent
        t0 = time.time()
        try:
            state = batch_qa(input=str(tmp_path / "in"), output=str(tmp_path / "out"), agent=TINY_AGENT,
                             engine={"engine": "openai", "endpoint": url, "model": str(tiny_llama_dir),
                                     "served_model": SERVED}, job={"batch_size": 2}, examples=1, return_state=True)
        finally:
            ray.shutdown()  # the flow's task started Ray and shut it down again
        sessions = ray_sessions_of_this_process(t0)
        assert state.is_completed(), state.message
        hits = files_containing(database, [OPENAI_CANARY, AWS_CANARY])
        assert files_containing(database, [url]), "the grep must see the stored flow parameters"
    assert seen_auth and all(a == f"Bearer {OPENAI_CANARY}" for a in seen_auth)
    assert sessions and hits == []
    assert [h for session in sessions for h in files_containing(session, [OPENAI_CANARY, AWS_CANARY])] == []
    assert files_containing(tmp_path, [OPENAI_CANARY, AWS_CANARY]) == []
    home = Path(PREFECT_HOME.value())
    assert not home.exists() or files_containing(home, [OPENAI_CANARY, AWS_CANARY]) == []
