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

from dupalign.kernel_cache import njit

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

    def update(self, W: npt.ArrayLike) -> F64:
        """The paper's estimator: pair this page's W with the previous page's W. Returns W
        normalized: the update as ``replay`` takes it. One kernel (``normalize`` and
        ``add_differences`` are its twins, bit for bit): as numpy calls on 64 values it
        cost more in calls than in work."""
        given = np.asarray(W, dtype=np.float64)
        flat = np.ascontiguousarray(given).ravel()
        w = np.empty_like(flat)
        prev = self._prev
        paired = prev is not None and prev.shape == given.shape
        other = prev.ravel() if prev is not None and paired else flat
        surv = np.empty_like(self.counts)  # the next lookup's, made here: one call less
        added = _update_kernel(flat, other, paired, self.counts, self.n_bins / self.y_max,
                               self.n_bins, w, surv)
        if added:
            self.n_samples += added
            self._surv = surv
        self._prev = shaped = w.reshape(given.shape)
        return shaped

    def replay(self, w: F64) -> None:
        """``update`` with W already normalized (an update logged in the store)."""
        prev = self._prev
        if prev is not None and prev.shape == w.shape:
            self._count(_add_kernel(np.ascontiguousarray(w).ravel(), prev.ravel(), self.counts,
                                    self.n_bins / self.y_max, self.n_bins))
        self._prev = w

    def _count(self, added: int) -> None:
        if added:
            self.n_samples += added
            self._surv = None

    def update_pair(self, W_u: npt.ArrayLike, W_v: npt.ArrayLike) -> None:
        """Learn from a known near-duplicate pair (u, v) instead of a random pair."""
        self.add_differences(self.normalize(W_u) - self.normalize(W_v))

    # -- prediction -----------------------------------------------------------------------
    def _survival_at_edges(self) -> F64:
        if self._surv is None:
            # surv[i] = P(|Y| >= edges[i]); the last entry is the overflow mass: one kernel
            # (twin: the cumulated counts from the end over their numpy sum)
            self._surv = np.empty_like(self.counts)
            _survival_kernel(self.counts, self._surv)
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


@njit(cache=True, nogil=True)
def _block_sum(a: F64, lo: int, n: int) -> float:
    """numpy's sum of at most 128 values: eight running sums (fewer than 8: one)."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - n % 8:
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(cache=True, nogil=True)
def pairwise_sum(a: F64, lo: int, n: int) -> float:
    """``a[lo:lo + n].sum()`` in numpy's order of additions (blocks of at most 128 summed by
    ``_block_sum``, the halves above them summed first), so a kernel's sum is numpy's bit for
    bit. Its recursion on an explicit stack: numba's cache cannot hold a recursive kernel
    (a process that loaded one crashed)."""
    if n <= 128:
        return _block_sum(a, lo, n)
    f_lo = np.empty(64, dtype=np.int64)  # frames: range, and 0 new / 1 left done / 2 both
    f_n = np.empty(64, dtype=np.int64)
    f_st = np.empty(64, dtype=np.int64)
    vals = np.empty(64)
    f_lo[0], f_n[0], f_st[0] = lo, n, 0
    top, nv = 1, 0
    while top:
        f = top - 1
        m = f_n[f]
        if m <= 128:
            vals[nv] = _block_sum(a, f_lo[f], m)
            nv += 1
            top -= 1
            continue
        n2 = m // 2
        n2 -= n2 % 8
        if f_st[f] == 2:
            vals[nv - 2] = vals[nv - 2] + vals[nv - 1]
            nv -= 1
            top -= 1
            continue
        f_lo[top], f_n[top] = (f_lo[f], n2) if f_st[f] == 0 else (f_lo[f] + n2, m - n2)
        f_st[top] = 0
        f_st[f] += 1
        top += 1
    return vals[0]


@njit(cache=True, nogil=True)
def _add_kernel(w: F64, prev: F64, counts: F64, scale: float, n_bins: int) -> int:
    """``add_differences(w - prev)``: the finite |w - prev| into the histogram, counted per
    bin first and then added, as numpy's bincount is; returns how many."""
    hist = np.zeros(n_bins + 1, dtype=np.int64)
    added = 0
    for j in range(w.shape[0]):
        a = abs(w[j] - prev[j])
        if np.isfinite(a):
            hist[min(int(a * scale), n_bins)] += 1
            added += 1
    if added:
        for i in range(n_bins + 1):
            counts[i] += hist[i]
    return added


@njit(cache=True, nogil=True)
def _survival_kernel(counts: F64, out: F64) -> None:
    total = pairwise_sum(counts, 0, counts.shape[0])
    acc = 0.0
    for i in range(counts.shape[0] - 1, -1, -1):
        acc += counts[i]
        out[i] = acc / total


@njit(cache=True, nogil=True)
def _update_kernel(W: F64, prev: F64, paired: bool, counts: F64, scale: float, n_bins: int,
                   w_out: F64, surv_out: F64) -> int:
    """``normalize(W)`` into ``w_out``, then, if ``paired``, ``_add_kernel`` against prev
    and, if that added any, the survival of the new counts into ``surv_out``."""
    b = W.shape[0]
    sq = np.empty(b)
    for j in range(b):
        sq[j] = W[j] * W[j]
    rms = math.sqrt(pairwise_sum(sq, 0, b) / b) if b else 0.0
    for j in range(b):
        w_out[j] = W[j] / rms if rms > 0 else 0.0
    added = _add_kernel(w_out, prev, counts, scale, n_bins) if paired else 0
    if added:
        _survival_kernel(counts, surv_out)
    return added


@njit(cache=True)
def rms_of(w: F64) -> float:
    # Four partial sums: a single running sum is a chain of dependent adds (4 cycles each).
    s0 = s1 = s2 = s3 = 0.0
    b = w.shape[0]
    main = b - b % 4
    for j in range(0, main, 4):
        s0 += w[j] * w[j]
        s1 += w[j + 1] * w[j + 1]
        s2 += w[j + 2] * w[j + 2]
        s3 += w[j + 3] * w[j + 3]
    for j in range(main, b):
        s0 += w[j] * w[j]
    ss = (s0 + s1) + (s2 + s3)
    return math.sqrt(ss / b) if b > 0 else 0.0


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


# -- numba twin used inside PSM: the same trees and frontier on packed sets -----------------
#
# A set of <= MAX_H ranks (each < MAX_RANKS) is one int64: element e in bits 8e..8e+7, the
# size in bits 56..58, and the unused element bytes hold SENTINEL. Keys and masks then read
# all seven bytes through tables whose SENTINEL entry is neutral (ratio 1.0, mask 0), with no
# loop whose trip count depends on the set: such loops mispredict on almost every probe.

MAX_H = 7
MAX_RANKS = 255
SENTINEL = 255
LINEAR_MAX_BUDGET = 64


@njit(cache=True)
def packed_size(s: int) -> int:
    return s >> 56


@njit(cache=True)
def packed_elem(s: int, e: int) -> int:
    return (s >> (8 * e)) & 255


@njit(cache=True)
def packed_root(size: int) -> int:
    s = size << 56
    for e in range(MAX_H):
        s |= (e if e < size else SENTINEL) << (8 * e)
    return s


@njit(cache=True)
def packed_key(base: float, ratio_ext: F64, s: int) -> float:
    """base * prod over the set of ratio_ext[rank]; ratio_ext[SENTINEL] must be 1.0.

    Multiplied in element order, like :func:`vosh_sets` (the sentinel factors are exact),
    so both give bit-identical keys and hence the same order, ties included.
    """
    k = base * ratio_ext[s & 255]
    k *= ratio_ext[(s >> 8) & 255]
    k *= ratio_ext[(s >> 16) & 255]
    k *= ratio_ext[(s >> 24) & 255]
    k *= ratio_ext[(s >> 32) & 255]
    k *= ratio_ext[(s >> 40) & 255]
    return k * ratio_ext[(s >> 48) & 255]


@njit(cache=True)
def packed_mask(bits_ext: npt.NDArray[np.uint64], s: int) -> np.uint64:
    """OR over the set of bits_ext[rank]; bits_ext[SENTINEL] must be 0."""
    m = bits_ext[s & 255] | bits_ext[(s >> 8) & 255] | bits_ext[(s >> 16) & 255]
    m |= bits_ext[(s >> 24) & 255] | bits_ext[(s >> 32) & 255] | bits_ext[(s >> 40) & 255]
    return m | bits_ext[(s >> 48) & 255]


@njit(cache=True)
def packed_children(s: int, b: int) -> tuple[int, int]:
    """Algorithm 2 (fixed, see :func:`_children`) on a packed set; -1 for a missing child.

    Left child: the last element + 1 (if < b). Right child: the scan from the end stops at
    the first gap >= 2, i.e. at the largest j <= size - 2 with e[j+1] - e[j] >= 2; there is
    a child (e[j] + 1) iff that gap is exactly 2. Computed over all six gaps with selects.
    """
    size = s >> 56
    sh = 8 * max(size - 1, 0)
    last = (s >> sh) & 255
    left = s + (1 << sh) if (size > 0) & (last <= b - 2) else -1
    jstar = -1
    gstar = 0
    for j in range(MAX_H - 1):
        g = ((s >> (8 * j + 8)) & 255) - ((s >> (8 * j)) & 255)
        c = (j <= size - 2) & (g >= 2)
        jstar = j if c else jstar
        gstar = g if c else gstar
    right = s + (1 << (8 * max(jstar, 0))) if (jstar >= 0) & (gstar == 2) else -1
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


@njit(cache=True)
def list_pop(keys: F64, n_used: int) -> int:
    """Index of the first largest key of an insertion-ordered list.

    The same order as the heap (largest key, then earliest insertion). Live keys are >= 0
    and removed entries -2, so the result is negative-keyed when nothing live is left. The
    max is a select chain and the search for its first index exits once: a
    compare-and-branch argmax mispredicts on most pops.
    """
    mx = -3.0
    for i in range(n_used):
        mx = max(mx, keys[i])
    for i in range(n_used):
        if keys[i] == mx:
            return i
    return 0


@njit(cache=True)
def vosh_enumerate(base: float, ratio_ext: F64, b: int, h: int, limit: int, keys: F64,
                   seqs: npt.NDArray[np.int64], sets: npt.NDArray[np.int64],
                   out: npt.NDArray[np.int64], out_keys: F64) -> int:
    """The first ``limit`` VOSH sets, packed, into out[:k] (keys into out_keys); returns k.

    ``ratio_ext[r]`` = p/(1-p) of rank r (ranks by non-increasing p, r < b <= MAX_RANKS),
    ``ratio_ext[SENTINEL]`` = 1.0, ``base`` = prod_j (1 - p_j); keys are p(u, S).
    Frontier: for limit <= LINEAR_MAX_BUDGET an insertion-ordered list (children are
    appended without a branch: both slots are written, the count grows by the number that
    exist); a heap above. Same order either way: largest key,
    then earliest insertion. Scratch arrays need 2 * limit + h + 2 entries.
    """
    hh = min(h, b)
    linear = limit <= LINEAR_MAX_BUDGET
    n = 0  # live nodes (heap) / slots used (list)
    seq = 0
    for size in range(hh + 1):
        root = packed_root(size)
        key = packed_key(base, ratio_ext, root)
        if linear:
            keys[n] = key
            sets[n] = root
            n += 1
        else:
            n = heap_push(keys, seqs, sets, n, key, seq, root)
        seq += 1
    k = 0
    while k < limit:
        if linear:
            i = list_pop(keys, n)
            key = keys[i]
            if key < 0.0:
                break
            s = sets[i]
            keys[i] = -2.0
        else:
            if n == 0:
                break
            n, key, s = heap_pop(keys, seqs, sets, n)
        out[k] = s
        out_keys[k] = key
        k += 1
        if k == limit:
            break
        left, right = packed_children(s, b)
        if linear:
            keys[n] = packed_key(base, ratio_ext, left)
            sets[n] = left
            n += left >= 0
            keys[n] = packed_key(base, ratio_ext, right)
            sets[n] = right
            n += right >= 0
        else:
            for c in (left, right):
                if c >= 0:
                    n = heap_push(keys, seqs, sets, n, packed_key(base, ratio_ext, c), seq, c)
                    seq += 1
    return k


@njit(cache=True)
def rank_desc(p: F64, b: int, order: npt.NDArray[np.int64]) -> None:
    """order[:b] = indices of p[:b] by decreasing p, ties by index (counting rank)."""
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
    ratio_ext = np.ones(SENTINEL + 1)
    base = 1.0
    for r in range(b):
        pr = p[order[r]]
        ratio_ext[r] = pr / (1.0 - pr)
        base *= 1.0 - pr
    hh = min(h, b)
    cap = 2 * limit + hh + 2
    keys = np.empty(cap)
    seqs = np.empty(cap, dtype=np.int64)
    sets = np.empty(cap, dtype=np.int64)
    packed = np.empty(limit, dtype=np.int64)
    pkeys = np.empty(limit)
    k = vosh_enumerate(base, ratio_ext, b, h, limit, keys, seqs, sets, packed, pkeys)
    out_sets = np.full((k, max(hh, 1)), -1, dtype=np.int64)
    out_sizes = np.zeros(k, dtype=np.int64)
    out_keys = np.zeros(k)
    for i in range(k):
        s = packed[i]
        size = packed_size(s)
        for e in range(size):
            out_sets[i, e] = order[packed_elem(s, e)]
        out_sets[i, :size].sort()
        out_sizes[i] = size
        out_keys[i] = pkeys[i]
    return out_sets, out_sizes, out_keys


def vosh_array(
    p: npt.ArrayLike, h: int, limit: int | None = None
) -> list[tuple[float, tuple[int, ...]]]:
    """The numba kernel's sequence in :func:`vosh_sets` form (h <= 7, len(p) <= 255)."""
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
