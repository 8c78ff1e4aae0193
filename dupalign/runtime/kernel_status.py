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


def kernels_cached() -> bool | None:
    """False when one of the three costliest kernels to compile (about 60 % of the
    compile time) has no fresh entry in the cache; None when numba's cache is not laid out
    as this reads it (a numba version that changed its private layout)."""
    kernels: tuple[Any, ...] = (span_refine.refine_pages, passage_align.scan_tasks,
                                psm._psm_batch_kernel)
    try:
        # the index file of a kernel's compiled versions, empty when missing or stale
        return all(bool(k._cache._cache_file._load_index()) for k in kernels)
    except (AttributeError, OSError, ValueError):
        return None
