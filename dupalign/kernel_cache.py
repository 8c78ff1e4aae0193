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
here also covers every module of the kernel's top-level package, in all its subpackages
(a callee may live in any of them), so any change to the package's sources compiles the
kernels again. A kernel module outside a package is keyed by the modules of its folder.

numba also names compiled code by a number each process counts from 1, so that code cached
by two processes could share a name and a third process that loads both would call one
for the other (``_names_apart``): each process counts from a random start.

A process that finds the kernels missing (a fresh install or clone, a kernel's source
changed) compiles them on first use: about two minutes of one core on the 2-core test
machine, in every process that starts before the cache is written (a ``scan --jobs N``
pool too). The commands say so before they go quiet for that long.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import itertools
import os
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


def _source_files(root: str) -> list[str]:
    """The ``.py`` files of the package ``root`` and its subpackages, or of the folder
    ``root`` alone when it is no package; sorted, relative to ``root``."""
    if not os.path.isfile(os.path.join(root, "__init__.py")):
        with os.scandir(root) as entries:
            return sorted(e.name for e in entries if e.name.endswith(".py") and e.is_file())
    found = []
    for folder, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d != "__pycache__"]
        rel = os.path.relpath(folder, root)
        found += [os.path.normpath(os.path.join(rel, n)) for n in names if n.endswith(".py")]
    return sorted(found)


@functools.cache
def _package_digest(root: str) -> bytes:
    """A digest of every source file of the package ``root`` (``_source_files``): taken once
    per process, from the sources as they were when the process compiled its kernels."""
    digest = hashlib.sha256()
    for rel in _source_files(root):
        with open(os.path.join(root, rel), "rb") as f:
            digest.update(rel.encode() + b"\0" + hashlib.sha256(f.read()).digest())
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
            return (own, _package_digest(_package_root(os.path.dirname(
                os.path.abspath(self._py_file)))))
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
