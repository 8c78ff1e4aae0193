"""Dynamic (lazily allocated) segment tree: range add, range max, rightmost position ≥ threshold.

The interval scans (OPH and MonoActive) keep the right intervals of the windows whose left
interval covers the current start position in this tree, and ask for the rightmost end
position whose covering weight reaches the threshold.

Representation (array-backed, numba-friendly): node 0 is the root and covers positions
``[0, size)``; a node has either two children or none (``lc[node] == 0`` means none, since
the root is never a child). Each node keeps ``tg`` — an add applied to its whole range and
never pushed down (a lazy tag that stays put, which is enough for add + max) — and
``mx = tg + max(mx[children])``: the maximum over its range of the adds made at or below it.
A node without children is uniform over its range (its value is the sum of the tags on
its root path), so nodes are only created when an update covers part of a node: memory is
O(updates · log size), independent of ``size``.

Positions in this module are 0-based and ranges are INCLUSIVE ``[lo, hi]``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from numba import njit

I64 = npt.NDArray[np.int64]

_MIN_CAPACITY = 16


@njit(cache=True)
def seg_new(capacity: int) -> tuple[I64, I64, I64, I64, I64]:
    """Arrays of an empty tree: (lc, rc, mx, tg, nn); ``nn[0]`` is the number of nodes in use."""
    cap = max(capacity, 16)
    lc = np.zeros(cap, dtype=np.int64)
    rc = np.zeros(cap, dtype=np.int64)
    mx = np.zeros(cap, dtype=np.int64)
    tg = np.zeros(cap, dtype=np.int64)
    nn = np.ones(1, dtype=np.int64)  # the root
    return lc, rc, mx, tg, nn


@njit(cache=True)
def _depth(size: int) -> int:
    d = 1
    s = 1
    while s < size:
        s *= 2
        d += 1
    return d


@njit(cache=True)
def _grow(lc: I64, rc: I64, mx: I64, tg: I64, need: int) -> tuple[I64, I64, I64, I64]:
    cap = lc.shape[0]
    if need <= cap:
        return lc, rc, mx, tg
    new = max(need, 2 * cap)
    lc2 = np.zeros(new, dtype=np.int64)
    rc2 = np.zeros(new, dtype=np.int64)
    mx2 = np.zeros(new, dtype=np.int64)
    tg2 = np.zeros(new, dtype=np.int64)
    lc2[:cap] = lc
    rc2[:cap] = rc
    mx2[:cap] = mx
    tg2[:cap] = tg
    return lc2, rc2, mx2, tg2


@njit(cache=True)
def seg_add(
    lc: I64, rc: I64, mx: I64, tg: I64, nn: I64, size: int, lo: int, hi: int, delta: int
) -> tuple[I64, I64, I64, I64]:
    """Add ``delta`` to every position in ``[lo, hi]`` (clipped to ``[0, size)``).

    Returns the (possibly reallocated) arrays: callers must rebind them.
    """
    lo = max(lo, 0)
    hi = min(hi, size - 1)
    if lo > hi or delta == 0:
        return lc, rc, mx, tg
    depth = _depth(size)
    # an update splits at most two nodes per level, each creating two children
    lc, rc, mx, tg = _grow(lc, rc, mx, tg, nn[0] + 4 * (depth + 1))
    # iterative DFS (numba's cached recursion is fragile); partial nodes are refreshed
    # bottom-up afterwards: in preorder a parent precedes its children, so go in reverse
    cap = 4 * (depth + 2)
    st_node = np.empty(cap, dtype=np.int64)
    st_nl = np.empty(cap, dtype=np.int64)
    st_nr = np.empty(cap, dtype=np.int64)
    partial = np.empty(cap, dtype=np.int64)
    n_part = 0
    top = 1
    st_node[0] = 0
    st_nl[0] = 0
    st_nr[0] = size - 1
    while top > 0:
        top -= 1
        node = st_node[top]
        nl = st_nl[top]
        nr = st_nr[top]
        if hi < nl or nr < lo:
            continue
        if lo <= nl and nr <= hi:
            tg[node] += delta
            mx[node] += delta
            continue
        if lc[node] == 0:
            a = nn[0]
            nn[0] = a + 2
            # slots may hold stale values: clear them
            for s in range(a, a + 2):
                lc[s] = 0
                rc[s] = 0
                mx[s] = 0
                tg[s] = 0
            lc[node] = a
            rc[node] = a + 1
        partial[n_part] = node
        n_part += 1
        mid = (nl + nr) // 2
        st_node[top] = lc[node]
        st_nl[top] = nl
        st_nr[top] = mid
        st_node[top + 1] = rc[node]
        st_nl[top + 1] = mid + 1
        st_nr[top + 1] = nr
        top += 2
    for x in range(n_part - 1, -1, -1):
        node = partial[x]
        mx[node] = tg[node] + max(mx[lc[node]], mx[rc[node]])
    return lc, rc, mx, tg


@njit(cache=True)
def seg_rightmost(
    lc: I64, rc: I64, mx: I64, tg: I64, size: int, lo: int, hi: int, threshold: int
) -> int:
    """Largest position p in ``[lo, hi]`` whose value is ≥ ``threshold``, or -1 if none."""
    lo = max(lo, 0)
    hi = min(hi, size - 1)
    if lo > hi:
        return -1
    cap = 2 * (_depth(size) + 2)
    st_node = np.empty(cap, dtype=np.int64)
    st_nl = np.empty(cap, dtype=np.int64)
    st_nr = np.empty(cap, dtype=np.int64)
    st_acc = np.empty(cap, dtype=np.int64)  # sum of the tags of the strict ancestors
    top = 1
    st_node[0] = 0
    st_nl[0] = 0
    st_nr[0] = size - 1
    st_acc[0] = 0
    # right-first DFS: the first qualifying uniform node found is the rightmost one
    while top > 0:
        top -= 1
        node = st_node[top]
        nl = st_nl[top]
        nr = st_nr[top]
        acc = st_acc[top]
        if hi < nl or nr < lo or acc + mx[node] < threshold:
            continue
        if lc[node] == 0:
            return min(nr, hi)  # uniform node: its value is acc + tg = acc + mx
        mid = (nl + nr) // 2
        acc2 = acc + tg[node]
        st_node[top] = lc[node]
        st_nl[top] = nl
        st_nr[top] = mid
        st_acc[top] = acc2
        st_node[top + 1] = rc[node]
        st_nl[top + 1] = mid + 1
        st_nr[top + 1] = nr
        st_acc[top + 1] = acc2
        top += 2
    return -1


@njit(cache=True)
def seg_max(lc: I64, rc: I64, mx: I64, tg: I64, size: int, lo: int, hi: int) -> int:
    """Maximum value over ``[lo, hi]`` (a non-empty range inside ``[0, size)``)."""
    cap = 2 * (_depth(size) + 2)
    st_node = np.empty(cap, dtype=np.int64)
    st_nl = np.empty(cap, dtype=np.int64)
    st_nr = np.empty(cap, dtype=np.int64)
    st_acc = np.empty(cap, dtype=np.int64)
    top = 1
    st_node[0] = 0
    st_nl[0] = 0
    st_nr[0] = size - 1
    st_acc[0] = 0
    best = np.iinfo(np.int64).min
    while top > 0:
        top -= 1
        node = st_node[top]
        nl = st_nl[top]
        nr = st_nr[top]
        acc = st_acc[top]
        if hi < nl or nr < lo:
            continue
        if (lo <= nl and nr <= hi) or lc[node] == 0:
            best = max(best, acc + mx[node])
            continue
        mid = (nl + nr) // 2
        acc2 = acc + tg[node]
        st_node[top] = lc[node]
        st_nl[top] = nl
        st_nr[top] = mid
        st_acc[top] = acc2
        st_node[top + 1] = rc[node]
        st_nl[top + 1] = mid + 1
        st_nr[top + 1] = nr
        st_acc[top + 1] = acc2
        top += 2
    return best


class DynamicSegmentTree:
    """Python handle on the array-backed tree; numba code calls the ``seg_*`` kernels directly.

    All positions start at value 0. Positions are 0-based, ranges inclusive ``[lo, hi]``.
    """

    def __init__(self, size: int, capacity: int = _MIN_CAPACITY) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = int(size)
        self._lc, self._rc, self._mx, self._tg, self._nn = seg_new(capacity)

    @property
    def node_count(self) -> int:
        """Nodes allocated so far (the root included)."""
        return int(self._nn[0])

    def add(self, lo: int, hi: int, delta: int) -> None:
        """Add ``delta`` to every position in ``[lo, hi]``; the range is clipped to the tree."""
        self._lc, self._rc, self._mx, self._tg = seg_add(
            self._lc, self._rc, self._mx, self._tg, self._nn, self.size, lo, hi, delta
        )

    def rightmost_at_least(self, lo: int, hi: int, threshold: int) -> int:
        """Largest position in ``[lo, hi]`` with value ≥ ``threshold``; -1 if there is none."""
        return int(
            seg_rightmost(self._lc, self._rc, self._mx, self._tg, self.size, lo, hi, threshold)
        )

    def range_max(self, lo: int, hi: int) -> int:
        """Maximum value over ``[lo, hi]`` (clipped; raises on an empty range)."""
        lo, hi = max(lo, 0), min(hi, self.size - 1)
        if lo > hi:
            raise ValueError("empty range")
        return int(seg_max(self._lc, self._rc, self._mx, self._tg, self.size, lo, hi))

    def value_at(self, pos: int) -> int:
        """Value at one position."""
        return self.range_max(pos, pos)
