"""Weighted OPH (dupalign.passage.weighted_oph) against its brute-force twin
(tests/oracles/weighted_oph.py): windows, sketches, the estimator."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.passage import weighted_oph as W
from tests.oracles import weighted_oph as O

TF = ["log", "raw", "binary", "sqrt", "squared"]
# small alphabets: repeated tokens, the case where weights differ from 1
texts = st.lists(st.integers(1, 7), min_size=0, max_size=12).map(
    lambda xs: np.array([x * 0x9E3779B97F4A7C15 % 2**64 for x in xs], dtype=np.uint64))


@settings(max_examples=150, deadline=None)
@given(texts, st.integers(1, 6), st.sampled_from(TF))
def test_windows_partition_every_subsequence_and_bin(units: np.ndarray, k: int, tf: str) -> None:
    """Non-empty windows: every (i, j, bin) with an element, once, with its smallest value;
    empty windows: every (i, j, bin) without one, once."""
    w = W.compact_windows(units, k, tf)  # type: ignore[arg-type]
    keys, empty = O.window_cover(w, len(units))
    want = O.all_cells(units.tolist(), k, tf)
    assert keys == {x: u for x, u in want.items() if u is not None}
    assert empty == {x for x, u in want.items() if u is None}


@settings(max_examples=100, deadline=None)
@given(texts, st.integers(1, 6), st.sampled_from(TF), st.data())
def test_sketches_are_the_definition(units: np.ndarray, k: int, tf: str, data: st.DataObject
                                     ) -> None:
    n = len(units)
    if n == 0:
        assert W.sketch(units, k, tf)[1].all()  # type: ignore[arg-type]
        return
    ranges = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(1, n)), min_size=1,
                                max_size=5).map(lambda rs: [(min(a, b - 1), b) for a, b in rs]))
    starts = np.array([a for a, _ in ranges], dtype=np.int64)
    ends = np.array([b for _, b in ranges], dtype=np.int64)
    keys, empty = W.sketches(W.samples(units, k, tf), starts, ends, k)  # type: ignore[arg-type]
    for p, (a, b) in enumerate(ranges):
        want = O.cells(units[a:b].tolist(), k, tf)
        got = [None if e else int(x) for x, e in zip(keys[p], empty[p], strict=True)]
        assert got == want


@settings(max_examples=100, deadline=None)
@given(texts, texts, st.integers(1, 16), st.sampled_from(TF))
def test_estimator_is_its_definition_and_exact_at_the_ends(a: np.ndarray, b: np.ndarray, k: int,
                                                           tf: str) -> None:
    """``N_mat / (k − N_emp)`` from the brute-force cells; 1 for equal weights, 0 for
    disjoint sets, in [0, 1]."""
    if len(a) == 0:
        return
    est = W.estimate(W.sketch(a, k, tf), W.sketch(b, k, tf))  # type: ignore[arg-type]
    ca, cb = O.cells(a.tolist(), k, tf), O.cells(b.tolist(), k, tf)
    n_emp = sum(x is None and y is None for x, y in zip(ca, cb, strict=True))
    n_mat = sum(x is not None and x == y for x, y in zip(ca, cb, strict=True))
    assert est == n_mat / (k - n_emp)
    assert 0.0 <= est <= 1.0
    exact = O.weighted_jaccard(a.tolist(), b.tolist(), tf)
    if exact == 1.0:
        assert est == 1.0
    if exact == 0.0:
        assert est == 0.0


@settings(max_examples=20, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=20, max_size=48),
       st.lists(st.integers(1, 100), min_size=20, max_size=48), st.sampled_from(["log", "raw"]))
def test_estimate_averages_to_the_element_jaccard(xs: list[int], ys: list[int], tf: str
                                                  ) -> None:
    """Over independent hashings (every unit rehashed with a salt) the mean estimate is the
    Jaccard of the element sets (OPH is unbiased for it) and close to the exact weighted
    Jaccard."""
    a = np.array(xs, dtype=np.uint64)
    b = np.array(ys, dtype=np.uint64)
    est, elem, exact = [], [], []
    for s in range(1, 201):
        sa, sb = W.mix64(a, s), W.mix64(b, s)
        est.append(W.estimate(W.sketch(sa, 64, tf), W.sketch(sb, 64, tf)))  # type: ignore[arg-type]
        elem.append(O.element_jaccard(sa.tolist(), sb.tolist(), tf))
        exact.append(O.weighted_jaccard(sa.tolist(), sb.tolist(), tf))
    assert abs(np.mean(est) - np.mean(elem)) < 0.02
    assert abs(np.mean(est) - exact[0]) < 0.06


@pytest.mark.parametrize("tf", ["log", "raw"])
def test_estimate_is_unbiased_where_units_repeat(tf: str) -> None:
    """Sets of a few units each repeated ~4 times, where a text bin may hold only elements
    that need repeats: counted empty on both sides by the same rule, the mean estimate over
    hashings is the mean element Jaccard (a text bin counted empty without an element
    present at count 1 made it high by ~0.04 here)."""
    rng = np.random.default_rng(5)
    for _ in range(3):
        a = rng.integers(1, 13, size=48).astype(np.uint64)
        b = a.copy()
        at = rng.random(48) < 0.3
        b[at] = rng.integers(1, 25, size=int(at.sum())).astype(np.uint64)
        est, elem = [], []
        for s in range(1, 301):
            sa, sb = W.mix64(a, s), W.mix64(b, s)
            est.append(W.estimate(W.sketch(sa, 64, tf), W.sketch(sb, 64, tf)))  # type: ignore[arg-type]
            elem.append(O.element_jaccard(sa.tolist(), sb.tolist(), tf))
        assert abs(np.mean(est) - np.mean(elem)) < 0.015
