"""ICWS sketches and the CWS early-termination filter against their brute-force twins."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.near.cws import (
    CwsFilter,
    FilterStats,
    binom_cdf,
    icws_samples,
    icws_sketch,
    minhash_sketch,
    observation_bounds,
    shingle_minhash_sketch,
    weighted_jaccard,
)
from dupalign.near.idf import IdfBuilder, tf_idf_weights
from dupalign.text.hashing import (
    mix64,
    mix_one,
    salt_key,
    shingle_hashes,
    to_unit,
    token_hashes,
    unit_one,
)
from tests.corpora import RFC
from tests.oracles.cws import (
    binom_cdf_twin,
    bounds_twin,
    decision_probabilities,
    icws_twin,
    weighted_jaccard_twin,
)

u64 = st.integers(min_value=0, max_value=2**64 - 1)
weight = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)
wsets = st.dictionaries(u64, weight, max_size=8)


def _arrays(d: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
    return np.array(list(d), dtype=np.uint64), np.array(list(d.values()), dtype=np.float64)


# --- ICWS ---------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(u64, st.integers(min_value=0, max_value=2**40))
def test_scalar_mix_is_hashing_mix64(x: int, salt: int) -> None:
    arr = np.array([x], dtype=np.uint64)
    assert int(mix_one(np.uint64(x), salt_key(salt))) == int(mix64(arr, salt)[0])
    assert unit_one(np.uint64(x)) == float(to_unit(arr)[0])


def _splitmix_py(x: int, salt: int) -> int:
    """splitmix64's finalizer in Python integers (arbitrary precision, masked by hand)."""
    m = (1 << 64) - 1
    x ^= (0x9E3779B97F4A7C15 * (salt + 1)) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


@settings(max_examples=200, deadline=None)
@given(st.lists(u64, max_size=40), st.integers(min_value=0, max_value=2**40))
def test_mix64_and_to_unit_equal_their_formulas_in_python_integers(
        xs: list[int], salt: int) -> None:
    arr = np.array(xs, dtype=np.uint64)
    assert mix64(arr, salt).tolist() == [_splitmix_py(x, salt) for x in xs]
    assert to_unit(arr).tolist() == [((x >> 11) + 0.5) / 2.0**53 for x in xs]
    if xs:  # a Python int and a 0-d input give a scalar
        assert int(mix64(xs[0], salt)) == _splitmix_py(xs[0], salt)


@settings(max_examples=150, deadline=None)
@given(wsets, st.integers(min_value=1, max_value=6), st.integers(min_value=0, max_value=1000))
def test_icws_matches_twin(d: dict[int, float], K: int, seed: int) -> None:
    s = icws_samples(*_arrays(d), K, seed)
    assert list(zip(s.hash.tolist(), s.t.tolist(), strict=True)) == icws_twin(d, K, seed)


@settings(max_examples=100, deadline=None)
@given(wsets, st.randoms(use_true_random=False))
def test_icws_is_consistent_and_order_free(d: dict[int, float], rnd) -> None:
    h, w = _arrays(d)
    a = icws_sketch(h, w, 32, seed=7)
    assert np.array_equal(a, icws_sketch(h.copy(), w.copy(), 32, seed=7))
    perm = list(range(len(d)))
    rnd.shuffle(perm)
    assert np.array_equal(a, icws_sketch(h[perm], w[perm], 32, seed=7))
    # zero weights are absent features; a repeated hash adds its weights
    h0 = np.concatenate([h, np.array([12345], dtype=np.uint64)])
    w0 = np.concatenate([w, [0.0]])
    if 12345 not in d:
        assert np.array_equal(a, icws_sketch(h0, w0, 32, seed=7))
    if d:
        hd = np.concatenate([h, h[:1]])
        wd = np.concatenate([w, [0.0]])
        wd[0] = w[0] / 2
        wd[-1] = w[0] - w[0] / 2
        assert np.array_equal(a, icws_sketch(hd, wd, 32, seed=7))


def test_icws_edges() -> None:
    e = icws_sketch(np.array([], dtype=np.uint64), np.array([]), 16, 0)
    assert e.dtype == np.uint64 and e.shape == (16,) and not e.any()
    h = np.arange(1, 40, dtype=np.uint64)
    w = np.linspace(0.1, 5.0, h.size)
    a, b = icws_sketch(h, w, 64, 0), icws_sketch(h, w, 64, 1)
    assert np.count_nonzero(a == b) < 16  # seeds give independent samples
    # one feature: every sample picks it; scaling weight by e^r-ish changes t, not x*
    s = icws_samples(np.array([99], dtype=np.uint64), np.array([3.0]), 8, 0)
    assert set(s.hash.tolist()) == {99}
    # huge and tiny weights: logs keep it finite
    s = icws_samples(np.array([1, 2], dtype=np.uint64), np.array([1e300, 1e-300]), 8, 0)
    assert np.isfinite(s.ln_a).all()
    with pytest.raises(ValueError):
        icws_sketch(np.array([1], dtype=np.uint64), np.array([-1.0]), 8, 0)
    with pytest.raises(ValueError):
        icws_sketch(np.array([1], dtype=np.uint64), np.array([1.0, 2.0]), 8, 0)


@settings(max_examples=100, deadline=None)
@given(wsets, wsets)
def test_weighted_jaccard_matches_twin(a: dict[int, float], b: dict[int, float]) -> None:
    assert weighted_jaccard(*_arrays(a), *_arrays(b)) == pytest.approx(
        weighted_jaccard_twin(a, b), rel=1e-12, abs=1e-12
    )


def _random_pair(rng: np.random.Generator, n: int) -> tuple[dict[int, float], dict[int, float]]:
    # B is A with a pair-specific amount of dropped/added features and reweighting,
    # so that the true similarity spreads over (0, 1)
    hs = rng.integers(1, 2**63, size=2 * n, dtype=np.uint64).tolist()
    wa = rng.lognormal(0.0, 1.0, size=n)
    a = dict(zip(hs[:n], wa.tolist(), strict=True))
    noise = rng.uniform(0.0, 1.0)
    b: dict[int, float] = {}
    for h, w in a.items():
        if rng.random() > noise / 2:
            b[h] = w * float(np.exp(rng.normal(0.0, noise)))
    for h in hs[n:]:
        if rng.random() < noise / 2:
            b[h] = float(rng.lognormal(0.0, 1.0))
    return a, b


def test_collision_rate_estimates_weighted_jaccard() -> None:
    # Ioffe: P(sample_k(A) = sample_k(B)) = J exactly, independently over k, so the number of
    # equal positions is B(K, J). Fixed seeds make the test deterministic; bounds are in
    # units of the binomial standard deviation.
    rng = np.random.default_rng(20240611)
    K, n_pairs = 128, 150
    matches, truths = [], []
    for i in range(n_pairs):
        a, b = _random_pair(rng, 60)
        j = weighted_jaccard_twin(a, b)
        sa, sb = icws_sketch(*_arrays(a), K, seed=i), icws_sketch(*_arrays(b), K, seed=i)
        matches.append(int(np.count_nonzero(sa == sb)))
        truths.append(j)
    m, jt = np.array(matches, dtype=float), np.array(truths)
    assert jt.min() < 0.3 and jt.max() > 0.8  # the pairs cover the range
    sd = np.sqrt(jt * (1 - jt) / K)
    # unbiased: the total count is a sum of independent binomials
    z = (m.sum() - K * jt.sum()) / math.sqrt(K * float((jt * (1 - jt)).sum()))
    assert abs(z) < 4
    # every pair within 5 standard deviations (+1 sample for the lattice)
    assert np.all(np.abs(m / K - jt) <= 5 * sd + 1 / K)
    # mean absolute error: E|err| ≈ 0.8 sd for a binomial; allow 1.0 mean sd (≈ 4 SE margin)
    assert float(np.abs(m / K - jt).mean()) <= float(sd.mean())


@pytest.mark.parametrize("lam", [1.25, 2.0, 4.0])
def test_scaled_copy_collides_at_one_over_lambda(lam: float) -> None:
    # J(A, λA) = 1/λ although both pick the same features: this checks the t part of the
    # sample, which a sketch of x* alone would miss (its collision rate would be ≈ 1)
    rng = np.random.default_rng(5)
    K, n_sets = 256, 20
    hits = 0
    for i in range(n_sets):
        h = rng.integers(1, 2**63, size=80, dtype=np.uint64)
        w = rng.lognormal(size=80)
        hits += int(np.count_nonzero(icws_sketch(h, w, K, i) == icws_sketch(h, lam * w, K, i)))
    n, p = K * n_sets, 1 / lam
    assert abs(hits - n * p) <= 4 * math.sqrt(n * p * (1 - p))


# --- binomial tails and bounds -------------------------------------------------------------

fractions_01 = st.builds(
    Fraction, st.integers(min_value=1, max_value=19), st.just(20)
) | st.sampled_from([Fraction(1, 3), Fraction(2, 7), Fraction(9, 10), Fraction(99, 100)])
small_e = st.sampled_from(
    [
        Fraction(1, 10**5),
        Fraction(1, 1000),
        Fraction(1, 100),
        Fraction(1, 20),
        Fraction(1, 5),
        Fraction(49, 100),
    ]
)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=30), fractions_01, small_e)
def test_bounds_match_brute_force(k: int, t: Fraction, e: Fraction) -> None:
    assert observation_bounds(k, t, e) == bounds_twin(k, t, e)
    for m in (-1, 0, k // 2, k - 1, k):
        assert binom_cdf(k, t, m) == binom_cdf_twin(k, t, m)


def test_paper_table_1() -> None:
    # Table 1 (T = 0.8, k = 100): its columns are P(X < m) and P(X ≥ m), see dupalign.near.cws
    t = Fraction(4, 5)
    table = {  # m: (P{X<m}, P{X>=m}) as printed
        5: (1.29e-61, 1.0), 55: (4.22e-09, 1.0), 60: (1.29e-06, 0.999999),
        65: (0.000147, 0.999853), 70: (0.006059, 0.993941), 75: (0.087475, 0.912525),
        80: (0.440538, 0.559462), 85: (0.871494, 0.128506), 90: (0.994304, 0.005696),
        95: (0.999981, 1.87e-05), 100: (1.0, 2.04e-10),
    }  # fmt: skip
    for m, (lt, ge) in table.items():
        below = float(binom_cdf(100, t, m - 1))
        assert below == pytest.approx(lt, rel=5e-3, abs=1e-6 if lt > 0.5 else 0)
        assert 1 - below == pytest.approx(ge, rel=5e-3)
    # the exact bounds at e = 1e-5; the paper's coarse reading says 60 and 95
    assert observation_bounds(100, 0.8, 1e-5) == (61, 95)


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=60), fractions_01, small_e, small_e)
def test_bounds_monotone(k: int, t: Fraction, e1: Fraction, e2: Fraction) -> None:
    lo, up = observation_bounds(k, t, e1)
    lo2, up2 = observation_bounds(k + 1, t, e1)
    assert lo <= lo2 and up <= up2  # more samples: both counts grow
    assert lo < k * t < up + 1  # "dissimilar" only below kT, "similar" only above
    if e1 <= e2:  # a larger e decides more pairs early
        lo3, up3 = observation_bounds(k, t, e2)
        assert lo <= lo3 and up >= up3
    t2 = t + (1 - t) / 2  # a higher threshold
    lo4, up4 = observation_bounds(k, t2, e1)
    assert lo <= lo4 and up <= up4


def test_filter_construction() -> None:
    f = CwsFilter(256, 0.8, 1e-5, [32, 64, 128])
    assert f.points.tolist() == [32, 64, 128, 256]
    for k, lo, up in zip(f.points, f.m_lower, f.m_upper, strict=True):
        assert (lo, up) == observation_bounds(int(k), Fraction(4, 5), Fraction(1, 10**5))
    assert np.all(f.t_lower < 0.8) and np.all(f.t_upper >= 0.8 - 1 / f.points)
    for bad in ([0, 10], [10, 10], [300]):
        with pytest.raises(ValueError):
            CwsFilter(256, 0.8, 1e-5, bad)
    with pytest.raises(ValueError):
        CwsFilter(256, 1.0)
    with pytest.raises(ValueError):
        CwsFilter(256, 0.8, 0.5)


# --- compare --------------------------------------------------------------------------------


def compare_twin(f: CwsFilter, a: np.ndarray, b: np.ndarray) -> tuple[str, str, int, int]:
    """Algorithm 2 read literally: at each observation point recount the first k samples."""
    for k, lo, up in zip(f.points.tolist(), f.m_lower.tolist(), f.m_upper.tolist(), strict=True):
        x = sum(int(a[i] == b[i]) for i in range(k))
        if x > up:
            return "similar", "upper", k, x
        if x <= lo:
            return "dissimilar", "lower", k, x
    x = sum(int(a[i] == b[i]) for i in range(f.K))
    return ("similar" if Fraction(x, f.K) >= f.threshold else "dissimilar"), "estimate", f.K, x


@settings(max_examples=150, deadline=None)
@given(
    st.integers(min_value=1, max_value=48),
    fractions_01,
    small_e,
    st.lists(st.floats(min_value=0, max_value=1), min_size=1, max_size=4),
    st.integers(min_value=0, max_value=2**32),
)
def test_compare_matches_twin_and_batch(
    K: int, t: Fraction, e: Fraction, rates: list[float], seed: int
) -> None:
    rng = np.random.default_rng(seed)
    pts = sorted(set(rng.integers(1, K + 1, size=3).tolist()))
    f = CwsFilter(K, t, e, pts)
    a = rng.integers(0, 2**64, size=K, dtype=np.uint64)
    others = np.stack([np.where(rng.random(K) < r, a, a ^ np.uint64(1)) for r in rates])
    batch = f.compare_many(a, others)
    for row, rb in zip(others, batch, strict=True):
        r = f.compare(a, row)
        assert r == rb
        assert (r.decision, r.decided_by, r.samples_used, r.matches) == compare_twin(f, a, row)
        assert r.est_jaccard == r.matches / r.samples_used
        assert r.samples_saved == K - r.samples_used


def _bernoulli_sketches(rng: np.random.Generator, K: int, R: float, n: int):
    a = np.arange(K, dtype=np.uint64)
    others = np.where(rng.random((n, K)) < R, a[None, :], a[None, :] + np.uint64(K))
    return a, others


def test_error_rate_at_threshold_matches_exact_probability() -> None:
    # Worst case for early errors: true similarity exactly T. The exact probability that a
    # bound fires (DP over the match count) is ≤ e per observation point, and the simulated
    # frequency agrees with it.
    K, T, e = 128, 0.6, 0.02
    f = CwsFilter(K, T, e)
    probs = decision_probabilities(f.points.tolist(), f.m_lower.tolist(), f.m_upper.tolist(), R=T)
    n_pts = len(f.points)
    assert probs["upper"] <= n_pts * e and probs["lower"] <= n_pts * e
    rng = np.random.default_rng(7)
    n = 4000
    a, others = _bernoulli_sketches(rng, K, T, n)
    stats = FilterStats()
    stats.add_all(f.compare_many(a, others))
    for by in ("upper", "lower"):
        p = probs[by]
        assert abs(stats.by[by] - n * p) <= 4 * math.sqrt(n * p * (1 - p)) + 1, (by, p)


@pytest.mark.parametrize(("R", "expect"), [(0.95, "similar"), (0.4, "dissimilar")])
def test_far_from_threshold_is_decided_early_and_right(R: float, expect: str) -> None:
    K, T, e = 256, 0.75, 1e-4
    f = CwsFilter(K, T, e)
    probs = decision_probabilities(f.points.tolist(), f.m_lower.tolist(), f.m_upper.tolist(), R)
    wrong = probs["lower"] if expect == "similar" else probs["upper"]
    assert wrong <= len(f.points) * e
    rng = np.random.default_rng(11)
    a, others = _bernoulli_sketches(rng, K, R, 2000)
    stats = FilterStats()
    results = f.compare_many(a, others)
    stats.add_all(results)
    n_wrong = sum(r.decision != expect for r in results)
    # expected wrong decisions: n · wrong ≪ 1 here; 3 leaves room only for a broken filter
    assert 2000 * wrong < 0.1 and n_wrong <= 3
    assert stats.pairs == 2000
    assert stats.samples_used + stats.samples_saved == 2000 * K
    assert stats.samples_used == sum(r.samples_used for r in results)
    assert stats.saved_fraction > 0.5  # most pairs stop at an early observation point


def test_icws_and_filter_end_to_end() -> None:
    rng = np.random.default_rng(3)
    h = rng.integers(1, 2**63, size=300, dtype=np.uint64)
    w = rng.lognormal(size=300)
    near_w = w.copy()
    near_w[:10] *= 1.5  # weighted Jaccard ≈ 0.97
    far_w = w.copy()
    far_w[150:] = 0  # drops about half the weight
    f = CwsFilter(128, 0.8, 1e-5, [16, 32, 64])
    a = icws_sketch(h, w, 128, 0)
    near = f.compare(a, icws_sketch(h, near_w, 128, 0))
    far = f.compare(a, icws_sketch(h, far_w, 128, 0))
    assert weighted_jaccard(h, w, h, near_w) > 0.95 and near.decision == "similar"
    assert weighted_jaccard(h, w, h, far_w) < 0.6 and far.decision == "dissimilar"
    assert far.decided_by == "lower" and far.samples_used < 128


@pytest.mark.testdata
def test_real_text_estimates_with_tf_idf_weights() -> None:
    # RFC rewrites (2821→5321 ...) and unrelated RFCs, weighted by log-tf × idf over the folder
    def tokens(name: str) -> np.ndarray:
        text = (RFC / f"{name}.txt").read_text(encoding="latin-1").lower()
        return token_hashes(re.findall(r"\w+", text))

    names = ["rfc2821", "rfc5321", "rfc822", "rfc2822", "rfc2246", "rfc4346", "rfc8446"]
    docs = {n: tokens(n) for n in names}
    builder = IdfBuilder()
    builder.add_documents(docs.values())
    table = builder.freeze(1)
    K = 256
    sk = {n: icws_sketch(*tf_idf_weights(d, table), K, seed=1) for n, d in docs.items()}
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    for a, b in pairs:
        j = weighted_jaccard(*tf_idf_weights(docs[a], table), *tf_idf_weights(docs[b], table))
        est = float(np.mean(sk[a] == sk[b]))
        assert abs(est - j) <= 4 * math.sqrt(j * (1 - j) / K) + 1 / K, (a, b, j, est)
    j_rewrite = weighted_jaccard(
        *tf_idf_weights(docs["rfc2821"], table), *tf_idf_weights(docs["rfc5321"], table)
    )
    assert j_rewrite > 0.7  # the rewrite is a near duplicate; the estimate tracks it


# --- min-hash sketches of shingle sets (near-duplicate verification) -----------------------


def _mix1(x: int, s: int) -> int:
    """mix64 of one value, as a Python int (for the twins)."""
    return int(mix64(np.array([x], dtype=np.uint64), s)[0])



def _shingle_twin(h: list[int], w: int, salt: int) -> list[int]:
    if not h:
        return []
    span = min(w, len(h))
    out = []
    for i in range(len(h) - span + 1):
        acc = h[i]
        for j in range(1, span):
            acc = _mix1(acc, salt) ^ h[i + j]
        out.append(_mix1(acc, salt + 1))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(u64, max_size=12), st.integers(min_value=1, max_value=5),
       st.integers(min_value=0, max_value=1000))
def test_shingle_hashes_match_twin(h: list[int], w: int, salt: int) -> None:
    got = shingle_hashes(np.array(h, dtype=np.uint64), w, salt)
    assert got.dtype == np.uint64
    assert got.tolist() == _shingle_twin(h, w, salt)


def test_shingle_hashes_keep_order() -> None:
    h = token_hashes(["a", "b", "c", "d"])
    assert shingle_hashes(h, 3)[0] != shingle_hashes(h[[1, 0, 2, 3]], 3)[0]
    assert shingle_hashes(h, 1).tolist() == mix64(h, 1).tolist()
    with pytest.raises(ValueError):
        shingle_hashes(h, 0)


def _minhash_twin(features: set[int], K: int, seed: int) -> list[int]:
    if not features:
        return [0] * K
    out = []
    for k in range(K):
        key = _mix1(k, (seed << 4) | 10)
        out.append(min(_mix1(_mix1(x, (seed << 4) | 9) ^ key, (seed << 4) | 11) for x in features))
    return out


@settings(max_examples=150, deadline=None)
@given(st.lists(u64, max_size=10), st.integers(min_value=1, max_value=6),
       st.integers(min_value=0, max_value=1000))
def test_minhash_sketch_matches_twin(f: list[int], K: int, seed: int) -> None:
    got = minhash_sketch(np.array(f, dtype=np.uint64), K, seed)
    assert got.tolist() == _minhash_twin(set(f), K, seed)
    # a set: order and repeats do not matter
    assert np.array_equal(got, minhash_sketch(np.array(f[::-1] + f, dtype=np.uint64), K, seed))


@settings(max_examples=150, deadline=None)
@given(st.lists(u64, max_size=14), st.integers(min_value=1, max_value=5),
       st.integers(min_value=0, max_value=1000), st.integers(min_value=1, max_value=6),
       st.integers(min_value=0, max_value=1000))
def test_shingle_minhash_sketch_matches_composition(h: list[int], w: int, salt: int, K: int,
                                                    seed: int) -> None:
    """The fused kernel of the verification sketch against its two steps (each with a twin
    above)."""
    arr = np.array(h, dtype=np.uint64)
    got = shingle_minhash_sketch(arr, w, salt, K, seed)
    assert got.tolist() == minhash_sketch(shingle_hashes(arr, w, salt), K, seed).tolist()


def test_minhash_sketch_estimates_jaccard() -> None:
    # |A ∩ B| = 600, |A ∪ B| = 1000: J = 0.6; K = 2048 samples, sd ≈ 0.011
    a = np.arange(0, 800, dtype=np.uint64)
    b = np.arange(200, 1000, dtype=np.uint64)
    sa, sb = minhash_sketch(a, 2048, 3), minhash_sketch(b, 2048, 3)
    assert abs(float(np.mean(sa == sb)) - 0.6) < 0.05
    assert np.array_equal(minhash_sketch(a, 64, 3), minhash_sketch(a.copy(), 64, 3))
    assert not np.array_equal(minhash_sketch(a, 64, 3), minhash_sketch(a, 64, 4))
    with pytest.raises(ValueError):
        minhash_sketch(a, 0)
