"""Data flows one way: memagent/ never imports Ray, Prefect or the layers above it; pipelines/
never imports Prefect; nothing below the command line imports it."""

from __future__ import annotations

import subprocess
import sys


def imported(packages: tuple[str, ...], forbidden: set[str]) -> str:
    """Import every module of ``packages`` in a fresh interpreter; the forbidden roots it pulled in."""
    code = (
        "import pkgutil, importlib, sys\n"
        f"for name in {packages!r}:\n"
        "    pkg = importlib.import_module(name)\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, name + '.'):\n"
        "        importlib.import_module(m.name)\n"
        f"print(','.join(sorted(n for n in sys.modules if n.split('.')[0] in {forbidden!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_memagent_imports_no_ray_or_prefect():
    bad = imported(("memagent",), {"ray", "prefect", "pipelines", "flows", "memagent_cli"})
    assert bad == "", f"memagent imported: {bad}"


def test_pipelines_import_no_prefect_and_nothing_imports_the_command_line():
    bad = imported(("memagent", "pipelines"), {"prefect", "flows", "memagent_cli"})
    assert bad == "", f"pipelines/memagent imported: {bad}"
