"""Checkpoint logs beside a batch output: a long document resumes inside itself.

While an actor reads a document, its read's state (:class:`memagent.agent.ReadState`) is
appended to a log under the output, every ``checkpoint_every_steps`` memory updates or
``checkpoint_every_s`` seconds, whichever comes first::

    OUTPUT/_progress/<sha256(id)[:32]>/00000000-00000010.json   steps 0..9, the state after step 9
                                       00000010-00000020.json   steps 10..19, the state after 19

Each segment holds only its own steps (a few KB whatever the document's length). Local disk writes
a hidden file and renames it; on S3 pyarrow completes the upload even when a write fails half way
(apache/arrow#40502), so a cut segment can land, and only the replay's check of each segment keeps
it out (the segments before it are used). When a task is
retried (actor or node death) or the job is rerun, the actor replays the row's log and the read
goes on from its next chunk (:func:`memagent.agent.read_document` ``resume=``). A log is keyed
by the row's input fingerprint (question, context, model, agent config) and the decoding stack
(:func:`pipelines.fingerprint.decode_parts`): a log written for another input, config or stack is
stale, counted in the row (``checkpoint_ignored``, naming the part that differed) and removed,
never used. A malformed segment is named in a warning; the segments before it are used.

Each segment names its writer (an *attempt*: one read of the row) and the attempt it continued.
Two attempts at one row (a zombie task) may write from the same step: :func:`memagent.checkpoint.resume_path`
follows one writer's resume path, and the others' segments are dropped and counted. A read that refuses its
resumed state (``ResumeMismatch``) starts a new read, and its writer removes the refused log first
(:class:`CheckpointWriter`), so two cuts never mix.

A log is removed once its row is committed as done: the driver sweeps the output's new files
while the job writes (:class:`Sweeper`) and once at its end, and a rerun's plan removes the logs
of ids already done (a driver killed between commit and sweep). Rows written as infrastructure
errors keep their logs: the rerun that redoes them resumes; a run's end removes every other log
(:func:`remove_stray`). ``memagent repair-output`` removes what is left of ids that are done.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable

import pyarrow.fs as pafs

from memagent.agent import ReadState
from memagent.checkpoint import BadSegment, Segment, new_segment, resume_path, parse_segment, replay
from pipelines import commit_rules, storage, storage_errors
from pipelines.storage import S3Options

log = logging.getLogger(__name__)

PROGRESS_DIR = "_progress"  # "_": never read as input or as output rows
_SEGMENT = re.compile(r"^(\d{8})-(\d{8})\.json$")

OnState = Callable[[ReadState], Awaitable[None]]


def log_key(row_id: str) -> str:
    """The directory name of a row's log (:func:`pipelines.storage.row_key`)."""
    return storage.row_key(row_id)


class CheckpointLog:
    """The checkpoint logs of one output (used inside the actors; every call is blocking I/O)."""

    def __init__(self, output: str, s3: S3Options | None, every_steps: int, every_s: float):
        self.fs, path = storage.filesystem(output, s3)
        self.root = f"{path.rstrip('/')}/{PROGRESS_DIR}"
        self.local = storage.is_local(self.fs)
        self.every_steps, self.every_s = every_steps, every_s
        self.bytes_written = 0
        self.segments_written = 0
        self.tips: dict[str, str] = {}  # row id -> the attempt that wrote the last segment its last load used

    def _dir(self, row_id: str) -> str:
        return f"{self.root}/{log_key(row_id)}"

    def load(self, row_id: str, key: str) -> tuple[ReadState | None, str | None]:
        """The state the row's log ends in (None: no usable log) and why a log was not (fully) used."""
        found = self.load_resume_path(row_id, key)
        return found.state, found.reason

    def load_resume_path(self, row_id: str, key: str) -> Loaded:
        """The row's log read back: its resume path (:func:`memagent.checkpoint.resume_path`), the rest removed."""
        directory = self._dir(row_id)
        files = self.fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True))
        names = sorted((f.base_name for f in files if _SEGMENT.match(f.base_name)), key=lambda n: int(n[:8]))
        if not names:
            return Loaded(None, None)
        read: dict[str, Segment] = {}
        reason = None
        for name in names:
            try:
                with self.fs.open_input_stream(f"{directory}/{name}") as f:
                    read[name] = parse_segment(f.read())
            except (BadSegment, UnicodeDecodeError) as exc:  # an OSError is the store's, not the segment's: raised
                reason = f"checkpoint {directory}/{name} is unreadable ({exc}); using the steps before it"
                log.warning("row %s: %s", row_id, reason)
                break
        path, rest = resume_path(list(read.values()))
        state, why = replay(path, row_id, key)
        other = next((s for s in read.values() if s.id != row_id or s.key != key), None)
        if other is not None:
            from pipelines.fingerprint import key_difference

            state, why = None, f"written for another input or config (stale: {key_difference(other.key, key)} differed)"
        reason = why or reason
        if state is None:  # stale or unreadable from the first segment: start over, and never read it again
            self.remove(row_id)
            return Loaded(None, reason or "unreadable")
        if rest:
            log.warning("row %s: %d checkpoint segment(s) off the resume path dropped (another attempt's, "
                        "or past a gap)", row_id, len(rest))
        # Segments off the resume path (another attempt's, past a gap or a bad one) would be misread next time.
        on_path = {id(c) for c in path}  # by identity, in one pass: a log may hold thousands of segments
        for name in names:
            if id(read.get(name)) not in on_path:
                try:
                    self.fs.delete_file(f"{directory}/{name}")
                except OSError as exc:  # left, it is off the path next time too: never worth a re-read
                    log.warning("row %s: could not remove checkpoint %s (%s)", row_id, name, exc)
        self.tips[row_id] = path[-1].attempt
        return Loaded(state, reason, tip=path[-1].attempt)

    def write(self, row_id: str, key: str, state: ReadState, first_step: int, *, attempt: str = "",
              parent: str | None = None) -> int:
        """Append the segment taking the log from ``first_step`` steps to ``state``; bytes written."""
        directory = self._dir(row_id)
        segment = new_segment(row_id, key, state, first_step, attempt=attempt, parent=parent)
        data = json.dumps(segment, ensure_ascii=False).encode()
        name = f"{directory}/{first_step:08d}-{len(state.steps):08d}.json"

        def put(target: str) -> None:
            with self.fs.open_output_stream(target) as f:
                f.write(data)
        storage.atomic_put(self.fs, name, put, uuid.uuid4().hex[:8])
        self.bytes_written += len(data)
        self.segments_written += 1
        return len(data)

    def remove(self, row_id: str) -> None:
        self.fs.delete_dir_contents(self._dir(row_id), missing_dir_ok=True)
        if self.local:
            try:
                self.fs.delete_dir(self._dir(row_id))
            except (FileNotFoundError, OSError):
                pass

    def resume_args(self, row_id: str, key: str) -> dict:
        """``answer_row``'s checkpoint arguments for one read: the state to resume, a writer, why a log was not used."""
        for tries in (1, 2):  # a failed listing or read is the store's hiccup: once more, then from the start
            try:
                found = self.load_resume_path(row_id, key)
                break
            except OSError as exc:  # an unreadable _progress/ costs a re-read, never the row
                log.warning("row %s: could not read its checkpoints (%s)%s", row_id, exc,
                            "; reading it from the start" if tries == 2 else "; trying again")
                found = Loaded(None, f"unreadable: {exc}")
        return dict(resume=found.state, on_state=self.writer(row_id, key, found.state, found.tip),
                    checkpoint_ignored=found.reason)

    def writer(self, row_id: str, key: str, resumed: ReadState | None, parent: str | None = None) -> CheckpointWriter:
        """``on_state`` for one read: appends a segment every ``every_steps`` updates or ``every_s`` seconds.

        ``parent``: the attempt whose segment ``resumed`` ends with (:attr:`Loaded.tip`; by default, the
        tip this log's last load of the row found)."""
        return CheckpointWriter(self, row_id, key, resumed, parent if parent is not None else self.tips.get(row_id))


@dataclass(frozen=True)
class Loaded:
    """A row's log read back: the state, why (part of) it was not used, its last writer."""

    state: ReadState | None
    reason: str | None
    tip: str | None = None


class CheckpointWriter:
    """``on_state`` of one read (one attempt): appends its segments after the state it resumed from.

    A state that does not extend the previous one is a new read (``answer_row`` refused the resumed
    state and reads from chunk 0): the log is removed and the writer starts again at step 0 under a new
    attempt, so a refused log is refused whole and never mixed with the fresh read.
    """

    def __init__(self, checkpoints: CheckpointLog, row_id: str, key: str, resumed: ReadState | None,
                 parent: str | None):
        self.checkpoints, self.row_id, self.key = checkpoints, row_id, key
        self.attempt = uuid.uuid4().hex[:12]
        self.written = len(resumed.steps) if resumed else 0
        self.parent = parent if self.written else None
        self.seen: tuple = resumed.steps if resumed else ()
        self.last = time.monotonic()
        self.off = False  # the refused log could not be removed: no checkpoints for this read

    def _restarted(self, state: ReadState) -> bool:
        n = len(self.seen)
        return n > 0 and (len(state.steps) <= n or state.steps[n - 1] != self.seen[-1])

    async def _restart(self) -> None:
        self.attempt, self.written, self.parent = uuid.uuid4().hex[:12], 0, None
        try:
            await asyncio.to_thread(self.checkpoints.remove, self.row_id)
        except OSError as exc:  # appending to the refused log would mix two reads: write none
            log.warning("row %s: could not remove a refused checkpoint (%s); no checkpoints this read",
                        self.row_id, exc)
            self.off = True

    async def __call__(self, state: ReadState) -> None:
        if self._restarted(state):
            await self._restart()
        self.seen = state.steps
        checkpoints = self.checkpoints
        due = (len(state.steps) - self.written >= checkpoints.every_steps
               or time.monotonic() - self.last >= checkpoints.every_s)
        if self.off or not due or len(state.steps) == self.written:
            return
        try:
            await asyncio.to_thread(checkpoints.write, self.row_id, self.key, state, self.written, attempt=self.attempt,
                                    parent=self.parent)
        except OSError as exc:  # a lost checkpoint costs re-reading, never the row
            log.warning("row %s: could not write a checkpoint at step %d (%s)", self.row_id, len(state.steps), exc)
            return
        self.written, self.last, self.parent = len(state.steps), time.monotonic(), None


def remove_logs(output: str, s3: S3Options | None, ids: Iterable[str]) -> int:
    """Remove the logs of ``ids`` (rows committed as done); how many there were."""
    fs, path = storage.filesystem(output, s3)
    root = f"{path.rstrip('/')}/{PROGRESS_DIR}"
    with storage_errors.output_errors(output, s3):
        present = {f.base_name for f in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
                   if f.type == pafs.FileType.Directory}
        if not present:
            return 0
        removed = 0
        for key in {log_key(i) for i in ids} & present:
            fs.delete_dir_contents(f"{root}/{key}", missing_dir_ok=True)
            try:
                fs.delete_dir(f"{root}/{key}")
            except OSError:
                pass  # S3 has no directories: nothing left to delete
            removed += 1
    return removed


def remove_stray(output: str, s3: S3Options | None, keep_ids: Iterable[str]) -> int:
    """At a run's end: remove every log but those of ``keep_ids`` (rows a rerun redoes), and the
    hidden files of torn local writes; how many logs went. What is left is what resumes."""
    fs, path = storage.filesystem(output, s3)
    root = f"{path.rstrip('/')}/{PROGRESS_DIR}"
    keep = {log_key(i) for i in keep_ids}
    gone: set[str] = set()
    with storage_errors.output_errors(output, s3):
        for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True, recursive=True)):
            key = info.path[len(root) + 1:].split("/", 1)[0]
            if info.type == pafs.FileType.File and (key not in keep or info.base_name.startswith(".")):
                fs.delete_file(info.path)
                if key not in keep:
                    gone.add(key)
        if storage.is_local(fs):  # the directories left empty (S3 has none)
            for info in fs.get_file_info(pafs.FileSelector(root, allow_not_found=True)):
                if info.type == pafs.FileType.Directory and info.base_name not in keep:
                    fs.delete_dir(info.path)
            if fs.get_file_info(root).type == pafs.FileType.Directory and not fs.get_file_info(
                    pafs.FileSelector(root)):
                fs.delete_dir(root)
    return len(gone)


def committed_ids(fs: pafs.FileSystem, file: str) -> list[str]:
    """Ids of a written output file's rows that are done (not infrastructure errors); [] while it is written."""
    return commit_rules.committed_rows(fs, file, ["id"]).column("id").to_pylist()


class Sweeper:
    """While the job writes, remove the logs of rows in output files that appeared since it started."""

    def __init__(self, output: str, s3: S3Options | None, every_s: float = 30.0):
        self.output, self.s3, self.every_s = output, s3, every_s
        self.fs, self.path = storage.filesystem(output, s3)
        with storage_errors.output_errors(output, s3):  # files before this run: swept by the plan
            self.seen = set(storage.output_files(self.fs, self.path))
        self.removed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memagent-checkpoint-sweeper", daemon=True)

    def __enter__(self) -> Sweeper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if exc[0] is None:
            self.sweep()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.sweep()
            except Exception as exc:  # noqa: BLE001 - logs left are swept by the next run
                log.warning("output %s: checkpoint sweep failed (%s)", self.output, exc)

    def sweep(self) -> None:
        ids: list[str] = []
        with storage_errors.output_errors(self.output, self.s3):
            for file in storage.output_files(self.fs, self.path):  # one level: the writer's files
                if file in self.seen:
                    continue
                try:
                    done = committed_ids(self.fs, file)
                except OSError as exc:  # its logs stay until a later sweep (or the next run's plan) reads it
                    log.warning("output %s: could not read %s to sweep its rows' checkpoints (%s)", self.output,
                                file, exc)
                    continue
                if done or storage.has_footer(self.fs, file):
                    self.seen.add(file)
                    ids.extend(done)
        if ids:
            self.removed += remove_logs(self.output, self.s3, ids)
