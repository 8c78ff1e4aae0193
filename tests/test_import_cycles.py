"""No import cycle among the engine's modules.

The graph is read from the sources (every ``import`` and ``from ... import`` anywhere in a
module: top level, in functions, under ``TYPE_CHECKING``), walking the package directory,
so it holds for any layout of subpackages. A cycle hidden behind a function-level import is
still a cycle: the two modules cannot be understood, tested or moved apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dupalign"


def module_files(root: Path) -> dict[str, Path]:
    """Every module below the package directory ``root``, by dotted name (a package by the
    name of its ``__init__``'s folder)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported_modules(name: str, path: Path, modules: set[str]) -> set[str]:
    """The package's modules that module ``name`` imports: ``from P import x`` names
    module ``P.x`` when there is one, else P itself."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package up
                package = name.split(".") if is_package else name.split(".")[:-1]
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def import_graph(root: Path) -> dict[str, set[str]]:
    files = module_files(root)
    names = set(files)
    return {name: imported_modules(name, path, names) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a closed path of module names, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_engine_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGE)
    assert len(graph) > 10 and "dupalign.runtime.engine" in graph  # the walk found the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("lazy", [False, True])
def test_a_cycle_is_found_whatever_the_import_s_form(tmp_path: Path, lazy: bool) -> None:
    """The check itself: a cycle through subpackages, a relative import and ``from P
    import module``, at top level or inside a function."""
    pkg = tmp_path / "pkg"
    (pkg / "a").mkdir(parents=True)
    (pkg / "b").mkdir()
    for init in (pkg, pkg / "a", pkg / "b"):
        (init / "__init__.py").write_text("")
    (pkg / "a" / "one.py").write_text("from ..b import two\n")
    back = "from pkg.a import one\n"
    (pkg / "b" / "two.py").write_text(
        f"def f():\n    {back}    return one\n" if lazy else back)
    (pkg / "b" / "three.py").write_text("import pkg.b.two\nfrom pkg.b import two as t\n")
    graph = import_graph(pkg)
    assert graph["pkg.b.three"] == {"pkg.b.two"}
    assert find_cycle(graph) == ["pkg.a.one", "pkg.b.two", "pkg.a.one"]
    (pkg / "b" / "two.py").write_text("")
    assert find_cycle(import_graph(pkg)) is None
