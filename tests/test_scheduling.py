"""The order make test hands files to its workers (tests/scheduling.py)."""

from __future__ import annotations

import json

from tests.scheduling import DURATIONS, load_durations, longest_first


def test_files_run_longest_first_and_unknown_files_before_all():
    """Files sort by measured seconds, longest first; a file without a figure goes first; ties keep their order."""
    durations = {"a.py": 1.0, "b.py": 30.0, "c.py": 1.0, "d.py": 0.0}
    assert longest_first(["a.py", "b.py", "new.py", "c.py", "d.py"], durations) == \
        ["new.py", "b.py", "a.py", "c.py", "d.py"]


def test_the_committed_durations_name_files_that_exist():
    """Every file in tests/file_durations.json exists and has a non-negative figure (--write-file-durations drops
    a removed or renamed file)."""
    durations = load_durations()
    assert durations and durations == json.loads(DURATIONS.read_text())
    root = DURATIONS.parent.parent
    assert [f for f in durations if not (root / f).is_file()] == []
    assert all(s >= 0 for s in durations.values())
