"""Bit volatility of a weighted simhash: how likely each bit is to flip when a page is
rewritten.

Sood & Loguinov, "Probabilistic Near-Duplicate Detection Using Simhash" (CIKM'11), §4.3 and §5.1.

Conventions: ``W[j]`` is the weight sum of bit ``j`` of the fingerprint, where bit ``j`` means
``(fp >> j) & 1`` (bit 0 is the least significant); the bit is 1 when ``W[j] > 0``.


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

import math

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
        # (``np.empty``, not ``empty_like``, and no reshape of a flat W: a page's update is
        # a few µs, most of it in such calls)
        w = np.empty(flat.shape[0])
        prev = self._prev
        paired = prev is not None and prev.shape == given.shape
        other = prev.ravel() if prev is not None and paired else flat
        surv = np.empty(self.counts.shape[0])  # the next lookup's, made here: one call less
        added = _update_kernel(flat, other, paired, self.counts, self.n_bins / self.y_max,
                               self.n_bins, w, surv)
        if added:
            self.n_samples += added
            self._surv = surv
        self._prev = shaped = w if given.ndim == 1 else w.reshape(given.shape)
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
