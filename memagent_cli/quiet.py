"""A quiet console: the job's own lines, the table and the summary; Ray's chatter only under ``-v``.

Nothing is lost: Ray's log files keep everything, and ``-v`` shows it on the console too. Only
commands that may start Ray (``starts_ray``, set beside their Ray job flags) have their stderr
filtered (:func:`known_lines_dropped`); every other command writes to the terminal itself.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

# Ray's notices that are known and harmless for this command, as (logger, why).
_QUIET_LOGGERS = {
    # Said on each dataset when the job runs with --no-progress (JobConfig.progress False).
    "ray.data._internal.progress": "progress bars disabled",
    # A local Ray started by the command is reached over loopback only.
    "ray._private.authentication.authentication_token_setup": "token authentication is on",
}

# Lines the Ray core worker (C++) writes straight to this process's stderr, as (pattern, why).
# Ray Data passes its map transformer and DataContext to every pool actor as object refs and holds
# them for the whole job, so a restarted actor finds them (the actor-kill tests prove it); the
# job must keep max_restarts > 0 to survive an actor's death, so the warning fires for every actor.
_QUIET_LINES = re.compile(
    rb"core_worker\.cc:\d+: Actor with class name: .* has constructor arguments in the object store "
    rb"and max_restarts > 0")


def quiet_ray(verbose: bool) -> None:
    """Ray's own INFO lines (a local Ray started, each dataset's execution) only under ``-v``.

    Its console handlers go to WARNING, so warnings still show and its log files keep everything;
    under ``-v`` they show INFO, as Ray sets them up. (``ray.init``'s ``logging_level`` would do
    for the "ray" logger only, and resets on each init.)
    """
    import ray.data  # noqa: F401 - configures Ray's and Ray Data's handlers (the parser has imported it)

    for name in ("ray", "ray.data"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.setLevel(logging.INFO if verbose else logging.WARNING)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.ERROR)


@contextmanager
def known_lines_dropped(fd: int = 2) -> Iterator[None]:
    """Drop the known, harmless lines that Ray's C++ core worker writes to ``fd`` (stderr).

    They bypass Python's logging, so the descriptor itself goes through a pipe: a thread copies
    every other line to the real stderr as it comes, and a partial line at once unless it may be
    such a log line (a progress bar redrawn with ``\\r`` shows as it is drawn). On exit the
    descriptor is restored and the pipe drained; a child that still holds the pipe keeps being
    copied while this process lives. The copier closes its copy of the real stderr when the pipe ends.
    """
    sys.stderr.flush()
    saved = os.dup(fd)
    read_end, write_end = os.pipe()
    os.dup2(write_end, fd)
    os.close(write_end)
    copier = threading.Thread(target=_copy_lines, args=(read_end, saved), daemon=True, name="stderr-filter")
    copier.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, fd)  # closes the pipe's last write end held here: the copier drains to EOF
        copier.join(timeout=2)


def _copy_lines(read_end: int, out: int) -> None:
    pending = b""
    try:
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                *lines, pending = (pending + chunk).split(b"\n")
                kept = b"".join(line + b"\n" for line in lines if not _QUIET_LINES.search(line))
                if not _may_be_log_line(pending):
                    kept, pending = kept + pending, b""
                if kept:
                    os.write(out, kept)
        if pending and not _QUIET_LINES.search(pending):
            os.write(out, pending)
    finally:
        os.close(out)


def _may_be_log_line(partial: bytes) -> bool:
    """Whether an unfinished line may become a core-worker log line (they start with ``[``, after any ``\\r``)."""
    return partial.rpartition(b"\r")[2].startswith(b"[")
