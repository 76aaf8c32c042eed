"""The docs name the code that is there: every module the README's layout or docs/serve.md names exists, and
every module of the product packages is named in the README's layout (memagent/serve's in docs/serve.md too)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("memagent", "pipelines", "flows", "memagent_cli")
MODULE = re.compile(r"\b(\w+)\.py\b")


def layout_block(readme: str) -> list[str]:
    section = readme.split("\n## Layout\n", 1)[1]
    return section.split("```\n", 2)[1].splitlines()


def layout_modules(lines: list[str]) -> set[str]:
    """Paths of the modules the layout names: a line opening with ``name/`` opens that package inside the package
    open above it; a line indented no deeper than an open package's line closes it; every ``x.py`` on a line
    belongs to the package open there (a continuation line is indented deeper than its package's line)."""
    open_packages: list[tuple[int, str]] = []  # (indent, path) of package lines, outermost first
    named = set()
    for line in lines:
        indent = len(line) - len(line.lstrip())
        while open_packages and open_packages[-1][0] >= indent:
            open_packages.pop()
        opened = re.match(r"\s*(\w+)/(\s|$)", line)
        if opened:
            parent = open_packages[-1][1] + "/" if open_packages else ""
            open_packages.append((indent, parent + opened.group(1)))
        if open_packages:
            named |= {f"{open_packages[-1][1]}/{m}.py" for m in MODULE.findall(line)}
    return named


def package_modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
            if not p.name.startswith("__") and "samples" not in p.parts}


def test_layout_parser_reads_nesting():
    """Names belong to the innermost package open on or above their line, and a package closes at its dedent."""
    lines = ["top/   a.py", "  sub/  b.py, c.py", "        d.py", "  e.py", "other/ f.py"]
    assert layout_modules(lines) == {"top/a.py", "top/sub/b.py", "top/sub/c.py", "top/sub/d.py", "top/e.py",
                                     "other/f.py"}


def test_readme_layout_names_every_module_and_only_modules_that_exist():
    """Every product module is in the README's layout, and every module it names is a file."""
    named = layout_modules(layout_block((ROOT / "README.md").read_text()))
    assert sorted(m for m in named if not (ROOT / m).is_file()) == []
    assert sorted(package_modules() - named) == []


def test_serve_doc_lists_the_serve_package():
    """docs/serve.md's module list of memagent/serve/ is the package's modules, no more, no fewer."""
    text = (ROOT / "docs" / "serve.md").read_text()
    listed = re.search(r"`memagent/serve/` \(one job a module: ([^)]*)\)", text)
    assert listed, "docs/serve.md lost its module list of memagent/serve/"
    names = set(re.findall(r"`(\w+)`", listed.group(1)))
    assert names == {p.stem for p in (ROOT / "memagent" / "serve").glob("*.py") if not p.name.startswith("__")}
