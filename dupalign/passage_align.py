"""Batched passage alignment: all query passages of one page in three numba calls.

The streaming query (dupalign.passages) aligns every passage of a new page against the
earlier pages whose windows collide with the passage's sketch. Done one passage at a time
in Python, the per-passage overhead (about a millisecond) dominated the cost; here the
page's passages go through the pipeline together:

1. ``passage_sketches``: the OPH sketch of every passage (P × k min-hashes);
2. the caller gathers the distinct inverted lists named by those sketches into one CSR
   array (entries sorted by ordinal within each list, as the store keeps them);
3. ``select_candidates``: per passage, the earlier pages that collide in enough distinct
   bins to reach the threshold if every empty bin also collided, capped at
   ``max_candidates`` (most collided bins first); ``viable_tasks`` drops those whose
   windows cannot cover a similar cell;
4. the caller reads the empty windows of those pages only;
5. ``scan_tasks``: per (passage, candidate page), the rectangles of its matched windows and
   collided empty windows, the interval scan, and the estimate of every reported range.

Integer weights as in dupalign.interval_scan: a matched non-empty window weighs
``w_match``, a jointly empty bin ``w_empty``, and a subsequence is similar when the weights
covering it reach ``need``. A stop list (longer than ``max_list``) comes with no entries:
its bin is neither a collision nor an empty bin.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from dupalign.interval_scan import scan_kernel
from dupalign.oph import oph_sketch_kernel

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.integer[Any]]  # int64, or int32 for the in-memory lists' rectangles

EMPTY_KEY_SHIFT = 16  # empty-window keys: ordinal << 16 | bin (k ≤ 2^16)


@njit(cache=True)
def passage_sketches(hvals: U64, bins: I64, starts: I64, ends: I64, k: int) -> tuple[U64, Bools]:
    """OPH sketch of every passage ``[starts[p], ends[p])``: ``(mins[P, k], empty[P, k])``,
    each row equal to ``oph.oph_sketch`` of the slice (``mins`` is 0 in empty bins)."""
    n_p = starts.shape[0]
    mins = np.zeros((n_p, k), dtype=np.uint64)
    empty = np.ones((n_p, k), dtype=np.bool_)
    for p in range(n_p):
        mins[p], empty[p] = oph_sketch_kernel(hvals[starts[p]:ends[p]], bins[starts[p]:ends[p]],
                                              k)
    return mins, empty


@njit(cache=True)
def entries_before(start: I64, length: I64, ords: I64, before: int) -> I64:
    """Per list (rows ``start[x]:start[x] + length[x]`` of ``ords``, sorted by ordinal; a
    negative length marks a long list), the number of entries whose page is < ``before``."""
    out = np.zeros(start.shape[0], dtype=np.int64)
    for x in range(start.shape[0]):
        if length[x] > 0:
            out[x] = np.searchsorted(ords[start[x]:start[x] + length[x]], before)
    return out


@njit(cache=True)
def _is_in(sorted_values: I64, v: int) -> bool:
    i = np.searchsorted(sorted_values, v)
    return i < sorted_values.shape[0] and sorted_values[i] == v


@njit(cache=True)
def select_candidates(
    lid: I64, n_before: I64, start: I64, ords: I64, q_empty: Bools, exclude: I64,
    w_match: int, w_empty: int, need: int, max_candidates: int,
) -> tuple[I64, I64, int]:  # fmt: skip
    """Candidate pages of every passage.

    ``lid[p, b]`` is the list of passage p's min-hash in bin b (-1 where the bin is
    empty); ``exclude`` is sorted. A page's collided bins are the distinct lists holding
    one of its windows.

    Returns ``(task_passage, task_page, pruned)``: the tasks sorted by passage, then page;
    ``pruned`` counts pages dropped because they cannot reach the threshold even if every
    empty bin collided (or are excluded).
    """
    n_p, k = lid.shape
    # collided-bin counts per page, indexed by ordinal (up to the largest ordinal counted);
    # after each passage only the pages it touched are reset
    n_ord = 1
    for x in range(n_before.shape[0]):
        if n_before[x] > 0:
            n_ord = max(n_ord, ords[start[x] + n_before[x] - 1] + 1)
    count = np.zeros(n_ord, dtype=np.int32)
    touched = np.empty(max(1, n_before.sum()), dtype=np.int64)
    t_p = np.empty(16, dtype=np.int64)
    t_o = np.empty(16, dtype=np.int64)
    n_t = 0
    pruned = 0
    for p in range(n_p):
        n_empty = 0
        n_u = 0
        for b in range(k):
            x = lid[p, b]
            if x < 0:
                if q_empty[p, b]:
                    n_empty += 1
                continue
            prev = -1
            for e in range(start[x], start[x] + n_before[x]):
                o = ords[e]
                if o != prev:  # one count per (page, list): a list is sorted by ordinal
                    prev = o
                    if count[o] == 0:
                        touched[n_u] = o
                        n_u += 1
                    count[o] += 1
        if n_u == 0:
            continue
        u_page = np.empty(n_u, dtype=np.int64)
        u_cnt = np.empty(n_u, dtype=np.int64)
        n_pass = 0
        for y in range(n_u):
            o = touched[y]
            hits = count[o]
            count[o] = 0
            if (w_match * hits + w_empty * n_empty >= need
                    and not (exclude.shape[0] and _is_in(exclude, o))):
                u_page[n_pass] = o
                u_cnt[n_pass] = hits
                n_pass += 1
            else:
                pruned += 1
        order = np.argsort(u_page[:n_pass])  # the few pages kept, by ordinal
        u_page = u_page[:n_pass][order]
        u_cnt = u_cnt[:n_pass][order]
        keep = np.arange(n_pass)
        if n_pass > max_candidates:
            # most collided bins first; ties keep the smaller ordinal (stable sort)
            keep = np.sort(np.argsort(-u_cnt, kind="mergesort")[:max_candidates])
        if n_t + keep.shape[0] > t_p.shape[0]:
            size = 2 * (n_t + keep.shape[0])
            t_p = _grow(t_p, size)
            t_o = _grow(t_o, size)
        for c in range(keep.shape[0]):
            t_p[n_t] = p
            t_o[n_t] = u_page[keep[c]]
            n_t += 1
    return t_p[:n_t].copy(), t_o[:n_t].copy(), pruned


@njit(cache=True)
def _grow(a: I64, size: int) -> I64:
    out = np.empty(size, dtype=np.int64)
    out[: a.shape[0]] = a
    return out


@njit(cache=True)
def _csr_range(keys: I64, off: I64, key: int) -> tuple[int, int]:
    """Rows ``[a, b)`` of ``key`` in a CSR array with sorted distinct ``keys`` (empty if absent)."""
    i = np.searchsorted(keys, key)
    if i < keys.shape[0] and keys[i] == key:
        return off[i], off[i + 1]
    return 0, 0


@njit(cache=True)
def _push(buf: I64, m: int, i_lo: int, i_hi: int, j_lo: int, j_hi: int, w: int) -> int:
    """Append a rectangle (rows of ``buf``: i_lo, i_hi, j_lo, j_hi, weight) unless it covers
    no subsequence; returns the new count."""
    if i_lo > i_hi or j_lo > j_hi:
        return m
    buf[m, 0], buf[m, 1], buf[m, 2], buf[m, 3], buf[m, 4] = i_lo, i_hi, j_lo, j_hi, w
    return m + 1


@njit(cache=True)
def _gather(
    buf: I64, p: int, o: int, lid: I64, n_before: I64, start: I64, ords: I64, rects: Ints,
    q_empty: Bools, empty_keys: I64, empty_off: I64, empty_lr: I64, w_match: int,
    w_empty: int,
) -> int:  # fmt: skip
    """Rectangles of page ``o`` against passage ``p`` into ``buf``; returns their count.

    Its windows in the passage's lists (rows of ``rects``, ordinals in ``ords``) and, when
    ``w_empty``, its empty windows in the passage's empty bins (CSR keyed by
    ``page << 16 | bin``, rows (l, r) covering i, j ∈ [l, r]). Empty windows get weight
    ``-w_empty``: the sign marks them. Each row of the inputs is used at most once, so
    ``buf`` needs no more rows than they hold together.
    """
    m = 0
    for b in range(lid.shape[1]):
        x = lid[p, b]
        if x >= 0:
            seg = ords[start[x]:start[x] + n_before[x]]
            for r in range(start[x] + np.searchsorted(seg, o),
                           start[x] + np.searchsorted(seg, o, side="right")):
                m = _push(buf, m, rects[r, 0], rects[r, 1], rects[r, 2], rects[r, 3], w_match)
        elif w_empty and q_empty[p, b]:
            a, z = _csr_range(empty_keys, empty_off, (o << EMPTY_KEY_SHIFT) | b)
            for r in range(a, z):
                lo, hi = empty_lr[r, 0], empty_lr[r, 1]
                m = _push(buf, m, lo, hi, lo, hi, -w_empty)
    return m


@njit(cache=True)
def _empty_bins(q_empty: Bools) -> I64:
    n_p, k = q_empty.shape
    out = np.zeros(n_p, dtype=np.int64)
    for p in range(n_p):
        for b in range(k):
            if q_empty[p, b]:
                out[p] += 1
    return out


@njit(cache=True)
def _reachable(buf: I64, m: int, lo_col: int, m_min: int, size: int) -> I64:
    """Prefix counts of the positions covered by ≥ ``m_min`` matched (weight > 0) intervals
    ``[buf[:, lo_col], buf[:, lo_col + 1]]``."""
    cov = np.zeros(size + 1, dtype=np.int64)
    for r in range(m):
        if buf[r, 4] > 0:
            cov[buf[r, lo_col]] += 1
            cov[buf[r, lo_col + 1] + 1] -= 1
    out = np.zeros(size + 1, dtype=np.int64)
    run = 0
    for x in range(size):
        run += cov[x]
        out[x + 1] = out[x] + (1 if run >= m_min else 0)
    return out


@njit(cache=True)
def _drop_unreachable(buf: I64, m: int, m_min: int) -> int:
    """Keep (compacted to the front) only the rectangles that can be part of a similar cell.

    A similar cell is covered by at least ``m_min`` matched windows (the rest of the
    threshold is all the empty windows could add), and then so are its start i
    and its end j in the projections on each axis. A rectangle whose start interval, or
    end interval, holds no such position covers no similar cell: dropping it changes no
    result (a necessary condition only; the scan decides). Returns the new count.
    """
    size = 0
    for r in range(m):
        size = max(size, buf[r, 1] + 2, buf[r, 3] + 2)
    ok_i = _reachable(buf, m, 0, m_min, size)
    ok_j = _reachable(buf, m, 2, m_min, size)
    kept = 0
    for r in range(m):
        # prefix counts: any reachable position in [lo, hi]
        if (ok_i[buf[r, 1] + 1] > ok_i[buf[r, 0]] and ok_j[buf[r, 3] + 1] > ok_j[buf[r, 2]]):
            buf[kept] = buf[r]
            kept += 1
    return kept


@njit(cache=True)
def viable_tasks(
    task_p: I64, task_o: I64, lid: I64, n_before: I64, start: I64, ords: I64, rects: Ints,
    q_empty: Bools, w_match: int, w_empty: int, need: int,
) -> Bools:  # fmt: skip
    """Which tasks may still hold a similar cell, judged from their matched windows alone
    (before their empty windows are read): some start position and some end position must
    each be covered by enough matched windows that the empty bins could make up the rest."""
    n_empty = _empty_bins(q_empty)
    none = np.empty(0, dtype=np.int64)
    none2 = np.empty((0, 2), dtype=np.int64)
    buf = np.empty((max(1, n_before.sum()), 5), dtype=np.int64)
    out = np.zeros(task_p.shape[0], dtype=np.bool_)
    for t in range(task_p.shape[0]):
        p = task_p[t]
        rest = need - w_empty * n_empty[p]
        if rest <= 0:
            out[t] = True  # nothing to judge by
            continue
        m = _gather(buf, p, task_o[t], lid, n_before, start, ords, rects, q_empty, none, none,
                    none2, w_match, 0)
        out[t] = _drop_unreachable(buf, m, -(-rest // w_match)) > 0
    return out


@njit(cache=True)
def scan_tasks(
    task_p: I64, task_o: I64, lid: I64, n_before: I64, start: I64, ords: I64, rects: Ints,
    q_empty: Bools, empty_keys: I64, empty_off: I64, empty_lr: I64,
    w_match: int, w_empty: int, need: int, min_len: int, k: int,
) -> tuple[I64, I64, I64, npt.NDArray[np.float64]]:  # fmt: skip
    """Interval scan of every (passage, candidate page) task over the rectangles that
    ``_gather`` collects.

    Returns ``(hit_task, start, end, estimate)``: every longest near-duplicate range of the
    page (half-open units) per task, with ``N_mat / (k − N_emp)`` at the range's cell.
    """
    n_empty = _empty_bins(q_empty)
    rows = n_before.sum() + empty_lr.shape[0]
    buf = np.empty((max(1, rows), 5), dtype=np.int64)
    h_t = np.empty(16, dtype=np.int64)
    h_s = np.empty(16, dtype=np.int64)
    h_e = np.empty(16, dtype=np.int64)
    h_x = np.empty(16, dtype=np.float64)
    n_h = 0
    for t in range(task_p.shape[0]):
        p = task_p[t]
        m = _gather(buf, p, task_o[t], lid, n_before, start, ords, rects, q_empty, empty_keys,
                    empty_off, empty_lr, w_match, w_empty)
        rest = need - w_empty * n_empty[p]
        m = _drop_unreachable(buf, m, max(1, -(-rest // w_match)))
        w = np.abs(buf[:m, 4])
        if m == 0 or w.sum() < need:
            continue
        s_out, e_out = scan_kernel(buf[:m, 0].copy(), buf[:m, 1].copy(), buf[:m, 2].copy(),
                                   buf[:m, 3].copy(), w, need, min_len)
        for y in range(s_out.shape[0]):
            i = s_out[y]
            j = e_out[y] - 1
            n_emp = 0
            n_all = 0
            for r in range(m):
                if buf[r, 0] <= i <= buf[r, 1] and buf[r, 2] <= j <= buf[r, 3]:
                    n_all += 1
                    if buf[r, 4] < 0:
                        n_emp += 1
            denom = k - n_emp
            if n_h == h_t.shape[0]:
                h_t, h_s, h_e = _grow(h_t, 2 * n_h), _grow(h_s, 2 * n_h), _grow(h_e, 2 * n_h)
                h_x2 = np.empty(2 * n_h, dtype=np.float64)
                h_x2[:n_h] = h_x
                h_x = h_x2
            h_t[n_h] = t
            h_s[n_h] = s_out[y]
            h_e[n_h] = e_out[y]
            h_x[n_h] = (n_all - n_emp) / denom if denom > 0 else 0.0
            n_h += 1
    return h_t[:n_h].copy(), h_s[:n_h].copy(), h_e[:n_h].copy(), h_x[:n_h].copy()
