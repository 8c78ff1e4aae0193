"""Interval scan: longest near-duplicate subsequences from weighted rectangles (OPH §4).

A compact window covers a rectangle of subsequences: start i ∈ [i_lo, i_hi], end
j ∈ [j_lo, j_hi] (for an OPH window (l, c, r): i ∈ [l, c], j ∈ [c, r]; for an empty one
i, j ∈ [l, r]). Given the windows that collide with a query, each with an integer weight,
a subsequence T[i..j] is a near-duplicate when the weights of the rectangles containing
(i, j) sum to at least the threshold. For OPH with θ = p/q: matched non-empty windows
weigh q, collided empty windows weigh p, and the threshold is k·p, which is exactly
``N_mat / (k − N_emp) ≥ θ`` in integers.

The scan (Algorithm 3 with the paper's three optimizations): sweep the distinct left
endpoints u in increasing order; keep the right intervals of the rectangles whose left
interval covers u in a segment tree (range add; the paper's tree is dynamic, over the
text's positions, ours is over the ≤ 2m distinct end bounds); when the running left count
reaches the threshold, ask the tree for the rightmost end j with covering weight ≥ the
threshold (tree updates are deferred to those moments, so that rectangles that open and
close while the count is below the threshold cost nothing); report T[u..j] only if
j > z, the largest end reported so far (the `z` filter), which leaves exactly the
near-duplicates not strictly contained in another one.
Ties by position are the window generator's business (dupalign.passage.oph).

When there are few cells (``FLAT_CELLS`` or fewer: a passage task's ~60 rectangles), the
tree is replaced by a flat array of cell weights: a range add touches each cell, a query
walks down from the last cell. That does more steps than the tree's O(log) but simpler
ones; on the dense stream's tasks the scan took 0.77x the time with the same output.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.passage.oph import U64, Bools, OPHWindows, oph_sketch
from dupalign.passage.segtree import seg_add, seg_new, seg_rightmost

I64 = npt.NDArray[np.int64]
ArrayLike = npt.ArrayLike

FLAT_CELLS = 256  # at most this many end cells: a flat array instead of the segment tree


@njit(cache=True, nogil=True)
def radix_sort(keys: I64, tmp: I64) -> None:
    """Sort non-negative int64 ``keys`` ascending in place (LSD, 8-bit digits, as many
    passes as the largest key has bytes); ``tmp``: scratch of the same length."""
    n = keys.shape[0]
    top = 0
    for x in range(n):
        top = max(top, keys[x])
    src, dst = keys, tmp
    cnt = np.empty(256, dtype=np.int64)
    shift = 0
    while shift < 64 and (top >> shift) > 0:
        cnt[:] = 0
        for x in range(n):
            cnt[(src[x] >> shift) & 255] += 1
        total = 0
        for d in range(256):
            c = cnt[d]
            cnt[d] = total
            total += c
        for x in range(n):
            d = (src[x] >> shift) & 255
            dst[cnt[d]] = src[x]
            cnt[d] += 1
        src, dst = dst, src
        shift += 8
    if shift % 16:  # an odd number of passes: the result is in tmp
        keys[:] = src


@njit(cache=True, nogil=True)
def _sorted_ends(lo: I64, hi: I64) -> tuple[I64, I64]:
    """The 2m interval ends ``lo[x]`` (event x) and ``hi[x] + 1`` (event m + x) sorted by
    position: ``(positions, events)`` (order within a position is unspecified).

    Sorted as packed int64 keys (position − min ‖ event): in numba that is several times
    faster than an argsort and gathers; argsort only if the positions span too far. The keys
    are distinct, so any sort gives the same order: a radix sort (``radix_sort``), 0.4x the
    time of numba's quicksort on llvm's large tasks and 0.85x on the dense stream's."""
    m = lo.shape[0]
    n = 2 * m
    base = lo.min()
    bits = 1
    while (1 << bits) < n:
        bits += 1
    pos = np.empty(n, dtype=np.int64)
    ev = np.empty(n, dtype=np.int64)
    if hi.max() + 1 - base >= (1 << (62 - bits)):
        for x in range(m):
            pos[x], pos[m + x] = lo[x], hi[x] + 1
        order = np.argsort(pos)
        return pos[order], order
    keys = np.empty(n, dtype=np.int64)
    for x in range(m):
        keys[x] = ((lo[x] - base) << bits) | x
        keys[m + x] = ((hi[x] + 1 - base) << bits) | (m + x)
    radix_sort(keys, np.empty(n, dtype=np.int64))
    mask = (1 << bits) - 1
    for e in range(n):
        pos[e] = (keys[e] >> bits) + base
        ev[e] = keys[e] & mask
    return pos, ev


@njit(cache=True, nogil=True, inline="always")
def _cell_of(bounds: I64, n: int, pos: int) -> int:
    """The last of ``bounds[:n]`` (ascending) at or before ``pos``, -1 if none (a binary
    search by hand: ``np.searchsorted`` on a slice costs more than the search here)."""
    a, z = 0, n
    while a < z:
        mid = (a + z) >> 1
        if bounds[mid] <= pos:
            a = mid + 1
        else:
            z = mid
    return a - 1


@njit(cache=True, nogil=True)
def _scan(
    il: I64, ih: I64, j_lo: I64, j_hi: I64, w: I64, threshold: int, min_len: int,
    flat_cells: int,
) -> tuple[I64, I64]:  # fmt: skip
    m = w.shape[0]
    # left endpoints: event x < m opens rectangle x at il[x], event m + x closes it
    ep_pos, ep_ev = _sorted_ends(il, ih)
    # End positions compressed to cells: between consecutive distinct bounds (j_lo, and
    # j_hi + 1) every position is covered by the same rectangles, so cell c stands for
    # positions [bounds[c], bounds[c + 1]) and the rightmost qualifying position is the
    # last one of the rightmost qualifying cell. The tree then has ≤ 2m leaves, whatever
    # the length of the text.
    j_pos, j_ev = _sorted_ends(j_lo, j_hi)
    bounds = np.empty(2 * m, dtype=np.int64)
    c_lo = np.empty(m, dtype=np.int64)
    c_hi = np.empty(m, dtype=np.int64)
    size = -1
    for e in range(2 * m):
        if size < 0 or j_pos[e] != bounds[size]:
            size += 1
            bounds[size] = j_pos[e]
        x = j_ev[e]
        if x < m:
            c_lo[x] = size
        else:
            c_hi[x - m] = size - 1
    flat = size <= flat_cells  # cell weights in ``cov``, else in the tree
    cov = np.zeros(size if flat else 0, dtype=np.int64)
    nd, st = seg_new(1 if flat else size)
    n_ep = 2 * m
    out_s = np.empty(n_ep, dtype=np.int64)
    out_e = np.empty(n_ep, dtype=np.int64)
    n_out = 0
    # Tree updates are deferred until a query needs them: a rectangle whose left interval
    # opens and closes while the running count stays below the threshold never touches
    # the tree (most of a text, usually). state: 0 unseen, 1 pending, 2 in tree, 3 done.
    state = np.zeros(m, dtype=np.int8)
    pending = np.empty(m, dtype=np.int64)
    n_pend = 0
    cnt = 0
    # A query looks at cells [c0, c_top] only: c0 = max(the cell of q_lo, c_z), with c_z the
    # first cell whose last position is past the largest end reported so far (a cell before
    # it can report nothing); c_top, the last cell of a rectangle ever added (past it every
    # cell weighs 0). Both c0 and c_z only grow, so cells before the last query's c0
    # (``dead``) are never read again: the flat array's adds and removals skip them
    # (``added``: where a rectangle's add began). On long copies most of a rectangle's end
    # interval lies before the end already reported.
    c_z = 0
    c_top = -1
    dead = 0
    added = np.empty(m if flat else 0, dtype=np.int64)
    e = 0
    while e < n_ep:
        u = ep_pos[e]
        while e < n_ep and ep_pos[e] == u:
            x = ep_ev[e]
            if x < m:
                cnt += w[x]
                state[x] = 1
                pending[n_pend] = x
                n_pend += 1
            else:
                x -= m
                cnt -= w[x]
                if state[x] == 2:
                    if flat:
                        for cc in range(max(added[x], dead), c_hi[x] + 1):
                            cov[cc] -= w[x]
                    else:
                        seg_add(nd, size, c_lo[x], c_hi[x], -w[x])
                state[x] = 3
            e += 1
        # every start in [u, next endpoint) has the same covering set: u is the longest
        if cnt >= threshold:
            q_lo = u + min_len - 1  # length j − u + 1 ≥ min_len (also j ≥ u)
            if q_lo < bounds[size]:
                # the cell holding q_lo (cell 0 if q_lo comes before every bound)
                c0 = max(_cell_of(bounds, size + 1, q_lo), c_z, 0)
                dead = c0
                for y in range(n_pend):
                    x = pending[y]
                    if state[x] == 1:
                        if flat:
                            added[x] = max(c_lo[x], c0)
                            for cc in range(added[x], c_hi[x] + 1):
                                cov[cc] += w[x]
                        else:
                            seg_add(nd, size, c_lo[x], c_hi[x], w[x])
                        state[x] = 2
                        c_top = max(c_top, c_hi[x])
                n_pend = 0
                if flat:  # the rightmost cell from c0 on reaching the threshold
                    c = c_top
                    while c >= c0 and cov[c] < threshold:
                        c -= 1
                    if c < c0:
                        c = -1
                else:
                    c = seg_rightmost(nd, st, size, c0, c_top, threshold)
                if c >= 0:  # past the largest end reported so far (c ≥ c_z)
                    out_s[n_out] = u
                    out_e[n_out] = bounds[c + 1]
                    n_out += 1
                    c_z = c + 1
    return out_s[:n_out].copy(), out_e[:n_out].copy()


def scan_rectangles(
    i_lo: ArrayLike,
    i_hi: ArrayLike,
    j_lo: ArrayLike,
    j_hi: ArrayLike,
    weights: ArrayLike,
    threshold: int,
    min_len: int = 1,
    flat_cells: int = FLAT_CELLS,
) -> list[tuple[int, int]]:
    """Longest near-duplicate subsequences covered by weighted rectangles.

    Input bounds are 0-based INCLUSIVE token positions: rectangle x covers every
    subsequence T[i..j] (inclusive) with ``i_lo[x] ≤ i ≤ i_hi[x]`` and
    ``j_lo[x] ≤ j ≤ j_hi[x]``. Rectangles with ``i_lo > i_hi`` or ``j_lo > j_hi`` are
    ignored. Weights are positive integers, ``threshold`` a positive integer.

    A subsequence T[i..j] is a near-duplicate when ``j − i + 1 ≥ min_len`` (the paper's
    length threshold t; default 1: every non-empty subsequence) and the weights of the
    rectangles containing (i, j) sum to ≥ ``threshold``. Returned: the near-duplicates not
    strictly contained in another near-duplicate, as HALF-OPEN 0-based ranges ``(i, j + 1)``
    (so ``end − start ≥ min_len``), sorted by start (and then also by end).

    O(m log m) for m rectangles, O(m) memory, whatever the positions: two sorts (left
    endpoints, right bounds), two tree updates per rectangle and at most one tree query per
    distinct left endpoint. ``flat_cells``: up to how many end cells a flat array stands
    for the tree (the same result; tests set it to 0 to exercise the tree).
    """
    il = np.asarray(i_lo, dtype=np.int64).ravel()
    ih = np.asarray(i_hi, dtype=np.int64).ravel()
    jl = np.asarray(j_lo, dtype=np.int64).ravel()
    jh = np.asarray(j_hi, dtype=np.int64).ravel()
    w = np.asarray(weights, dtype=np.int64).ravel()
    if not (il.shape == ih.shape == jl.shape == jh.shape == w.shape):
        raise ValueError("rectangle arrays must have the same length")
    if threshold <= 0:
        raise ValueError("threshold must be positive (else every subsequence matches)")
    if min_len < 1:
        raise ValueError("min_len must be >= 1")
    if w.size and w.min() <= 0:
        raise ValueError("weights must be positive")
    keep = (il <= ih) & (jl <= jh)
    if not keep.all():
        il, ih, jl, jh, w = il[keep], ih[keep], jl[keep], jh[keep], w[keep]
    if int(w.sum()) < threshold:  # the paper's line 1: no cell can reach the threshold
        return []
    s, e = _scan(il, ih, jl, jh, w, int(threshold), int(min_len), int(flat_cells))
    return list(zip(s.tolist(), e.tolist(), strict=True))


@njit(cache=True, nogil=True)
def scan_kernel(
    il: I64, ih: I64, jl: I64, jh: I64, w: I64, threshold: int, min_len: int
) -> tuple[I64, I64]:
    """``scan_rectangles`` for numba callers: valid rectangles (``il ≤ ih``, ``jl ≤ jh``),
    positive weights, at least one rectangle. Returns (starts, ends), half-open."""
    return _scan(il, ih, jl, jh, w, threshold, min_len, FLAT_CELLS)


def collisions(windows: OPHWindows, query_mins: U64, query_empty: Bools) -> Bools:
    """Which windows collide with a query sketch.

    A non-empty window collides when the query's bin is non-empty with the same min-hash;
    an empty window collides when the query's bin is empty too.
    """
    qe = query_empty[windows.bin]
    return np.where(windows.empty, qe, ~qe & (query_mins[windows.bin] == windows.value))


def oph_rectangles(
    windows: OPHWindows, mask: Bools, theta: tuple[int, int]
) -> tuple[I64, I64, I64, I64, I64]:
    """Rectangles and integer weights of the windows selected by ``mask`` for θ = p/q.

    Non-empty (l, c, r): i ∈ [l, c], j ∈ [c, r], weight q. Empty (l, r): i, j ∈ [l, r],
    weight p. The matching threshold is k·p.
    """
    p, q = _check_theta(theta)
    emp = windows.empty[mask]
    lo, c, r = windows.l[mask], windows.c[mask], windows.r[mask]
    i_hi = np.where(emp, r, c)
    j_lo = np.where(emp, lo, c)
    w = np.where(emp, p, q).astype(np.int64)
    return lo, i_hi, j_lo, r, w


def align_sketch(
    query_mins: U64,
    query_empty: Bools,
    text_windows: OPHWindows,
    k: int,
    theta: tuple[int, int],
    min_len: int = 1,
) -> list[tuple[int, int]]:
    """Longest subsequences T[s:e] (half-open, 0-based) whose OPH estimate against the query
    sketch is ≥ θ = p/q and whose length is ≥ ``min_len``."""
    p, q = _check_theta(theta)
    if query_mins.shape[0] != k or query_empty.shape[0] != k:
        raise ValueError("query sketch must have k bins")
    mask = collisions(text_windows, query_mins, query_empty)
    n_emp = int(np.count_nonzero(mask & text_windows.empty))
    n_mat = int(np.count_nonzero(mask)) - n_emp
    if q * n_mat + p * n_emp < k * p:
        return []
    return scan_rectangles(*oph_rectangles(text_windows, mask, theta), k * p, min_len)


def align(
    query_hvals: U64,
    text_windows: OPHWindows,
    k: int,
    theta: tuple[int, int],
    min_len: int = 1,
) -> list[tuple[int, int]]:
    """Pairwise alignment: the longest near-duplicate subsequences of a text for a query.

    ``query_hvals`` are the query's OPH values (``oph.oph_values``); ``text_windows`` come
    from ``oph.compact_windows`` with the same k. Returns half-open 0-based token ranges
    ``(text_start, text_end)`` of the text with ``N_mat / (k − N_emp) ≥ p/q``.
    """
    mins, empty = oph_sketch(query_hvals, k)
    return align_sketch(mins, empty, text_windows, k, theta, min_len)


def _check_theta(theta: tuple[int, int]) -> tuple[int, int]:
    p, q = int(theta[0]), int(theta[1])
    if not 0 < p <= q:
        raise ValueError(f"theta must be a fraction p/q with 0 < p <= q, got {theta}")
    return p, q
