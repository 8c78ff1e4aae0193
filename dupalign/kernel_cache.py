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
here also covers the kernel modules beside the kernel's file and every module of that
folder they import, so any such change compiles the kernels again (an edit of the engine,
the pipeline or the index, which hold no kernel, does not).

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
import re
import secrets
from collections.abc import Iterator
from typing import Any

from numba import njit, vectorize
from numba.core import bytecode, caching, sigutils

__all__ = ["kernels_cached", "njit", "vectorize"]


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


def _folder_digest(folder: str) -> bytes:
    """A digest of the kernel modules in ``folder`` and of every module of the folder they
    import, directly or not (recomputed when a file changes)."""
    with os.scandir(folder) as entries:
        files = sorted((e.name, e.stat().st_mtime_ns, e.stat().st_size) for e in entries
                       if e.name.endswith(".py") and e.is_file())
    return _digest_of(folder, tuple(files))


_IMPORT = re.compile(r"^\s*(?:from (\w+)\.(\w+) import|import (\w+)\.(\w+)|from (\w+) import "
                     r"\(?([\w, ]+))", re.MULTILINE)


@functools.lru_cache(maxsize=64)
def _digest_of(folder: str, files: tuple[tuple[str, int, int], ...]) -> bytes:
    package = os.path.basename(folder)
    sources = {}
    for name, *_ in files:
        with open(os.path.join(folder, name), "rb") as f:
            sources[name[:-3]] = f.read()
    # the modules a kernel's machine code may hold something of: the kernel modules (those
    # that take njit from here) and what they import (callees, constants); the others
    # (the engine, the pipeline, ...) change no compiled code
    reached = [m for m, text in sources.items() if b"kernel_cache import" in text]
    seen = set(reached)
    while reached:
        text = sources[reached.pop()].decode("utf-8", "replace")
        for match in _IMPORT.finditer(text):
            p1, m1, p2, m2, p3, names = match.groups()
            found = ([m1] if p1 == package else [m2] if p2 == package else
                     [n.strip() for n in names.split(",")] if p3 == package else [])
            for module in found:
                if module in sources and module not in seen:
                    seen.add(module)
                    reached.append(module)
    digest = hashlib.sha256()
    for module in sorted(seen):
        digest.update(module.encode() + b"\0" + hashlib.sha256(sources[module]).digest())
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
            return (own, _folder_digest(os.path.dirname(os.path.abspath(self._py_file))))
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


_install_guards()
_names_apart()


def kernels_cached() -> bool | None:
    """False when one of the three costliest kernels to compile (about 60 % of the
    compile time) has no fresh entry in the cache; None when numba's cache is not laid out
    as this reads it (a numba version that changed its private layout)."""
    from dupalign import passage_align, psm, span_refine

    kernels: tuple[Any, ...] = (span_refine.refine_pages, passage_align.scan_tasks,
                                psm._psm_batch_kernel)
    try:
        # the index file of a kernel's compiled versions, empty when missing or stale
        return all(bool(k._cache._cache_file._load_index()) for k in kernels)
    except (AttributeError, OSError, ValueError):
        return None
