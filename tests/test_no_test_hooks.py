"""No test or benchmark machinery in product code: no fault switch read from the environment, no
argument or attribute that only a test or a benchmark uses. Tests inject faults through seams a
user could use too (an engine or a reward passed in) or patch in the test itself.

The rules: (1) no environment variable named for tests or faults; (2) no comment or docstring
saying something is for tests; (3) every public function, class and method of product code is
named by product code (outside its definition, imports and ``__all__``), by the docs or by a
deployment file: an API that only tests or benchmarks call is a test hook."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("memagent", "pipelines", "flows", "memagent_cli")
# Where a user-facing name may be the only use: the docs and the files that deploy the flows.
DOCS = ("README.md", "docs/*.md", "prefect.yaml", "infra/**/*.yaml", "Makefile")

WORD = re.compile(r"\w+")
HOOKS = {
    # A variable name with TEST or FAULT as one of its words (not AWS_DEFAULT_REGION).
    "a fault switch in the environment": re.compile(r"\b(?:[A-Z0-9]+_)*(?:TESTS?|FAULTS?)(?:_[A-Z0-9]+)+\b"
                                                     r"|\b(?:[A-Z0-9]+_)+(?:TESTS?|FAULTS?)\b"),
    "a test-only argument or comment": re.compile(r"\b(?:tests? only|(?<!-)only (?:for )?tests|for tests"
                                                  r"|tests? swaps? in|for testing)\b", re.IGNORECASE),
}


def public_definitions(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of every public top-level function and class, and every public method."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            out.append((node.lineno, node.name))
        if isinstance(node, ast.ClassDef):
            out += [(m.lineno, f"{node.name}.{m.name}") for m in node.body
                    if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and not m.name.startswith("_")]
    return out


def without_imports(text: str) -> str:
    """``text`` without its import statements and ``__all__``: a re-export is not a use."""
    lines = text.splitlines()
    drop: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        exported = isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
        if isinstance(node, (ast.Import, ast.ImportFrom)) or exported:
            drop.update(range(node.lineno - 1, node.end_lineno or node.lineno))
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def unused_apis(sources: dict[str, str], docs: str) -> list[str]:
    """``path:line name`` of each public definition in ``sources`` that nothing but its definition names."""
    uses = Counter(WORD.findall("\n".join(without_imports(text) for text in sources.values())))
    documented = set(WORD.findall(docs))
    return [f"{path}:{line} {name}" for path, text in sources.items()
            for line, name in public_definitions(ast.parse(text))
            if uses[name.rsplit(".", 1)[-1]] <= 1 and name.rsplit(".", 1)[-1] not in documented]


def hooks_in(text: str) -> list[tuple[int, str, str]]:
    """(line, kind, match) for every hook pattern found in ``text``."""
    found = []
    for kind, pattern in HOOKS.items():
        for m in pattern.finditer(text):
            found.append((text.count("\n", 0, m.start()) + 1, kind, m.group(0)))
    return sorted(found)


def test_product_code_has_no_test_hooks():
    """No product file holds a fault switch or a test-only comment."""
    found = [f"{path.relative_to(ROOT)}:{line}: {kind}: {match!r}"
             for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))
             for line, kind, match in hooks_in(path.read_text())]
    assert not found, "test machinery in product code:\n" + "\n".join(found)


def test_every_public_api_is_used_by_the_product_or_documented():
    """Each public function, class and method is named by product code, the docs or a deployment file."""
    sources = {str(path.relative_to(ROOT)): path.read_text()
               for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))}
    docs = "\n".join(p.read_text() for pattern in DOCS for p in sorted(ROOT.glob(pattern)))
    found = unused_apis(sources, docs)
    assert not found, "public API only tests or benchmarks use (make it real and documented, or remove it):\n" + \
        "\n".join(found)


def test_the_scan_finds_each_kind_of_hook():
    """Each rule finds its kind of hook in a sample and nothing in look-alikes."""
    sample = '''
KILL_AT = "MEMAGENT_FAULT_TRAIN_KILL_AT"
crash = os.environ.get("MEMAGENT_TEST_CRASH")
def run(rows, accept_rule=accept_sampled):  # tests swap in a wrong rule
    """seed: for tests only."""
'''
    kinds = {kind for _, kind, _ in hooks_in(sample)}
    assert kinds == set(HOOKS)
    assert [line for line, _, _ in hooks_in(sample)] == [2, 3, 4, 5]
    assert hooks_in('DEFAULT_MODEL = "smollm2-135m"  # the tests use it too\nAWS_DEFAULT_REGION\n'
                    '"CPU-only tests: see make test-fast"\n') == []
    lib = "def used(): ...\ndef hook(): ...\nclass Stats:\n    def record(self): ...\n    def snapshot(self): ...\n"
    user = "from lib import hook, used\n__all__ = ['hook']\nused()\nStats().record()\n"
    assert unused_apis({"lib.py": lib, "user.py": user}, docs="") == ["lib.py:2 hook", "lib.py:5 Stats.snapshot"]
    assert unused_apis({"lib.py": lib, "user.py": user}, docs="`hook()` and `snapshot()`") == []
