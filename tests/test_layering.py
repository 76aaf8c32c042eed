"""Data flows one way: memagent/ never imports Ray, Prefect or the layers above it; pipelines/
never imports Prefect; nothing below the command line imports it; no import cycle between
modules, nor between subpackages."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


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


# -- no import cycles between project modules -------------------------------------------------
# A cycle makes the import order decide what works (a partially initialised module), and one
# hidden under TYPE_CHECKING or inside a function still couples the two modules both ways, so
# every import statement counts, wherever it sits.

ROOT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = ("memagent", "pipelines", "flows", "memagent_cli")


def project_modules() -> dict[str, Path]:
    """Dotted name -> source file, for every module of the project's packages."""
    modules: dict[str, Path] = {}
    for package in PROJECT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def import_edges(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules that ``name`` imports anywhere in its source (not the implicit parents)."""
    is_package = path.name == "__init__.py"
    edges: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # ``from pkg import sub`` imports the submodule; ``from pkg import name`` the package.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # ``import pkg.mod.Thing``-style: nearest module
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.add(target)
    return edges


def find_cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Per strongly connected component (Tarjan): one cycle in it as a closed path of module
    names, and all its modules (breaking that cycle may leave others among them)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles = []
    for component in components:  # shortest way back to the start, within the component
        start = min(component)
        paths = {start: [start]}
        queue = [start]
        while queue:
            node = queue.pop(0)
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    queue = []
                    cycles.append((paths[node] + [start], sorted(component)))
                    break
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    queue.append(nxt)
    return sorted(cycles)


def test_no_import_cycles_between_project_modules():
    modules = project_modules()
    graph = {name: import_edges(name, path, modules) for name, path in modules.items()}
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(
        f"{' -> '.join(cycle)}  (all of: {', '.join(members)})" for cycle, members in cycles)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with each subpackage as one node (``memagent.engines.hf`` -> ``memagent.engines``);
    a top-level module (``memagent.models``, ``pipelines.worker``) stays a node of its own."""
    unit = lambda name: ".".join(name.split(".")[:2])  # noqa: E731
    packages: dict[str, set[str]] = {unit(name): set() for name in graph}
    for name, targets in graph.items():
        packages[unit(name)].update(unit(t) for t in targets if unit(t) != unit(name))
    return packages


def test_no_import_cycles_between_project_packages():
    # Two subpackages that import each other (even through different modules) are one knot: neither
    # can be read, tested or moved without the other.
    modules = project_modules()
    graph = package_graph({name: import_edges(name, path, modules) for name, path in modules.items()})
    cycles = find_cycles(graph)
    assert not cycles, "package import cycles:\n" + "\n".join(
        f"{' -> '.join(cycle)}  (all of: {', '.join(members)})" for cycle, members in cycles)


def test_package_graph_sees_a_knot_that_no_module_cycle_shows():
    graph = {"m.engines.openai": {"m.data.io"}, "m.data.io": set(), "m.data.filter": {"m.engines"},
             "m.engines": set(), "m.models": set()}
    assert find_cycles(graph) == []
    assert find_cycles(package_graph(graph)) == [(["m.data", "m.engines", "m.data"], ["m.data", "m.engines"])]


def test_cycle_finder_sees_type_checking_and_function_imports(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("def f():\n    from pkg import a\n")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import X\n")
    (package / "b.py").write_text("from . import a\n")
    (package / "c.py").write_text("import pkg.b\n")
    modules = {"pkg": package / "__init__.py", "pkg.a": package / "a.py", "pkg.b": package / "b.py",
               "pkg.c": package / "c.py"}
    graph = {name: import_edges(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg": {"pkg.a"}, "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.b"}}
    assert find_cycles(graph) == [(["pkg.a", "pkg.b", "pkg.a"], ["pkg.a", "pkg.b"])]


def roots_imported(path: Path) -> set[str]:
    """The top-level names of every import in ``path``'s source (anywhere: a lazy import counts too)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_oracles_live_in_memagent_testing():
    """Benchmarks and the oracles import nothing from tests/; the product imports neither tests/ nor the
    oracles (memagent_testing: perfect readers, fault harness, generators shared by tests and benchmarks)."""
    users = {"benchmarks": {"tests"}, "memagent_testing": {"tests"},
             **{package: {"tests", "memagent_testing"} for package in PROJECT_PACKAGES}}
    bad = [f"{path.relative_to(ROOT)} imports {sorted(roots_imported(path) & forbidden)}"
           for package, forbidden in users.items() for path in sorted((ROOT / package).rglob("*.py"))
           if roots_imported(path) & forbidden]
    assert bad == []
