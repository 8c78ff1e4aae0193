"""OPH sketches and OPH compact windows (dupalign.passage.oph) against brute force and the paper."""

from __future__ import annotations

import csv
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.passage.oph import (
    compact_windows,
    compact_windows_binned,
    oph_bins,
    oph_counts,
    oph_estimate,
    oph_sketch,
    oph_sketch_binned,
    oph_values,
)
from dupalign.text.hashing import token_hashes
from tests.corpora import CLOUGH
from tests.oracles.oph import divide_conquer_windows, subsequence_sketch, windows_as_set

# ---------------------------------------------------------------- the paper's Figure 2

FIG2_T = [82, 59, 22, 57, 90, 39, 94, 42, 32, 64, 91, 48, 99, 73, 53]
FIG2_S = [90, 64, 39, 30, 66, 42, 22, 63, 28, 56, 91, 11, 96, 99, 53, 61, 88, 73, 31]
E = None  # the paper's empty min-hash
FIG2_SKETCH_T = [91, 22, 53, 64, E, E, 57, 48, 39, 90]
FIG2_SKETCH_S = [11, 22, 53, 64, E, 56, E, 28, 39, 30]


def residue_bins(h: list[int]) -> np.ndarray:
    """Figure 2's partition: Ω_t = {x mod 10 = t} for t = 1..9, Ω_10 = {x mod 10 = 0};
    0-based bin = t − 1."""
    r = np.asarray(h, dtype=np.int64) % 10
    return np.where(r == 0, 9, r - 1)


def as_paper(sk: tuple[np.ndarray, np.ndarray]) -> list[int | None]:
    mins, empty = sk
    return [None if e else int(v) for v, e in zip(mins, empty, strict=True)]


def fig2(h: list[int]) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(h, dtype=np.uint64), residue_bins(h)


def test_figure2_sketches_and_estimate() -> None:
    t = oph_sketch_binned(*fig2(FIG2_T), 10)
    s = oph_sketch_binned(*fig2(FIG2_S), 10)
    assert as_paper(t) == FIG2_SKETCH_T
    assert as_paper(s) == FIG2_SKETCH_S
    assert oph_counts(t, s) == (4, 1)  # N_mat = 4 (bins 2, 3, 4, 9), N_emp = 1 (bin 5)
    assert oph_estimate(t, s) == pytest.approx(4 / 9)
    assert min(FIG2_T) == 22 and min(FIG2_S) == 11  # h(T) and h(S) of Example 2


def windows_1based(h: list[int], t: int) -> tuple[set[tuple[int, int, int]], set[tuple[int, int]]]:
    """Non-empty (l, c, r) and empty (l, r) windows of 1-based paper bin t, 1-based."""
    w = compact_windows_binned(*fig2(h), 10)
    sel = w.bin == t - 1
    ne = {
        (lo + 1, c + 1, r + 1)
        for lo, c, r, e in zip(w.l[sel], w.c[sel], w.r[sel], w.empty[sel], strict=True)
        if not e
    }
    em = {(lo + 1, r + 1) for lo, r, e in zip(w.l[sel], w.r[sel], w.empty[sel], strict=True) if e}
    return ne, em


def test_example3_windows_of_bin9() -> None:
    # T^9 = (<0,∞>, <2,59>, <6,39>, <13,99>, <16,∞>)
    ne, em = windows_1based(FIG2_T, 9)
    assert ne == {(1, 6, 15), (1, 2, 5), (7, 13, 15)}
    # adjacent-pair gaps: (0,2) → [1,1], (2,6) → [3,5], (6,13) → [7,12], (13,16) → [14,15]
    assert em == {(1, 1), (3, 5), (7, 12), (14, 15)}


def test_section3_examples() -> None:
    h, b = fig2(FIG2_T)
    w = compact_windows_binned(h, b, 10)
    rows = list(zip(w.bin, w.empty, w.value, w.l, w.c, w.r, strict=True))

    def covering(t: int, i: int, j: int) -> list[tuple[bool, int]]:
        """Windows of paper bin t covering 1-based T[i, j]."""
        i0, j0 = i - 1, j - 1
        return [
            (bool(e), int(v))
            for bb, e, v, lo, c, r in rows
            if bb == t - 1 and (lo <= i0 <= j0 <= r if e else lo <= i0 <= c <= j0 <= r)
        ]

    # §3: h(T[10,13], 8) = h(T[11,13], 8) = h(T[12]) = 48
    assert covering(8, 10, 13) == covering(8, 11, 13) == [(False, 48)]
    # §3.1: T[7,10] and T[8,12] are empty in Ω_9 (window <T,h,9,7,12>)
    assert covering(9, 7, 10) == covering(9, 8, 12) == [(True, 0)]
    # §3.2: h(T[10,14], 9) = h(T[12,15], 9) = 99; <T,h,9,1,6,15> gives 39 to T[4,7], T[5,8]
    assert covering(9, 10, 14) == covering(9, 12, 15) == [(False, 99)]
    assert covering(9, 4, 7) == covering(9, 5, 8) == [(False, 39)]


def test_bin_with_no_token_gives_one_empty_window() -> None:
    # Figure 2: Ω_5 holds no value of T
    ne, em = windows_1based(FIG2_T, 5)
    assert ne == set() and em == {(1, 15)}


def test_adjacent_tokens_give_no_empty_window() -> None:
    h = np.array([5, 7, 9, 1], dtype=np.uint64)
    b = np.array([0, 0, 1, 0])
    w = compact_windows_binned(h, b, 2)
    em = {
        (int(t), int(lo), int(r)) for t, lo, r, e in zip(w.bin, w.l, w.r, w.empty, strict=True) if e
    }
    assert em == {(0, 2, 2), (1, 0, 1), (1, 3, 3)}


# ------------------------------------------------------------- property tests vs brute force


@st.composite
def binned_texts(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int]:
    """Small texts over a small alphabet: tokens repeat (ties), values of distinct tokens
    may collide too; the bin is a function of the value."""
    k = draw(st.integers(1, 5))
    n = draw(st.integers(0, 11))
    n_vals = draw(st.integers(1, 6))
    vals = draw(st.lists(st.integers(0, 2**64 - 1), min_size=n_vals, max_size=n_vals))
    toks = draw(st.lists(st.integers(0, n_vals - 1), min_size=n, max_size=n))
    salt = draw(st.integers(0, 1000))
    h = np.array([vals[t] for t in toks], dtype=np.uint64)
    b = np.array([(int(v) * 2654435761 + salt) % 2**61 % k for v in h], dtype=np.int64)
    return h, b, k


def check_exact_cover(h: np.ndarray, b: np.ndarray, k: int) -> None:
    w = compact_windows_binned(h, b, k)
    n = len(h)
    used = np.zeros(len(w), dtype=bool)
    for i in range(n):
        for j in range(i, n):
            sk = subsequence_sketch(h.tolist(), b.tolist(), k, i, j)
            for t in range(k):
                cover = np.flatnonzero(
                    (w.bin == t)
                    & np.where(
                        w.empty,
                        (w.l <= i) & (j <= w.r),
                        (w.l <= i) & (i <= w.c) & (w.c <= j) & (j <= w.r),
                    )
                )
                assert len(cover) == 1, (i, j, t, cover)
                x = cover[0]
                empty, value, argpos = sk[t]
                assert bool(w.empty[x]) == empty
                if not empty:
                    assert int(w.value[x]) == value
                    assert int(w.c[x]) == argpos  # ties by position: the leftmost minimum
                used[x] = True
    assert used.all()  # every window represents at least one subsequence


@settings(max_examples=400, deadline=None)
@given(binned_texts())
def test_windows_represent_every_minhash_exactly_once(text: tuple) -> None:
    check_exact_cover(*text)


@settings(max_examples=300, deadline=None)
@given(binned_texts())
def test_windows_equal_paper_divide_and_conquer(text: tuple) -> None:
    h, b, k = text
    got = windows_as_set(compact_windows_binned(h, b, k))
    assert got == divide_conquer_windows(h.tolist(), b.tolist(), k)
    w = compact_windows_binned(h, b, k)
    assert len(got) == len(w)  # no duplicate rows
    n = len(h)
    assert int((~w.empty).sum()) == n  # Lemma 6: one non-empty window per position
    if n:
        assert int(w.empty.sum()) <= n + k - 2  # Lemma 3
    else:
        assert len(w) == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 5), max_size=10),
    st.integers(1, 8),
    st.integers(0, 2**32),
)
def test_public_pipeline_exact_cover(toks: list[int], k: int, salt: int) -> None:
    h = oph_values(np.array(toks, dtype=np.uint64), salt)
    check_exact_cover(h, oph_bins(h, k), k)
    w = compact_windows(h, k)
    assert windows_as_set(w) == windows_as_set(compact_windows_binned(h, oph_bins(h, k), k))


@settings(max_examples=200, deadline=None)
@given(binned_texts())
def test_sketch_equals_brute_force(text: tuple) -> None:
    h, b, k = text
    mins, empty = oph_sketch_binned(h, b, k)
    if len(h) == 0:
        assert empty.all()
        return
    sk = subsequence_sketch(h.tolist(), b.tolist(), k, 0, len(h) - 1)
    assert empty.tolist() == [e for e, _, _ in sk]
    assert [int(v) for v, e in zip(mins, empty, strict=True) if not e] == [
        v for e, v, _ in sk if not e
    ]


def test_equal_tokens_share_a_value() -> None:
    th = token_hashes(["a", "b", "a", "c", "b"])
    h = oph_values(th)
    assert h[0] == h[2] and h[1] == h[4] and len(set(h.tolist())) == 3


# ------------------------------------------------------------------------------ bins


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=20), st.integers(1, 2**31))
def test_bins_are_contiguous_even_ranges(vals: list[int], k: int) -> None:
    got = oph_bins(np.array(vals, dtype=np.uint64), k).tolist()
    assert got == [v * k >> 64 for v in vals]


@pytest.mark.parametrize("k", [1, 3, 10, 64, 100, 2**31])
def test_bin_boundaries(k: int) -> None:
    # bin t starts at ceil(t·2^64/k): the value there is in t, the one before in t − 1
    ts = sorted({t for t in (1, k // 2, k - 1) if 1 <= t < k})
    starts = [-(-t * 2**64 // k) for t in ts]
    h = np.array(starts + [s - 1 for s in starts] + [0, 2**64 - 1], dtype=np.uint64)
    got = oph_bins(h, k).tolist()
    m = len(ts)
    assert got[:m] == ts
    assert got[m : 2 * m] == [t - 1 for t in ts]
    assert got[-2:] == [0, k - 1]
    sizes = [-(-(t + 1) * 2**64 // k) - -(-t * 2**64 // k) for t in range(min(k, 50))]
    assert max(sizes) - min(sizes) <= 1  # even partition


def test_bad_k_and_bins() -> None:
    with pytest.raises(ValueError):
        oph_bins(np.zeros(3, dtype=np.uint64), 0)
    with pytest.raises(ValueError):
        compact_windows_binned(np.zeros(2, dtype=np.uint64), np.array([0, 3]), 3)


# -------------------------------------------------- estimator vs exact Jaccard on real text


def clough_tokens(name: str) -> list[str]:
    raw = (CLOUGH / name).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")
    return re.findall(r"\w+", text.casefold())


def clough_pairs() -> list[tuple[list[str], list[str]]]:
    with (CLOUGH / "file_information.csv").open() as f:
        rows = list(csv.DictReader(f))
    pairs = []
    for cat in ("cut", "light", "heavy", "non"):
        for row in [r for r in rows if r["Category"] == cat][:3]:
            pairs.append((clough_tokens(row["File"]), clough_tokens(f"orig_task{row['Task']}.txt")))
    return pairs


@pytest.mark.testdata
def test_estimator_is_unbiased_on_clough() -> None:
    k, n_salts = 64, 200
    for a, b in clough_pairs():
        exact = len(set(a) & set(b)) / len(set(a) | set(b))
        ta, tb = token_hashes(a), token_hashes(b)
        ests = []
        for salt in range(n_salts):
            sa = oph_sketch(oph_values(ta, salt), k)
            ests.append(oph_estimate(sa, oph_sketch(oph_values(tb, salt), k)))
        e = np.array(ests)
        # one estimate has sd ≈ sqrt(J(1-J)/k) ≤ 0.0625; the mean of 200 is within ~0.0044 sd
        assert abs(e.mean() - exact) < 0.02, (exact, e.mean())
        assert np.sqrt(((e - exact) ** 2).mean()) < 0.08  # measured ≤ 0.06
