"""Interval scan (dupalign.passage.interval_scan) against brute force and the paper's examples."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.passage.interval_scan import (
    align,
    align_sketch,
    collisions,
    radix_sort,
    scan_rectangles,
)
from dupalign.passage.oph import (
    compact_windows,
    compact_windows_binned,
    oph_bins,
    oph_counts,
    oph_sketch_binned,
    oph_values,
)
from dupalign.text.hashing import token_hashes
from tests.oracles.oph import (
    algorithm3,
    brute_align,
    brute_scan_rectangles,
    cover_weights,
    exact_jaccard_alignment,
    subsequence_sketch,
)
from tests.passage.test_oph import FIG2_S, FIG2_T, fig2

# -------------------------------------------------------------------- Example 4 (§4.1)
# d1 = <T,h,1,1,3,9>, d2 = <T,h,1,4,8,13> (non-empty), d3 = <T,h,2,6,10> (empty), kθ = 1.6:
# |C'| + θ|C'_E| = 1.8 = 1 + θ gives θ = 0.8 = 4/5 and k = 2. Integer weights: q = 5 for
# non-empty, p = 4 for empty, threshold k·p = 8. 0-based: subtract 1 from every position.
EX4: tuple[list[int], list[int], list[int], list[int], list[int]] = (
    [0, 3, 5],
    [2, 7, 9],
    [2, 7, 5],
    [8, 12, 9],
    [5, 5, 4],  # i_lo, i_hi, j_lo, j_hi, w
)


def test_example4_compact_alignment() -> None:
    # the paper's "[u3, u4]" is [u3, u4 − 1]: ([6, 8], [8, 10]) 1-based
    assert algorithm3(*EX4, 8) == [((5, 7), (7, 9))]


def test_example4_longest_only() -> None:
    got = scan_rectangles(*EX4, 8)
    # the longest subsequence of the compact alignment: T[6, 10] 1-based, [5, 10) half-open
    assert got == [(5, 10)]
    assert got == brute_scan_rectangles(*EX4, 8)
    # min_len 6 = the length of T[6,10] + 1: nothing left
    assert scan_rectangles(*EX4, 8, 6) == []
    assert scan_rectangles(*EX4, 8, 5) == [(5, 10)]


def test_example1_exact_jaccard_alignment() -> None:
    # Definition 1 with θ = 0.75 = 3/4: T1[3,6], T2[1,4], T3[4,7] (1-based)
    q = [8, 2, 9]
    assert exact_jaccard_alignment([7, 1, 2, 8, 5, 9, 7], q, 3, 4) == [(2, 6)]
    assert exact_jaccard_alignment([2, 9, 7, 8, 4, 6, 3], q, 3, 4) == [(0, 4)]
    assert exact_jaccard_alignment([6, 1, 1, 9, 5, 8, 2], q, 3, 4) == [(3, 7)]


def test_figure2_alignment() -> None:
    h, b = fig2(FIG2_T)
    w = compact_windows_binned(h, b, 10)
    s_mins, s_empty = oph_sketch_binned(*fig2(FIG2_S), 10)
    mask = collisions(w, s_mins, s_empty)
    # S matches T in bins 2, 3, 4, 9 (values 22, 53, 64, 39); S is empty in bins 5 and 7
    assert sorted(int(v) for v in w.value[mask & ~w.empty]) == [22, 39, 53, 64]
    assert sorted(
        (int(t) + 1, int(lo) + 1, int(r) + 1)
        for t, lo, r in zip(
            w.bin[mask & w.empty], w.l[mask & w.empty], w.r[mask & w.empty], strict=True
        )
    ) == [(5, 1, 15), (7, 1, 3), (7, 5, 15)]
    assert oph_counts(oph_sketch_binned(h, b, 10), (s_mins, s_empty)) == (4, 1)
    # the whole of T estimates 4/9 against S: it is the one longest near-duplicate at 4/9
    assert align_sketch(s_mins, s_empty, w, 10, (4, 9)) == [(0, 15)]
    for theta in [(1, 2), (3, 5), (1, 3), (1, 10)]:
        assert align_sketch(s_mins, s_empty, w, 10, theta) == brute_align(
            s_mins.tolist(), s_empty.tolist(), h.tolist(), b.tolist(), 10, *theta
        )


# ------------------------------------------------------------------- property tests


@st.composite
def rectangles(draw: st.DrawFn) -> dict:
    m = draw(st.integers(0, 8))
    dom = draw(st.integers(1, 14))
    rects = []
    for _ in range(m):
        a, b = sorted(draw(st.lists(st.integers(0, dom), min_size=2, max_size=2)))
        c, d = sorted(draw(st.lists(st.integers(0, dom), min_size=2, max_size=2)))
        rects.append((a, b, c, d, draw(st.integers(1, 5))))
    total = sum(r[4] for r in rects)
    return dict(
        i_lo=[r[0] for r in rects], i_hi=[r[1] for r in rects],
        j_lo=[r[2] for r in rects], j_hi=[r[3] for r in rects], w=[r[4] for r in rects],
        threshold=draw(st.integers(1, total + 2)), min_len=draw(st.integers(1, 5)),
    )  # fmt: skip


@settings(max_examples=800, deadline=None)
@given(rectangles())
def test_scan_equals_brute_force(r: dict) -> None:
    args = (r["i_lo"], r["i_hi"], r["j_lo"], r["j_hi"], r["w"], r["threshold"], r["min_len"])
    assert scan_rectangles(*args) == brute_scan_rectangles(*args)


@settings(max_examples=400, deadline=None)
@given(rectangles(), st.sampled_from([0, 3, 8]))
def test_scan_with_the_tree_equals_brute_force(r: dict, flat_cells: int) -> None:
    """The segment tree (more cells than ``flat_cells``) and the flat array of cell weights
    (few cells, the default for small inputs) each give the brute force's ranges."""
    args = (r["i_lo"], r["i_hi"], r["j_lo"], r["j_hi"], r["w"], r["threshold"], r["min_len"])
    assert scan_rectangles(*args, flat_cells=flat_cells) == brute_scan_rectangles(*args)


@settings(max_examples=150, deadline=None)
@given(rectangles())
def test_algorithm3_is_an_exact_partition(r: dict) -> None:
    """Theorem 3 on the oracle itself: compact alignments cover each near-duplicate cell once."""
    args = (r["i_lo"], r["i_hi"], r["j_lo"], r["j_hi"], r["w"])
    if not r["w"]:
        return
    seen: dict[tuple[int, int], int] = {}
    for (a, b), (c, d) in algorithm3(*args, r["threshold"]):
        for i in range(a, b + 1):
            for j in range(c, d + 1):
                seen[(i, j)] = seen.get((i, j), 0) + 1
    assert all(v == 1 for v in seen.values())
    hi = max(max(r["i_hi"]), max(r["j_hi"]))
    near = {
        (i, j)
        for i in range(hi + 1)
        for j in range(hi + 1)
        if cover_weights(*args, i, j) >= r["threshold"]
    }
    assert set(seen) == near


@st.composite
def text_and_query(draw: st.DrawFn) -> tuple:
    k = draw(st.integers(1, 4))
    n_vals = draw(st.integers(1, 6))
    vals = draw(st.lists(st.integers(0, 2**64 - 1), min_size=n_vals, max_size=n_vals))
    text = draw(st.lists(st.integers(0, n_vals - 1), min_size=1, max_size=9))
    if draw(st.booleans()) and len(text) > 1:  # a slice of the text, possibly edited
        a = draw(st.integers(0, len(text) - 1))
        b = draw(st.integers(a + 1, len(text)))
        query = text[a:b] + draw(st.lists(st.integers(0, n_vals - 1), max_size=2))
    else:
        query = draw(st.lists(st.integers(0, n_vals - 1), min_size=1, max_size=6))
    q = draw(st.integers(1, 6))
    p = draw(st.integers(1, q))

    def binned(toks: list[int]) -> tuple[np.ndarray, np.ndarray]:
        h = np.array([vals[t] for t in toks], dtype=np.uint64)
        return h, np.array([int(v) % 7 % k for v in h], dtype=np.int64)

    return binned(text), binned(query), k, (p, q), draw(st.integers(1, 4))


@settings(max_examples=500, deadline=None)
@given(text_and_query())
def test_oph_alignment_equals_brute_force(case: tuple) -> None:
    (th, tb), (qh, qb), k, theta, min_len = case
    mins, empty = oph_sketch_binned(qh, qb, k)
    w = compact_windows_binned(th, tb, k)
    got = align_sketch(mins, empty, w, k, theta, min_len)
    p, q = theta
    want = brute_align(mins.tolist(), empty.tolist(), th.tolist(), tb.tolist(), k, p, q, min_len)
    assert got == want
    # every reported range really estimates ≥ θ (checked on its own sketch)
    for s, e in got:
        sk = subsequence_sketch(th.tolist(), tb.tolist(), k, s, e - 1)
        n_emp = sum(1 for t in range(k) if sk[t][0] and empty[t])
        n_mat = sum(1 for t in range(k) if not sk[t][0] and not empty[t] and sk[t][1] == mins[t])
        assert theta[1] * n_mat + theta[0] * n_emp >= k * theta[0]
        assert e - s >= min_len


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(0, 30), min_size=5, max_size=60),
    st.data(),
    st.sampled_from([4, 16, 64]),
)
def test_copied_passage_is_found(text: list[int], data: st.DataObject, k: int) -> None:
    h = oph_values(np.array(text, dtype=np.uint64), 7)
    a = data.draw(st.integers(0, len(text) - 1))
    b = data.draw(st.integers(a + 1, len(text)))
    got = align(h[a:b], compact_windows(h, k), k, (9, 10))
    # an exact copy estimates 1 ≥ θ: some longest near-duplicate contains it
    assert any(s <= a and b <= e for s, e in got)
    # the ranges are longest-only: none contains another
    assert all(
        not (s1 <= s2 and e2 <= e1) for x, (s1, e1) in enumerate(got)
        for y, (s2, e2) in enumerate(got) if x != y
    )  # fmt: skip


def test_real_text_alignment_matches_brute_force() -> None:
    text = (
        "the quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat "
        "and the dog barks at the fox that runs into the brown woods near the old mill"
    )
    h = oph_values(token_hashes(text.split(" ")), 3)
    query = oph_values(
        token_hashes(["the", "lazy", "dog", "while", "a", "cat", "sleeps", "on", "a", "mat"]), 3
    )
    k = 8
    b = oph_bins(h, k)
    mins, empty = oph_sketch_binned(query, oph_bins(query, k), k)
    for theta in [(1, 2), (2, 3), (1, 4)]:
        got = align(query, compact_windows(h, k), k, theta, min_len=3)
        assert got == brute_align(mins.tolist(), empty.tolist(), h.tolist(), b.tolist(), k,
                                  *theta, 3)  # fmt: skip
    assert align(query, compact_windows(h, k), k, (1, 2), 3)  # the copied passage is there


def test_validation() -> None:
    with pytest.raises(ValueError):
        scan_rectangles([0], [1], [0], [1], [1], 0)
    with pytest.raises(ValueError):
        scan_rectangles([0], [1], [0], [1], [0], 1)
    with pytest.raises(ValueError):
        scan_rectangles([0], [1], [0], [1], [1], 1, min_len=0)
    w = compact_windows(oph_values(np.arange(5, dtype=np.uint64)), 4)
    with pytest.raises(ValueError):
        align(oph_values(np.arange(3, dtype=np.uint64)), w, 4, (0, 1))
    with pytest.raises(ValueError):
        align(oph_values(np.arange(3, dtype=np.uint64)), w, 4, (3, 2))


def test_empty_inputs() -> None:
    assert scan_rectangles([], [], [], [], [], 1) == []
    assert scan_rectangles([3], [1], [0], [5], [9], 1) == []  # i_lo > i_hi: ignored
    w = compact_windows(np.zeros(0, dtype=np.uint64), 4)
    assert len(w) == 0
    assert align(oph_values(np.arange(3, dtype=np.uint64)), w, 4, (1, 2)) == []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 300), st.integers(0, (1 << 63) - 1)), max_size=600))
def test_radix_sort_equals_sort(values: list[int]) -> None:
    """The interval ends' sort: any number of byte passes (odd and even), repeated keys."""
    keys = np.array(values, dtype=np.int64)
    radix_sort(keys, np.empty_like(keys))
    assert keys.tolist() == sorted(values)
