"""Dynamic (lazily allocated) segment tree: range add, range max, rightmost position ≥ threshold.

The interval scans (OPH and MonoActive) keep the right intervals of the windows whose left
interval covers the current start position in this tree, and ask for the rightmost end
position whose covering weight reaches the threshold.

Representation (array-backed, numba-friendly): one int64 row per node, ``nd[node] =
(lc, rc, mx, tg)`` (one cache line per node visit); node 0 is the root and covers positions
``[0, size)``; a node has either two children or none (``nd[node, 0] == 0`` means none, since
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
def seg_new(size: int, capacity: int) -> tuple[I64, I64, I64]:
    """Arrays of an all-zero tree over ``[0, size)``: ``(nd, meta, st)``.

    ``meta = [nodes in use, size, depth]``; ``st`` is scratch space for the traversals
    (allocated once here: the scans call add/query ~10^5 times). ``capacity`` is the number
    of node rows; ``seg_capacity`` gives one that never runs out, else call ``seg_reserve``
    before each ``seg_add``.
    """
    cap = max(min(capacity, 2 * size - 1), 1)
    nd = np.empty((cap, 4), dtype=np.int64)  # rows are cleared when handed out
    nd[0] = 0
    depth = _depth(size)
    meta = np.array([1, size, depth], dtype=np.int64)  # node 0, the root, is in use
    st = np.empty((5, 4 * (depth + 2)), dtype=np.int64)
    return nd, meta, st


@njit(cache=True)
def _depth(size: int) -> int:
    d = 1
    s = 1
    while s < size:
        s *= 2
        d += 1
    return d


@njit(cache=True)
def _grow(nd: I64, need: int) -> I64:
    cap = nd.shape[0]
    new = max(need, 2 * cap)
    nd2 = np.empty((new, 4), dtype=np.int64)
    nd2[:cap] = nd
    return nd2


@njit(cache=True)
def seg_capacity(size: int, n_adds: int) -> int:
    """Node rows that suffice for ``n_adds`` updates of a tree over ``[0, size)``.

    The fully split tree has 2·size − 1 nodes, and one update splits at most two nodes
    per level (two new rows each).
    """
    return min(2 * size - 1, 1 + 4 * _depth(size) * n_adds)


@njit(cache=True)
def seg_reserve(nd: I64, meta: I64) -> I64:
    """The node array, reallocated if needed so that one more ``seg_add`` fits."""
    need = min(meta[0] + 4 * meta[2], 2 * meta[1] - 1)
    if need > nd.shape[0]:
        return _grow(nd, need)
    return nd


@njit(cache=True)
def seg_add(nd: I64, meta: I64, st: I64, lo: int, hi: int, delta: int) -> None:
    """Add ``delta`` to every position in ``[lo, hi]`` (clipped to ``[0, size)``).

    In place: the tree must have room (``seg_capacity`` rows, or ``seg_reserve`` first);
    raises IndexError otherwise. Not returning the array keeps the callers' hot loops free
    of array rebinding (numba then refcounts it on every iteration: ~10× slower scans).
    """
    size = meta[1]
    lo = max(lo, 0)
    hi = min(hi, size - 1)
    if lo > hi or delta == 0:
        return
    # iterative DFS (numba's cached recursion is fragile); partial nodes are refreshed
    # bottom-up afterwards: in preorder a parent precedes its children, so go in reverse
    n_part = 0
    top = 1
    st[0, 0] = 0
    st[1, 0] = 0
    st[2, 0] = size - 1
    while top > 0:
        top -= 1
        node = st[0, top]
        nl = st[1, top]
        nr = st[2, top]
        if hi < nl or nr < lo:
            continue
        if lo <= nl and nr <= hi:
            nd[node, 3] += delta
            nd[node, 2] += delta
            continue
        if nd[node, 0] == 0:
            a = meta[0]
            if a + 2 > nd.shape[0]:
                raise IndexError("segment tree is full: seg_reserve before seg_add")
            meta[0] = a + 2
            # slots may hold stale values: clear them
            for s in range(a, a + 2):
                nd[s, 0] = 0
                nd[s, 1] = 0
                nd[s, 2] = 0
                nd[s, 3] = 0
            nd[node, 0] = a
            nd[node, 1] = a + 1
        st[3, n_part] = node
        n_part += 1
        mid = (nl + nr) // 2
        st[0, top] = nd[node, 0]
        st[1, top] = nl
        st[2, top] = mid
        st[0, top + 1] = nd[node, 1]
        st[1, top + 1] = mid + 1
        st[2, top + 1] = nr
        top += 2
    for x in range(n_part - 1, -1, -1):
        node = st[3, x]
        nd[node, 2] = nd[node, 3] + max(nd[nd[node, 0], 2], nd[nd[node, 1], 2])


@njit(cache=True)
def seg_rightmost(nd: I64, meta: I64, st: I64, lo: int, hi: int, threshold: int) -> int:
    """Largest position p in ``[lo, hi]`` whose value is ≥ ``threshold``, or -1 if none."""
    size = meta[1]
    lo = max(lo, 0)
    hi = min(hi, size - 1)
    if lo > hi:
        return -1
    top = 1
    st[0, 0] = 0
    st[1, 0] = 0
    st[2, 0] = size - 1
    st[4, 0] = 0
    # right-first DFS: the first qualifying uniform node found is the rightmost one
    while top > 0:
        top -= 1
        node = st[0, top]
        nl = st[1, top]
        nr = st[2, top]
        acc = st[4, top]
        if hi < nl or nr < lo or acc + nd[node, 2] < threshold:
            continue
        if nd[node, 0] == 0:
            return min(nr, hi)  # uniform node: its value is acc + tg = acc + mx
        mid = (nl + nr) // 2
        acc2 = acc + nd[node, 3]
        st[0, top] = nd[node, 0]
        st[1, top] = nl
        st[2, top] = mid
        st[4, top] = acc2
        st[0, top + 1] = nd[node, 1]
        st[1, top + 1] = mid + 1
        st[2, top + 1] = nr
        st[4, top + 1] = acc2
        top += 2
    return -1


@njit(cache=True)
def seg_max(nd: I64, meta: I64, st: I64, lo: int, hi: int) -> int:
    """Maximum value over ``[lo, hi]`` (a non-empty range inside ``[0, size)``)."""
    size = meta[1]
    top = 1
    st[0, 0] = 0
    st[1, 0] = 0
    st[2, 0] = size - 1
    st[4, 0] = 0
    best = np.iinfo(np.int64).min
    while top > 0:
        top -= 1
        node = st[0, top]
        nl = st[1, top]
        nr = st[2, top]
        acc = st[4, top]
        if hi < nl or nr < lo:
            continue
        if (lo <= nl and nr <= hi) or nd[node, 0] == 0:
            best = max(best, acc + nd[node, 2])
            continue
        mid = (nl + nr) // 2
        acc2 = acc + nd[node, 3]
        st[0, top] = nd[node, 0]
        st[1, top] = nl
        st[2, top] = mid
        st[4, top] = acc2
        st[0, top + 1] = nd[node, 1]
        st[1, top + 1] = mid + 1
        st[2, top + 1] = nr
        st[4, top + 1] = acc2
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
        self._nd, self._meta, self._st = seg_new(size, capacity)

    @property
    def node_count(self) -> int:
        """Nodes allocated so far (the root included)."""
        return int(self._meta[0])

    def add(self, lo: int, hi: int, delta: int) -> None:
        """Add ``delta`` to every position in ``[lo, hi]``; the range is clipped to the tree."""
        self._nd = seg_reserve(self._nd, self._meta)
        seg_add(self._nd, self._meta, self._st, lo, hi, delta)

    def rightmost_at_least(self, lo: int, hi: int, threshold: int) -> int:
        """Largest position in ``[lo, hi]`` with value ≥ ``threshold``; -1 if there is none."""
        return int(seg_rightmost(self._nd, self._meta, self._st, lo, hi, threshold))

    def range_max(self, lo: int, hi: int) -> int:
        """Maximum value over ``[lo, hi]`` (clipped; raises on an empty range)."""
        lo, hi = max(lo, 0), min(hi, self.size - 1)
        if lo > hi:
            raise ValueError("empty range")
        return int(seg_max(self._nd, self._meta, self._st, lo, hi))

    def value_at(self, pos: int) -> int:
        """Value at one position."""
        return self.range_max(pos, pos)
