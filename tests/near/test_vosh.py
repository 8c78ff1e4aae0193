"""VOSH against the brute force of §5.1 (all subsets, sorted); the volatility model."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.near.volatility import VolatilityModel, pairwise_sum
from dupalign.near.vosh import LINEAR_MAX_BUDGET, _children, vosh_array, vosh_sets


def p_of(p: list[float], s: tuple[int, ...]) -> float:
    """Equation (6), computed the obvious way."""
    return math.prod(p[i] for i in s) * math.prod(1 - p[j] for j in range(len(p)) if j not in s)


def brute_force(p: list[float], h: int) -> list[tuple[float, tuple[int, ...]]]:
    sets = [s for k in range(min(h, len(p)) + 1) for s in itertools.combinations(range(len(p)), k)]
    return sorted(((p_of(p, s), s) for s in sets), key=lambda t: -t[0])


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-300)


def check_against_brute_force(p: list[float], h: int, got: list[tuple[float, tuple[int, ...]]]):
    want = brute_force(p, h)
    sets = [s for _, s in got]
    assert len(sets) == len(set(sets)), "a set was yielded twice"
    assert sorted(sets) == sorted(s for _, s in want), "a set is missing or extra"
    # Same sequence of probabilities as the sorted brute force, hence non-increasing order;
    # sets may differ only inside groups of (numerically) equal probability.
    for (kg, s), (kw, _) in zip(got, want, strict=True):
        assert close(p_of(p, s), kw)
        assert close(kg, kw)
    for a, b in itertools.pairwise(got):
        assert p_of(p, a[1]) >= p_of(p, b[1]) * (1 - 1e-9)


probs = st.one_of(
    st.floats(1e-6, 0.99),  # no subnormals: products must not underflow
    st.sampled_from([0.0, 0.1, 0.25, 0.5]),  # ties and zeros
)


@settings(max_examples=300, deadline=None)
@given(p=st.lists(probs, min_size=0, max_size=10), h=st.integers(0, 4))
def test_vosh_sets_equals_brute_force(p: list[float], h: int) -> None:
    check_against_brute_force(p, h, list(vosh_sets(p, h)))


@settings(max_examples=300, deadline=None)
@given(p=st.lists(probs, min_size=1, max_size=10), h=st.integers(0, 4))
def test_numba_vosh_equals_python_vosh(p: list[float], h: int) -> None:
    got = vosh_array(p, h)  # heap frontier when there are more than 64 sets
    check_against_brute_force(p, h, got)
    python = [s for _, s in vosh_sets(p, h)]
    assert [s for _, s in got] == python
    # The linear frontier (budgets <= 64) yields the same prefix.
    assert [s for _, s in vosh_array(p, h, LINEAR_MAX_BUDGET)] == python[:LINEAR_MAX_BUDGET]


@settings(max_examples=50, deadline=None)
@given(p=st.lists(probs, min_size=20, max_size=64), h=st.integers(1, 4))
def test_linear_and_heap_frontiers_agree_on_wide_hashes(p: list[float], h: int) -> None:
    linear = vosh_array(p, h, LINEAR_MAX_BUDGET)
    heap = vosh_array(p, h, LINEAR_MAX_BUDGET + 1)[:LINEAR_MAX_BUDGET]
    assert [s for _, s in linear] == [s for _, s in heap]
    assert [s for _, s in linear] == [s for _, s in vosh_sets(p, h, LINEAR_MAX_BUDGET)]


@settings(max_examples=100, deadline=None)
@given(p=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=10), h=st.integers(0, 4),
       limit=st.integers(0, 30))
def test_limit_is_a_prefix_and_empty_set_first(p: list[float], h: int, limit: int) -> None:
    full = list(vosh_sets(p, h))
    assert full[0][1] == ()  # p_j <= 1/2 for every volatility
    assert list(vosh_sets(p, h, limit)) == full[:limit]
    assert [s for _, s in vosh_array(p, h, limit)] == [s for _, s in full[:limit]]


def test_tree_gives_every_set_exactly_one_parent() -> None:
    """The fixed Algorithm 2 is a spanning tree of the h-subsets (no duplicates)."""
    b = 9
    for h in range(1, 5):
        seen = {tuple(range(h))}
        frontier = [tuple(range(h))]
        while frontier:
            s = frontier.pop()
            for c in _children(s, b):
                assert c not in seen, c
                seen.add(c)
                frontier.append(c)
        assert seen == set(itertools.combinations(range(b), h))


def test_paper_typo_would_duplicate() -> None:
    """With the paper's loop (no stop at a gap of 2), (0, 2, 4) would give (1, 2, 4), which
    is already the left child of (1, 2, 3); the fixed rule increments the rightmost gap."""
    assert _children((0, 2, 4), 9) == [(0, 2, 5), (0, 3, 4)]
    assert (1, 2, 4) in _children((1, 2, 3), 9)
    # Figure 2, h = 2: (1,2) -> (1,3) -> {(1,4), (2,3)} in the paper's 1-based ranks.
    assert _children((0, 1), 5) == [(0, 2)]
    assert _children((0, 2), 5) == [(0, 3), (1, 2)]


def test_paper_example_bit_order() -> None:
    """§4.3: weights (1.9, 0.01, -0.5): bit 1 (0.01) is the most volatile, then -0.5."""
    m = VolatilityModel()
    W = np.array([1.9, 0.01, -0.5])
    p = m.volatility(W)
    assert p[1] > p[2] > p[0]
    assert list(vosh_sets(p, 1))[1][1] == (1,)


def test_volatility_prior_is_sensible() -> None:
    m = VolatilityModel()
    w = np.linspace(-3, 3, 64)
    p = m.volatility(w)
    assert np.all((p > 0) & (p <= 0.5))
    # Symmetric in the sign of W and strictly decreasing in |W|.
    assert np.allclose(p, p[::-1])
    assert np.all(np.diff(p[32:]) < 0)
    assert m.volatility(np.zeros(64)).tolist() == [0.5] * 64


def test_volatility_learns_scale_of_changes() -> None:
    rng = np.random.default_rng(7)
    wide, narrow = VolatilityModel(), VolatilityModel()
    for _ in range(300):
        w = rng.laplace(size=64)
        wide.update(w)
        narrow.update_pair(w, w + rng.normal(scale=0.05, size=64))
    assert wide.n_samples == 299 * 64 and narrow.n_samples == 300 * 64
    w = rng.laplace(size=64)
    # Small edits make every bit much less volatile than random pairs of pages do.
    assert np.all(narrow.volatility(w) < wide.volatility(w))
    # The random-pair model is close to the cold-start prior (both: Laplace, var 2).
    assert np.allclose(wide.volatility(w), VolatilityModel().volatility(w), atol=0.05)


def test_volatility_is_scale_invariant_and_batched() -> None:
    rng = np.random.default_rng(3)
    m = VolatilityModel()
    for _ in range(50):
        m.update(rng.laplace(size=64))
    W = rng.laplace(size=(5, 64))
    assert np.allclose(m.volatility(W), m.volatility(W * 1000.0))
    assert np.array_equal(m.volatility(W)[2], m.volatility(W[2]))


def test_model_round_trip() -> None:
    rng = np.random.default_rng(11)
    m = VolatilityModel(n_bins=64, y_max=6.0)
    for _ in range(20):
        m.update(rng.laplace(size=64))
    m2 = VolatilityModel.from_bytes(m.to_bytes())
    W = rng.laplace(size=(4, 64))
    assert np.array_equal(m2.volatility(W), m.volatility(W))
    assert m2.to_bytes() == m.to_bytes()
    # The stream state (previous W) survives too: both models learn the same next pair.
    w = rng.laplace(size=64)
    m.update(w)
    m2.update(w)
    assert np.array_equal(m.counts, m2.counts)
    with pytest.raises(ValueError):
        VolatilityModel.from_bytes(b"\x80")


def _numpy_update(m: VolatilityModel, W: np.ndarray) -> np.ndarray:
    """``update`` as numpy calls: the kernel's twin."""
    w = VolatilityModel.normalize(W)
    if m._prev is not None and m._prev.shape == w.shape:
        m.add_differences(w - m._prev)
    m._prev = w
    return w


def _numpy_survival(m: VolatilityModel) -> np.ndarray:
    return np.cumsum(m.counts[::-1])[::-1] / float(m.counts.sum())


weights = st.lists(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
                   min_size=64, max_size=64)


@settings(max_examples=60, deadline=None)
@given(pages=st.lists(st.one_of(weights, st.just([0.0] * 64)), min_size=1, max_size=12),
       n_bins=st.integers(2, 600), y_max=st.floats(0.5, 20.0))
def test_update_kernel_is_its_numpy_twin(pages: list[list[float]], n_bins: int,
                                         y_max: float) -> None:
    """The model learned by the kernel is numpy's bit for bit: its normalized W, counts,
    samples and survival, after every page and after a replay of the logged updates."""
    kernel, twin = VolatilityModel(n_bins, y_max), VolatilityModel(n_bins, y_max)
    replayed = VolatilityModel(n_bins, y_max)
    for page in pages:
        W = np.array(page)
        w = kernel.update(W)
        assert w.tobytes() == _numpy_update(twin, W).tobytes()
        replayed.replay(np.frombuffer(w.astype("<f8").tobytes(), dtype="<f8").astype(float))
        for m in (kernel, replayed):
            assert m.counts.tobytes() == twin.counts.tobytes()
            assert m.n_samples == twin.n_samples
            assert m.kernel_params()[0].tobytes() == _numpy_survival(twin).tobytes()
    assert kernel.to_bytes() == twin.to_bytes() == replayed.to_bytes()


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.floats(-1e9, 1e9, allow_nan=False), max_size=700))
def test_pairwise_sum_is_numpys(values: list[float]) -> None:
    a = np.array(values, dtype=np.float64)
    assert pairwise_sum(a, 0, a.size) == float(a.sum())


def test_rejects_invalid_probabilities() -> None:
    with pytest.raises(ValueError):
        list(vosh_sets([0.2, 1.0], 2))
    with pytest.raises(ValueError):
        vosh_array([-0.1], 1)
