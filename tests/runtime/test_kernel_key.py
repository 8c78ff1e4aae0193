"""A kernel's cache key covers the modules its machine code can hold and no others
(dupalign/kernel_cache.py): its own module and the package's modules that it imports,
transitively. An edit elsewhere loads the kernel from the cache; an edit to a callee or a
constant it imports compiles it again, and it answers the new way."""

from __future__ import annotations

import dis
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import CodeType

import pytest

from dupalign import kernel_cache
from dupalign.kernel_cache import import_statements, imported_files

REPO = Path(__file__).resolve().parents[2]

# a kernel in ``a`` calls a kernel of ``b`` and reads a constant of ``b``; ``c`` is a module
# of the package that ``a`` does not import; ``far`` reaches ``c`` only through a function's
# import of a module that does not exist (so its key is the whole package's)
_PACKAGE = {
    "__init__.py": "",
    "a.py": ("from dupalign.kernel_cache import njit\n"
             "from .b import OFFSET, part\n\n"
             "@njit(cache=True)\ndef whole(x):\n    return part(x) + OFFSET\n"),
    "b.py": ("from dupalign.kernel_cache import njit\n\nOFFSET = 1\n\n"
             "@njit(cache=True)\ndef part(x):\n    return x * 2\n"),
    "c.py": "LIMIT = 3  # a comment\n",
    "far.py": ("from dupalign.kernel_cache import njit\n\n"
               "@njit(cache=True)\ndef alone(x):\n    return x - 1\n\n"
               "def later():\n    from pkg.gone import nothing  # no such module\n"
               "    return nothing\n"),
}
_RUN = """
import json
from pkg import a, far
out = {}
for name, kernel in (("a", a.whole), ("far", far.alone)):
    value = kernel(5)
    out[name] = [value, sum(kernel.stats.cache_hits.values()),
                 sum(kernel.stats.cache_misses.values())]
print(json.dumps(out))
"""


class _Package:
    """The package on disk, and a fresh process that calls its kernels."""

    def __init__(self, tmp: Path) -> None:
        self.folder = tmp / "pkg"
        self.folder.mkdir()
        for name, text in _PACKAGE.items():
            (self.folder / name).write_text(text)
        self.env = dict(os.environ, PYTHONPATH=f"{tmp}{os.pathsep}{REPO}",
                        NUMBA_CACHE_DIR=str(tmp / "cache"))
        self.tmp = tmp

    def edit(self, name: str, old: str, new: str) -> None:
        path = self.folder / name
        text = path.read_text()
        assert old in text
        path.write_text(text.replace(old, new))

    def run(self) -> dict[str, tuple[int, bool]]:
        """Each kernel's answer to 5, and whether it came from the cache (False: compiled)."""
        done = subprocess.run([sys.executable, "-c", _RUN], capture_output=True, text=True,
                              env=self.env, cwd=self.tmp, timeout=300)
        assert done.returncode == 0, done.stderr
        found = json.loads(done.stdout.splitlines()[-1])
        for _, hits, misses in found.values():
            assert hits + misses == 1
        return {name: (value, hits == 1) for name, (value, hits, _) in found.items()}


@pytest.fixture
def package(tmp_path: Path) -> _Package:
    made = _Package(tmp_path)
    assert made.run() == {"a": (11, False), "far": (4, False)}  # compiled, then
    assert made.run() == {"a": (11, True), "far": (4, True)}  # loaded from the cache
    return made


def test_an_edit_to_a_module_a_kernel_does_not_import_keeps_it_cached(
    package: _Package,
) -> None:
    package.edit("c.py", "a comment", "another comment")
    assert package.run() == {"a": (11, True), "far": (4, False)}  # far: the whole package's key
    assert package.run() == {"a": (11, True), "far": (4, True)}


def test_an_edit_to_an_imported_callee_or_constant_compiles_the_kernel_again(
    package: _Package,
) -> None:
    package.edit("b.py", "x * 2", "x * 3")
    assert package.run()["a"] == (16, False)  # the old key loaded 11
    assert package.run()["a"] == (16, True)
    package.edit("b.py", "OFFSET = 1", "OFFSET = 4")
    assert package.run()["a"] == (19, False)


def test_an_edit_to_the_kernel_s_own_module_compiles_it_again(package: _Package) -> None:
    package.edit("a.py", "return part(x) + OFFSET", "return part(x) + OFFSET - 1")
    assert package.run() == {"a": (10, False), "far": (4, False)}


_SOURCE = b"""\"\"\"A docstring: import this, from here import that.
    from the cache import nothing (prose)
    import prose
\"\"\"
from __future__ import annotations
import os, sys as system
import pkg.a.deep as deep
from . import b
from .b import (OFFSET,  # why (a comment)
                part)
from ..up import x as y
from pkg.c import \\
    LIMIT
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from pkg.typed import Kind
def f():
    import pkg.inner; import pkg.second
    return 1
"""


def test_import_statements_finds_every_form_and_reads_the_names() -> None:
    assert sorted(import_statements(_SOURCE)) == sorted([
        (0, "__future__", ("annotations",)), (0, "os", ()), (0, "sys", ()),
        (0, "pkg.a.deep", ()), (1, "", ("b",)), (1, "b", ("OFFSET", "part")),
        (2, "up", ("x",)), (0, "pkg.c", ("LIMIT",)), (0, "typing", ("TYPE_CHECKING",)),
        (0, "pkg.typed", ("Kind",)), (0, "pkg.inner", ()), (0, "pkg.second", ()),
        (0, "prose", ()),  # the docstring's last line reads as one: an edge too many
    ])


def test_imports_resolve_to_the_package_s_files_or_to_none(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    for rel in ("__init__.py", "a.py", "b.py", "sub/__init__.py", "sub/d.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("")
    kernel_cache._source_files.cache_clear()
    kernel_cache._source_set.cache_clear()
    top = str(root)
    assert imported_files(top, "sub/d.py", 1, "", ("d", "x")) == ["sub/__init__.py", "sub/d.py"]
    assert imported_files(top, "sub/d.py", 2, "a", ("f",)) == ["a.py"]
    assert imported_files(top, "sub/__init__.py", 1, "d", ("f",)) == ["sub/d.py"]
    assert imported_files(top, "a.py", 0, "pkg", ("b", "sub", "g")) == [
        "__init__.py", "b.py", "sub/__init__.py"]
    assert imported_files(top, "a.py", 0, "pkg.sub.d", ()) == ["sub/d.py"]
    assert imported_files(top, "a.py", 0, "numpy", ("ndarray",)) == []
    assert imported_files(top, "a.py", 0, "pkg.gone", ("x",)) is None
    assert imported_files(top, "a.py", 3, "", ("x",)) is None  # beyond the top


def _bytecode_imports(code: CodeType) -> set[tuple[int, str, tuple[str, ...]]]:
    """(level, module, names) of every IMPORT_NAME, in functions too: what Python runs."""
    found = set()
    steps = list(dis.get_instructions(code))
    for i, step in enumerate(steps):
        if step.opname == "IMPORT_NAME":
            level, names = steps[i - 2].argval, steps[i - 1].argval
            found.add((level, step.argval, tuple(names or ())))
    for const in code.co_consts:
        if isinstance(const, CodeType):
            found |= _bytecode_imports(const)
    return found


_ROOT = str(Path(kernel_cache.__file__).parent)
_KERNEL_MODULES = [rel for rel in kernel_cache._source_files(_ROOT)
                   if b"from dupalign.kernel_cache import" in kernel_cache._source(_ROOT, rel)]


def test_every_import_of_the_package_is_found() -> None:
    """The statements read from the lines include every import the bytecode does."""
    assert len(_KERNEL_MODULES) > 20
    for rel in kernel_cache._source_files(_ROOT):
        source = kernel_cache._source(_ROOT, rel)
        missed = _bytecode_imports(compile(source, rel, "exec", dont_inherit=True)) - set(
            import_statements(source))
        assert not missed, rel


def test_kernels_reach_their_code_only_through_the_imports_read() -> None:
    """What the key relies on, in every module a kernel module reaches: no import that the
    lines do not show (importlib, __import__, sys.modules), every kernel defined at the top
    of its module. And the key leaves out what kernels do not reach."""
    reached: set[str] = set()
    for rel in _KERNEL_MODULES:
        files = kernel_cache._reached(_ROOT, rel)
        assert files is not None, rel  # every import resolved
        reached.update(files)
    dynamic = re.compile(rb"importlib|__import__|sys\.modules|\bexec\(|\beval\(")
    nested = re.compile(rb"^[ \t]+@(njit|vectorize)", re.M)
    made = re.compile(rb"\b(?:njit|vectorize)\((?:[^()]|\([^()]*\))*\)\(([\w.]+)\)")
    for rel in reached:
        source = kernel_cache._source(_ROOT, rel)
        if rel != "kernel_cache.py":  # (its docstring names them)
            assert not dynamic.search(source), rel
        assert not nested.search(source), rel
        for function in made.findall(source):  # a kernel made in a function: of its own
            own = re.compile(rb"^def " + re.escape(function) + rb"\(", re.M)
            assert own.search(source), (rel, function)
    assert "service/cli.py" not in reached
    assert "near/psm.py" in (kernel_cache._reached(_ROOT, "near/bphs.py") or ())
