"""The files of a documents input, listed as they stream: in a Ray Data read task, never held on the driver.

    DocumentListing (a Ray Data datasource: get_read_tasks gives one read task, which walks the input
        directory by directory; estimate_inmemory_data_size is unknown; get_name "ListDocuments" in
        Ray Data's progress and stats)
        ─► blocks of (path, size), at most LISTING_BLOCK_FILES rows each, filtered by PathFilter
        ─► the conversion stage reads each file (pipelines/documents_cache.py)

Ray Data's own file readers list every path (and its size) on the driver before the first file is read:
over 200,000 files, 467 MB of the driver's memory and 19 s before the first row (benchmarks/
documents_listing.py: ~2 KB a file; against 105 MB and 3.5 s here). Here the
driver holds the input's root and the filter (it walks only up to the first file to read:
pipelines/documents_input.py first_file_to_read); the read task yields the listing in blocks as it walks, so
the first documents are converting while the walk goes on, and nothing anywhere holds the whole listing
(one directory's entries at a time: a store lists a directory in one call). Names starting with ``_``
or ``.`` are not descended into (job markers, hidden folders, the conversion cache).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import ray
from ray.data.block import BlockMetadata
from ray.data.datasource import Datasource, ReadTask

LISTING_BLOCK_FILES = 256  # paths per listing block: small, so that conversion starts while the walk goes on
LISTING_COLUMNS = pa.schema([pa.field("path", pa.string()), pa.field("size", pa.int64())])


def walk_files(fs: pafs.FileSystem, paths: str | list[str], keep: Any = None) -> Iterator[tuple[str, int]]:
    """(path, size) of each file under the directory ``paths`` (breadth first, names sorted, names
    starting with ``_`` or ``.`` skipped), or of each file of the list ``paths`` that exists; with ``keep``
    (a :class:`pipelines.documents_input.PathFilter`), only the files it accepts."""
    if isinstance(paths, list):
        for start in range(0, len(paths), LISTING_BLOCK_FILES):
            for info in fs.get_file_info(paths[start:start + LISTING_BLOCK_FILES]):
                if info.type == pafs.FileType.File and (keep is None or keep.accepts(info.path)):
                    yield info.path, info.size
        return
    folders = deque([paths.rstrip("/") or paths])
    while folders:
        infos = sorted(fs.get_file_info(pafs.FileSelector(folders.popleft(), allow_not_found=True)),
                       key=lambda i: i.path)
        for info in infos:
            if info.base_name.startswith(("_", ".")):
                continue
            if info.type == pafs.FileType.Directory:
                folders.append(info.path)
            elif info.type == pafs.FileType.File and (keep is None or keep.accepts(info.path)):
                yield info.path, info.size


def listing_blocks(fs: pafs.FileSystem, paths: str | list[str], keep: Any) -> Iterator[pa.Table]:
    """:func:`walk_files` in blocks of at most :data:`LISTING_BLOCK_FILES` rows (``LISTING_COLUMNS``)."""
    block: list[tuple[str, int]] = []
    for item in walk_files(fs, paths, keep):
        block.append(item)
        if len(block) == LISTING_BLOCK_FILES:
            yield _table(block)
            block = []
    if block:
        yield _table(block)


def _table(block: list[tuple[str, int]]) -> pa.Table:
    return pa.table([pa.array([p for p, _ in block], pa.string()), pa.array([s for _, s in block], pa.int64())],
                    schema=LISTING_COLUMNS)


def read_listing(fs: pafs.FileSystem, paths: str | list[str], keep: Any = None) -> ray.data.Dataset:
    """The Ray dataset of the files' (path, size) rows, listed in one read task as the job streams."""
    return ray.data.read_datasource(DocumentListing(fs, paths, keep), override_num_blocks=1)


class DocumentListing(Datasource):
    """Ray Data datasource: the walk (:func:`listing_blocks`) as one read task yielding blocks."""

    def __init__(self, fs: pafs.FileSystem, paths: str | list[str], keep: Any = None):
        super().__init__()
        self.fs, self.paths, self.keep = fs, paths, keep

    def estimate_inmemory_data_size(self) -> int | None:
        return None  # unknown until walked: that is the point

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        fs, paths, keep = self.fs, self.paths, self.keep
        meta = BlockMetadata(num_rows=None, size_bytes=None, exec_stats=None, input_files=None)
        return [ReadTask(lambda: listing_blocks(fs, paths, keep), meta, schema=LISTING_COLUMNS,
                         per_task_row_limit=per_task_row_limit)]

    def get_name(self) -> str:
        return "ListDocuments"
