"""The records in the rows and each type's records dataset (pipelines/records_output.py): exactly once against
the committed documents rows under any history of runs, redos and faults, locally and on the moto S3 server;
and the batch job writing them end to end (Ray, a scripted engine)."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memagent.config import AgentConfig
from memagent.engines import EngineConfig
from memagent.extraction import output_fields, record_items
from memagent.extraction.records import Evidence, Record
from pipelines import records_output, storage
from pipelines.batch_qa import BatchQAConfig, run_batch_qa
from pipelines.job import JobConfig
from pipelines.records_output import RECORDS_DIR, EarlierLayout, export_records, read_records
from pipelines.storage import S3Options
from memagent_testing.fault_fs import FAULTS, Injector, Killed, applies, faulty
from tests.pipeline_helpers import read_output, write_rows
from memagent_testing.records_helpers import CONFIG, document, payment, records_engine

PAYMENTS = CONFIG.extraction.record_types[0]
COLUMN = "records_payments"
ROW_SCHEMA = pa.schema([("id", pa.string()), ("error", pa.string()),
                        next(f for f in output_fields(CONFIG.extraction) if f.name == COLUMN)])


def rec(payer: str, step: int = 0) -> Record:
    return Record("payments", {"payer": payer, "date": "2021-03-14", "amount": 5.0},
                  {"payer": Evidence(step, 0, len(payer))}, 1, step, step)


def row(doc: str, payers: list[str], error: str | None = None) -> dict:
    """A documents row as the batch job writes it: its records in ``records_payments`` (null in error rows)."""
    items = None if error else record_items(PAYMENTS, [rec(p) for p in payers])
    return {"id": doc, "error": error, COLUMN: items}


def commit(fs: pafs.FileSystem, path: str, name: str, rows: list[dict]) -> None:
    """A documents file landing (what Ray Data's writer does for a block of rows)."""
    pq.write_table(pa.Table.from_pylist(rows, schema=ROW_SCHEMA), f"{path}/{name}", filesystem=fs)


def committed(rows_by_file: dict[str, list[dict]]) -> list[tuple]:
    """(id, record_index, payer) of every record of the done rows (no error, or one that is not ``infra:``)."""
    out = [(r["id"], item["record_index"], item["payer"]) for rows in rows_by_file.values() for r in rows
           if not (r["error"] or "").startswith("infra:") and r[COLUMN] for item in r[COLUMN]]
    return sorted(out)


def keys(table: pa.Table) -> list[tuple]:
    return sorted((r["id"], r["record_index"], r["payer"]) for r in table.to_pylist()) if len(table) else []


def dataset(fs: pafs.FileSystem, path: str) -> tuple[list[tuple], int]:
    """The records dataset's files read whole (as ``pd.read_parquet`` reads the folder) and how many there are."""
    files = storage.output_files(fs, f"{path}/{RECORDS_DIR}/payments")
    return sorted(k for f in files for k in keys(pq.read_table(f, filesystem=fs))), len(files)


file_rows = st.lists(st.tuples(st.sampled_from([None, None, "infra: lost", "input: empty context"]),
                               st.lists(st.sampled_from(["Acme Ltd", "Birch Ltd", "Cedar Ltd"]), max_size=3)),
                     min_size=1, max_size=4)
step = st.one_of(st.tuples(st.just("commit"), file_rows),
                 st.tuples(st.just("redo"), st.integers(0, 50)),  # a file rewritten without one row (a redo)
                 st.tuples(st.just("export"), st.none()),
                 st.tuples(st.just("faulty export"), st.tuples(st.sampled_from(["open_output_stream", "move",
                                                                                  "delete_file",
                                                                                  "get_file_info_selector",
                                                                                  "open_input_file"]),
                                                                st.integers(0, 3), st.sampled_from(FAULTS))))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps=st.lists(step, min_size=1, max_size=12), per_file=st.integers(1, 8))
def test_the_records_dataset_is_the_committed_records_once_under_any_history(steps, per_file):
    """Under any sequence of committed documents files (rows with and without records, error and ``infra:``
    rows), files rewritten by a redo, and exports cut short by a fault at any records call: ``read_records``
    is always the done rows' records once; after a clean export the dataset's files, read whole, are too,
    in at most one file per ``per_file`` records plus one."""
    with tempfile.TemporaryDirectory() as tmp:
        fs, path = pafs.LocalFileSystem(), tmp
        files: dict[str, list[dict]] = {}
        for n, (kind, arg) in enumerate(steps):
            if kind == "commit":
                rows = [row(f"d{n}-{i}", payers, error) for i, (error, payers) in enumerate(arg)]
                files[f"part-{n}.parquet"] = rows
                commit(fs, path, f"part-{n}.parquet", rows)
            elif kind == "redo" and files:
                name = sorted(files)[arg % len(files)]
                kept = files.pop(name)[1:]
                fs.delete_file(f"{path}/{name}")
                if kept:
                    files[f"part-{n}-kept.parquet"] = kept
                    commit(fs, path, f"part-{n}-kept.parquet", kept)
            elif kind == "faulty export":
                call, at, fault = arg
                if applies(fault, call):
                    injector = Injector({("records", call, at): fault})
                    try:
                        _export(faulty(fs, injector), path, per_file)
                    except Killed:
                        pass
            else:
                _export(fs, path, per_file)
                got, n_files = dataset(fs, path)
                assert got == committed(files)
                assert n_files <= len(got) // per_file + 1
            assert keys(read_records(path, "payments")) == committed(files)


def _export(fs: pafs.FileSystem, path: str, per_file: int) -> None:
    real = storage.filesystem
    storage.filesystem = lambda uri, s3=None: (fs, uri)
    try:
        export_records(path, None, ["payments"], records_per_file=per_file)
    finally:
        storage.filesystem = real


def test_exports_add_only_new_documents_files_and_keep_the_files_few(tmp_path):
    """A second export reads only the documents files the first did not hold, merges the small file with them,
    and replaces it: one file per ``records_per_file`` records (and the remainder)."""
    fs, path = pafs.LocalFileSystem(), str(tmp_path)
    for i in range(3):
        commit(fs, path, f"a{i}.parquet", [row(f"a{i}", ["Acme Ltd", "Birch Ltd"])])
    assert export_records(path, None, ["payments"], records_per_file=4) == 2  # 4 records, then the remainder
    commit(fs, path, "b.parquet", [row("b", ["Cedar Ltd"])])
    reads: list[str] = []
    real = records_output._row_records
    records_output._row_records = lambda f, file, t: reads.append(file.rsplit("/", 1)[-1]) or real(f, file, t)
    try:
        assert export_records(path, None, ["payments"], records_per_file=4) == 1  # the 2-record file + b's
    finally:
        records_output._row_records = real
    assert reads == ["b.parquet"]
    got, n_files = dataset(fs, path)
    assert len(got) == 7 and n_files == 2
    assert export_records(path, None, ["payments"], records_per_file=4) == 0  # nothing new: nothing written


@pytest.mark.parametrize("fault", ["kill_before", "kill_after", "fail", "lost"])
def test_an_export_cut_short_between_its_write_and_its_removals_doubles_nothing(tmp_path, fault):
    """An export that dies (or fails) at removing the small file it merged leaves two files naming one documents
    file: ``read_records`` reads its records once all the same, and the next export removes the extra file."""
    fs, path = pafs.LocalFileSystem(), str(tmp_path)
    commit(fs, path, "a.parquet", [row("a", ["Acme Ltd"])])
    export_records(path, None, ["payments"], records_per_file=4)
    commit(fs, path, "b.parquet", [row("b", ["Birch Ltd"])])
    try:
        _export(faulty(fs, Injector({("records", "delete_file", 0): fault})), path, 4)
    except Killed:
        pass
    want = [("a", 0, "Acme Ltd"), ("b", 0, "Birch Ltd")]
    if fault in ("kill_before", "fail"):
        assert dataset(fs, path)[1] == 2  # the merged file and the small one it replaces, both there
    assert keys(read_records(path, "payments")) == want
    export_records(path, None, ["payments"], records_per_file=4)
    assert dataset(fs, path) == (want, 1)


def test_a_foreign_file_in_a_type_folder_is_named_and_never_hides_the_real_ones(tmp_path):
    """A file in ``_records/payments/`` that is not an export (no documents files named in its footer, or not
    Parquet) is named in ``errors`` and left out, whatever its name sorts before; without ``errors`` it raises."""
    fs, path = pafs.LocalFileSystem(), str(tmp_path)
    commit(fs, path, "block-0.parquet", [row("a", ["Acme Ltd"]), row("b", ["Birch Ltd"])])
    export_records(path, None, ["payments"])
    folder = tmp_path / RECORDS_DIR / "payments"
    pq.write_table(pa.table({"id": ["x"], "payer": [1.5]}), folder / "0000-foreign.parquet")
    (folder / "0001-notes.parquet").write_text("not parquet")
    errors: list[str] = []
    got = read_records(path, "payments", errors=errors)
    assert keys(got) == [("a", 0, "Acme Ltd"), ("b", 0, "Birch Ltd")]
    assert got.schema.field("date").type == pa.date32()
    assert len(errors) == 2 and "0000-foreign" in errors[0] and "names no documents files" in errors[0]
    assert "0001-notes" in errors[1] and all("left out" in e for e in errors)
    with pytest.raises(ValueError, match="0000-foreign.parquet of type 'payments' is not an export"):
        read_records(path, "payments")
    export_records(path, None, ["payments"])  # an export leaves what it did not write
    assert (folder / "0000-foreign.parquet").exists()


def test_an_output_of_the_earlier_records_layout_is_refused_with_what_to_do(tmp_path):
    """An output written with one records file per document (a ``records_file`` column) is refused by name."""
    path = str(tmp_path)
    pq.write_table(pa.table({"id": ["a"], "error": pa.array([None], pa.string()), "records_file": ["x"]}),
                   f"{path}/block-0.parquet")
    with pytest.raises(EarlierLayout, match="block-0.parquet is of the earlier records layout.*new output directory"):
        read_records(path, "payments")
    folder = tmp_path / RECORDS_DIR / "payments"
    folder.mkdir(parents=True)
    pq.write_table(pa.table({"id": ["a"]}), folder / f"{'a' * 32}-{'b' * 12}.parquet")
    with pytest.raises(EarlierLayout, match="one file per document"):
        read_records(path, "payments")


def test_a_documents_file_that_cannot_be_read_is_never_taken_for_one_without_records(tmp_path, monkeypatch):
    """A store error reading a committed documents file fails the read (never "no records") and the export
    (logged; it writes nothing), and quarantines nothing; the next export holds its records."""
    fs, path = pafs.LocalFileSystem(), str(tmp_path)
    commit(fs, path, "block-0.parquet", [row("a", ["Acme Ltd"])])
    real = storage.filesystem
    failing = {("output", "open_input_file", 0): "fail"}
    monkeypatch.setattr(storage, "filesystem", lambda uri, s3=None: (faulty(real(uri, s3)[0], Injector(dict(failing))),
                                                                      real(uri, s3)[1]))
    with pytest.raises(OSError, match="injected"):
        read_records(path, "payments")
    assert export_records(path, None, ["payments"]) == 0
    monkeypatch.setattr(storage, "filesystem", real)
    assert dataset(fs, path) == ([], 0)
    assert storage.complete_parquet_files(fs, path) == [f"{path}/block-0.parquet"]  # not moved aside
    assert export_records(path, None, ["payments"]) == 1 and dataset(fs, path) == ([("a", 0, "Acme Ltd")], 1)


def docs() -> list[dict]:
    rows = []
    for i in range(3):
        text = document([payment("Acme Ltd", 100 + i, "2021-03-14")], [payment("Birch Ltd", 7, "2021-04-01")],
                        [payment("Acme Ltd", 200 + i, "2021-03-14", "Northbank")])
        rows.append({"id": f"doc-{i}", "question": "", "context": text})
    return rows


def job(tmp_path: Path, output: str, s3: S3Options | None = None, agent: AgentConfig = CONFIG) -> BatchQAConfig:
    return BatchQAConfig(input=str(tmp_path / "in"), output=output, **({"s3": s3} if s3 else {}),
                         engine=EngineConfig(model=str(tmp_path / "unused")), agent=agent,
                         job=JobConfig(batch_size=2, progress=False, checkpoint_every_steps=1))


@pytest.mark.slow
def test_the_batch_job_writes_the_records_once_across_reruns(ray_local, tiny_llama_dir, tmp_path):
    """The job's rows carry their records; the type's dataset is one file after the run, unchanged by a rerun."""
    write_rows(tmp_path / "in" / "docs.parquet", docs())
    out = str(tmp_path / "out")
    build = functools.partial(records_engine, {"tokenizer": str(tiny_llama_dir)})
    summary = run_batch_qa(job(tmp_path, out), build_engine=build)
    assert summary.rows_out == 3 and summary.error_rows == 0
    rows = {r["id"]: r for r in read_output(out)}
    assert all(r["n_records_payments"] == 2 == len(r[COLUMN]) and r["record_splits"] == 0 for r in rows.values())
    got = read_records(out, "payments")
    assert len(got) == 6 and got.column_names[:3] == ["id", "record_type", "record_index"]
    assert got.schema.field("bank").type == pa.struct([("name", pa.string())])
    assert got.schema.field("first_chunk").type == pa.int32()
    acme = [r for r in got.to_pylist() if r["id"] == "doc-1" and r["payer"] == "Acme Ltd"][0]
    assert acme["amount"] == 201 and acme["mentions"] == 2 and acme["bank"] == {"name": "Northbank"}
    assert {e["field"] for e in acme["record_evidence"]} == {"payer", "date", "amount", "bank.name"}
    files = storage.output_files(pafs.LocalFileSystem(), f"{out}/{RECORDS_DIR}/payments")
    assert len(files) == 1 and pq.read_table(files[0]).equals(got)  # the dataset: the records once, one file
    again = run_batch_qa(job(tmp_path, out), build_engine=build)
    assert again.rows_out == 0 and again.skipped == 3
    assert storage.output_files(pafs.LocalFileSystem(), f"{out}/{RECORDS_DIR}/payments") == files
    assert read_records(out, "payments").equals(got)


@pytest.mark.slow
def test_the_batch_job_records_on_the_loopback_s3_server(tiny_llama_dir, tmp_path, monkeypatch):
    """The same on S3 (moto on loopback): the records read back whole, and a rerun changes nothing."""
    import ray

    from infra.local_s3 import CREDENTIALS, s3_server

    ray.shutdown()  # a Ray started before the credentials were set gives its workers none
    for k, v in CREDENTIALS.items():
        monkeypatch.setenv(k, v)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
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
    finally:
        ray.shutdown()
