"""No test or benchmark machinery in product code: no fault switch read from the environment, no
argument or attribute that only a test or a benchmark uses. Tests inject faults through seams a
user could use too (an engine or a reward passed in) or patch in the test itself."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("memagent", "pipelines", "flows", "memagent_cli")

HOOKS = {
    # A variable name with TEST or FAULT as one of its words (not AWS_DEFAULT_REGION).
    "a fault switch in the environment": re.compile(r"\b(?:[A-Z0-9]+_)*(?:TESTS?|FAULTS?)(?:_[A-Z0-9]+)+\b"
                                                     r"|\b(?:[A-Z0-9]+_)+(?:TESTS?|FAULTS?)\b"),
    "a test-only argument or comment": re.compile(r"\b(?:tests? only|(?<!-)only (?:for )?tests|for tests"
                                                  r"|tests? swaps? in|for testing)\b", re.IGNORECASE),
    # Names of hooks that were taken out (tests monkeypatch; benchmarks read the DEBUG log).
    "a removed test or benchmark hook": re.compile(r"\b(?:accept_rule|decode_log|LoopStats)\b"),
}


def hooks_in(text: str) -> list[tuple[int, str, str]]:
    """(line, kind, match) for every hook pattern found in ``text``."""
    found = []
    for kind, pattern in HOOKS.items():
        for m in pattern.finditer(text):
            found.append((text.count("\n", 0, m.start()) + 1, kind, m.group(0)))
    return sorted(found)


def test_product_code_has_no_test_hooks():
    found = [f"{path.relative_to(ROOT)}:{line}: {kind}: {match!r}"
             for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))
             for line, kind, match in hooks_in(path.read_text())]
    assert not found, "test machinery in product code:\n" + "\n".join(found)


def test_the_scan_finds_each_kind_of_hook():
    sample = '''
KILL_AT = "MEMAGENT_FAULT_TRAIN_KILL_AT"
crash = os.environ.get("MEMAGENT_TEST_CRASH")
def run(rows, accept_rule=accept_sampled):  # tests swap in a wrong rule
    """seed: for tests only."""
    self.decode_log = deque()
'''
    kinds = {kind for _, kind, _ in hooks_in(sample)}
    assert kinds == set(HOOKS)
    assert [line for line, _, _ in hooks_in(sample)] == [2, 3, 4, 4, 5, 6]
    assert hooks_in('DEFAULT_MODEL = "smollm2-135m"  # the tests use it too\nAWS_DEFAULT_REGION\n'
                    '"CPU-only tests: see make test-fast"\n') == []
