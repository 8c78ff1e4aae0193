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
def _volatility_rows(w: F64, surv: F64, y_max: float, prior_scale: float) -> F64:
    m, b = w.shape
    out = np.empty((m, b))
    n_bins = surv.shape[0] - 1
    for r in range(m):
        ss = 0.0
        for j in range(b):
            ss += w[r, j] * w[r, j]
        rms = math.sqrt(ss / b) if b > 0 else 0.0
        for j in range(b):
            c = abs(w[r, j]) / rms if rms > 0 else 0.0
            if c >= y_max:
                # Past the histogram: overflow mass decays like the prior's tail.
                s = surv[n_bins] * math.exp(-(c - y_max) / prior_scale)
            else:
                x = c * n_bins / y_max
                i = int(x)
                f = x - i
                s = surv[i] * (1.0 - f) + surv[i + 1] * f
            out[r, j] = 0.5 * s
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


# -- numba twin used inside PSM: same tree, same heap, on fixed-size arrays ----------------


@njit(cache=True)
def _heap_less(keys: F64, seqs: npt.NDArray[np.int64], a: int, c: int) -> bool:
    # "a before c": larger key first, then earlier insertion.
    if keys[a] != keys[c]:
        return keys[a] > keys[c]
    return seqs[a] < seqs[c]


@njit(cache=True)
def _heap_swap(keys, seqs, elems, sizes, a, c):
    keys[a], keys[c] = keys[c], keys[a]
    seqs[a], seqs[c] = seqs[c], seqs[a]
    sizes[a], sizes[c] = sizes[c], sizes[a]
    for q in range(elems.shape[1]):
        elems[a, q], elems[c, q] = elems[c, q], elems[a, q]


@njit(cache=True)
def heap_push(keys, seqs, elems, sizes, n, key, seq, src, size):
    """Push node (key, seq, src[:size]) onto the heap of n nodes; returns the new count."""
    keys[n] = key
    seqs[n] = seq
    sizes[n] = size
    for q in range(size):
        elems[n, q] = src[q]
    i = n
    while i > 0:
        par = (i - 1) >> 1
        if _heap_less(keys, seqs, i, par):
            _heap_swap(keys, seqs, elems, sizes, i, par)
            i = par
        else:
            break
    return n + 1


@njit(cache=True)
def heap_pop(keys, seqs, elems, sizes, n, out):
    """Pop the top node into ``out``; returns (new count, its size, its key)."""
    size = sizes[0]
    key = keys[0]
    for q in range(size):
        out[q] = elems[0, q]
    n -= 1
    if n > 0:
        _heap_swap(keys, seqs, elems, sizes, 0, n)
        i = 0
        while True:
            lc = 2 * i + 1
            if lc >= n:
                break
            best = lc
            if lc + 1 < n and _heap_less(keys, seqs, lc + 1, lc):
                best = lc + 1
            if _heap_less(keys, seqs, best, i):
                _heap_swap(keys, seqs, elems, sizes, best, i)
                i = best
            else:
                break
    return n, size, key


@njit(cache=True)
def set_key(base: float, ratio: F64, s: npt.NDArray[np.int64], size: int) -> float:
    k = base
    for q in range(size):
        k *= ratio[s[q]]
    return k


@njit(cache=True)
def vosh_order_kernel(
    p: F64, h: int, limit: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], F64]:
    """The first ``limit`` VOSH sets: (indices (k, h) padded with -1, sizes (k,), keys (k,))."""
    b = p.shape[0]
    order = np.argsort(-p, kind="mergesort")
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
    elems = np.empty((cap, max(hh, 1)), dtype=np.int64)
    sizes = np.empty(cap, dtype=np.int64)
    cur = np.empty(max(hh, 1), dtype=np.int64)
    child = np.empty(max(hh, 1), dtype=np.int64)
    n = 0
    seq = 0
    for size in range(hh + 1):
        for q in range(size):
            cur[q] = q
        n = heap_push(keys, seqs, elems, sizes, n, set_key(base, ratio, cur, size), seq, cur,
                      size)
        seq += 1
    out_sets = np.full((limit, max(hh, 1)), -1, dtype=np.int64)
    out_sizes = np.zeros(limit, dtype=np.int64)
    out_keys = np.zeros(limit)
    k = 0
    while n > 0 and k < limit:
        n, size, key = heap_pop(keys, seqs, elems, sizes, n, cur)
        for q in range(size):
            out_sets[k, q] = order[cur[q]]
        out_sets[k, :size].sort()
        out_sizes[k] = size
        out_keys[k] = key
        k += 1
        n, seq = push_children(keys, seqs, elems, sizes, n, seq, cur, child, size, b, base,
                               ratio)
    return out_sets[:k], out_sizes[:k], out_keys[:k]


@njit(cache=True)
def push_children(keys, seqs, elems, sizes, n, seq, cur, child, size, b, base, ratio):
    """Algorithm 2 (fixed, see :func:`_children`) on ``cur[:size]``; pushes both children."""
    if size == 0:
        return n, seq
    if cur[size - 1] <= b - 2:
        for q in range(size):
            child[q] = cur[q]
        child[size - 1] += 1
        n = heap_push(keys, seqs, elems, sizes, n, set_key(base, ratio, child, size), seq,
                      child, size)
        seq += 1
    for j in range(size - 2, -1, -1):
        gap = cur[j + 1] - cur[j]
        if gap == 1:
            continue
        if gap == 2:
            for q in range(size):
                child[q] = cur[q]
            child[j] += 1
            n = heap_push(keys, seqs, elems, sizes, n, set_key(base, ratio, child, size), seq,
                          child, size)
            seq += 1
        break
    return n, seq


def vosh_array(
    p: npt.ArrayLike, h: int, limit: int | None = None
) -> list[tuple[float, tuple[int, ...]]]:
    """The numba kernel's sequence in :func:`vosh_sets` form (for tests and inspection)."""
    pv = np.ascontiguousarray(p, dtype=np.float64)
    if np.any(pv < 0) or np.any(pv >= 1):
        raise ValueError("volatilities must lie in [0, 1)")
    b = pv.shape[0]
    total = sum(math.comb(b, i) for i in range(min(h, b) + 1))
    lim = total if limit is None else min(limit, total)
    sets, sizes, keys = vosh_order_kernel(pv, h, lim)
    return [
        (float(keys[i]), tuple(int(x) for x in sets[i, : sizes[i]])) for i in range(len(keys))
    ]
