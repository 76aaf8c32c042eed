"""The plan phase of a documents input, under the output's lease: what is done, what changed, what to read.

    the output's committed ids ─► their files, hashed and fingerprinted as the job would (Ray Data,
        the conversion cache: nothing converted twice) ─► changed ones refused, or redone
    ─► the documents read: the streamed listing, less the done ids (never read again) ─► InputPlan

Up front this reads only the output and the files of the ids it holds (O(committed rows), in Ray
tasks), and walks the input only up to its first file to read; the lake is listed as the job streams,
in a read task, and converted as it goes (pipelines/documents_input.py, pipelines/documents_listing.py). Ray is started here, after the lease, so no
conversion starts before this run holds the output.
"""

from __future__ import annotations

from typing import Callable

import pyarrow as pa

from memagent.documents.columns import DOCUMENT_COLUMNS
from pipelines import fingerprint
from pipelines.batch_config import BatchQAConfig
from pipelines.documents_cache import sweep_staged
from pipelines.documents_input import (
    NO_FILES, DocumentSource, PathFilter, document_rows, first_file_to_read, read_questions,
)
from pipelines.input_plan import InputPlan, check_output, committed_state, output_schema


def plan_documents(cfg: BatchQAConfig, source: DocumentSource, start_ray: Callable[[BatchQAConfig], object]) -> InputPlan:
    """The plan of a documents input (module doc); ``start_ray`` starts Ray (the job's way) unless it runs."""
    import ray

    done_files = check_output(cfg)
    sweep_staged(cfg)
    questions = read_questions(cfg)
    start_ray(cfg)
    questions_ref = ray.put(questions) if questions is not None else None
    present: set[str] = set()

    def changed_of(out_fs: object, done: pa.Array, retry: pa.Array) -> pa.Array:
        """The done ids whose file (or question, or settings) changed; ``present`` gets the ids whose file is there."""
        current = _fingerprints(cfg, source, [*done.to_pylist(), *retry.to_pylist()], questions_ref)
        present.update(current)
        recorded = fingerprint.recorded_fingerprints(out_fs, done_files, done)
        return pa.array([i for i, fp in current.items() if i in recorded and recorded[i] != fp], pa.string())

    done, redo = committed_state(cfg, done_files, changed_of, lambda: pa.array(sorted(present), pa.string()))
    skip = set(done.to_pylist())
    keep = PathFilter(source.root, source.pattern, skip)
    listed, to_read = first_file_to_read(source, keep)
    if not listed:
        raise ValueError(f"input {cfg.input}: {NO_FILES}")
    rows = document_rows(cfg, source, source.paths, keep, questions_ref) if to_read else None
    schema = DOCUMENT_COLUMNS if questions is None else DOCUMENT_COLUMNS.append(pa.field("question", pa.string()))
    skipped = sum(1 for i in skip & present if source.includes(i))
    # Rows in: counted as they stream (None) unless nothing is left to read.
    return InputPlan(schema=schema, total_rows=None if to_read else skipped, committed_ids=done,
                     skipped=skipped, output_schema=output_schema(cfg, schema), redo_ids=redo, documents=rows)


def _fingerprints(cfg: BatchQAConfig, source: DocumentSource, ids: list[str], questions: object) -> dict[str, str]:
    """id -> the fingerprint this run gives the document ``id`` (its file read, hashed and converted through
    the cache, as the job's stages do), for the ids whose file is still there."""
    if not ids:
        return {}
    rows = document_rows(cfg, source, [source.path_of(i) for i in ids], None, questions)  # the missing left out
    rows = rows.map_batches(fingerprint.add_fingerprints, fn_kwargs=dict(question=fingerprint.job_question(cfg),
                                                                         key=fingerprint.answer_key(cfg)),
                            batch_format="pyarrow", batch_size=None)
    out: dict[str, str] = {}
    for batch in rows.select_columns(["id", fingerprint.COLUMN]).iter_batches(batch_format="pyarrow", batch_size=4096):
        out.update(zip(batch.column("id").to_pylist(), batch.column(fingerprint.COLUMN).to_pylist()))
    return out
