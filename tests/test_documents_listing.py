"""The documents input's listing: every file once, hidden names skipped, streamed in blocks from a Ray read
task; the driver walks only up to the first file to read."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines import documents_listing
from pipelines.documents_input import DocumentSource, PathFilter, first_file_to_read
from pipelines.documents_listing import listing_blocks, walk_files

NAMES = st.sampled_from(["a", "b", "_x", ".h", "doc.pdf", "n.txt", "z z.md", "é.html", "sub", "_SUCCESS"])
TREES = st.recursive(st.dictionaries(NAMES, st.binary(max_size=8), max_size=4),
                     lambda inner: st.dictionaries(NAMES, inner, max_size=4), max_leaves=30)


def write_tree(root: Path, tree: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for name, node in tree.items():
        if isinstance(node, dict):
            write_tree(root / name, node)
        else:
            (root / name).write_bytes(node)


def visible_files(root: Path) -> dict[str, int]:
    """The oracle: os.walk's files under no name starting with _ or ., path -> size."""
    found = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for name in files:
            if not name.startswith(("_", ".")):
                found[f"{folder}/{name}"] = os.path.getsize(f"{folder}/{name}")
    return found


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=TREES, block=st.integers(1, 5))
def test_the_walk_yields_every_visible_file_once_in_small_blocks(tree, block):
    """Every file not under a name starting with _ or . is listed exactly once with its size, breadth first,
    and the blocks (at most LISTING_BLOCK_FILES rows) put together are the walk."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "lake"
        write_tree(root, tree)
        fs = pafs.LocalFileSystem()
        walked = list(walk_files(fs, str(root)))
        assert dict(walked) == visible_files(root) and len(walked) == len(dict(walked))
        depths = [p.count("/") for p, _ in walked]
        assert depths == sorted(depths)  # breadth first: a folder's files before its sub-folders'
        saved, documents_listing.LISTING_BLOCK_FILES = documents_listing.LISTING_BLOCK_FILES, block
        try:
            blocks = list(listing_blocks(fs, str(root), None))
        finally:
            documents_listing.LISTING_BLOCK_FILES = saved
        assert all(0 < b.num_rows <= block for b in blocks)
        assert [(p, s) for b in blocks for p, s in zip(b["path"].to_pylist(), b["size"].to_pylist())] == walked
        named = [p for p, _ in walked] + [str(root / "gone.pdf")]
        assert list(walk_files(fs, named)) == walked  # files named one by one: the missing one left out


def counting_fs(log: Path) -> pafs.FileSystem:
    """The local file system, each directory listing logged with the lister's process id (the handler is a
    local class: Ray pickles it by value into the read task)."""
    import fsspec

    class Counting(pafs.FSSpecHandler):
        def get_file_info_selector(self, selector):
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {selector.base_dir}\n")
            return super().get_file_info_selector(selector)

    return pafs.PyFileSystem(Counting(fsspec.filesystem("file")))


@pytest.mark.slow
def test_the_driver_lists_up_to_the_first_file_and_the_read_task_lists_the_rest(ray_local_s3, tmp_path):
    """Over 30 folders of files, the driver lists 2 directories (the root, the first folder) before the job
    starts and none while its rows stream; a read task lists every folder; every file is one row; with
    every id done, the driver walks it all and finds nothing to read."""
    from pipelines.batch_qa import BatchQAConfig
    from pipelines.documents_input import document_rows

    lake = tmp_path / "lake"
    for i in range(30):
        for j in range(3):
            (lake / f"f{i:02d}" / f"d{j}.txt").parent.mkdir(parents=True, exist_ok=True)
            (lake / f"f{i:02d}" / f"d{j}.txt").write_text(f"Folder {i}, note {j}: {i * j} units.")
    log = tmp_path / "listings.log"
    source = DocumentSource(counting_fs(log), str(lake), str(lake))
    keep = PathFilter(source.root, None, {"f00/d0.txt"})
    assert first_file_to_read(source, keep) == (True, True)
    driver = lambda: [line.split()[1] for line in log.read_text().splitlines() if line.split()[0] == str(os.getpid())]
    assert driver() == [str(lake), str(lake / "f00")]
    cfg = BatchQAConfig(input=str(lake), output=str(tmp_path / "out"), question="How many units?")
    rows = document_rows(cfg, source, source.paths, keep).take_all()
    assert sorted(r["id"] for r in rows) == sorted(f"f{i:02d}/d{j}.txt" for i in range(30) for j in range(3))[1:]
    assert all(r["context"].startswith("Folder ") and r["document_error"] is None for r in rows)
    assert len(driver()) == 2
    workers = [line.split()[1] for line in log.read_text().splitlines() if line.split()[0] != str(os.getpid())]
    assert sorted(workers) == sorted([str(lake)] + [str(lake / f"f{i:02d}") for i in range(30)])
    every = PathFilter(source.root, None, {r["id"] for r in rows} | {"f00/d0.txt"})
    assert first_file_to_read(source, every) == (True, False) and len(driver()) == 2 + 31


def test_listed_files_are_read_in_the_stage_an_oversized_one_hashed_not_converted(tmp_path):
    """The conversion stage reads each listed file: one over the byte limit is an ``oversized`` error row with
    its real content hash (a change is still seen) and the verdict is not cached (a raised limit converts it);
    a file removed after it was listed is an error row, not a lost row."""
    import hashlib

    import pyarrow as pa

    from memagent.documents import DocumentLimits
    from memagent.documents.columns import DOCUMENT_COLUMNS
    from pipelines.documents_cache import convert_files

    lake = tmp_path / "lake"
    lake.mkdir()
    big = ("The long note says 12 units. " * 200).encode()
    (lake / "big.txt").write_bytes(big)
    (lake / "small.txt").write_text("Seven units.")
    fs = pafs.LocalFileSystem()
    listing = pa.table({"path": [str(lake / n) for n in ("big.txt", "small.txt", "gone.txt")],
                        "size": [len(big), 12, 5]})
    run = lambda limit: {r["id"]: r for r in convert_files(
        listing, fs=fs, root=str(lake), cache=str(tmp_path / "cache"), s3=None,
        limits=DocumentLimits(max_bytes=limit), schema=DOCUMENT_COLUMNS).to_pylist()}
    rows = run(1000)
    assert rows["big.txt"]["document_error"] == f"big.txt: oversized: {len(big)} bytes, more than the limit of 1000"
    assert rows["big.txt"]["document_sha256"] == hashlib.sha256(big).hexdigest() and rows["big.txt"]["context"] is None
    assert rows["small.txt"]["context"].startswith("Seven units") and rows["small.txt"]["document_error"] is None
    assert rows["gone.txt"]["document_error"] == "gone.txt: missing: the file was removed after it was listed"
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 1  # the small file's conversion only
    rows = run(len(big))
    assert rows["big.txt"]["document_error"] is None and "12 units" in rows["big.txt"]["context"]
