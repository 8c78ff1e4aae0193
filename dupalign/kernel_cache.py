"""numba's on-disk cache of the engine's compiled kernels: safe for many processes at once,
and whether it holds the kernels yet.

Every kernel module takes ``njit`` (and ``vectorize``) from here, so the two guards below
are in place before any kernel is compiled or loaded.

Many processes compile at once on a fresh install: ``scan --jobs N`` pools, the roles of a
topology on one machine, pytest workers. numba (0.60–0.68 at least) names a kernel's
compiled versions by a counter read from the kernel's index file, then rewrites the index
without a lock. Two processes that compile two versions of one kernel at once (a call from
another kernel compiles a literal-argument version beside the generic one) can take the
same number: the index then names one signature's machine code for another's, and every
later process runs the wrong code, silently (a test saw a kernel return no spans at all).
So here: a save holds an exclusive lock on the index while it reads, chooses and writes
(no lock, no save: compiling again is slow, never wrong), and a load whose code was built
for another signature is refused (compiled again), which also repairs caches written before.

numba also keys a kernel's cache by its own source file only, while the machine code holds
the kernels it calls and the module constants it reads, from other files: after a change
to a callee alone (a ``git pull``, an edit), every later process ran the old code. The key
here also covers the sources of the modules of the kernel's top-level package that the
kernel's module imports, transitively (``_reached``: its ``import`` and ``from ... import``
statements read from the source, relative ones resolved, those in functions and under ``if
TYPE_CHECKING:`` too, a package's ``__init__`` when it is named): a change to one of them
compiles the kernel again, a change elsewhere (the service, the CLI) does not. An import
that names no file of the package keys the kernel by every source of the package, as does
a kernel module outside a package by every module of its folder. This relies on a kernel
reaching the code and constants it compiles in only through the names its module imports:
no ``importlib``/``__import__``/``sys.modules`` in the modules it reaches, no kernel
defined in a function from another module's functions, no kernel passed to a kernel as an
argument, no ``__init__`` that rebinds a module's names (running a package's ``__init__``
is not counted); tests/runtime/test_kernel_key.py checks the first two in the package.

numba also names compiled code by a number each process counts from 1, so that code cached
by two processes could share a name and a third process that loads both would call one
for the other (``_names_apart``): each process counts from a random start.

A process that finds the kernels missing (a fresh install or clone, a change to a kernel's
module or to one it imports) compiles them on first use: about two minutes of one core on
the 2-core test machine, in every process that starts before the cache is written (a
``scan --jobs N`` pool too). The commands say so before they go quiet for that long.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import itertools
import os
import re
import secrets
import sys
from collections.abc import Iterator
from typing import Any

from numba import njit, vectorize
from numba.core import bytecode, caching, sigutils

__all__ = ["njit", "vectorize"]


@contextlib.contextmanager
def _index_locked(index_path: str) -> Iterator[bool]:
    """Hold an exclusive lock beside a kernel's index file; yields False when the
    filesystem cannot lock (then the caller saves nothing)."""
    try:
        fd = os.open(index_path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def _package_root(folder: str) -> str:
    """The folder of the top-level package that holds ``folder`` (``folder`` itself when it
    is no package)."""
    root = folder
    if not os.path.isfile(os.path.join(root, "__init__.py")):
        return root
    while os.path.isfile(os.path.join(os.path.dirname(root), "__init__.py")):
        root = os.path.dirname(root)
    return root


@functools.cache
def _source_files(root: str) -> tuple[str, ...]:
    """The ``.py`` files of the package ``root`` and its subpackages, or of the folder
    ``root`` alone when it is no package; sorted, relative to ``root``, ``/``-separated."""
    if not os.path.isfile(os.path.join(root, "__init__.py")):
        with os.scandir(root) as entries:
            return tuple(sorted(e.name for e in entries if e.name.endswith(".py")
                                and e.is_file()))
    found = []
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        rel = os.path.relpath(folder, root).replace(os.sep, "/")
        found += [n if rel == "." else f"{rel}/{n}" for n in names if n.endswith(".py")]
    return tuple(sorted(found))


@functools.cache
def _source_set(root: str) -> frozenset[str]:
    return frozenset(_source_files(root))


@functools.cache
def _source(root: str, rel: str) -> bytes:
    """A source file as this process first read it: its imports and its digest agree."""
    with open(os.path.join(root, rel), "rb") as f:
        return f.read()


@functools.cache
def _source_digest(root: str, rel: str) -> bytes:
    return rel.encode() + b"\0" + hashlib.sha256(_source(root, rel)).digest()


# An import statement at the start of a line, indented or not (in a function, under ``if
# TYPE_CHECKING:``); a docstring's line that reads as one adds an edge, never loses one.
_IMPORT_WORD = re.compile(rb"import")
_STATEMENT = re.compile(rb"[ \t]*(?:from[ \t]+(\.*)[ \t]*([\w.]*)[ \t]*)?import[ \t(\\]")
_COMMENT = re.compile(rb"#[^\n]*")
_NAME = re.compile(rb"[\w.]+|\*")


def import_statements(source: bytes) -> list[tuple[int, str, tuple[str, ...]]]:
    """(level, module, names) of the import statements of a module's source: names is
    empty for ``import module``. Read from their lines with regular expressions, ~10x
    faster than ``ast.parse`` (a process keys its kernels as it imports them). Relies on no
    import following another statement but an import on its line (``x = 1; import y``:
    ruff's E701/E702): a test compares what it finds in the package with the bytecode."""
    found: list[tuple[int, str, tuple[str, ...]]] = []
    last = -1
    for word in _IMPORT_WORD.finditer(source):  # (a literal's search is the fastest)
        start = source.rfind(b"\n", 0, word.start()) + 1
        statement = _STATEMENT.match(source, start) if start != last else None
        if statement is None:
            continue
        last = start
        end = source.find(b"\n", start)
        end = len(source) if end < 0 else end
        while source[start:end].rstrip().endswith(b"\\") and end < len(source):
            end = source.find(b"\n", end + 1)  # a continued line
            end = len(source) if end < 0 else end
        line = _COMMENT.sub(b"", source[statement.end() - 1:end])
        if line.count(b"(") > line.count(b")"):  # a parenthesized list of names
            close = source.find(b")", end)
            close = len(source) if close < 0 else close + 1
            line = _COMMENT.sub(b"", source[statement.end() - 1:close])
        line, _, more = line.partition(b";")
        if _STATEMENT.match(more):  # import a; import b
            found += import_statements(more.strip())
        names = [n.split()[0] for n in line.translate(None, b"()\\").split(b",") if n.strip()]
        if not names or not all(_NAME.fullmatch(n) for n in names):
            continue  # prose in a docstring
        if statement.group(1) is None:
            found += [(0, n.decode(), ()) for n in names]
        else:
            found.append((len(statement.group(1)), statement.group(2).decode(),
                          tuple(n.decode() for n in names)))
    return found


def _module_file(root: str, parts: tuple[str, ...]) -> str | None:
    """The source file of the package ``root``'s module ``parts`` (its names below the
    top-level package's), or None when it has none."""
    files = _source_set(root)
    for rel in ("/".join(parts) + ".py" if parts else None, "/".join((*parts, "__init__.py"))):
        if rel in files:
            return rel
    return None


def imported_files(root: str, rel: str, level: int, module: str,
                   names: tuple[str, ...]) -> list[str] | None:
    """The files of the package ``root`` that one import statement of its file ``rel``
    names: the module imported from, and each of ``names`` that is a module of its own.
    Empty for a module of another package; None when it cannot be resolved to a file."""
    top = os.path.basename(root)
    parts = tuple(module.split(".")) if module else ()
    if level:
        here = tuple(rel[:-len(".py")].split("/"))
        package = here[:-1]  # a package's __init__ is in its own package, too
        if level - 1 > len(package):
            return None
        parts = package[:len(package) - (level - 1)] + parts
    elif not parts or parts[0] != top:
        return []  # numpy, numba... (their versions are numba's own concern)
    else:
        parts = parts[1:]
    base = _module_file(root, parts)
    if base is None:
        return None
    sub = (_module_file(root, (*parts, n)) for n in names if n != "*")
    return [base, *(f for f in sub if f is not None)]


@functools.cache
def _imported(root: str, rel: str) -> frozenset[str] | None:
    """The files of the package ``root`` that its file ``rel`` imports (None: see below)."""
    found: set[str] = set()
    for level, module, names in import_statements(_source(root, rel)):
        files = imported_files(root, rel, level, module, names)
        if files is None:
            return None
        found.update(files)
    return frozenset(found)


@functools.cache
def _reached(root: str, rel: str) -> tuple[str, ...] | None:
    """The files of the package ``root`` that its module ``rel`` imports, transitively, and
    ``rel``; None when an import cannot be resolved (the caller keys by the whole package)."""
    seen, todo = {rel}, [rel]
    while todo:
        files = _imported(root, todo.pop())
        if files is None:
            return None
        todo += files - seen
        seen |= files
    return tuple(sorted(seen))


@functools.cache
def _module_digest(py_file: str) -> bytes:
    """A digest of the sources that a kernel module's machine code can hold: the module's
    and those of its package that it imports, transitively (every file of its package when
    one import cannot be resolved, or of its folder when it is in no package); taken once
    per process and module, from the sources as they were when the process compiled."""
    folder = os.path.dirname(os.path.abspath(py_file))
    root = _package_root(folder)
    files: tuple[str, ...] | None = None
    if os.path.isfile(os.path.join(root, "__init__.py")):
        rel = os.path.relpath(os.path.abspath(py_file), root).replace(os.sep, "/")
        files = _reached(root, rel) if rel in _source_set(root) else None
    digest = hashlib.sha256()
    for rel in files or _source_files(root):
        digest.update(_source_digest(root, rel))
    return digest.digest()


def _install_guards() -> None:
    index_file = caching.IndexDataCacheFile
    cache = caching.Cache
    locator = caching._SourceFileBackedLocatorMixin
    if getattr(index_file.save, "_dupalign_locked", False):
        return  # already installed (a module reloaded)
    unlocked_save = index_file.save
    unchecked_load = cache._load_overload
    own_file_stamp = locator.get_source_stamp

    def stamp(self: Any) -> Any:
        own = own_file_stamp(self)
        try:
            return (own, _module_digest(self._py_file))
        except OSError:
            return own

    def save(self: Any, key: Any, data: Any) -> None:
        with _index_locked(self._index_path) as locked:
            if locked:
                unlocked_save(self, key, data)

    def load(self: Any, sig: Any, target_context: Any) -> Any:
        cres = unchecked_load(self, sig, target_context)
        built_for = getattr(getattr(cres, "signature", None), "args", None)
        if built_for is not None and tuple(built_for) != tuple(
                sigutils.normalize_signature(sig)[0]):
            return None  # another signature's code under this one's name: compile again
        return cres

    save._dupalign_locked = True  # type: ignore[attr-defined]
    index_file.save = save  # type: ignore[method-assign]
    cache._load_overload = load  # type: ignore[method-assign]
    locator.get_source_stamp = stamp  # type: ignore[method-assign]


def _names_apart() -> None:
    """numba names the machine code of every function it compiles (its kernels' callees
    too, numba's own sorts among them) by the function's name, argument types and a number
    counted from 1 in each process, and the cache keeps those names. Two processes can so
    give one name to different code: numba's sort and argsort of an int64 array are two
    closures of one factory, alike in name and types, and which one gets a number depends
    on what the process compiled before. A process that loads kernels of both processes
    from the cache links every call of that name to the code loaded first: CI saw
    ``keys.sort()`` leave keys unsorted after the test workers had cached kernels beside
    those of ``make warm-kernels``. Each process counts from a random start instead."""
    ids = getattr(bytecode.FunctionIdentity, "_unique_ids", None)
    if isinstance(ids, itertools.count):
        bytecode.FunctionIdentity._unique_ids = itertools.count(
            1 + secrets.randbits(48))


def _no_blas_probe() -> None:
    """numba probes for a BLAS when it first compiles or loads a kernel (numba.np.arraymath
    imports scipy.linalg for it): ~0.3 s of CPU in every process where SciPy is installed
    (the dev extra's datasketch installs it), more than loading a role's kernels. No kernel
    calls a BLAS-backed function (np.dot, np.linalg, np.convolve...), so numba is told
    there is none, as where SciPy is missing: the same machine code, cached or compiled.
    (arraymath is imported here under that answer; it costs ~0.1 s.) In a process that
    embeds dupalign, its own numba code keeps np.dot and np.linalg (they import SciPy
    again when compiled); only np.convolve and np.correlate take numba's plain loop."""
    blas = "scipy.linalg.cython_blas"
    if "numba.np.arraymath" in sys.modules or sys.modules.get(blas) is not None:
        return  # probed already, or a BLAS that costs nothing more to find
    missing = blas not in sys.modules
    sys.modules[blas] = None  # type: ignore[assignment]  # its import raises ImportError
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        if missing:
            del sys.modules[blas]


_install_guards()
_names_apart()
_no_blas_probe()
