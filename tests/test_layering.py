"""The package's layering beyond import-linter's contracts (pyproject.toml, run by make lint):
no module imports another module's private names."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dupalign"


def _private_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.startswith("dupalign"):
            found += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports "
                      f"{node.module}.{a.name}"
                      for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 40  # the whole package was walked
    offenders = [line for f in files for line in _private_imports(f)]
    assert offenders == []
