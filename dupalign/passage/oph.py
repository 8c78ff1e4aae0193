"""One Permutation Hashing (OPH) sketches and OPH compact windows (Peng, Zhang, Deng, SIGMOD 2024).

Token hash values: ``oph_values(token_hashes, salt)`` = ``hashing.mix64(token_hashes, salt)``,
so every occurrence of a token has the same value.

Bins: the 64-bit hash range is split into ``k`` CONTIGUOUS ranges of (nearly) equal size:
``bin(h) = floor(h · k / 2^64)`` (the high bits of h·k), so bin t holds the values in
``[ceil(t·2^64/k), ceil((t+1)·2^64/k))``. The paper's Figure 2 uses residues mod 10; any even
partition works, and the ``*_binned`` functions accept any bin assignment in which equal
values share a bin (the worked examples in the tests use residues).

Ties (duplicates of a token share a value) are broken by position: among equal values the
leftmost occurrence is the smaller. This is the paper's "order by token positions"
optimization; it makes the windows of equal min-hashes have disjoint left intervals.

Positions: 0-based. Every window's ``l``, ``c``, ``r`` are INCLUSIVE token positions.
A non-empty window (bin t, value v, l, c, r) says: every subsequence T[i..j] (inclusive) with
``l ≤ i ≤ c ≤ j ≤ r`` has OPH min-hash v in bin t (the token at c). An empty window
(bin t, l, r) says: every T[i..j] with ``l ≤ i ≤ j ≤ r`` has no token in bin t. Together they
represent every (subsequence, bin) pair exactly once (the paper's Theorem 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.text.hashing import mix64

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]
Sketch = tuple[U64, Bools]

OPH_SALT = 0x4F5048  # "OPH": keeps OPH values independent of the other mix64 users


def oph_values(token_hashes: U64, salt: int = OPH_SALT) -> U64:
    """OPH hash value of each token (position order kept; equal tokens get equal values)."""
    return mix64(np.asarray(token_hashes, dtype=np.uint64), salt)


def oph_bins(hvals: U64, k: int) -> I64:
    """Bin of each value under the contiguous even partition: ``floor(h · k / 2^64)``."""
    if not 1 <= k <= 1 << 31:
        raise ValueError(f"k must be in [1, 2^31], got {k}")
    h = np.asarray(hvals, dtype=np.uint64)
    kk = np.uint64(k)
    s32 = np.uint64(32)
    hi = h >> s32
    lo = h & np.uint64(0xFFFFFFFF)
    # h·k = hi·k·2^32 + lo·k; neither hi·k nor lo·k overflows 64 bits for k ≤ 2^31
    return ((hi * kk + ((lo * kk) >> s32)) >> s32).astype(np.int64)


@njit(cache=True, nogil=True)
def oph_sketch_kernel(hvals: U64, bins: I64, k: int) -> tuple[U64, Bools]:
    """``oph_sketch_binned`` for numba callers (bins already checked)."""
    mins = np.zeros(k, dtype=np.uint64)
    empty = np.ones(k, dtype=np.bool_)
    for x in range(hvals.shape[0]):
        b = bins[x]
        if empty[b] or hvals[x] < mins[b]:
            mins[b] = hvals[x]
            empty[b] = False
    return mins, empty


def _check_bins(bins: I64, k: int) -> None:
    if bins.size and (bins.min() < 0 or bins.max() >= k):
        raise ValueError(f"bin ids must be in [0, {k})")


def oph_sketch_binned(hvals: U64, bins: I64, k: int) -> Sketch:
    """OPH sketch under a given bin assignment: ``(mins, empty)``; ``mins[t]`` is 0 if empty."""
    h = np.ascontiguousarray(hvals, dtype=np.uint64)
    b = np.ascontiguousarray(bins, dtype=np.int64)
    if h.shape != b.shape:
        raise ValueError("hvals and bins must have the same length")
    _check_bins(b, k)
    return oph_sketch_kernel(h, b, k)


def oph_sketch(hvals: U64, k: int) -> Sketch:
    """OPH sketch of a token sequence: ``(mins: uint64[k], empty: bool[k])``.

    ``mins[t]`` is the smallest value in bin t (0 and meaningless when ``empty[t]``).
    """
    h = np.ascontiguousarray(hvals, dtype=np.uint64)
    return oph_sketch_kernel(h, oph_bins(h, k), k)


def oph_counts(a: Sketch, b: Sketch) -> tuple[int, int]:
    """``(N_mat, N_emp)`` of the paper's Eq. 4.

    N_mat counts bins where both sketches hold the same value (two empty bins are NOT a
    match); N_emp counts bins that are empty in both.
    """
    am, ae = a
    bm, be = b
    if am.shape != bm.shape:
        raise ValueError("sketches of different k")
    n_emp = int(np.count_nonzero(ae & be))
    n_mat = int(np.count_nonzero(~ae & ~be & (am == bm)))
    return n_mat, n_emp


def oph_estimate(a: Sketch, b: Sketch) -> float:
    """Jaccard estimate ``N_mat / (k − N_emp)`` (paper's Eq. 3).

    NaN when every bin is empty in both sketches (two empty texts)."""
    n_mat, n_emp = oph_counts(a, b)
    k = a[0].shape[0]
    return n_mat / (k - n_emp) if k > n_emp else float("nan")


@dataclass(frozen=True)
class OPHWindows:
    """All OPH compact windows of one text, as parallel arrays (one row per window).

    ``l``, ``c``, ``r`` are 0-based INCLUSIVE token positions. For an empty window
    (``empty[x]``) ``value[x] = 0`` and ``c[x] = -1``; its rectangle is i, j ∈ [l, r].
    Order: non-empty windows by (bin, c), then empty windows by (bin, l).
    """

    bin: I64
    value: U64
    empty: Bools
    l: I64  # noqa: E741 - the paper's name
    c: I64
    r: I64

    def __len__(self) -> int:
        return int(self.bin.shape[0])


@njit(cache=True, nogil=True)
def windows_kernel(hvals: U64, bins: I64, k: int) -> tuple[I64, U64, Bools, I64, I64, I64]:
    n = hvals.shape[0]
    # group positions by bin, in increasing position order (counting sort: O(n + k))
    start = np.zeros(k + 1, dtype=np.int64)
    for x in range(n):
        start[bins[x] + 1] += 1
    for t in range(k):
        start[t + 1] += start[t]
    fill = start[:k].copy()
    pos = np.empty(n, dtype=np.int64)
    sv = np.empty(n, dtype=np.uint64)  # values in the same order: sequential reads below
    for x in range(n):
        b = bins[x]
        pos[fill[b]] = x
        sv[fill[b]] = hvals[x]
        fill[b] += 1

    # empty windows: the gaps between consecutive positions of a bin, with dummies -1 and n;
    # a gap of width 0 (adjacent positions) is no window. Count them to size the output.
    m = 0
    for t in range(k):
        prev = -1
        for x in range(start[t], start[t + 1] + 1):
            nxt = pos[x] if x < start[t + 1] else n
            if nxt - prev >= 2:
                m += 1
            prev = nxt
    ob = np.empty(n + m, dtype=np.int64)
    ov = np.zeros(n + m, dtype=np.uint64)
    oe = np.zeros(n + m, dtype=np.bool_)
    ol = np.empty(n + m, dtype=np.int64)
    oc = np.full(n + m, -1, dtype=np.int64)
    orr = np.empty(n + m, dtype=np.int64)

    # non-empty windows (rows 0..n-1): one per position; l and r are the previous/next
    # positions in the same bin with a smaller (value, position) key, found with a
    # monotone stack (the all-nearest-smaller-values form of the paper's Algorithm 2)
    stack = np.empty(n, dtype=np.int64)  # row indices
    for t in range(k):
        top = 0
        for x in range(start[t], start[t + 1]):
            p = pos[x]
            v = sv[x]
            # an earlier equal value has a smaller key (it is to the left): keep it
            while top > 0 and sv[stack[top - 1]] > v:
                top -= 1
                orr[stack[top]] = p - 1
            ob[x] = t
            ov[x] = v
            oc[x] = p
            ol[x] = pos[stack[top - 1]] + 1 if top > 0 else 0
            stack[top] = x
            top += 1
        while top > 0:
            top -= 1
            orr[stack[top]] = n - 1

    y = n
    for t in range(k):
        prev = -1
        for x in range(start[t], start[t + 1] + 1):
            nxt = pos[x] if x < start[t + 1] else n
            if nxt - prev >= 2:
                ob[y] = t
                oe[y] = True
                ol[y] = prev + 1
                orr[y] = nxt - 1
                y += 1
            prev = nxt
    return ob, ov, oe, ol, oc, orr


def compact_windows_binned(hvals: U64, bins: I64, k: int) -> OPHWindows:
    """All OPH compact windows under a given bin assignment (equal values must share a bin)."""
    h = np.ascontiguousarray(hvals, dtype=np.uint64)
    b = np.ascontiguousarray(bins, dtype=np.int64)
    if h.shape != b.shape or h.ndim != 1:
        raise ValueError("hvals and bins must be 1-d arrays of the same length")
    _check_bins(b, k)
    ob, ov, oe, ol, oc, orr = windows_kernel(h, b, k)
    return OPHWindows(bin=ob, value=ov, empty=oe, l=ol, c=oc, r=orr)


def compact_windows(hvals: U64, k: int) -> OPHWindows:
    """All OPH compact windows of a text with OPH values ``hvals``, in O(n + k) time.

    Exactly n non-empty windows (one per position) and at most n + k − 2 empty windows
    (n ≥ 1); a bin with no token in the text gives the single empty window (0, n − 1).
    """
    h = np.ascontiguousarray(hvals, dtype=np.uint64)
    return compact_windows_binned(h, oph_bins(h, k), k)
