"""Bit volatility of a weighted simhash and the Volatility Ordered Set Heap (VOSH).

Sood & Loguinov, "Probabilistic Near-Duplicate Detection Using Simhash" (CIKM'11), §4.3–§6.1.

Conventions: ``W[j]`` is the weight sum of bit ``j`` of the fingerprint, where bit ``j`` means
``(fp >> j) & 1`` (bit 0 is the least significant); the bit is 1 when ``W[j] > 0``.
Bit sets are tuples of such 0-based bit indices.

Volatility (§4.3, §5.1). A rewrite of page u changes each weight by a random amount:
``W'_j = W_j - Y_j``. Bit j flips when ``Y_j`` has the sign of ``W_j`` and exceeds it in
magnitude, so its volatility is ``p_j = P(Y > |W_j|)``. The paper takes Y's distribution to
be that of ``W_j(u) - W_j(v)`` over pairs of pages of the collection (its Figure 1(b)),
symmetric around 0, and estimates it empirically. :class:`VolatilityModel` does exactly that
on the stream: every page's W is paired with the previous page's W (two pages of a stream are
a random pair of the collection) and the 64 differences are added to a histogram of ``|Y|``.
Because ``P(Y > c) = P(|Y| > c) / 2`` for a symmetric Y, a histogram of ``|Y|`` suffices.

Scale: weights are divided by the page's own RMS weight ``sqrt(mean_j W_j**2)`` before use,
so the model does not depend on how feature weights are normalized (tf·idf, L2, ...); with
that unit, a random-pair difference has variance ≈ 2. Cold start: the histogram starts with
pseudo-counts from a Laplace law of variance 2 (the paper observes Laplace-like tails), worth
``prior_weight`` samples, so ``volatility`` is sensible before any update and strictly
decreasing in ``|W_j|`` afterwards too (ranking by volatility is never degenerate).

``update_pair(W_u, W_v)`` feeds the same histogram from a known near-duplicate pair instead;
a deployment should use one source or the other (see the bench for the effect on recall).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator

import msgpack
import numpy as np
import numpy.typing as npt
from numba import njit

F64 = npt.NDArray[np.float64]

_MODEL_VERSION = 1


class VolatilityModel:
    """Empirical distribution of the weight change Y, giving bit volatility p_j = P(Y > |W_j|).

    The histogram of ``|Y|`` (in units of the page's RMS weight) has ``n_bins`` bins evenly
    spaced on ``[0, y_max)`` plus an overflow bin; the survival function is piecewise linear
    inside bins and follows the prior's exponential tail past ``y_max``.
    """

    def __init__(
        self, n_bins: int = 512, y_max: float = 8.0, prior_scale: float = 1.0,
        prior_weight: float = 256.0,
    ) -> None:
        if n_bins < 2 or y_max <= 0 or prior_scale <= 0 or prior_weight <= 0:
            raise ValueError("n_bins >= 2 and positive y_max, prior_scale, prior_weight required")
        self.n_bins = int(n_bins)
        self.y_max = float(y_max)
        self.prior_scale = float(prior_scale)
        self.prior_weight = float(prior_weight)
        edges = np.linspace(0.0, self.y_max, self.n_bins + 1)
        # |Y| ~ Exponential(prior_scale) when Y ~ Laplace(prior_scale); bin masses of it.
        surv = np.exp(-edges / self.prior_scale)
        prior = np.empty(self.n_bins + 1)
        prior[:-1] = surv[:-1] - surv[1:]
        prior[-1] = surv[-1]
        self._edges = edges
        self.counts: F64 = prior * self.prior_weight
        self.n_samples = 0
        self._prev: F64 | None = None
        self._surv: F64 | None = None

    # -- learning -------------------------------------------------------------------------
    @staticmethod
    def normalize(W: npt.ArrayLike) -> F64:
        """Weights divided by their RMS (all zeros stay zeros)."""
        w = np.asarray(W, dtype=np.float64)
        rms = math.sqrt(float(np.mean(w * w))) if w.size else 0.0
        return w / rms if rms > 0 else np.zeros_like(w)

    def add_differences(self, abs_y: npt.ArrayLike) -> None:
        """Add samples of |Y| (already in RMS units) to the histogram."""
        a = np.abs(np.asarray(abs_y, dtype=np.float64).ravel())
        a = a[np.isfinite(a)]
        if a.size == 0:
            return
        idx = np.minimum((a * (self.n_bins / self.y_max)).astype(np.int64), self.n_bins)
        self.counts += np.bincount(idx, minlength=self.n_bins + 1)
        self.n_samples += int(a.size)
        self._surv = None

    def update(self, W: npt.ArrayLike) -> None:
        """The paper's estimator: pair this page's W with the previous page's W."""
        w = self.normalize(W)
        if self._prev is not None and self._prev.shape == w.shape:
            self.add_differences(w - self._prev)
        self._prev = w

    def update_pair(self, W_u: npt.ArrayLike, W_v: npt.ArrayLike) -> None:
        """Learn from a known near-duplicate pair (u, v) instead of a random pair."""
        self.add_differences(self.normalize(W_u) - self.normalize(W_v))

    # -- prediction -----------------------------------------------------------------------
    def _survival_at_edges(self) -> F64:
        if self._surv is None:
            total = float(self.counts.sum())
            # surv[i] = P(|Y| >= edges[i]); the last entry is the overflow mass.
            tail = np.cumsum(self.counts[::-1])[::-1] / total
            self._surv = np.ascontiguousarray(tail, dtype=np.float64)
        return self._surv

    def volatility(self, W: npt.ArrayLike) -> F64:
        """p_j = P(Y > |W_j|) = P(|Y| > |W_j|) / 2, for one W (shape (b,)) or a batch (m, b)."""
        w = np.asarray(W, dtype=np.float64)
        if w.ndim == 1:
            return _volatility_rows(w[None, :], self._survival_at_edges(), self.y_max,
                                    self.prior_scale)[0]
        return _volatility_rows(np.ascontiguousarray(w), self._survival_at_edges(),
                                self.y_max, self.prior_scale)

    def kernel_params(self) -> tuple[F64, float, float]:
        """(survival at bin edges, y_max, prior_scale) for :func:`bit_volatility` in numba."""
        return self._survival_at_edges(), self.y_max, self.prior_scale

    # -- persistence ----------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        return msgpack.packb(
            {
                "v": _MODEL_VERSION,
                "n_bins": self.n_bins,
                "y_max": self.y_max,
                "prior_scale": self.prior_scale,
                "prior_weight": self.prior_weight,
                "counts": self.counts.astype("<f8").tobytes(),
                "n_samples": self.n_samples,
                "prev": None if self._prev is None else self._prev.astype("<f8").tobytes(),
            }
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> VolatilityModel:
        d = msgpack.unpackb(data)
        if d.get("v") != _MODEL_VERSION:
            raise ValueError(f"unsupported VolatilityModel version {d.get('v')!r}")
        m = cls(d["n_bins"], d["y_max"], d["prior_scale"], d["prior_weight"])
        m.counts = np.frombuffer(d["counts"], dtype="<f8").astype(np.float64)
        if m.counts.shape != (m.n_bins + 1,):
            raise ValueError("corrupt VolatilityModel: counts length")
        m.n_samples = int(d["n_samples"])
        m._prev = None if d["prev"] is None else np.frombuffer(d["prev"], "<f8").astype(np.float64)
        return m


@njit(cache=True)
def rms_of(w: F64) -> float:
    ss = 0.0
    for j in range(w.shape[0]):
        ss += w[j] * w[j]
    return math.sqrt(ss / w.shape[0]) if w.shape[0] > 0 else 0.0


@njit(cache=True)
def bit_volatility(c: float, surv: F64, y_max: float, prior_scale: float) -> float:
    """P(Y > c) for c = |W_j| / rms >= 0, from the histogram's survival at its bin edges."""
    n_bins = surv.shape[0] - 1
    if c >= y_max:
        # Past the histogram: the overflow mass decays like the prior's tail.
        return 0.5 * surv[n_bins] * math.exp(-(c - y_max) / prior_scale)
    x = c * n_bins / y_max
    i = int(x)
    f = x - i
    return 0.5 * (surv[i] * (1.0 - f) + surv[i + 1] * f)


@njit(cache=True)
def _volatility_rows(w: F64, surv: F64, y_max: float, prior_scale: float) -> F64:
    m, b = w.shape
    out = np.empty((m, b))
    for r in range(m):
        rms = rms_of(w[r])
        for j in range(b):
            c = abs(w[r, j]) / rms if rms > 0 else 0.0
            out[r, j] = bit_volatility(c, surv, y_max, prior_scale)
    return out


# ---------------------------------------------------------------------------------------
# VOSH
# ---------------------------------------------------------------------------------------


def _children(s: tuple[int, ...], b: int) -> list[tuple[int, ...]]:
    """Algorithm 2 (ProduceChildren) on ranks 0..b-1, with the paper's two slips fixed.

    Line 9 must increment the right child S_R (not S_L), and the scan must stop at the first
    gap >= 2, as the text says ("until it finds the first gap"); otherwise (0, 2, 4) would
    yield (1, 2, 4), which is also the left child of (1, 2, 3).
    """
    out: list[tuple[int, ...]] = []
    h = len(s)
    if h == 0:
        return out
    if s[-1] <= b - 2:
        out.append((*s[:-1], s[-1] + 1))
    for j in range(h - 2, -1, -1):
        gap = s[j + 1] - s[j]
        if gap == 1:
            continue
        if gap == 2:
            out.append((*s[:j], s[j] + 1, *s[j + 1 :]))
        break
    return out


def vosh_sets(
    p: npt.ArrayLike, h: int, limit: int | None = None
) -> Iterator[tuple[float, tuple[int, ...]]]:
    """Bit sets S with |S| <= h in non-increasing p(u, S) = prod_S p_i * prod_notS (1 - p_j).

    Yields ``(p(u, S), S)`` with S a sorted tuple of indices into ``p``; every set exactly
    once; at most ``limit`` sets. Needs 0 <= p_j < 1. The empty set comes first whenever all
    p_j <= 1/2 (true for volatilities). Θ(k log k) for k sets: one VOSH tree per set size
    (§5.2) whose roots seed a max-heap M (§6.1); each pop pushes at most two children.
    Ties are broken by insertion order, so the sequence is deterministic.
    """
    pv = np.asarray(p, dtype=np.float64)
    b = int(pv.shape[0])
    if np.any(pv < 0) or np.any(pv >= 1):
        raise ValueError("volatilities must lie in [0, 1)")
    order = np.argsort(-pv, kind="stable")  # rank -> bit index, most volatile first
    ps = pv[order]
    ratio = ps / (1.0 - ps)
    base = float(np.prod(1.0 - ps))

    def key(s: tuple[int, ...]) -> float:
        k = base
        for r in s:
            k *= float(ratio[r])
        return k

    heap: list[tuple[float, int, tuple[int, ...]]] = []
    seq = 0
    for size in range(min(h, b) + 1):
        root = tuple(range(size))
        heap.append((-key(root), seq, root))
        seq += 1
    heapq.heapify(heap)
    emitted = 0
    while heap and (limit is None or emitted < limit):
        negk, _, s = heapq.heappop(heap)
        yield -negk, tuple(sorted(int(order[r]) for r in s))
        emitted += 1
        for c in _children(s, b):
            heapq.heappush(heap, (-key(c), seq, c))
            seq += 1


# -- numba twin used inside PSM: the same trees and heap on packed sets ---------------------
#
# A set of <= MAX_H ranks (each < 256) is one int64: rank e in bits 8e..8e+7, size in bits
# 56..58. The heap holds parallel arrays (key, insertion number, packed set), so a swap moves
# three scalars; this keeps a PSM probe's heap work to a few tens of nanoseconds.

MAX_H = 7
MAX_RANKS = 256


@njit(cache=True)
def packed_size(s: int) -> int:
    return s >> 56


@njit(cache=True)
def packed_elem(s: int, e: int) -> int:
    return (s >> (8 * e)) & 255


@njit(cache=True)
def packed_root(size: int) -> int:
    s = size << 56
    for e in range(size):
        s |= e << (8 * e)
    return s


@njit(cache=True)
def packed_key(base: float, ratio: F64, s: int) -> float:
    k = base
    for e in range(s >> 56):
        k *= ratio[(s >> (8 * e)) & 255]
    return k


@njit(cache=True)
def packed_children(s: int, b: int) -> tuple[int, int]:
    """Algorithm 2 (fixed, see :func:`_children`) on a packed set; -1 for a missing child."""
    size = s >> 56
    left = -1
    right = -1
    if size == 0:
        return left, right
    if packed_elem(s, size - 1) <= b - 2:
        left = s + (1 << (8 * (size - 1)))
    for j in range(size - 2, -1, -1):
        gap = packed_elem(s, j + 1) - packed_elem(s, j)
        if gap == 1:
            continue
        if gap == 2:
            right = s + (1 << (8 * j))
        break
    return left, right


@njit(cache=True)
def _before(keys: F64, seqs: npt.NDArray[np.int64], a: int, c: int) -> bool:
    # Larger key first, then earlier insertion (deterministic ties, as in vosh_sets).
    if keys[a] != keys[c]:
        return keys[a] > keys[c]
    return seqs[a] < seqs[c]


@njit(cache=True)
def heap_push(keys, seqs, sets, n, key, seq, s):
    """Push (key, seq, packed set) onto the heap of n nodes; returns n + 1."""
    i = n
    keys[i] = key
    seqs[i] = seq
    sets[i] = s
    while i > 0:
        par = (i - 1) >> 1
        if not _before(keys, seqs, i, par):
            break
        keys[i], keys[par] = keys[par], keys[i]
        seqs[i], seqs[par] = seqs[par], seqs[i]
        sets[i], sets[par] = sets[par], sets[i]
        i = par
    return n + 1


@njit(cache=True)
def heap_pop(keys, seqs, sets, n):
    """Remove the top node; returns (n - 1, its key, its packed set)."""
    key = keys[0]
    s = sets[0]
    n -= 1
    keys[0] = keys[n]
    seqs[0] = seqs[n]
    sets[0] = sets[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _before(keys, seqs, c + 1, c):
            c += 1
        if not _before(keys, seqs, c, i):
            break
        keys[i], keys[c] = keys[c], keys[i]
        seqs[i], seqs[c] = seqs[c], seqs[i]
        sets[i], sets[c] = sets[c], sets[i]
        i = c
    return n, key, s


LINEAR_MAX_BUDGET = 64


@njit(cache=True)
def list_pop(keys: F64, n_used: int) -> int:
    """Index of the first largest live key of an insertion-ordered list (removed: -2).

    The same order as the heap (largest key, then earliest insertion). Pops cost O(list)
    but for the small budgets of PSM (list <= 2 · budget + h + 1 nodes) a linear scan is
    ~2× faster than the heap's data-dependent branches; above LINEAR_MAX_BUDGET the heap's
    O(log k) wins.
    """
    best = 0
    bk = -1.0
    for i in range(n_used):
        if keys[i] > bk:
            bk = keys[i]
            best = i
    return best


@njit(cache=True)
def rank_desc(p: F64, b: int, order: npt.NDArray[np.int64]) -> None:
    """order[:b] = indices of p[:b] by decreasing p, ties by index.

    Counting rank (O(b^2) but branch-free): for b ≈ 20 header bits it beats insertion sort,
    whose data-dependent branches mispredict on every query.
    """
    for i in range(b):
        v = p[i]
        r = 0
        for j in range(b):
            u = p[j]
            r += (u > v) | ((u == v) & (j < i))
        order[r] = i


@njit(cache=True)
def vosh_order_kernel(
    p: F64, h: int, limit: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], F64]:
    """The first ``limit`` VOSH sets: (indices (k, h) padded with -1, sizes (k,), keys (k,))."""
    b = p.shape[0]
    order = np.empty(b, dtype=np.int64)
    rank_desc(p, b, order)
    ratio = np.empty(b)
    base = 1.0
    for r in range(b):
        pr = p[order[r]]
        ratio[r] = pr / (1.0 - pr)
        base *= 1.0 - pr
    hh = min(h, b)
    cap = 2 * limit + hh + 2
    keys = np.empty(cap)
    seqs = np.empty(cap, dtype=np.int64)
    sets = np.empty(cap, dtype=np.int64)
    linear = limit <= LINEAR_MAX_BUDGET
    n = 0  # live nodes
    used = 0  # list slots used (linear mode)
    seq = 0
    for size in range(hh + 1):
        root = packed_root(size)
        key = packed_key(base, ratio, root)
        if linear:
            keys[used] = key
            sets[used] = root
            used += 1
            n += 1
        else:
            n = heap_push(keys, seqs, sets, n, key, seq, root)
        seq += 1
    out_sets = np.full((limit, max(hh, 1)), -1, dtype=np.int64)
    out_sizes = np.zeros(limit, dtype=np.int64)
    out_keys = np.zeros(limit)
    k = 0
    while n > 0 and k < limit:
        if linear:
            i = list_pop(keys, used)
            key = keys[i]
            s = sets[i]
            keys[i] = -2.0
            n -= 1
        else:
            n, key, s = heap_pop(keys, seqs, sets, n)
        size = packed_size(s)
        for e in range(size):
            out_sets[k, e] = order[packed_elem(s, e)]
        out_sets[k, :size].sort()
        out_sizes[k] = size
        out_keys[k] = key
        k += 1
        left, right = packed_children(s, b)
        for c in (left, right):
            if c >= 0:
                ck = packed_key(base, ratio, c)
                if linear:
                    keys[used] = ck
                    sets[used] = c
                    used += 1
                    n += 1
                else:
                    n = heap_push(keys, seqs, sets, n, ck, seq, c)
                seq += 1
    return out_sets[:k], out_sizes[:k], out_keys[:k]


def vosh_array(
    p: npt.ArrayLike, h: int, limit: int | None = None
) -> list[tuple[float, tuple[int, ...]]]:
    """The numba kernel's sequence in :func:`vosh_sets` form (h <= 7, len(p) <= 256)."""
    pv = np.ascontiguousarray(p, dtype=np.float64)
    if np.any(pv < 0) or np.any(pv >= 1):
        raise ValueError("volatilities must lie in [0, 1)")
    b = pv.shape[0]
    if h > MAX_H or b > MAX_RANKS:
        raise ValueError(f"the packed kernel needs h <= {MAX_H} and at most {MAX_RANKS} bits")
    total = sum(math.comb(b, i) for i in range(min(h, b) + 1))
    lim = total if limit is None else min(limit, total)
    sets, sizes, keys = vosh_order_kernel(pv, h, lim)
    return [
        (float(keys[i]), tuple(int(x) for x in sets[i, : sizes[i]])) for i in range(len(keys))
    ]
