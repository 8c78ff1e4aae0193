"""Brute-force twins of dupalign.passage.oph, dupalign.passage.segtree and
dupalign.passage.interval_scan.

Deliberately naive: enumerate every subsequence, every bin, every cell. Positions are 0-based
and inclusive unless a docstring says half-open.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from dupalign.passage.oph import OPHWindows

# (bin, empty, value, l, c, r); value 0 and c -1 for empty windows, as in OPHWindows
Window = tuple[int, bool, int, int, int, int]


def windows_as_set(w: OPHWindows) -> set[Window]:
    """An OPHWindows as a set of plain tuples."""
    rows = zip(w.bin, w.empty, w.value, w.l, w.c, w.r, strict=True)
    return {(int(b), bool(e), int(v), int(lo), int(c), int(r)) for b, e, v, lo, c, r in rows}


def subsequence_sketch(
    hvals: Sequence[int], bins: Sequence[int], k: int, i: int, j: int
) -> list[tuple[bool, int, int]]:
    """OPH sketch of T[i..j] computed directly, per bin: (empty, min value, position of the
    leftmost occurrence of the min) — position -1 when empty."""
    out: list[tuple[bool, int, int]] = []
    for t in range(k):
        best: tuple[int, int] | None = None
        for x in range(i, j + 1):
            if bins[x] == t and (best is None or (int(hvals[x]), x) < best):
                best = (int(hvals[x]), x)
        out.append((True, 0, -1) if best is None else (False, best[0], best[1]))
    return out


def divide_conquer_windows(hvals: Sequence[int], bins: Sequence[int], k: int) -> set[Window]:
    """The paper's Algorithms 1 and 2 literally: 1-based positions with dummy tuples at 0 and
    n+1, a linear-scan range minimum (ties by position), results converted to 0-based."""
    n = len(hvals)
    out: set[Window] = set()
    for t in range(k):
        induced = [(0, None)] + [(x + 1, int(hvals[x])) for x in range(n) if bins[x] == t]
        induced.append((n + 1, None))
        for (i, _), (j, _) in itertools.pairwise(induced):
            if i + 1 <= j - 1:  # l > r is not a window
                out.add((t, True, 0, i + 1 - 1, -1, j - 1 - 1))
        real = [(p, v) for p, v in induced if v is not None]

        def rec(lo: int, hi: int, real: list[tuple[int, int]] = real, t: int = t) -> None:
            inside = [(v, p) for p, v in real if lo <= p <= hi]
            if not inside:
                return
            v, c = min(inside)
            out.add((t, False, v, lo - 1, c - 1, hi - 1))
            rec(lo, c - 1)
            rec(c + 1, hi)

        rec(1, n)
    return out


def cover_weights(
    i_lo: Sequence[int], i_hi: Sequence[int], j_lo: Sequence[int], j_hi: Sequence[int],
    w: Sequence[int], i: int, j: int,
) -> int:  # fmt: skip
    """Sum of the weights of the rectangles containing (i, j)."""
    return sum(
        int(w[x]) for x in range(len(w)) if i_lo[x] <= i <= i_hi[x] and j_lo[x] <= j <= j_hi[x]
    )


def longest_only(pairs: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """Inclusive (i, j) pairs not strictly contained in another pair, as sorted half-open."""
    keep = [
        (i, j)
        for i, j in pairs
        if not any(a <= i and j <= b and (a, b) != (i, j) for a, b in pairs)
    ]
    return sorted((i, j + 1) for i, j in keep)


def brute_scan_rectangles(
    i_lo: Sequence[int], i_hi: Sequence[int], j_lo: Sequence[int], j_hi: Sequence[int],
    w: Sequence[int], threshold: int, min_len: int = 1,
) -> list[tuple[int, int]]:  # fmt: skip
    """Twin of interval_scan.scan_rectangles: every (i, j), its covering weight, longest-only."""
    if len(w) == 0:
        return []
    lo = min(min(i_lo), min(j_lo))
    hi = max(max(i_hi), max(j_hi))
    near = {
        (i, j)
        for i in range(lo, hi + 1)
        for j in range(i + min_len - 1, hi + 1)
        if cover_weights(i_lo, i_hi, j_lo, j_hi, w, i, j) >= threshold
    }
    return longest_only(near)


def brute_align(
    query_mins: Sequence[int], query_empty: Sequence[bool], hvals: Sequence[int],
    bins: Sequence[int], k: int, p: int, q: int, min_len: int = 1,
) -> list[tuple[int, int]]:  # fmt: skip
    """Twin of interval_scan.align_sketch: sketch every subsequence directly and test
    N_mat / (k − N_emp) ≥ p/q as q·N_mat + p·N_emp ≥ k·p; longest-only, half-open."""
    n = len(hvals)
    near: set[tuple[int, int]] = set()
    for i in range(n):
        for j in range(i + min_len - 1, n):
            sk = subsequence_sketch(hvals, bins, k, i, j)
            n_emp = sum(1 for t in range(k) if sk[t][0] and query_empty[t])
            n_mat = sum(
                1
                for t in range(k)
                if not sk[t][0] and not query_empty[t] and sk[t][1] == int(query_mins[t])
            )
            if q * n_mat + p * n_emp >= k * p:
                near.add((i, j))
    return longest_only(near)


def algorithm3(
    i_lo: Sequence[int], i_hi: Sequence[int], j_lo: Sequence[int], j_hi: Sequence[int],
    w: Sequence[int], threshold: int,
) -> list[tuple[tuple[int, int], tuple[int, int]]]:  # fmt: skip
    """The paper's Algorithm 3 (no optimizations): all compact alignments
    ``([u_x, u_{x+1} − 1], [v_y, v_{y+1} − 1])``, inclusive. Like the paper it does not
    restrict to i ≤ j."""
    if sum(w) < threshold:
        return []
    ep = sorted(
        [(i_lo[x], w[x], x) for x in range(len(w))]
        + [(i_hi[x] + 1, -w[x], x) for x in range(len(w))]
    )
    us = sorted({u for u, _, _ in ep})
    active: set[int] = set()
    cnt = 0
    out = []
    for ux, unext in itertools.pairwise(us):
        for u, dw, x in ep:
            if u == ux:
                cnt += dw
                if dw > 0:
                    active.add(x)
                else:
                    active.discard(x)
        if cnt >= threshold:
            ep2 = sorted([(j_lo[x], w[x]) for x in active] + [(j_hi[x] + 1, -w[x]) for x in active])
            vs = sorted({v for v, _ in ep2})
            cnt2 = 0
            for vy, vnext in itertools.pairwise(vs):
                cnt2 += sum(dw for v, dw in ep2 if v == vy)
                if cnt2 >= threshold:
                    out.append(((ux, unext - 1), (vy, vnext - 1)))
    return out


def exact_jaccard_alignment(
    text: Sequence[int], query: Sequence[int], p: int, q: int
) -> list[tuple[int, int]]:
    """Definition 1 with exact Jaccard: every T[i..j] with J(Q, T[i..j]) ≥ p/q, half-open."""
    qs = set(query)
    out = []
    for i in range(len(text)):
        for j in range(i, len(text)):
            s = set(text[i : j + 1])
            if q * len(s & qs) >= p * len(s | qs):
                out.append((i, j + 1))
    return out


class NaiveRangeArray:
    """Twin of segtree.SegmentTree: a plain array."""

    def __init__(self, size: int) -> None:
        self.a = np.zeros(size, dtype=np.int64)

    def add(self, lo: int, hi: int, delta: int) -> None:
        lo, hi = max(lo, 0), min(hi, len(self.a) - 1)
        if lo <= hi:
            self.a[lo : hi + 1] += delta

    def rightmost_at_least(self, lo: int, hi: int, threshold: int) -> int:
        for x in range(min(hi, len(self.a) - 1), max(lo, 0) - 1, -1):
            if self.a[x] >= threshold:
                return x
        return -1

    def range_max(self, lo: int, hi: int) -> int:
        return int(self.a[max(lo, 0) : min(hi, len(self.a) - 1) + 1].max())
