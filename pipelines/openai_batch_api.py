"""``/v1/files`` and ``/v1/batches`` of ``memagent serve``: OpenAI's Batch API over :mod:`pipelines.openai_batch`.

Every file and every batch's state is a JSON or data file under the storage root (nothing only in
memory): a server killed mid-batch and started again on the same root picks each unfinished batch up
(:meth:`BatchService.start`) and answers only its lines not answered yet. A batch keeps its own copy of
its input file, taken at creation (``batches/<id>/input.jsonl``): deleting the file under a running batch
changes nothing, before a restart or after. One batch runs at a time, in a background thread, in the
order created. Attached to the server's event loop (:meth:`BatchService.attach`, ``memagent serve`` does it at
startup), the lines run on the server's own engine there: one copy of the model, and lines batched with the live
requests by the engine's batcher.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import threading
import uuid
from collections.abc import Coroutine
from typing import Any

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import Response

from memagent.serve.handling import load_body
from memagent.serve.protocol import APIError
from pipelines.openai_batch import ENDPOINT, BatchRunConfig, Store, duplicate_ids, jsonl, now, run_requests

log = logging.getLogger(__name__)

ACTIVE = ("validating", "in_progress", "finalizing", "cancelling")
DAY_S = 24 * 3600
CREATE_FIELDS = frozenset({"input_file_id", "endpoint", "completion_window", "metadata"})


class BatchService:
    """Files and batches under ``root``; batches run by the batch job with ``cfg`` (chat lines on ``engine``)."""

    def __init__(self, root: str, cfg: BatchRunConfig, *, engine: Any = None, build_engine: Any = None):
        self.store, self.cfg, self.engine, self.build_engine = Store(root, cfg.s3), cfg, engine, build_engine
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.lock = threading.Lock()  # batch.json read-modify-writes
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Answer lines on ``loop``, the server's, where ``engine`` (the server's engine) is driven: a second event
        loop would need a second engine, a second copy of the weights on the GPU."""
        self.loop = loop

    def _on_loop(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` to its end: on the attached loop (from the runner's thread), else on a loop of its own."""
        if self.loop is None:
            asyncio.run(work)
        else:
            asyncio.run_coroutine_threadsafe(work, self.loop).result()

    # --- files ---------------------------------------------------------------------------------
    def add_file(self, data: bytes, filename: str, purpose: str) -> dict:
        meta = {"id": f"file-{uuid.uuid4().hex[:24]}", "object": "file", "bytes": len(data), "created_at": now(),
                "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
                "status_details": None}
        self.store.put(f"files/{meta['id']}.data", data)
        self.store.put(f"files/{meta['id']}.json", json.dumps(meta).encode())
        return meta

    def file(self, file_id: str) -> dict:
        return self._record(f"files/{_safe(file_id)}.json", "File", file_id, "file_id", "file_not_found")

    def _record(self, rel: str, kind: str, id_: str, param: str, code: str) -> dict:
        """The JSON record at ``rel``, or OpenAI's 404 for the ``kind`` of object ``id_`` names."""
        raw = self.store.get(rel)
        if raw is None:
            raise APIError(404, f"No such {kind} object: {id_}", param=param, code=code)
        return json.loads(raw)

    def content(self, file_id: str) -> bytes:
        self.file(file_id)
        return self.store.get(f"files/{_safe(file_id)}.data") or b""

    def files(self) -> list[dict]:
        names = [n[:-5] for n in self.store.names("files") if n.endswith(".json")]
        return sorted((self.file(n) for n in names), key=lambda f: (f["created_at"], f["id"]), reverse=True)

    def delete_file(self, file_id: str) -> dict:
        self.file(file_id)
        self.store.delete(f"files/{_safe(file_id)}.data")
        self.store.delete(f"files/{_safe(file_id)}.json")
        return {"id": file_id, "object": "file", "deleted": True}

    # --- batches -------------------------------------------------------------------------------
    def create(self, body: dict) -> dict:
        if unknown := sorted(set(body) - CREATE_FIELDS):  # as OpenAI answers an unknown argument: a 400 naming it
            raise APIError(400, f"{unknown[0]}: Extra inputs are not permitted (a batch takes "
                           f"{', '.join(sorted(CREATE_FIELDS))})", param=unknown[0])
        endpoint, window = body.get("endpoint"), body.get("completion_window")
        if endpoint != ENDPOINT:
            raise APIError(400, f"endpoint: this server runs batches of {ENDPOINT!r} only, got {endpoint!r}",
                           param="endpoint")
        if window != "24h":
            raise APIError(400, f"completion_window: expected '24h', got {window!r}", param="completion_window")
        meta = body.get("metadata")
        if meta is not None and not (isinstance(meta, dict) and len(meta) <= 16):
            raise APIError(400, "metadata: expected an object of at most 16 keys", param="metadata")
        input_file = self.file(str(body.get("input_file_id")))
        if input_file["purpose"] != "batch":
            raise APIError(400, f"input_file_id: file {input_file['id']} has purpose {input_file['purpose']!r}, "
                           "not 'batch'", param="input_file_id")
        t = now()
        batch = {"id": f"batch_{uuid.uuid4().hex[:24]}", "object": "batch", "endpoint": endpoint, "errors": None,
                 "input_file_id": input_file["id"], "completion_window": window, "status": "validating",
                 "output_file_id": None, "error_file_id": None, "created_at": t, "in_progress_at": None,
                 "expires_at": t + DAY_S, "finalizing_at": None, "completed_at": None, "failed_at": None,
                 "expired_at": None, "cancelling_at": None, "cancelled_at": None,
                 "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": meta}
        # The batch's own copy of its input, taken now as OpenAI's batch takes it at validation: the file deleted
        # under the batch, before or after a restart, changes nothing; written before the batch exists.
        self.store.put(f"batches/{batch['id']}/input.jsonl", self.content(input_file["id"]))
        self._save(batch)
        self.queue.put(batch["id"])
        return batch

    def batch(self, batch_id: str) -> dict:
        return self._record(f"batches/{_safe(batch_id, 'batch_id')}/batch.json", "Batch", batch_id, "batch_id",
                            "batch_not_found")

    def batches(self, after: str | None, limit: int) -> dict:
        all_ = sorted((self.batch(n) for n in self.store.names("batches")), key=lambda b: (b["created_at"], b["id"]),
                      reverse=True)
        if after:
            ids = [b["id"] for b in all_]
            all_ = all_[ids.index(after) + 1:] if after in ids else []
        page = all_[:limit]
        return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None, "has_more": len(all_) > limit}

    def cancel(self, batch_id: str) -> dict:
        with self.lock:
            batch = self.batch(batch_id)
            if batch["status"] in ("completed", "failed", "expired", "cancelled"):
                raise APIError(400, f"batch {batch_id} is {batch['status']}; only a running batch can be cancelled",
                               param="batch_id")
            if batch["status"] != "cancelling":
                batch.update(status="cancelling", cancelling_at=now())
                self._save(batch)
        return batch

    def _save(self, batch: dict) -> None:
        self.store.put(f"batches/{batch['id']}/batch.json", json.dumps(batch).encode())

    def _update(self, batch_id: str, **fields: Any) -> dict:
        with self.lock:
            batch = self.batch(batch_id)
            if batch["status"] == "cancelling" and fields.get("status") in ("in_progress", "finalizing"):
                fields.pop("status")  # a cancel that came in meanwhile wins
            batch.update(fields)
            self._save(batch)
            return batch

    # --- the runner ------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> BatchService:
        """Queue every batch a previous server left unfinished, then start the runner thread (its lines answered on
        ``loop`` when given: :meth:`attach`)."""
        if loop is not None:
            self.attach(loop)
        active = [b for b in (self.batch(n) for n in self.store.names("batches")) if b["status"] in ACTIVE]
        for b in sorted(active, key=lambda b: b["created_at"]):
            self.queue.put(b["id"])
        self.thread = threading.Thread(target=self._loop, name="memagent-batches", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.queue.put(None)

    def _loop(self) -> None:
        while (batch_id := self.queue.get()) is not None:
            try:
                self.run(batch_id)
            except Exception as exc:  # noqa: BLE001 - one batch's failure must not stop the others
                log.exception("batch %s failed", batch_id)
                self._update(batch_id, status="failed", failed_at=now(),
                             errors={"object": "list", "data": [{"code": "batch_failed", "message": str(exc)[:500],
                                                                 "param": None, "line": None}]})

    def run(self, batch_id: str) -> None:
        """Run (or resume) one batch to completed, or to cancelled when a cancel came in."""
        batch = self.batch(batch_id)
        if batch["status"] not in ACTIVE:
            return
        data = self.store.get(f"batches/{batch_id}/input.jsonl")
        if data is None:
            raise RuntimeError(f"the batch's copy of its input (batches/{batch_id}/input.jsonl) is missing")
        if batch["status"] == "validating":
            if duplicates := duplicate_ids(data):  # the batch fails validation, as OpenAI's does
                self._update(batch_id, status="failed", failed_at=now(), errors={"object": "list", "data": duplicates})
                return
            batch = self._update(batch_id, status="in_progress", in_progress_at=now())

        def progress(done: int, total: int) -> None:
            self._update(batch_id, request_counts={**self.batch(batch_id)["request_counts"], "total": total})

        def cancelled() -> bool:
            return self.batch(batch_id)["status"] == "cancelling"

        out, err = run_requests(data, self.store, f"batches/{batch_id}", self.cfg, engine=self.engine,
                                build_engine=self.build_engine, progress=progress, cancelled=cancelled,
                                run=self._on_loop)
        final = "cancelled" if cancelled() else "completed"
        self._update(batch_id, status="finalizing", finalizing_at=now())
        fields = {"status": final, f"{final}_at": now(), "request_counts": {
            "total": self.batch(batch_id)["request_counts"]["total"] or len(out) + len(err),
            "completed": len(out), "failed": len(err)}}
        if out:
            fields["output_file_id"] = self._result_file(batch_id, "output", out)
        if err:
            fields["error_file_id"] = self._result_file(batch_id, "error", err)
        self._update(batch_id, **fields)

    def _result_file(self, batch_id: str, kind: str, lines: list[dict]) -> str:
        meta = self.add_file(jsonl(lines), f"{batch_id}_{kind}.jsonl", "batch_output")
        return meta["id"]


def _safe(name: str, param: str = "file_id") -> str:
    """An id as a path segment; a 400 for one holding anything but ASCII letters, digits, ``-`` and ``_``
    (stripped instead, two ids would name one file, and a path-traversing id another's)."""
    if not name or not all(c.isascii() and (c.isalnum() or c in "-_") for c in name):
        raise APIError(400, f"{param}: {name[:100]!r} is not an id of this server (ids hold only ASCII letters, "
                       "digits, - and _)", param=param, code="invalid_id")
    return name


def batch_router(service: BatchService) -> APIRouter:
    """The routes of OpenAI's Files and Batches APIs over ``service``."""
    router = APIRouter()
    _file_routes(router, service)
    _batch_routes(router, service)
    return router


def _file_routes(router: APIRouter, service: BatchService) -> None:
    @router.post("/v1/files")
    async def upload(file: UploadFile = File(...), purpose: str = Form(...)) -> dict:
        if purpose != "batch":
            raise APIError(400, f"purpose: this server takes files of purpose 'batch' only, got {purpose!r}",
                           param="purpose")
        return service.add_file(await file.read(), file.filename or "upload.jsonl", purpose)

    @router.get("/v1/files")
    async def list_files() -> dict:
        return {"object": "list", "data": service.files(), "has_more": False}

    @router.get("/v1/files/{file_id}")
    async def get_file(file_id: str) -> dict:
        return service.file(file_id)

    @router.get("/v1/files/{file_id}/content")
    async def get_content(file_id: str) -> Response:
        return Response(service.content(file_id), media_type="application/jsonl")

    @router.delete("/v1/files/{file_id}")
    async def delete(file_id: str) -> dict:
        return service.delete_file(file_id)


def _batch_routes(router: APIRouter, service: BatchService) -> None:
    @router.post("/v1/batches")
    async def create(request: Request) -> dict:
        return service.create(load_body(await request.body()))

    @router.get("/v1/batches")
    async def list_batches(after: str | None = None, limit: int = 20) -> dict:
        if not 1 <= limit <= 100:
            raise APIError(400, f"limit: expected 1 to 100, got {limit}", param="limit")
        return service.batches(after, limit)

    @router.get("/v1/batches/{batch_id}")
    async def get_batch(batch_id: str) -> dict:
        return service.batch(batch_id)

    @router.post("/v1/batches/{batch_id}/cancel")
    async def cancel(batch_id: str) -> dict:
        return service.cancel(batch_id)
