"""The order test files run in under ``make test``: longest first.

``make test`` gives whole files to two pytest-xdist workers (``--dist loadfile``) in collection order
(``--no-loadscope-reorder``; xdist's own order puts files with many tests first, so the few long
end-to-end files came last and one worker ran them alone while the other sat idle). Sorting files by
their measured duration, longest first, is the classic longest-processing-time schedule: the files
left at the end are the short ones, and both workers finish together.

The durations live in tests/file_durations.json (seconds per file, from a ``make test`` run);
``pytest ... --write-file-durations`` updates the files it ran. A file not listed there runs first,
so a new long file never lands at the end; a stale figure costs time, never a result.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("file_durations.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--write-file-durations", action="store_true",
                     help=f"write each test file's summed duration to {DURATIONS.name} (the order make test runs)")


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    return json.loads(path.read_text()) if path.is_file() else {}


def longest_first(files: list[str], durations: dict[str, float]) -> list[str]:
    """``files`` sorted by duration, longest first; unknown files before all, ties in their given order."""
    unknown = float("inf")
    return sorted(files, key=lambda f: -durations.get(f, unknown))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    by_file: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_file[item.nodeid.split("::", 1)[0]].append(item)
    order = longest_first(list(by_file), load_durations())
    items[:] = [item for f in order for item in by_file[f]]


class _Recorder:
    """Sums each file's setup, call and teardown durations (on the controller, workers' reports included)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput") or not self.seconds:
            return  # an xdist worker: the controller writes
        # A subset run updates its files; a removed or renamed file's figure goes.
        merged = {**load_durations(), **{f: round(s, 1) for f, s in self.seconds.items()}}
        merged = {f: s for f, s in merged.items() if (session.config.rootpath / f).is_file()}
        DURATIONS.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--write-file-durations"):
        config.pluginmanager.register(_Recorder(), "file-durations-recorder")
