"""Whether numba's on-disk cache holds the engine's compiled kernels.

A process that finds them missing (a fresh install or clone, a kernel's source changed)
compiles them on first use: about two minutes of one core on the 2-core test machine,
in every process that starts before the cache is written (a ``scan --jobs N`` pool too).
The commands say so before they go quiet for that long.
"""

from __future__ import annotations

from typing import Any


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
