"""Whether numba's cache holds the engine's costliest kernels yet (a first run compiles them
for about two minutes: the commands say so before they go quiet that long).

Apart from dupalign.kernel_cache, which every kernel module imports: this check imports
kernels, and the cache guard must import none.
"""

from __future__ import annotations

from typing import Any

from dupalign.near import psm
from dupalign.passage import batch_align as passage_align
from dupalign.passage import span_refine


def costliest_kernels() -> tuple[Any, ...]:
    """Three of the costliest kernels to compile (about 60 % of the compile time), each one
    that every engine run calls: a kernel no run calls is never cached, and the check would
    answer False on every start (tests/runtime/test_kernel_status.py)."""
    return (span_refine.refine_pages, passage_align.scan_tasks, psm._psm_one_kernel)


def kernels_cached() -> bool | None:
    """False when one of ``costliest_kernels`` has no fresh entry in the cache; None when
    numba's cache is not laid out as this reads it (a numba version that changed its
    private layout)."""
    try:
        # the index file of a kernel's compiled versions, empty when missing or stale
        return all(bool(k._cache._cache_file._load_index()) for k in costliest_kernels())
    except (AttributeError, OSError, ValueError):
        return None
