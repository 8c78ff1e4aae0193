"""Segment tree over ``[0, size)``: range add, range max, rightmost position ≥ threshold.

The interval scans (OPH and MonoActive) keep the right intervals of the windows whose left
interval covers the current start position in this tree, and ask for the rightmost end
position whose covering weight reaches the threshold. They compress the end positions
first (dupalign.passage.interval_scan), so ``size`` is at most twice the number of windows and a
plain array-backed tree is smaller and faster than a lazily allocated one over the page.

Representation (array-backed, numba-friendly): a perfect binary tree with ``n`` leaves
(``n`` the smallest power of two ≥ size), node 1 the root, node x's children 2x and 2x + 1,
leaf x covering position x − n. One row per node, ``nd[x] = (mx, tg)``: ``tg`` is an add
applied to the node's whole range and never pushed down (a lazy tag that stays put, which
is enough for add + max), ``mx = tg + max(mx[children])``: the maximum over its range of
the adds made at or below it. A position's value is the sum of the tags on its root path.

Positions in this module are 0-based and ranges are INCLUSIVE ``[lo, hi]``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit

I64 = npt.NDArray[np.int64]


@njit(cache=True, nogil=True)
def seg_new(size: int) -> tuple[I64, I64]:
    """An all-zero tree over ``[0, size)`` (size ≥ 1): ``(nd, st)``, ``st`` being scratch
    space for the queries (allocated once here: the scans query ~10^5 times)."""
    n = 1
    depth = 1
    while n < size:
        n *= 2
        depth += 1
    nd = np.zeros((2 * n, 2), dtype=np.int64)
    st = np.empty((4, 2 * depth + 2), dtype=np.int64)
    return nd, st


@njit(cache=True, nogil=True)
def _pull(nd: I64, x: int) -> None:
    """Refresh ``mx`` on the path from node ``x`` up to the root."""
    while x >= 1:
        nd[x, 0] = nd[x, 1] + max(nd[2 * x, 0], nd[2 * x + 1, 0])
        x >>= 1


@njit(cache=True, nogil=True)
def seg_add(nd: I64, size: int, lo: int, hi: int, delta: int) -> None:
    """Add ``delta`` to every position in ``[lo, hi]`` (clipped to ``[0, size)``).

    Bottom-up: the O(log n) nodes that tile the range get the tag, then the two boundary
    paths are refreshed. In place (the callers' hot loops stay free of array rebinding)."""
    lo = max(lo, 0)
    hi = min(hi, size - 1)
    if lo > hi or delta == 0:
        return
    n = nd.shape[0] // 2
    a = lo + n
    z = hi + n + 1
    while a < z:
        if a & 1:
            nd[a, 0] += delta
            nd[a, 1] += delta
            a += 1
        if z & 1:
            z -= 1
            nd[z, 0] += delta
            nd[z, 1] += delta
        a >>= 1
        z >>= 1
    _pull(nd, (lo + n) >> 1)
    _pull(nd, (hi + n) >> 1)


@njit(cache=True, nogil=True)
def seg_rightmost(nd: I64, st: I64, size: int, lo: int, hi: int, threshold: int) -> int:
    """Largest position p in ``[lo, hi]`` whose value is ≥ ``threshold``, or -1 if none."""
    lo = max(lo, 0)
    hi = min(hi, size - 1)
    if lo > hi:
        return -1
    n = nd.shape[0] // 2
    top = 1
    st[0, 0] = 1  # node
    st[1, 0] = 0  # its first position
    st[2, 0] = n - 1  # its last position
    st[3, 0] = 0  # the tags above it
    # right-first DFS: the first qualifying leaf found is the rightmost one; a node fully
    # inside [lo, hi] whose max qualifies always holds one, so only the two boundary paths
    # can be left without an answer
    while top > 0:
        top -= 1
        x = st[0, top]
        nl = st[1, top]
        nr = st[2, top]
        acc = st[3, top]
        if hi < nl or nr < lo or acc + nd[x, 0] < threshold:
            continue
        if x >= n:
            return nl
        mid = (nl + nr) // 2
        acc2 = acc + nd[x, 1]
        st[0, top] = 2 * x
        st[1, top] = nl
        st[2, top] = mid
        st[3, top] = acc2
        st[0, top + 1] = 2 * x + 1
        st[1, top + 1] = mid + 1
        st[2, top + 1] = nr
        st[3, top + 1] = acc2
        top += 2
    return -1


@njit(cache=True, nogil=True)
def seg_max(nd: I64, size: int, lo: int, hi: int) -> int:
    """Maximum value over ``[lo, hi]`` (a non-empty range inside ``[0, size)``).

    Bottom-up over the nodes that tile the range, each plus the tags above it."""
    n = nd.shape[0] // 2
    best = np.iinfo(np.int64).min
    a = lo + n
    z = hi + n + 1
    while a < z:
        if a & 1:
            best = max(best, nd[a, 0] + _tags_above(nd, a))
            a += 1
        if z & 1:
            z -= 1
            best = max(best, nd[z, 0] + _tags_above(nd, z))
        a >>= 1
        z >>= 1
    return best


@njit(cache=True, nogil=True)
def _tags_above(nd: I64, x: int) -> int:
    acc = 0
    x >>= 1
    while x >= 1:
        acc += nd[x, 1]
        x >>= 1
    return acc


class SegmentTree:
    """Python handle on the array-backed tree; numba code calls the ``seg_*`` kernels directly.

    All positions start at value 0. Positions are 0-based, ranges inclusive ``[lo, hi]``.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = int(size)
        self._nd, self._st = seg_new(self.size)

    def add(self, lo: int, hi: int, delta: int) -> None:
        """Add ``delta`` to every position in ``[lo, hi]``; the range is clipped to the tree."""
        seg_add(self._nd, self.size, lo, hi, delta)

    def rightmost_at_least(self, lo: int, hi: int, threshold: int) -> int:
        """Largest position in ``[lo, hi]`` with value ≥ ``threshold``; -1 if there is none."""
        return int(seg_rightmost(self._nd, self._st, self.size, lo, hi, threshold))

    def range_max(self, lo: int, hi: int) -> int:
        """Maximum value over ``[lo, hi]`` (clipped; raises on an empty range)."""
        lo, hi = max(lo, 0), min(hi, self.size - 1)
        if lo > hi:
            raise ValueError("empty range")
        return int(seg_max(self._nd, self.size, lo, hi))

    def value_at(self, pos: int) -> int:
        """Value at one position."""
        return self.range_max(pos, pos)
