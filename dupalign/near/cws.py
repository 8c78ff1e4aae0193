"""ICWS weighted-Jaccard sketches and the CWS early-termination filter.

Sketches: Ioffe's Improved Consistent Weighted Sampling (ICDM 2010). For sample k and every
feature x with weight S(x) > 0, draw r, c ~ Gamma(2, 1) and β ~ U(0, 1) and set

    t = ⌊ln S(x) / r + β⌋,   ln a = ln c − r (t − β + 1)        (a = c / (y e^r), y = e^{r(t−β)})

The sample is (x*, t*) with x* = argmin ln a. Two weighted sets pick the same (x*, t*) with
probability equal to their weighted Jaccard Σ min / Σ max. The randomness of (x, k) is a pure
function of the token hash, the sample index and the seed (``hashing.mix64``), so there is no
vocabulary and a sketch does not depend on feature order.

Filter: Yuan et al., "Efficient Near-Duplicate Document Detection Using Consistent Weighted
Sampling Filter" (§5.2, Alg. 2). After the first k samples, X = #matches ~ B(k, R). With
threshold T and small probability e, at each observation point k:

    m_lower(k) = max{m : P(X ≤ m | R = T) ≤ e}   → "dissimilar" if X ≤ m_lower(k)
    m_upper(k) = min{m : P(X > m | R = T) ≤ e}   → "similar"    if X > m_upper(k)

T_L(k) = m_lower/k and T_U(k) = m_upper/k as in the paper. The comparisons are those of the
paper's tests of H1/H2 (Alg. 2 line 7 uses ≤ T_L; for line 9 we use the strict X > m_upper of
event B, which is what the e-bound holds for; the paper's "= e^{-k}" is a typo for e). Since
binomial tails are monotone in R, each bound errs with probability ≤ e for every R on the
wrong side of T; over n observation points the error is ≤ n·e (union bound). If neither bound
fires up to K, the pair is decided by the estimate X/K ≥ T.

Trap: the columns of the paper's Table 1 (T = 0.8, k = 100) labelled P{X ≤ m} and P{X > m}
are really P(X < m) and P(X ≥ m) (e.g. 0.440538 = P(X ≤ 79), 2.04e-10 = P(X = 100)); the
paper then reads the table at steps of 5 ("R < 60 %", "R > 95 %"). The exact bounds for
e = 1e-5 are m_lower = 61 (P(X ≤ 61) = 9.7e-6) and m_upper = 95 (P(X > 95) = 3.7e-6,
P(X > 94) = 1.9e-5).

Tails are computed exactly with integers: T = p/q and e are rationals (a float is read through
its shortest repr, so 0.8 means 4/5), and Σ C(k,i) p^i (q−p)^{k−i} is compared with e · q^k.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.text.hashing import mix64, mix_one, salt_key, unit_one

U64 = npt.NDArray[np.uint64]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

_MASK64 = (1 << 64) - 1

# mix64 salts, per seed: 16 streams so that streams of different seeds never coincide.
_S_FEATURE, _S_SAMPLE, _S_R0, _S_R1, _S_C0, _S_C1, _S_BETA, _S_T, _S_PACK = range(9)
_S_MH_FEATURE, _S_MH_SAMPLE, _S_MH_VALUE = range(9, 12)


def _salt(seed: int, stream: int) -> int:
    return ((seed << 4) | stream) & _MASK64


@njit(cache=True, nogil=True)
def _icws_kernel(
    base: U64, lnw: F64, sample_keys: U64, salts: U64, best_i: I64, best_t: I64, best_lna: F64
) -> None:
    n = base.shape[0]
    kk = sample_keys.shape[0]
    for k in range(kk):
        best_lna[k] = np.inf
        best_i[k] = -1
        best_t[k] = 0
    for i in range(n):
        b = base[i]
        lw = lnw[i]
        for k in range(kk):
            x = b ^ sample_keys[k]
            r = -np.log(unit_one(mix_one(x, salts[0])) * unit_one(mix_one(x, salts[1])))
            c = -np.log(unit_one(mix_one(x, salts[2])) * unit_one(mix_one(x, salts[3])))
            beta = unit_one(mix_one(x, salts[4]))
            t = np.floor(lw / r + beta)
            lna = np.log(c) - r * (t - beta + 1.0)
            # strict <: on an exact tie the smaller hash wins (features arrive sorted)
            if lna < best_lna[k]:
                best_lna[k] = lna
                best_i[k] = i
                best_t[k] = np.int64(t)


def _weighted_set(hashes: npt.ArrayLike, weights: npt.ArrayLike) -> tuple[U64, F64]:
    """Sorted distinct hashes with positive weights; duplicate hashes add their weights."""
    h = np.asarray(hashes, dtype=np.uint64).ravel()
    w = np.asarray(weights, dtype=np.float64).ravel()
    if h.shape != w.shape:
        raise ValueError(f"hashes and weights differ in length: {h.size} != {w.size}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and non-negative")
    uniq, inv = np.unique(h, return_inverse=True)
    ws: F64 = np.bincount(inv.ravel(), weights=w, minlength=uniq.size).astype(np.float64)
    keep = ws > 0
    return uniq[keep], ws[keep]


@dataclass(frozen=True)
class IcwsSamples:
    """The raw ICWS samples of one weighted set: per sample k the chosen feature's hash,
    its t_k, and ln a_k (the minimum that chose it). Empty set: ``hash`` all 0, ``t`` 0."""

    hash: U64
    t: I64
    ln_a: F64


def icws_samples(
    hashes: npt.ArrayLike, weights: npt.ArrayLike, K: int, seed: int = 0
) -> IcwsSamples:
    """K ICWS samples (x*_k, t*_k) of the weighted set {hash_i: weight_i}.

    Weights must be finite and ≥ 0; zero weights mean "absent"; repeated hashes are merged
    by adding their weights.
    """
    if not 1 <= K <= 1 << 16:
        raise ValueError(f"K must be in [1, 65536], got {K}")
    h, w = _weighted_set(hashes, weights)
    best_i = np.empty(K, dtype=np.int64)
    best_t = np.empty(K, dtype=np.int64)
    best_lna = np.empty(K, dtype=np.float64)
    base = mix64(h, _salt(seed, _S_FEATURE))
    sample_keys = mix64(np.arange(K, dtype=np.uint64), _salt(seed, _S_SAMPLE))
    salts = np.array(
        [salt_key(_salt(seed, s)) for s in (_S_R0, _S_R1, _S_C0, _S_C1, _S_BETA)],
        dtype=np.uint64,
    )
    _icws_kernel(base, np.log(w), sample_keys, salts, best_i, best_t, best_lna)
    if h.size == 0:
        return IcwsSamples(np.zeros(K, dtype=np.uint64), np.zeros(K, dtype=np.int64), best_lna)
    return IcwsSamples(h[best_i], best_t, best_lna)


def pack_samples(samples: IcwsSamples, seed: int = 0) -> U64:
    """One uint64 per sample that is equal iff (x*, t*) is (up to 2^-64 collisions)."""
    t_key = mix64(samples.t.view(np.uint64), _salt(seed, _S_T))
    return mix64(samples.hash ^ t_key, _salt(seed, _S_PACK))


def icws_sketch(hashes: npt.ArrayLike, weights: npt.ArrayLike, K: int, seed: int = 0) -> U64:
    """ICWS sketch: K uint64 fingerprints of (x*_k, t*_k); compare two sketches position by
    position (equal ⇔ same sample). The empty set gives all zeros.

    Cost O(n·K) with three logs per (feature, sample): about 2 ms for n = 500, K = 128.
    """
    s = icws_samples(hashes, weights, K, seed)
    if not s.hash.any():
        return np.zeros(K, dtype=np.uint64)
    return pack_samples(s, seed)


@njit(cache=True, nogil=True)
def _minhash_kernel(base: U64, sample_keys: U64, salt_c: np.uint64, out: U64) -> None:
    # samples outer: the running minimum stays in a register while features stream by
    for k in range(sample_keys.shape[0]):
        key = sample_keys[k]
        best = np.uint64(0xFFFFFFFFFFFFFFFF)
        for i in range(base.shape[0]):
            v = mix_one(base[i] ^ key, salt_c)
            if v < best:
                best = v
        out[k] = best


def minhash_sketch(features: npt.ArrayLike, K: int, seed: int = 0) -> U64:
    """K-min-hash sketch of a set of uint64 features (repeats are ignored): sample k is
    min over x of mix64(mix64(x) ^ key_k). Two sets agree on sample k with probability
    equal to their Jaccard similarity, independently over k, so sketches compare under the
    same ``CwsFilter`` as ICWS sketches (ICWS with all weights 1 is this, in distribution).
    The empty set gives all zeros. Cost O(n·K) with one mix per (feature, sample).
    """
    if not 1 <= K <= 1 << 16:
        raise ValueError(f"K must be in [1, 65536], got {K}")
    f = np.asarray(features, dtype=np.uint64).ravel()
    if f.size == 0:
        return np.zeros(K, dtype=np.uint64)
    base = mix64(f, _salt(seed, _S_MH_FEATURE))
    keys = mix64(np.arange(K, dtype=np.uint64), _salt(seed, _S_MH_SAMPLE))
    out = np.empty(K, dtype=np.uint64)
    _minhash_kernel(base, keys, salt_key(_salt(seed, _S_MH_VALUE)), out)
    return out


@njit(cache=True, nogil=True)
def _shingle_features_kernel(h: U64, span: int, c_step: np.uint64, c_last: np.uint64,
                             c_feature: np.uint64, out: U64) -> None:
    # hashing.shingle_hashes(h, span, salt), then minhash_sketch's feature mix, per shingle
    for i in range(out.shape[0]):
        acc = h[i]
        for j in range(1, span):
            acc = mix_one(acc, c_step) ^ h[i + j]
        out[i] = mix_one(mix_one(acc, c_last), c_feature)


@functools.lru_cache(maxsize=8)
def _sample_keys(K: int, seed: int) -> U64:
    keys = mix64(np.arange(K, dtype=np.uint64), _salt(seed, _S_MH_SAMPLE))
    keys.flags.writeable = False
    return keys


@functools.lru_cache(maxsize=8)
def shingle_minhash_keys(salt: int, K: int, seed: int) -> tuple[U64, U64]:
    """The constants ``shingle_minhash_into`` takes after the shingle width: the mixes of
    the shingle step, its last step, the feature and the value (one array: a numpy scalar
    costs a kernel call more than an array does), and the sample keys."""
    mixes = np.array([salt_key(salt), salt_key(salt + 1), salt_key(_salt(seed, _S_MH_FEATURE)),
                      salt_key(_salt(seed, _S_MH_VALUE))], dtype=np.uint64)
    mixes.flags.writeable = False
    return mixes, _sample_keys(K, seed)


@njit(cache=True, nogil=True)
def shingle_minhash_into(h: U64, span: int, mixes: U64, sample_keys: U64, out: U64) -> None:
    """``shingle_minhash_sketch`` of ``h`` (not empty; ``span`` = min(w, len(h))) into
    ``out``, for kernels."""
    base = np.empty(h.shape[0] - span + 1, dtype=np.uint64)
    _shingle_features_kernel(h, span, mixes[0], mixes[1], mixes[2], base)
    _minhash_kernel(base, sample_keys, mixes[3], out)


def shingle_minhash_sketch(hashes: npt.ArrayLike, w: int, salt: int, K: int,
                           seed: int = 0) -> U64:
    """``minhash_sketch(hashing.shingle_hashes(hashes, w, salt), K, seed)`` in one pass (the
    composition is its oracle in the tests): a page's verification sketch costs one kernel
    instead of ~10 numpy passes over its tokens."""
    if w < 1:
        raise ValueError(f"w must be ≥ 1, got {w}")
    if not 1 <= K <= 1 << 16:
        raise ValueError(f"K must be in [1, 65536], got {K}")
    h = np.ascontiguousarray(hashes, dtype=np.uint64).ravel()
    if h.size == 0:
        return np.zeros(K, dtype=np.uint64)
    out = np.empty(K, dtype=np.uint64)
    shingle_minhash_into(h, min(w, h.size), *shingle_minhash_keys(salt, K, seed), out)
    return out


def weighted_jaccard(
    hashes_a: npt.ArrayLike,
    weights_a: npt.ArrayLike,
    hashes_b: npt.ArrayLike,
    weights_b: npt.ArrayLike,
) -> float:
    """Exact weighted Jaccard Σ min / Σ max of two weighted sets (0 for two empty sets)."""
    ha, wa = _weighted_set(hashes_a, weights_a)
    hb, wb = _weighted_set(hashes_b, weights_b)
    keys = np.union1d(ha, hb)
    va = np.zeros(keys.size)
    vb = np.zeros(keys.size)
    va[np.searchsorted(keys, ha)] = wa
    vb[np.searchsorted(keys, hb)] = wb
    den = float(np.maximum(va, vb).sum())
    return float(np.minimum(va, vb).sum()) / den if den > 0 else 0.0


# --- exact binomial tails ----------------------------------------------------------------


def as_fraction(x: float | Fraction | str) -> Fraction:
    """A float through its shortest repr (0.8 → 4/5), so thresholds mean what they say."""
    if isinstance(x, Fraction):
        return x
    return Fraction(repr(x) if isinstance(x, float) else x)


def _pmf_numerators(k: int, p: Fraction) -> tuple[list[int], int]:
    """Integers n_i with P(X = i) = n_i / D for X ~ B(k, p), and D = q^k."""
    a, q = p.numerator, p.denominator
    b = q - a
    pa = [1] * (k + 1)
    pb = [1] * (k + 1)
    for i in range(1, k + 1):
        pa[i] = pa[i - 1] * a
        pb[i] = pb[i - 1] * b
    return [math.comb(k, i) * pa[i] * pb[k - i] for i in range(k + 1)], q**k


def binom_cdf(k: int, p: Fraction | float, m: int) -> Fraction:
    """Exact P(X ≤ m) for X ~ B(k, p)."""
    pf = as_fraction(p)
    if m < 0:
        return Fraction(0)
    if m >= k:
        return Fraction(1)
    nums, den = _pmf_numerators(k, pf)
    return Fraction(sum(nums[: m + 1]), den)


@functools.lru_cache(maxsize=4096)  # exact sums of fractions; every engine asks the same
def observation_bounds(k: int, threshold: Fraction | float, e: Fraction | float) -> tuple[int, int]:
    """(m_lower, m_upper) at observation point k, see the module docstring.

    m_lower = −1 when even X = 0 is not a small-probability event (no "dissimilar" at k);
    m_upper = k when no count is (no "similar" at k: X > k is impossible).
    """
    t, ef = as_fraction(threshold), as_fraction(e)
    nums, den = _pmf_numerators(k, t)
    # compare  cum / den ≤ e_num / e_den  as integers
    lim = ef.numerator * den
    m_lower = -1
    cum = 0
    for m in range(k + 1):
        cum += nums[m]
        if cum * ef.denominator <= lim:
            m_lower = m
        else:
            break
    m_upper = k
    tail = den  # P(X > m) numerator, for m = −1
    for m in range(k + 1):
        tail -= nums[m]
        if tail * ef.denominator <= lim:
            m_upper = m
            break
    return m_lower, m_upper


# --- the filter -------------------------------------------------------------------------

Decision = Literal["similar", "dissimilar"]
DecidedBy = Literal["upper", "lower", "estimate"]


@dataclass(frozen=True)
class CwsResult:
    """Outcome of comparing two sketches.

    ``decided_by`` is "upper" (X > m_upper at an observation point), "lower"
    (X ≤ m_lower) or "estimate" (undecided at K: similar iff X / K ≥ T).
    ``est_jaccard`` = matches / samples_used.
    """

    decision: Decision
    decided_by: DecidedBy
    est_jaccard: float
    samples_used: int
    matches: int
    K: int

    @property
    def samples_saved(self) -> int:
        return self.K - self.samples_used

    @property
    def early(self) -> bool:
        return self.samples_used < self.K


@dataclass
class FilterStats:
    """Running totals for metrics: pairs compared and sample comparisons saved."""

    pairs: int = 0
    samples_used: int = 0
    samples_saved: int = 0
    by: dict[str, int] = field(default_factory=lambda: {"upper": 0, "lower": 0, "estimate": 0})
    similar: int = 0

    def add(self, result: CwsResult) -> None:
        self.pairs += 1
        self.samples_used += result.samples_used
        self.samples_saved += result.samples_saved
        self.by[result.decided_by] += 1
        self.similar += result.decision == "similar"

    def add_all(self, results: Iterable[CwsResult]) -> None:
        for r in results:
            self.add(r)

    @property
    def saved_fraction(self) -> float:
        total = self.samples_used + self.samples_saved
        return self.samples_saved / total if total else 0.0


class CwsFilter:
    """Compare ICWS sketches of length K against threshold T with early termination.

    ``observation_points``: increasing sample counts in [1, K]; K is appended if missing.
    Default: K/8, 2K/8, …, K. The error of each early decision is ≤ e per observation point.
    """

    def __init__(
        self,
        K: int,
        threshold: float | Fraction,
        e: float | Fraction = 1e-5,
        observation_points: Sequence[int] | None = None,
    ) -> None:
        t, ef = as_fraction(threshold), as_fraction(e)
        if not 0 < t < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        if not 0 < ef < Fraction(1, 2):
            raise ValueError(f"e must be in (0, 0.5), got {e}")
        if K < 1:
            raise ValueError(f"K must be ≥ 1, got {K}")
        if observation_points is None:
            step = max(1, K // 8)
            observation_points = range(step, K + 1, step)
        pts = [int(k) for k in observation_points]
        if not pts or pts[0] < 1 or any(b <= a for a, b in itertools.pairwise(pts)):
            raise ValueError("observation_points must be strictly increasing and ≥ 1")
        if pts[-1] > K:
            raise ValueError(f"observation points exceed K = {K}")
        if pts[-1] != K:
            pts.append(K)
        self.K = K
        self.threshold = t
        self.e = ef
        self.points = np.array(pts, dtype=np.int64)
        bounds = [observation_bounds(k, t, ef) for k in pts]
        self.m_lower = np.array([b[0] for b in bounds], dtype=np.int64)
        self.m_upper = np.array([b[1] for b in bounds], dtype=np.int64)
        # (as Python ints for ``compare``'s loop, made once: it runs per candidate pair)
        self._steps = list(zip(pts, (b[0] for b in bounds), (b[1] for b in bounds),
                               strict=True))
        self._last = self.points - 1

    @property
    def t_lower(self) -> F64:
        """T_L(k) = m_lower / k at each observation point."""
        return self.m_lower / self.points

    @property
    def t_upper(self) -> F64:
        """T_U(k) = m_upper / k at each observation point."""
        return self.m_upper / self.points

    def _final(self, matches: int) -> CwsResult:
        # exact: X / K ≥ p / q  ⇔  X·q ≥ K·p
        sim = matches * self.threshold.denominator >= self.K * self.threshold.numerator
        return CwsResult(
            "similar" if sim else "dissimilar",
            "estimate",
            matches / self.K,
            self.K,
            matches,
            self.K,
        )

    def compare(self, a: npt.ArrayLike, b: npt.ArrayLike) -> CwsResult:
        """Compare two sketches sample by sample, stopping at the first bound that fires."""
        av = np.asarray(a, dtype=np.uint64)
        bv = np.asarray(b, dtype=np.uint64)
        if av.shape != (self.K,) or bv.shape != (self.K,):
            raise ValueError(f"sketches must have shape ({self.K},), got {av.shape}, {bv.shape}")
        # the matches up to each observation point at once: three numpy calls in all, not
        # two a point (the index stage compares every PSM candidate)
        counts = np.cumsum(av == bv)[self._last].tolist()
        for (k, lo, up), matches in zip(self._steps, counts, strict=True):
            if matches > up:
                return CwsResult("similar", "upper", matches / k, k, matches, self.K)
            if matches <= lo:
                return CwsResult("dissimilar", "lower", matches / k, k, matches, self.K)
        return self._final(matches)

    def compare_many(self, a: npt.ArrayLike, others: npt.ArrayLike) -> list[CwsResult]:
        """``compare(a, others[j])`` for each row j, vectorized over rows (same results)."""
        av = np.asarray(a, dtype=np.uint64)
        ov = np.asarray(others, dtype=np.uint64)
        if ov.ndim != 2 or ov.shape[1] != self.K or av.shape != (self.K,):
            raise ValueError(f"expected a ({self.K},) sketch and an (m, {self.K}) array")
        cum = np.cumsum(ov == av[None, :], axis=1)[:, self.points - 1]  # (m, points)
        up = cum > self.m_upper[None, :]
        lo = cum <= self.m_lower[None, :]
        fired = up | lo
        out: list[CwsResult] = []
        for j in range(ov.shape[0]):
            hits = np.flatnonzero(fired[j])
            if hits.size == 0:
                out.append(self._final(int(cum[j, -1])))
                continue
            p = int(hits[0])
            k = int(self.points[p])
            x = int(cum[j, p])
            if up[j, p]:
                out.append(CwsResult("similar", "upper", x / k, k, x, self.K))
            else:
                out.append(CwsResult("dissimilar", "lower", x / k, k, x, self.K))
        return out
