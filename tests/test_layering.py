"""Data flows one way: memagent/ never imports Ray, Prefect or the layers above it."""

from __future__ import annotations

import subprocess
import sys


def test_memagent_imports_no_ray_or_prefect():
    code = (
        "import pkgutil, importlib, sys, memagent\n"
        "for m in pkgutil.walk_packages(memagent.__path__, 'memagent.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in {'ray', 'prefect', 'pipelines', 'flows'})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"memagent imported: {out.stdout.strip()}"


def test_pipelines_import_no_prefect_and_nothing_imports_the_command_line():
    code = (
        "import pkgutil, importlib, sys, memagent, pipelines\n"
        "for pkg in (memagent, pipelines):\n"
        "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in {'prefect', 'flows', 'memagent_cli'})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"pipelines/memagent imported: {out.stdout.strip()}"
