"""Weighted OPH (dupalign.passage.weighted_oph) against its brute-force twin
(tests/oracles/weighted_oph.py): windows, sketches, the estimator."""

from __future__ import annotations

import numpy as np
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
    w = W.compact_windows(units, k, tf)  # type: ignore[arg-type]
    assert O.window_cover(w, len(units)) == O.all_samples(units.tolist(), k, tf)


@settings(max_examples=100, deadline=None)
@given(texts, st.integers(1, 6), st.sampled_from(TF), st.data())
def test_sketches_are_the_definition(units: np.ndarray, k: int, tf: str, data: st.DataObject
                                     ) -> None:
    n = len(units)
    if n == 0:
        keys, empty = W.sketch(units, k, tf)  # type: ignore[arg-type]
        assert empty.all()
        return
    ranges = data.draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(1, n)), min_size=1,
                                max_size=5).map(lambda rs: [(min(a, b - 1), b) for a, b in rs]))
    starts = np.array([a for a, _ in ranges], dtype=np.int64)
    ends = np.array([b for _, b in ranges], dtype=np.int64)
    keys, empty = W.sketches(W.samples(units, k, tf), starts, ends, k)  # type: ignore[arg-type]
    for p, (a, b) in enumerate(ranges):
        want = O.sample(units[a:b].tolist(), k, tf)
        assert [None if e else int(x) for x, e in zip(keys[p], empty[p], strict=True)] == want


@settings(max_examples=100, deadline=None)
@given(texts, texts, st.integers(1, 16), st.sampled_from(TF))
def test_estimator_against_exact_weighted_jaccard(a: np.ndarray, b: np.ndarray, k: int, tf: str
                                                  ) -> None:
    """Exact where it must be (identical, disjoint, estimate in [0, 1]) and, per bin, a match
    only when the bin's samples are one shared token at equal ICWS sample."""
    sa, sb = W.sketch(a, k, tf), W.sketch(b, k, tf)  # type: ignore[arg-type]
    est = W.estimate(sa, sb)
    exact = O.weighted_jaccard(a.tolist(), b.tolist(), tf)
    if len(a) == 0 and len(b) == 0:
        assert np.isnan(est)
        return
    assert 0.0 <= est <= 1.0
    if exact == 1.0:
        assert est == 1.0
    if exact == 0.0:
        assert est == 0.0
    ka, kb = O.sample(a.tolist(), k, tf), O.sample(b.tolist(), k, tf)
    n_emp = sum(x is None and y is None for x, y in zip(ka, kb, strict=True))
    n_mat = sum(x is not None and x == y for x, y in zip(ka, kb, strict=True))
    assert est == (n_mat / (k - n_emp) if k > n_emp else est)


@settings(max_examples=60, deadline=None)
@given(texts, texts, st.sampled_from(TF))
def test_one_token_per_bin_estimates_token_ratio(a: np.ndarray, b: np.ndarray, tf: str) -> None:
    """Averaged over many independent salts (token rehashes), a bin holding one token
    matches with probability min(w_A, w_B) / max(w_A, w_B) (ICWS consistency): with k = 1
    and a single distinct token, the mean estimate is that ratio."""
    t = np.uint64(0x1234567)
    ca, cb = int(np.count_nonzero(a % 3 == 0)) + 1, int(np.count_nonzero(b % 3 == 0)) + 1
    wa, wb = O.weight(ca, tf), O.weight(cb, tf)
    salts = np.arange(1, 2001, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    hits = 0
    for s in salts:
        u = np.array([t ^ s])
        hits += W.estimate(W.sketch(np.repeat(u, ca), 1, tf),  # type: ignore[arg-type]
                           W.sketch(np.repeat(u, cb), 1, tf)) == 1.0  # type: ignore[arg-type]
    assert abs(hits / len(salts) - min(wa, wb) / max(wa, wb)) < 0.05
