"""Batched passage alignment: all query passages of one page in three numba calls.

The streaming query (dupalign.passage.index) aligns every passage of a new page against the
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

Integer weights as in dupalign.passage.interval_scan: a matched non-empty window weighs
``w_match``, a jointly empty bin ``w_empty``, and a subsequence is similar when the weights
covering it reach ``need``. A stop list (longer than ``max_list``) comes with no entries:
its bin is neither a collision nor an empty bin.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.passage.interval_scan import scan_kernel
from dupalign.passage.oph import oph_sketch_kernel

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.integer[Any]]  # int64, or int32 for the in-memory lists' rectangles

EMPTY_KEY_SHIFT = 16  # empty-window keys: ordinal << 16 | bin (k ≤ 2^16)
_ANY_LENGTH = -(1 << 62)  # a min_len that keeps every window


@njit(cache=True, nogil=True)
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


@njit(cache=True, nogil=True)
def entries_before(start: I64, length: I64, ords: I64, before: int) -> I64:
    """Per list (rows ``start[x]:start[x] + length[x]`` of ``ords``, sorted by ordinal; a
    negative length marks a long list), the number of entries whose page is < ``before``."""
    out = np.zeros(start.shape[0], dtype=np.int64)
    for x in range(start.shape[0]):
        if length[x] > 0:
            out[x] = np.searchsorted(ords[start[x]:start[x] + length[x]], before)
    return out


@njit(cache=True, nogil=True)
def _is_in(sorted_values: I64, v: int) -> bool:
    i = np.searchsorted(sorted_values, v)
    return i < sorted_values.shape[0] and sorted_values[i] == v


@njit(cache=True, nogil=True)
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
    # collided-bin counts per page, in slots: ordinal - lo when the lists' ordinals span a
    # short range, else a hash table of the pages they hold (lists of text copied over a
    # long crawl span it all: an array over the range would cost 400 MB a call at 10^8
    # pages); after each passage only the slots it touched are reset
    n_entries = max(1, n_before.sum())
    lo, hi = 1 << 62, -1
    for x in range(n_before.shape[0]):
        if n_before[x] > 0:
            lo = min(lo, int(ords[start[x]]))
            hi = max(hi, int(ords[start[x] + n_before[x] - 1]))
    dense = hi - lo < max(1 << 20, 8 * n_entries)
    bits = 4
    while (1 << bits) < 2 * n_entries:
        bits += 1
    slot_page = np.full(1 if dense else 1 << bits, -1, dtype=np.int64)
    count = np.zeros(max(1, hi - lo + 1) if dense else 1 << bits, dtype=np.int32)
    touched = np.empty(n_entries, dtype=np.int64)
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
                    s = o - lo if dense else _slot(slot_page, bits, o)
                    if count[s] == 0:
                        touched[n_u] = s
                        n_u += 1
                    count[s] += 1
        if n_u == 0:
            continue
        u_page = np.empty(n_u, dtype=np.int64)
        u_cnt = np.empty(n_u, dtype=np.int64)
        n_pass = 0
        for y in range(n_u):
            s = touched[y]
            o = s + lo if dense else slot_page[s]
            hits = count[s]
            count[s] = 0
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


@njit(cache=True, nogil=True)
def _slot(slot_page: I64, bits: int, page: int) -> int:
    """The slot of ``page`` in an open-addressing table of 2**bits slots (-1: free), taken
    if it is not there yet: Fibonacci hashing, linear probing."""
    mask = np.int64((1 << bits) - 1)
    s = np.int64((np.uint64(page) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(64 - bits))
    while slot_page[s] != page:
        if slot_page[s] < 0:
            slot_page[s] = page
            break
        s = (s + np.int64(1)) & mask
    return int(s)


@njit(cache=True, nogil=True)
def _grow(a: I64, size: int) -> I64:
    out = np.empty(size, dtype=np.int64)
    out[: a.shape[0]] = a
    return out


@njit(cache=True, nogil=True)
def _csr_range(keys: I64, off: I64, key: int) -> tuple[int, int]:
    """Rows ``[a, b)`` of ``key`` in a CSR array with sorted distinct ``keys`` (empty if absent)."""
    i = np.searchsorted(keys, key)
    if i < keys.shape[0] and keys[i] == key:
        return off[i], off[i + 1]
    return 0, 0


@njit(cache=True, nogil=True)
def _push(buf: I64, m: int, i_lo: int, i_hi: int, j_lo: int, j_hi: int, w: int,
          min_len: int) -> int:
    """Append a rectangle (rows of ``buf``: i_lo, i_hi, j_lo, j_hi, weight) unless it covers
    no subsequence of ``min_len`` or more (the longest it covers is [i_lo, j_hi]: a shorter
    window can be part of no reported range, nor count in its estimate); returns the new
    count."""
    if i_lo > i_hi or j_lo > j_hi or j_hi - i_lo + 1 < min_len:
        return m
    buf[m, 0], buf[m, 1], buf[m, 2], buf[m, 3], buf[m, 4] = i_lo, i_hi, j_lo, j_hi, w
    return m + 1


NO_CAP = 1 << 62  # a ``max_repeats`` that reads every window


@njit(cache=True, nogil=True)
def _gather_matched(
    buf: I64, p: int, o: int, lid: I64, n_before: I64, start: I64, ords: I64, rects: Ints,
    w_match: int, min_len: int, max_repeats: int,
) -> int:  # fmt: skip
    """Rectangles of page ``o``'s windows in passage ``p``'s lists (rows of ``rects``,
    ordinals in ``ords``) into ``buf``, weight ``w_match``, those covering a subsequence of
    ``min_len`` or more (``_push``); returns their count.

    A list that holds more than ``max_repeats`` windows of page ``o`` (a unit repeated in
    that page) gives only its first ``max_repeats`` and those whose start interval meets
    the start interval of a window of the other lists (the ones with at most
    ``max_repeats``: where the passage's rarer units place it in page ``o``). Text
    repeated in page ``o`` is then aligned at its first places, and the work per passage
    no longer grows with the repeats; a page without such lists is read whole."""
    k = lid.shape[1]
    m = 0
    runs = np.zeros((k, 2), dtype=np.int64)  # page o's windows in each bin's list
    n_rare = 0
    n_over = 0
    for b in range(k):
        x = lid[p, b]
        if x >= 0:
            seg = ords[start[x]:start[x] + n_before[x]]
            a = start[x] + np.searchsorted(seg, o)
            z = start[x] + np.searchsorted(seg, o, side="right")
            runs[b, 0], runs[b, 1] = a, z
            if z - a > max_repeats:
                n_over += 1
                continue
            n_rare += z - a
            for r in range(a, z):
                m = _push(buf, m, rects[r, 0], rects[r, 1], rects[r, 2], rects[r, 3], w_match,
                          min_len)
    if n_over == 0:
        return m
    # the start intervals of the other lists' windows, as sorted disjoint half-open spans
    lo = np.empty(n_rare, dtype=np.int64)
    hi = np.empty(n_rare, dtype=np.int64)
    y = 0
    for b in range(k):
        if runs[b, 1] - runs[b, 0] <= max_repeats:
            for r in range(runs[b, 0], runs[b, 1]):
                lo[y], hi[y] = rects[r, 0], rects[r, 1] + 1
                y += 1
    order = np.argsort(lo)
    s_lo = np.empty(n_rare, dtype=np.int64)
    s_hi = np.empty(n_rare, dtype=np.int64)
    n_s = 0
    for y in order:
        if n_s and lo[y] <= s_hi[n_s - 1]:
            s_hi[n_s - 1] = max(s_hi[n_s - 1], hi[y])
        else:
            s_lo[n_s], s_hi[n_s] = lo[y], hi[y]
            n_s += 1
    s_lo, s_hi = s_lo[:n_s], s_hi[:n_s]
    for b in range(k):
        a, z = runs[b, 0], runs[b, 1]
        if z - a > max_repeats:
            for r in range(a, z):
                if r - a < max_repeats or _meets(s_lo, s_hi, rects[r, 0], rects[r, 1]):
                    m = _push(buf, m, rects[r, 0], rects[r, 1], rects[r, 2], rects[r, 3],
                              w_match, min_len)
    return m


@njit(cache=True, nogil=True)
def _check_empty_rows(empty_off: I64, empty_lr: I64) -> None:
    """The empty windows of one (page, bin) are the gaps between the bin's tokens (or the
    steps of weighted OPH): rows (l, i_hi, j_hi) with l ≤ i_hi ≤ j_hi, sorted and disjoint
    in i. ``_gather_empty`` relies on it."""
    for x in range(empty_off.shape[0] - 1):
        for r in range(empty_off[x], empty_off[x + 1]):
            if (empty_lr[r, 0] > empty_lr[r, 1] or empty_lr[r, 1] > empty_lr[r, 2]
                    or (r > empty_off[x] and empty_lr[r, 0] <= empty_lr[r - 1, 1])):
                raise ValueError("empty windows of a (page, bin) must be sorted disjoint rows")


@njit(cache=True, nogil=True)
def _first_ending_at(empty_lr: I64, a: int, z: int, pos: int) -> int:
    """First row in ``[a, z)`` whose i-range ends at or after ``pos`` (rows sorted by it)."""
    while a < z:
        mid = (a + z) // 2
        if empty_lr[mid, 1] < pos:
            a = mid + 1
        else:
            z = mid
    return a


@njit(cache=True, nogil=True)
def _gather_empty(
    buf: I64, m: int, p: int, o: int, q_empty: Bools, empty_keys: I64, empty_off: I64,
    empty_lr: I64, w_empty: int, i_s: I64, i_e: I64, j_s: I64, j_e: I64, min_len: int,
) -> int:  # fmt: skip
    """Append to ``buf`` (after its ``m`` rows) page ``o``'s empty windows in passage ``p``'s
    empty bins (CSR keyed by ``page << 16 | bin``, rows (l, i_hi, j_hi) covering
    i ∈ [l, i_hi], j ∈ [i, j_hi]; for a gap i_hi = j_hi) that meet the reachable spans on
    both axes (``_keep_reachable``: the others cover no similar cell) and cover a
    subsequence of ``min_len`` or more, with weight ``-w_empty`` (the sign marks them);
    returns the new count.

    A bin's rows are sorted and disjoint, so those meeting an i-span are one run found by
    binary search: a long page's thousands of empty windows are not visited one by one.
    """
    for b in range(q_empty.shape[1]):
        if not q_empty[p, b]:
            continue
        a, z = _csr_range(empty_keys, empty_off, (o << EMPTY_KEY_SHIFT) | b)
        for s in range(i_s.shape[0]):  # spans in order: a row meeting two is taken once
            a = _first_ending_at(empty_lr, a, z, i_s[s])
            while a < z and empty_lr[a, 0] < i_e[s]:
                lo, i_hi, j_hi = empty_lr[a, 0], empty_lr[a, 1], empty_lr[a, 2]
                if _meets(j_s, j_e, lo, j_hi):
                    m = _push(buf, m, lo, i_hi, lo, j_hi, -w_empty, min_len)
                a += 1
    return m


@njit(cache=True, nogil=True)
def _empty_bins(q_empty: Bools) -> I64:
    n_p, k = q_empty.shape
    out = np.zeros(n_p, dtype=np.int64)
    for p in range(n_p):
        for b in range(k):
            if q_empty[p, b]:
                out[p] += 1
    return out


@njit(cache=True, nogil=True)
def _reachable_spans(buf: I64, m: int, lo_col: int, m_min: int, opens: I64, closes: I64,
                     starts: I64, ends: I64) -> int:
    """The positions covered by ≥ ``m_min`` (≥ 1) matched (weight > 0) intervals
    ``[buf[:, lo_col], buf[:, lo_col + 1]]``, as sorted disjoint half-open spans
    ``[starts[s], ends[s])``; returns their number. ``opens`` and ``closes`` are scratch
    space; every array holds at least ``m`` values.

    A sweep over the interval ends in order: O(m log m) whatever the page length (a prefix
    count over every position of the page cost O(page length) per task, which dominated on
    long pages), or O(m + spread) by counting when the intervals spread over few positions.
    """
    n = 0
    first = 1 << 62
    last = -first
    for r in range(m):
        if buf[r, 4] > 0:
            opens[n] = buf[r, lo_col]
            closes[n] = buf[r, lo_col + 1] + 1  # first position after the interval
            first = min(first, opens[n])
            last = max(last, closes[n])
            n += 1
    if n and last - first <= 64 * n:  # counting costs about as much as sorting then
        return _spans_by_count(opens, closes, n, first, last, m_min, starts, ends)
    opens[:n].sort()
    closes[:n].sort()
    n_s = 0
    run = 0
    a = 0
    z = 0
    while z < n:  # at each endpoint x, in order: the coverage on [x, next endpoint)
        x = closes[z] if a == n else min(opens[a], closes[z])
        was = run >= m_min
        while a < n and opens[a] == x:
            run += 1
            a += 1
        while z < n and closes[z] == x:
            run -= 1
            z += 1
        if run >= m_min and not was:
            starts[n_s] = x
        elif was and run < m_min:
            ends[n_s] = x
            n_s += 1
    return n_s


@njit(cache=True, nogil=True)
def _spans_by_count(opens: I64, closes: I64, n: int, first: int, last: int, m_min: int,
                    starts: I64, ends: I64) -> int:
    """``_reachable_spans`` by a difference array over positions ``[first, last]``."""
    delta = np.zeros(last - first + 1, dtype=np.int64)
    for r in range(n):
        delta[opens[r] - first] += 1
        delta[closes[r] - first] -= 1
    n_s = 0
    run = 0
    for x in range(last - first + 1):
        was = run >= m_min
        run += delta[x]
        if run >= m_min and not was:
            starts[n_s] = first + x
        elif was and run < m_min:
            ends[n_s] = first + x
            n_s += 1
    return n_s


@njit(cache=True, nogil=True)
def _meets(starts: I64, ends: I64, lo: int, hi: int) -> bool:
    """Whether ``[lo, hi]`` (inclusive) meets one of the sorted disjoint spans."""
    s = np.searchsorted(ends, lo, side="right")  # first span ending after lo
    return s < starts.shape[0] and starts[s] <= hi


@njit(cache=True, nogil=True)
def _keep_reachable(buf: I64, m: int, m_min: int,
                    scratch: I64) -> tuple[int, I64, I64, I64, I64]:
    """Keep (compacted to the front) only the matched rectangles (rows of ``buf``) that can
    be part of a similar cell; return their count and the reachable spans on each axis.

    A similar cell is covered by at least ``m_min`` matched windows (the rest of the
    threshold is all the empty windows could add), and then so are its start i
    and its end j in the projections on each axis. A rectangle whose start interval, or
    end interval, holds no such position covers no similar cell: dropping it changes no
    result (a necessary condition only; the scan decides). Returns ``(count, i_starts,
    i_ends, j_starts, j_ends)``, the spans as in ``_reachable_spans``, views of
    ``scratch`` (6 rows of ≥ m values, reused across tasks: no allocation per task).
    """
    n_i = _reachable_spans(buf, m, 0, m_min, scratch[0], scratch[1], scratch[2], scratch[3])
    n_j = _reachable_spans(buf, m, 2, m_min, scratch[0], scratch[1], scratch[4], scratch[5])
    i_s, i_e = scratch[2, :n_i], scratch[3, :n_i]
    j_s, j_e = scratch[4, :n_j], scratch[5, :n_j]
    kept = 0
    if n_i and n_j:
        for r in range(m):
            if (_meets(i_s, i_e, buf[r, 0], buf[r, 1])
                    and _meets(j_s, j_e, buf[r, 2], buf[r, 3])):
                buf[kept] = buf[r]
                kept += 1
    return kept, i_s, i_e, j_s, j_e


@njit(cache=True, nogil=True)
def viable_tasks(
    task_p: I64, task_o: I64, lid: I64, n_before: I64, start: I64, ords: I64, rects: Ints,
    q_empty: Bools, w_match: int, w_empty: int, need: int, max_repeats: int,
) -> Bools:  # fmt: skip
    """Which tasks may still hold a similar cell, judged from their matched windows alone
    (before their empty windows are read): some start position and some end position must
    each be covered by enough matched windows that the empty bins could make up the rest."""
    n_empty = _empty_bins(q_empty)
    buf = np.empty((max(1, n_before.sum()), 5), dtype=np.int64)
    scratch = np.empty((6, buf.shape[0]), dtype=np.int64)
    out = np.zeros(task_p.shape[0], dtype=np.bool_)
    for t in range(task_p.shape[0]):
        p = task_p[t]
        rest = need - w_empty * n_empty[p]
        if rest <= 0:
            out[t] = True  # nothing to judge by
            continue
        # every window, whatever its length: the decision stays the one documented above
        m = _gather_matched(buf, p, task_o[t], lid, n_before, start, ords, rects, w_match,
                            _ANY_LENGTH, max_repeats)
        out[t] = _any_reachable(buf, m, -(-rest // w_match), scratch)
    return out


@njit(cache=True, nogil=True)
def _any_reachable(buf: I64, m: int, m_min: int, scratch: I64) -> bool:
    """Whether ``_keep_reachable`` would keep a rectangle, without compacting them: no end
    sweep when no start position is reachable, and a stop at the first rectangle kept (the
    viability filter needs no more)."""
    n_i = _reachable_spans(buf, m, 0, m_min, scratch[0], scratch[1], scratch[2], scratch[3])
    if n_i == 0:
        return False
    n_j = _reachable_spans(buf, m, 2, m_min, scratch[0], scratch[1], scratch[4], scratch[5])
    i_s, i_e = scratch[2, :n_i], scratch[3, :n_i]
    j_s, j_e = scratch[4, :n_j], scratch[5, :n_j]
    for r in range(m):
        if n_j and _meets(i_s, i_e, buf[r, 0], buf[r, 1]) and _meets(j_s, j_e, buf[r, 2],
                                                                      buf[r, 3]):
            return True
    return False


@njit(cache=True, nogil=True)
def scan_tasks(
    task_p: I64, task_o: I64, lid: I64, n_before: I64, start: I64, ords: I64, rects: Ints,
    q_empty: Bools, empty_keys: I64, empty_off: I64, empty_lr: I64,
    w_match: int, w_empty: int, need: int, min_len: int, k: int, max_repeats: int,
) -> tuple[I64, I64, I64, npt.NDArray[np.float64]]:  # fmt: skip
    """Interval scan of every (passage, candidate page) task over the rectangles of its
    matched windows and collided empty windows that can be part of a similar cell.

    Returns ``(hit_task, start, end, estimate)``: every longest near-duplicate range of the
    page (half-open units) per task, with ``N_mat / (k − N_emp)`` at the range's cell.
    """
    if w_empty:
        _check_empty_rows(empty_off, empty_lr)
    n_empty = _empty_bins(q_empty)
    rows = n_before.sum() + empty_lr.shape[0]
    buf = np.empty((max(1, rows), 5), dtype=np.int64)
    scratch = np.empty((6, buf.shape[0]), dtype=np.int64)
    h_t = np.empty(16, dtype=np.int64)
    h_s = np.empty(16, dtype=np.int64)
    h_e = np.empty(16, dtype=np.int64)
    h_x = np.empty(16, dtype=np.float64)
    n_h = 0
    for t in range(task_p.shape[0]):
        p = task_p[t]
        m = _gather_matched(buf, p, task_o[t], lid, n_before, start, ords, rects, w_match,
                            min_len, max_repeats)
        rest = need - w_empty * n_empty[p]
        m, i_s, i_e, j_s, j_e = _keep_reachable(buf, m, max(1, -(-rest // w_match)), scratch)
        if w_empty:
            m = _gather_empty(buf, m, p, task_o[t], q_empty, empty_keys, empty_off, empty_lr,
                              w_empty, i_s, i_e, j_s, j_e, min_len)
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
