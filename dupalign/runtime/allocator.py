"""glibc's allocator, told to give freed memory back to the system.

What the engine frees is mostly large and bursty: a flushed memtable (RocksDB allocates it
in blocks of megabytes), the list cache's arrays when they move, a page's batch. glibc
serves blocks above its mmap threshold from their own mappings, returned when freed, but
raises that threshold to the size of each such block freed (up to 32 MB), after which the
same blocks come from its heaps, and a heap returns memory only from its top. So a worker
kept the memtables' peak, not their size (docs/performance/memory.md). Here: a fixed
threshold (which also turns the raising off), few heaps (RocksDB's background threads
would each get one), and ``trim`` every few pages, which hands the free pages inside the
heaps back (``malloc_trim``). Elsewhere than glibc these do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MMAP_THRESHOLD = 1 << 20  # blocks from 1 MB up get their own mapping
ARENAS = 2  # glibc's default is 8 per core


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 (glibc only)
        return libc
    except (OSError, AttributeError):
        return None


@functools.cache
def configure() -> bool:
    """Set the threshold and the number of heaps, once per process (the heaps before
    RocksDB's threads start); False where this is not glibc."""
    libc = _libc()
    if libc is None:
        return False
    libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    libc.mallopt(M_ARENA_MAX, ARENAS)
    return True


def trim() -> None:
    """Give the free pages of every heap back to the system."""
    if (libc := _libc()) is not None:
        libc.malloc_trim(0)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def free_bytes() -> int:
    """Bytes the heaps hold free (freed, not given back yet; 0 where unknown)."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):  # (glibc 2.33 on)
        return 0
    libc.mallinfo2.restype = _MallInfo2
    return int(libc.mallinfo2().fordblks)
