"""MonoActive compact windows: the paper's worked examples and brute-force property tests."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.passage import monoactive as M
from dupalign.passage import monoactive_query as Q
from tests.oracles import monoactive as O

# --- the paper's running example (Figure 1): T = ABABAABBCC with an explicit h(t, x) ---------

CODE = {"A": 1, "B": 2, "C": 3}
RUNNING = [CODE[ch] for ch in "ABABAABBCC"]
H = {"A": [2, 5, 8, 12], "B": [9, 4, 16, 1], "C": [3, 6]}
TABLE = {(CODE[t], x): v for t, vs in H.items() for x, v in enumerate(vs, 1)}


def _running() -> tuple[M.Layout, M.EntryHashes]:
    lay = M.layout(np.array(RUNNING, dtype=np.uint64))
    # layout orders tokens by hash (A, B, C), entries by x: exactly the table's order
    vals = np.array(H["A"] + H["B"] + H["C"], dtype=np.uint64)
    return lay, M.entries_from_values(lay, vals)


def _rows(w: M.Windows) -> list[tuple[int, int, int, int, int]]:
    return [
        (int(w.key[r]), int(w.a[r]), int(w.b[r]), int(w.c[r]), int(w.d[r])) for r in range(len(w))
    ]


def one_based(rows: list[tuple[int, int, int, int, int]]) -> set[tuple[int, ...]]:
    return {(v, a + 1, b + 1, c + 1, d + 1) for v, a, b, c, d in rows}


def test_example_1_multiset_jaccard() -> None:
    assert O.multiset_jaccard("ABBC", "BCD") == Fraction(2, 5)


def test_example_3_alignment_with_exact_similarity() -> None:
    q = "ACE"
    found = {
        (name, i + 1, j + 1)
        for name, text in (("T", "ABBCDE"), ("S", "BCCDEF"))
        for i in range(len(text))
        for j in range(i, len(text))
        if O.multiset_jaccard(q, text[i : j + 1]) >= Fraction(1, 2)
    }
    assert found == {("T", 1, 6), ("T", 4, 6), ("S", 3, 5)}
    assert O.multiset_jaccard(q, "CCDE") == Fraction(2, 5)


def test_running_example_minhashes_and_keys() -> None:
    val = O.table_value(TABLE)
    mh = O.all_minhashes(RUNNING, val)
    assert mh[(0, 9)] == 1  # Example 2: h(T) = h(B, 4) = 1
    assert mh[(2, 5)] == 2  # Example 6: H(T[3, 6]) = {2, 5, 8, 9}
    assert mh[(0, 2)] == 2  # Example 8
    keys = O.all_keys(RUNNING, val)
    assert len(keys) == 23  # Example 7
    assert (0, 2, 2) in keys and TABLE[(CODE["A"], 2)] == 5  # h(T, 1, 3) = h(A, 2) = 5
    # Example 4: both rectangles are compact windows
    assert all(mh[(i, j)] == 1 for i in range(0, 2) for j in range(7, 10))
    assert all(mh[(i, j)] == 2 for i in range(3, 5) for j in range(4, 10))


def test_running_example_active_keys() -> None:
    lay, eh = _running()
    p, q, _ = M.active_keys(lay, eh)
    assert len(p) == 14  # Figure 1(e)
    assert set(zip((p + 1).tolist(), (q + 1).tolist(), strict=True)) == {
        (a + 1, b + 1) for a, b in O.active_keys(RUNNING, O.table_value(TABLE))
    }
    # Example 9: the first 8 keys in visiting order (value 2 and value 3 keys in any order)
    first = list(zip((p[:8] + 1).tolist(), (q[:8] + 1).tolist(), strict=True))
    assert first[0] == (2, 8)
    assert set(first[1:5]) == {(1, 1), (3, 3), (5, 5), (6, 6)}
    assert set(first[5:7]) == {(9, 9), (10, 10)}
    assert first[7] in {(2, 4), (4, 7), (7, 8)}  # value 4 keys


def test_running_example_partition() -> None:
    lay, eh = _running()
    rows = _rows(M.monotonic_partition(lay, eh))
    assert len(rows) == 13  # Example 9 / Figure 1(b)
    got = one_based(rows)
    assert (1, 1, 2, 8, 10) in got  # Example 4
    assert {(2, 2, 3, 3, 7), (2, 3, 3, 8, 10)} <= got  # Example 10
    assert O.partition_problems(rows, 10, O.all_minhashes(RUNNING, O.table_value(TABLE))) == []
    assert sorted(rows) == sorted(O.mono_all(RUNNING, O.table_value(TABLE)))


# --- property tests against brute force --------------------------------------------------------

POOL = [3, 0x9E3779B97F4A7C15, 12345678901234567, 42, 2**63 + 5]
seqs = st.lists(st.sampled_from(POOL[:4]) | st.sampled_from(POOL), min_size=1, max_size=20)
small_alpha = st.integers(1, 4).flatmap(
    lambda a: st.lists(st.sampled_from(POOL[:a]), min_size=1, max_size=20)
)
texts = small_alpha | seqs
TF_MODES: list[M.TfMode] = ["raw", "log", "binary", "sqrt", "squared"]
idfs = st.dictionaries(st.sampled_from(POOL), st.sampled_from([0.1, 0.5, 1.0, 2.5, 7.0]))


def _fast(
    seq: list[int], mode: str, fn: int, tf: M.TfMode = "raw", idf: dict[int, float] | None = None
) -> tuple[M.Layout, M.EntryHashes]:
    lay = M.layout(np.array(seq, dtype=np.uint64))
    if mode == "multiset":
        return lay, M.multiset_entries(lay, fn)
    return lay, M.weighted_entries(lay, M.entry_weights(lay, tf, idf), fn)


@settings(max_examples=150, deadline=None)
@given(texts, st.integers(0, 200))
def test_multiset_active_keys_and_partition(seq: list[int], fn: int) -> None:
    val = O.multiset_value(fn)
    lay, eh = _fast(seq, "multiset", fn)
    p, q, _ = M.active_keys(lay, eh)
    pairs = list(zip(p.tolist(), q.tolist(), strict=True))
    assert len(pairs) == len(set(pairs))
    assert set(pairs) == O.active_keys(seq, val)
    rows = _rows(M.monotonic_partition(lay, eh, fn))
    assert len(rows) <= 2 * len(pairs)  # Lemma 10
    assert O.partition_problems(rows, len(seq), O.all_minhashes(seq, val)) == []
    # the active-key optimization does not change the partition (§6.1)
    assert sorted(rows) == sorted(O.mono_all(seq, val))


@settings(max_examples=150, deadline=None)
@given(texts, st.integers(0, 200), st.sampled_from(TF_MODES), idfs)
def test_weighted_active_keys_and_partition(
    seq: list[int], fn: int, tf: M.TfMode, idf: dict[int, float]
) -> None:
    val = O.weighted_value(fn, tf, idf)
    lay, eh = _fast(seq, "weighted", fn, tf, idf)
    # Lemma 12: h(t, 1) >= h(t, 2) >= ... in the total order
    for t in set(seq):
        orders = [val(t, x)[0] for x in range(1, seq.count(t) + 1)]
        assert orders == sorted(orders, reverse=True)
    p, q, _ = M.active_keys(lay, eh)
    assert set(zip(p.tolist(), q.tolist(), strict=True)) == O.active_keys(seq, val)
    rows = _rows(M.monotonic_partition(lay, eh, fn))
    mh = O.all_minhashes(seq, val, weighted=True)
    assert O.partition_problems(rows, len(seq), mh) == []
    # vanilla Algorithm 4 with frequency-descending ties is a partition too
    assert O.partition_problems(O.mono_all(seq, val), len(seq), mh) == []


@settings(max_examples=60, deadline=None)
@given(texts, st.integers(1, 4), st.sampled_from(["multiset", "weighted"]),
       st.sampled_from(TF_MODES), idfs)  # fmt: skip
def test_compact_windows_all_functions(
    seq: list[int], k: int, mode: str, tf: M.TfMode, idf: dict[int, float]
) -> None:
    # idf as a callable here (a Mapping elsewhere)
    w = M.compact_windows(np.array(seq, dtype=np.uint64), k, mode, tf, M.idf_lookup(idf))  # type: ignore[arg-type]
    assert sorted(set(w.fn.tolist())) == list(range(k))
    for fn in range(k):
        val = O.weighted_value(fn, tf, idf) if mode == "weighted" else O.multiset_value(fn)
        mh = O.all_minhashes(seq, val, weighted=mode == "weighted")
        assert O.partition_problems(_rows(w.select(w.fn == fn)), len(seq), mh) == []


@settings(max_examples=100, deadline=None)
@given(texts, st.integers(1, 6), st.sampled_from(["multiset", "weighted"]),
       st.sampled_from(TF_MODES), idfs)  # fmt: skip
def test_query_minhashes(
    seq: list[int], k: int, mode: str, tf: M.TfMode, idf: dict[int, float]
) -> None:
    got = Q.query_minhashes(np.array(seq, dtype=np.uint64), k, mode, tf, idf)  # type: ignore[arg-type]
    for fn in range(k):
        if mode == "weighted":
            assert int(got[fn]) == O.minhash_weighted(seq, O.weighted_value(fn, tf, idf))
        else:
            assert int(got[fn]) == O.minhash_multiset(seq, O.multiset_value(fn))


@settings(max_examples=100, deadline=None)
@given(texts, st.data(), st.integers(1, 4), st.sampled_from(["multiset", "weighted"]),
       st.sampled_from(TF_MODES), idfs)  # fmt: skip
def test_query_minhashes_of_many_ranges_at_once(
    seq: list[int], data: st.DataObject, k: int, mode: str, tf: M.TfMode,
    idf: dict[int, float],
) -> None:
    """A page's passages sketched in one pass: each range's keys are its own brute-force
    min-hashes (ranges overlap, repeat and differ in length)."""
    ranges = data.draw(st.lists(st.tuples(st.integers(0, len(seq) - 1), st.integers(1, len(seq)))
                                .map(lambda r: (min(r[0], r[1] - 1), r[1])), max_size=6))
    starts = np.array([a for a, _ in ranges], dtype=np.int64)
    ends = np.array([b for _, b in ranges], dtype=np.int64)
    got = Q.query_minhashes_many(np.array(seq, dtype=np.uint64), starts, ends, k, mode, tf, idf)  # type: ignore[arg-type]
    assert got.shape == (len(ranges), k)
    for p, (a, b) in enumerate(ranges):
        for fn in range(k):
            if mode == "weighted":
                want = O.minhash_weighted(seq[a:b], O.weighted_value(fn, tf, idf))
            else:
                want = O.minhash_multiset(seq[a:b], O.multiset_value(fn))
            assert int(got[p, fn]) == want


thetas = st.tuples(st.integers(1, 6), st.integers(1, 6)).filter(lambda t: t[0] <= t[1])


@settings(max_examples=120, deadline=None)
@given(small_alpha, texts, st.integers(1, 6), thetas, st.integers(1, 3),
       st.sampled_from(["multiset", "weighted"]), st.sampled_from(TF_MODES), idfs)  # fmt: skip
def test_align_matches_brute_force(
    query: list[int], text: list[int], k: int, theta: tuple[int, int], min_len: int,
    mode: str, tf: M.TfMode, idf: dict[int, float],
) -> None:  # fmt: skip
    query = query[:6]
    weighted = mode == "weighted"
    got = Q.align_weighted(
        np.array(query, dtype=np.uint64), np.array(text, dtype=np.uint64), k, theta,
        mode, tf, idf, min_len,  # type: ignore[arg-type]
    )  # fmt: skip
    values = [
        O.weighted_value(fn, tf, idf) if weighted else O.multiset_value(fn) for fn in range(k)
    ]
    assert got == O.brute_align(query, text, values, theta, weighted, min_len)


@settings(max_examples=60, deadline=None)
@given(small_alpha, texts, st.integers(2, 8), st.integers(1, 8), st.integers(1, 3))
def test_plane_sweep_of_colliding_windows(
    query: list[int], text: list[int], k: int, need: int, min_len: int
) -> None:
    w = M.compact_windows(np.array(text, dtype=np.uint64), k)
    hit = Q.colliding(w, Q.query_minhashes(np.array(query, dtype=np.uint64), k))
    rects = list(zip(hit.a.tolist(), hit.b.tolist(), hit.c.tolist(), hit.d.tolist(), strict=True))
    expect = O.brute_scan(rects, need, min_len)
    got = Q._scan(hit, need, min_len) if len(hit) >= need else []
    assert got == expect


# --- units --------------------------------------------------------------------------------------


def test_threshold_count_is_exact() -> None:
    assert Q.threshold_count(10, (3, 10)) == 3
    assert Q.threshold_count(64, (1, 3)) == 22
    assert Q.threshold_count(5, (1, 1)) == 5
    with pytest.raises(ValueError):
        Q.threshold_count(8, (0, 1))
    with pytest.raises(ValueError):
        Q.threshold_count(8, (3, 2))


def test_tf_weights() -> None:
    tf = np.array([1, 2, 4])
    assert M.tf_weights(tf, "raw").tolist() == [1.0, 2.0, 4.0]
    assert M.tf_weights(tf, "binary").tolist() == [1.0, 1.0, 1.0]
    assert M.tf_weights(tf, "squared").tolist() == [1.0, 4.0, 16.0]
    assert np.allclose(M.tf_weights(tf, "log"), 1 + np.log([1, 2, 4]))


def test_non_monotone_tf_is_rejected() -> None:
    lay = M.layout(np.array([1, 1, 2], dtype=np.uint64))
    with pytest.raises(ValueError, match="non-decreasing"):
        M.entry_weights(lay, lambda x: 1.0 / x)
    with pytest.raises(ValueError):
        M.entry_weights(lay, "raw", {1: -1.0})


def test_custom_tf_function_is_a_partition() -> None:
    seq = [1, 2, 1, 1, 3, 1, 2, 1, 1, 2]
    lay = M.layout(np.array(seq, dtype=np.uint64))
    step = lambda x: np.minimum(x, 3).astype(np.float64)  # noqa: E731 - capped tf
    eh = M.weighted_entries(lay, M.entry_weights(lay, step), fn=7)
    val = O.weighted_value(7, "raw")
    capped = lambda t, x: val(t, min(x, 3))  # noqa: E731
    mh = O.all_minhashes(seq, capped, weighted=True)
    assert O.partition_problems(_rows(M.monotonic_partition(lay, eh, 7)), len(seq), mh) == []


def test_icws_estimates_weighted_jaccard() -> None:
    """The ICWS samples behave as standard ICWS: collision rate ≈ weighted Jaccard."""
    a = {1: 3.0, 2: 1.0, 3: 0.5, 4: 2.0}
    b = {1: 1.0, 2: 1.0, 3: 2.5, 5: 1.5}
    k = 4000

    def sketch(ws: dict[int, float]) -> list[int]:
        th = np.array(list(ws), dtype=np.uint64)
        w = np.array(list(ws.values()))
        out = []
        for fn in range(k):
            ln_a, z, key = M.icws_hash(th, w, fn)
            out.append(int(key[np.lexsort((th, -z, ln_a))[0]]))
        return out

    est = np.mean(np.array(sketch(a)) == np.array(sketch(b)))
    assert abs(est - O.weighted_jaccard(a, b)) < 0.03  # 4 sigma at k = 4000


def test_multiset_hash_estimates_multiset_jaccard() -> None:
    s, t = [1, 1, 1, 2, 3, 3], [1, 2, 2, 3, 4]
    k = 4000
    qs = Q.query_minhashes(np.array(s, dtype=np.uint64), k)
    qt = Q.query_minhashes(np.array(t, dtype=np.uint64), k)
    assert abs(np.mean(qs == qt) - float(O.multiset_jaccard(s, t))) < 0.03


def test_identical_query_finds_whole_text() -> None:
    rng = np.random.default_rng(5)
    text = rng.integers(0, 30, 200).astype(np.uint64)
    q = text[60:110]
    modes: list[M.Mode] = ["multiset", "weighted"]
    for mode in modes:
        got = Q.align_weighted(q, text, 16, (1, 1), mode, "log")
        assert (60, 110) in got or any(s <= 60 and e >= 110 for s, e in got)


def test_tied_values_are_not_active() -> None:
    """Definition 12 is strict: a value equal to an earlier one of its token is not active."""
    seq = [1, 2, 1, 1, 2, 1]
    table = {(1, 1): 5, (1, 2): 5, (1, 3): 3, (1, 4): 3, (2, 1): 4, (2, 2): 9}
    lay = M.layout(np.array(seq, dtype=np.uint64))
    eh = M.entries_from_values(lay, np.array([5, 5, 3, 3, 4, 9], dtype=np.uint64))
    p, q, _ = M.active_keys(lay, eh)
    val = O.table_value(table)
    assert set(zip(p.tolist(), q.tolist(), strict=True)) == O.active_keys(seq, val)
    assert len(p) == 4 + 2 + 2  # (1,1): 4 keys, (1,3): 2 keys, (2,1): 2 keys
    rows = _rows(M.monotonic_partition(lay, eh))
    assert O.partition_problems(rows, len(seq), O.all_minhashes(seq, val)) == []
