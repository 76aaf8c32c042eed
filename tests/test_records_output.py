"""The records output (pipelines/records_output.py): exactly once against the committed documents rows,
locally and on the moto S3 server; and the batch job writing it end to end (Ray, a scripted engine)."""

from __future__ import annotations

import functools
import os

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from memagent.config import AgentConfig
from memagent.engines import EngineConfig
from memagent.extraction.records import Evidence, Record
from pipelines.batch_qa import BatchQAConfig, run_batch_qa
from pipelines.job import JobConfig
from pipelines.records_output import RECORDS_DIR, RecordsWriter, read_records, remove_orphans
from pipelines.storage import S3Options
from tests.pipeline_helpers import read_output, write_rows
from tests.records_helpers import CONFIG, document, payment, records_engine


def rec(payer: str, step: int = 0) -> Record:
    return Record("payments", {"payer": payer, "date": "2021-03-14", "amount": 5.0},
                  {"payer": Evidence(step, 0, len(payer))}, 1, step, step)


def commit(fs, path: str, name: str, rows: list[dict]) -> None:
    """A documents file landing (what Ray Data's writer does for a block of rows)."""
    table = pa.Table.from_pylist([{"id": r["id"], "error": r.get("error"), "records_file": r.get("records_file")}
                                  for r in rows], schema=pa.schema([("id", pa.string()), ("error", pa.string()),
                                                                    ("records_file", pa.string())]))
    pq.write_table(table, f"{path}/{name}", filesystem=fs)


def exactly_once(output: str, fs, path: str, s3: S3Options | None = None) -> None:
    writer = RecordsWriter(output, s3, CONFIG.extraction)
    first = writer.write("a", {"payments": [rec("Acme Ltd")]})  # an attempt whose row never landed
    second = writer.write("a", {"payments": [rec("Acme Ltd"), rec("Birch Ltd")]})  # the retry: committed
    writer.write("b", {"payments": [rec("Cedar Ltd")]})  # killed before its row was written
    infra = writer.write("c", {"payments": [rec("Dune Ltd")]})  # its row is an infrastructure error
    assert writer.write("d", {"payments": []}) is None  # no records: no file
    commit(fs, path, "block-0.parquet", [{"id": "a", "records_file": second},
                                         {"id": "c", "records_file": infra, "error": "infra: lost"},
                                         {"id": "d"}])
    got = read_records(output, "payments", s3)
    assert [(r["id"], r["payer"], r["record_index"]) for r in got.to_pylist()] == [
        ("a", "Acme Ltd", 0), ("a", "Birch Ltd", 1)]  # once, whole; orphans left out
    assert got.schema.field("date").type == pa.date32()
    assert remove_orphans(output, s3) == 3 and first != second
    left = [f for f in fs.get_file_info(pafs.FileSelector(f"{path}/{RECORDS_DIR}", recursive=True))
            if f.type == pafs.FileType.File]
    assert [f.base_name for f in left] == [f"{second}.parquet"]
    assert read_records(output, "payments", s3).equals(got)
    # The documents dataset is still readable on its own: the records are under "_".
    assert len(read_output(path, filesystem=fs)) == 3


def test_only_records_named_by_committed_rows_count(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    exactly_once(str(out), pafs.LocalFileSystem(), str(out))


@pytest.mark.slow
def test_records_exactly_once_on_the_loopback_s3_server(monkeypatch):
    from infra.local_s3 import CREDENTIALS, s3_server

    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    with s3_server(buckets=("lake",)) as endpoint:
        s3 = S3Options(endpoint_url=endpoint)
        fs = pafs.S3FileSystem(endpoint_override=endpoint.split("://")[1], scheme="http", region="us-east-1")
        exactly_once("s3://lake/out", fs, "lake/out", s3)


def docs() -> list[dict]:
    rows = []
    for i in range(3):
        text = document([payment("Acme Ltd", 100 + i, "2021-03-14")], [payment("Birch Ltd", 7, "2021-04-01")],
                        [payment("Acme Ltd", 200 + i, "2021-03-14", "Northbank")])
        rows.append({"id": f"doc-{i}", "question": "", "context": text})
    return rows


def job(tmp_path, output: str, s3: S3Options | None = None, agent: AgentConfig = CONFIG) -> BatchQAConfig:
    return BatchQAConfig(input=str(tmp_path / "in"), output=output, **({"s3": s3} if s3 else {}),
                         engine=EngineConfig(model=str(tmp_path / "unused")), agent=agent,
                         job=JobConfig(batch_size=2, progress=False, checkpoint_every_steps=1))


@pytest.mark.slow
def test_the_batch_job_writes_the_records_dataset_once_across_reruns(ray_local, tiny_llama_dir, tmp_path):
    write_rows(tmp_path / "in" / "docs.parquet", docs())
    out = str(tmp_path / "out")
    build = functools.partial(records_engine, {"tokenizer": str(tiny_llama_dir)})
    summary = run_batch_qa(job(tmp_path, out), build_engine=build)
    assert summary.rows_out == 3 and summary.error_rows == 0
    rows = {r["id"]: r for r in read_output(out)}
    assert all(r["n_records_payments"] == 2 and r["record_splits"] == 0 and r["records_file"] for r in rows.values())
    got = read_records(out, "payments")
    assert len(got) == 6 and got.column_names[:3] == ["id", "record_type", "record_index"]
    assert got.schema.field("bank").type == pa.struct([("name", pa.string())])
    assert got.schema.field("first_chunk").type == pa.int32()
    acme = [r for r in got.to_pylist() if r["id"] == "doc-1" and r["payer"] == "Acme Ltd"][0]
    assert acme["amount"] == 201 and acme["mentions"] == 2 and acme["bank"] == {"name": "Northbank"}
    assert {e["field"] for e in acme["record_evidence"]} == {"payer", "date", "amount", "bank.name"}
    files = sorted(os.listdir(f"{out}/{RECORDS_DIR}/payments"))
    assert len(files) == 3  # one per document, no orphan left after the run
    # A killed attempt's leftovers and a rerun: the rerun skips the done ids and removes the orphan.
    RecordsWriter(out, None, CONFIG.extraction).write("doc-0", {"payments": [rec("Ghost Ltd")]})
    again = run_batch_qa(job(tmp_path, out), build_engine=build)
    assert again.rows_out == 0 and again.skipped == 3
    assert sorted(os.listdir(f"{out}/{RECORDS_DIR}/payments")) == files
    assert read_records(out, "payments").equals(got)


@pytest.mark.slow
def test_the_batch_job_records_on_the_loopback_s3_server(tiny_llama_dir, tmp_path, monkeypatch):
    import ray

    from infra.local_s3 import CREDENTIALS, s3_server

    ray.shutdown()  # a Ray started before the credentials were set gives its workers none
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        s3_job(tmp_path, tiny_llama_dir)
    finally:
        ray.shutdown()


def s3_job(tmp_path, tiny_llama_dir) -> None:
    from infra.local_s3 import s3_server

    write_rows(tmp_path / "in" / "docs.parquet", docs())
    build = functools.partial(records_engine, {"tokenizer": str(tiny_llama_dir)})
    with s3_server(buckets=("lake",)) as endpoint:
        s3 = S3Options(endpoint_url=endpoint)
        summary = run_batch_qa(job(tmp_path, "s3://lake/out", s3), build_engine=build)
        assert summary.rows_out == 3
        got = read_records("s3://lake/out", "payments", s3)
        assert len(got) == 6 and sorted(set(got.column("id").to_pylist())) == ["doc-0", "doc-1", "doc-2"]
        again = run_batch_qa(job(tmp_path, "s3://lake/out", s3), build_engine=build)
        assert again.rows_out == 0 and read_records("s3://lake/out", "payments", s3).equals(got)


def test_a_committed_file_that_cannot_be_read_is_never_taken_for_an_uncommitted_one(tmp_path, monkeypatch):
    """A store error reading a committed documents file (a transient fault) removes none of its records in the
    orphan sweep and quarantines nothing: not knowing what is committed is never taken for "nothing is"."""
    from pipelines import storage
    from tests.fault_fs import Injector, faulty

    out = tmp_path / "out"
    out.mkdir()
    fs = pafs.LocalFileSystem()
    stem = RecordsWriter(str(out), None, CONFIG.extraction).write("a", {"payments": [rec("Acme Ltd")]})
    commit(fs, str(out), "block-0.parquet", [{"id": "a", "records_file": stem}])
    real = storage.filesystem
    failing = {("output", "open_input_file", 0): "fail"}  # the first read of the documents file fails
    monkeypatch.setattr(storage, "filesystem", lambda uri, s3=None: (faulty(real(uri, s3)[0], Injector(dict(failing))),
                                                                      real(uri, s3)[1]))
    assert remove_orphans(str(out)) == 0
    with pytest.raises(OSError, match="injected"):
        storage.complete_parquet_files(*storage.filesystem(str(out)))
    monkeypatch.setattr(storage, "filesystem", real)
    assert [r["payer"] for r in read_records(str(out), "payments").to_pylist()] == ["Acme Ltd"]
    assert storage.complete_parquet_files(fs, str(out)) == [f"{out}/block-0.parquet"]  # not moved aside


def test_a_foreign_file_in_a_type_folder_is_named_and_never_hides_the_real_ones(tmp_path):
    """A committed file under ``payments/`` that is not a payments records file (another type's rows, or
    this type's name on clashing columns) and whose name sorts first is named in ``errors`` and left out;
    every real payments file is still read (before, the first file's columns decided, hiding them all)."""
    out = tmp_path / "out"
    out.mkdir()
    fs = pafs.LocalFileSystem()
    writer = RecordsWriter(str(out), None, CONFIG.extraction)
    real = [writer.write(doc, {"payments": [rec(payer)]}) for doc, payer in (("a", "Acme Ltd"), ("b", "Birch Ltd"))]
    folder = out / RECORDS_DIR / "payments"
    other_type = pa.table({"id": ["x"], "record_type": ["invoices"], "record_index": pa.array([0], pa.int32()),
                           "number": [7]})
    clashing = pa.table({"id": ["y"], "record_type": ["payments"], "record_index": pa.array([0], pa.int32()),
                         "payer": [1.5], "date": ["not a date"]})
    pq.write_table(other_type, folder / "0000-foreign.parquet")
    pq.write_table(clashing, folder / "0001-foreign.parquet")
    commit(fs, str(out), "block-0.parquet", [{"id": "a", "records_file": real[0]}, {"id": "b", "records_file": real[1]},
                                             {"id": "x", "records_file": "0000-foreign"},
                                             {"id": "y", "records_file": "0001-foreign"}])
    errors: list[str] = []
    got = read_records(str(out), "payments", errors=errors)
    assert sorted(got.column("payer").to_pylist()) == ["Acme Ltd", "Birch Ltd"]
    assert got.schema.field("date").type == pa.date32()
    assert len(errors) == 2 and "0000-foreign" in errors[0] and "record type 'invoices'" in errors[0]
    assert "0001-foreign" in errors[1] and all("left out" in e for e in errors)
    with pytest.raises(ValueError, match="record type 'invoices'"):
        read_records(str(out), "payments")
