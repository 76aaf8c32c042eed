"""The repository stands alone: nothing in it points outside the checkout."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A path that leaves the checkout: the evaluation data beside it, or this machine's layout.
OUTSIDE = re.compile(r"\.\./shared|shared/data|(^|[\s\"'(=:])/work/")


def repo_files() -> list[Path]:
    """Tracked and untracked, not ignored files (what a commit of this tree would hold)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                         cwd=ROOT, capture_output=True, check=True).stdout
    return [ROOT / p for p in out.decode().split("\0") if p and (ROOT / p).is_file()]


def test_no_file_points_outside_the_checkout():
    hits = []
    for path in repo_files():
        if path == Path(__file__).resolve():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary (images, parquet)
        hits += [f"{path.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
                 for n, line in enumerate(text.splitlines(), 1) if OUTSIDE.search(line)]
    assert not hits, "paths outside the checkout:\n" + "\n".join(hits)


def test_shipped_samples_are_package_data():
    """The samples the deployments and examples default to install with the package."""
    from memagent.data.samples import HOTPOTQA_DEV, SQUAD_DEV

    assert HOTPOTQA_DEV.is_file() and SQUAD_DEV.is_file()
    assert (HOTPOTQA_DEV.parent / "SOURCES.md").read_text().count("CC BY-SA 4.0") >= 1
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"memagent.data.samples" = ["*.json", "*.md"]' in pyproject


def test_report_assets_are_package_data():
    """The report page inlines its CSS and JS from files: each must install with the package."""
    import fnmatch
    import tomllib

    from memagent.report import html

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    package = ROOT / "memagent" / "report"
    assets = [p.relative_to(package).as_posix() for p in (package / "assets").iterdir()]
    assert {"assets/report.css", "assets/report.js"} <= set(assets)
    assert all(any(fnmatch.fnmatch(a, g) for g in declared["memagent.report"]) for a in assets), assets
    assert html.CSS.startswith(":root{") and "report-data" in html.JS
