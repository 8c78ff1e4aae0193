"""Versioned idf: builder against a dict twin, freezing, bytes round trip, tf × idf weights."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.near.idf import (
    UNIFORM_IDF,
    IdfBuilder,
    IdfTable,
    TfMode,
    _tf,
    counted_weights,
    smoothed_idf,
    tf_idf_weights,
    tf_table,
    weights_by_directory,
    weights_into,
)

# small hash alphabet so that documents share tokens; one huge value for the uint64 edge
token = st.integers(min_value=0, max_value=30) | st.just(2**64 - 1)
docs_st = st.lists(st.lists(token, max_size=12), max_size=25)


def df_twin(docs: list[list[int]]) -> Counter[int]:
    df: Counter[int] = Counter()
    for d in docs:
        df.update(set(d))
    return df


def _arr(d: list[int]) -> np.ndarray:
    return np.array(d, dtype=np.uint64)


@settings(max_examples=150, deadline=None)
@given(docs_st, st.integers(min_value=1, max_value=20))
def test_builder_counts_match_twin(docs: list[list[int]], buffer_entries: int) -> None:
    b = IdfBuilder(max_terms=None, buffer_entries=buffer_entries)
    b.add_documents(_arr(d) for d in docs)
    twin = df_twin(docs)
    probe = sorted(set(twin) | {31, 12345})
    assert b.df(_arr(probe)).tolist() == [twin.get(t, 0) for t in probe]
    assert b.n_docs == len(docs) and len(b) == len(twin)
    t = b.freeze(version=3)
    assert t.version == 3 and t.n_docs == len(docs) and len(t) == len(twin)
    n = len(docs)
    expect = [np.float32(math.log((n + 1) / (twin.get(x, 0) + 1)) + 1) for x in probe]
    assert t.idf(_arr(probe)).tolist() == [float(v) for v in expect]
    # unknown tokens get the idf of df = 0, the largest value
    assert t.default_idf == float(np.float32(math.log(n + 1) + 1))
    assert all(v <= t.default_idf for v in t.values.tolist())


@settings(max_examples=80, deadline=None)
@given(docs_st, st.integers(min_value=1, max_value=20), st.randoms(use_true_random=False))
def test_frozen_table_is_deterministic_and_order_free(
    docs: list[list[int]], buffer_entries: int, rnd
) -> None:
    a = IdfBuilder(max_terms=None)
    a.add_documents(_arr(d) for d in docs)
    shuffled = list(docs)
    rnd.shuffle(shuffled)
    b = IdfBuilder(max_terms=None, buffer_entries=buffer_entries)
    b.add_documents(_arr(d) for d in shuffled)
    ta, tb = a.freeze(1), b.freeze(1)
    assert ta == tb and ta.to_bytes() == tb.to_bytes() and ta.digest() == tb.digest()


@settings(max_examples=80, deadline=None)
@given(docs_st)
def test_round_trip(docs: list[list[int]]) -> None:
    b = IdfBuilder()
    b.add_documents(_arr(d) for d in docs)
    t = b.freeze(7)
    data = t.to_bytes()
    back = IdfTable.from_bytes(data)
    assert back == t and back.version == 7 and back.n_docs == len(docs)
    probe = _arr(list(range(40)))
    assert back.idf(probe).tolist() == t.idf(probe).tolist()  # bit-identical weights
    # compact: 8-byte key + 4-byte value per token, plus a small header
    assert len(data) <= 12 * len(t) + 160


def test_uniform_cold_start_table() -> None:
    assert UNIFORM_IDF.version == 0 and UNIFORM_IDF.n_docs == 0 and len(UNIFORM_IDF) == 0
    h = np.array([0, 1, 2**64 - 1], dtype=np.uint64)
    assert UNIFORM_IDF.idf(h).tolist() == [1.0, 1.0, 1.0]
    assert IdfTable.from_bytes(UNIFORM_IDF.to_bytes()) == UNIFORM_IDF
    assert UNIFORM_IDF.idf(np.array([], dtype=np.uint64)).shape == (0,)


def test_rejects_bad_input() -> None:
    b = IdfBuilder()
    with pytest.raises(ValueError):
        b.freeze(0)
    with pytest.raises(ValueError):
        IdfTable.from_bytes(b.to_bytes())  # a builder checkpoint is not a table
    with pytest.raises(ValueError):
        IdfTable(1, 1, np.array([2, 1], dtype=np.uint64), np.ones(2, np.float32), 1.0)
    with pytest.raises(ValueError):
        tf_idf_weights(np.array([1], dtype=np.uint64), UNIFORM_IDF, "bogus")  # type: ignore[arg-type]


def test_min_df_drops_rare_tokens() -> None:
    b = IdfBuilder()
    b.add_documents([_arr([1, 2]), _arr([1, 3]), _arr([1])])
    t = b.freeze(1, min_df=2)
    assert t.keys.tolist() == [1]
    idf = t.idf(_arr([1, 2, 99]))
    assert idf[0] == pytest.approx(math.log(4 / 4) + 1, rel=1e-6)
    assert idf[1] == idf[2] == t.default_idf == pytest.approx(math.log(4) + 1, rel=1e-6)


@settings(max_examples=80, deadline=None)
@given(docs_st, st.integers(min_value=1, max_value=6), st.integers(min_value=1, max_value=8))
def test_pruning_bounds_memory_and_error(
    docs: list[list[int]], max_terms: int, buffer_entries: int
) -> None:
    b = IdfBuilder(max_terms=max_terms, buffer_entries=buffer_entries)
    for d in docs:
        b.add_document(_arr(d))
        # the bound holds after every merge; the buffer is at most buffer_entries more
        assert b._keys.size <= max_terms
    twin = df_twin(docs)
    probe = sorted(twin)
    got = b.df(_arr(probe)).tolist()
    for x, g in zip(probe, got, strict=True):
        assert twin[x] - b.max_undercount <= g <= twin[x]


def test_builder_checkpoint_resumes_exactly() -> None:
    rng = np.random.default_rng(1)
    docs = [rng.integers(0, 500, size=rng.integers(0, 60)).astype(np.uint64) for _ in range(300)]
    whole = IdfBuilder(max_terms=None, buffer_entries=64)
    whole.add_documents(docs)
    first = IdfBuilder(max_terms=None, buffer_entries=64)
    first.add_documents(docs[:120])
    resumed = IdfBuilder.from_bytes(first.to_bytes(), buffer_entries=64)
    resumed.add_documents(docs[120:])
    assert resumed.freeze(2) == whole.freeze(2)


@settings(max_examples=100, deadline=None)
@given(st.lists(token, max_size=40), st.sampled_from(["log", "raw", "binary", "sqrt"]))
def test_tf_idf_weights_match_twin(doc: list[int], mode: str) -> None:
    b = IdfBuilder()
    b.add_documents([_arr(doc), _arr(doc[::2]), _arr([1, 2, 3])])
    t = b.freeze(1)
    uniq, w = tf_idf_weights(_arr(doc), t, mode)  # type: ignore[arg-type]
    counts = Counter(doc)
    tf = {
        "log": lambda c: 1 + math.log(c),
        "raw": float,
        "binary": lambda c: 1.0,
        "sqrt": math.sqrt,
    }[mode]
    assert uniq.tolist() == sorted(counts)
    for h, wi in zip(uniq.tolist(), w.tolist(), strict=True):
        assert wi == pytest.approx(tf(counts[h]) * float(t.idf(_arr([h]))[0]), rel=1e-12)
    if doc:
        _, wn = tf_idf_weights(_arr(doc), t, mode, normalize=True)  # type: ignore[arg-type]
        assert math.fsum(wn.tolist()) == pytest.approx(1.0, rel=1e-12)
        assert np.allclose(wn, w / w.sum())


def test_smoothed_idf_formula() -> None:
    assert smoothed_idf(9, [0, 9]).tolist() == [math.log(10) + 1, 1.0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=50), st.lists(st.integers(0, 40), max_size=30),
       st.lists(st.sampled_from([1, 2, 3, 7, 4096, 4097, 10**6]), min_size=50, max_size=50),
       st.sampled_from(["log", "raw", "binary", "sqrt"]))
def test_counted_weights_are_tf_times_idf(tokens: list[int], known: list[int],
                                          counts: list[int], mode: TfMode) -> None:
    """The kernel (a tf table, a binary search per token) against the numpy twin, bit for
    bit, counts past the table included."""
    uniq = np.unique(np.array(tokens, dtype=np.uint64))
    keys = np.unique(np.array(known, dtype=np.uint64))
    table = IdfTable(2, 9, keys, (keys.astype(np.float32) + 0.5) / 3, 0.7)
    c = np.array(counts[:uniq.size], dtype=np.int64)
    twin = _tf(c, mode) * table.idf(uniq)
    assert counted_weights(uniq, c, table, mode).tobytes() == twin.tobytes()
    assert counted_weights(uniq, c, IdfTable.uniform(), mode).tobytes() == (
        _tf(c, mode) * IdfTable.uniform().idf(uniq)).tobytes()


# token hashes spread over the whole range (the directory buckets them by their top bits),
# with neighbours, the extremes and a crowded bucket
spread = st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**64 - 2,
                                                       2**64 - 1]) | st.integers(0, 64)


@settings(max_examples=300, deadline=None)
@given(st.lists(spread, max_size=200), st.lists(spread, max_size=60), st.data(),
       st.sampled_from(["log", "raw", "binary", "sqrt"]))
def test_weights_by_directory_are_weights_into(known: list[int], others: list[int],
                                               data: st.DataObject, mode: TfMode) -> None:
    """The near kernel's lookup through ``IdfTable.directory`` against the binary search
    (``weights_into``), bit for bit: known tokens, unknown ones, an empty table, counts past
    the tf table (both say not weighted)."""
    keys = np.unique(np.array(known, dtype=np.uint64))
    table = IdfTable(2, 9, keys, (np.arange(keys.size, dtype=np.float32) + 0.5) / 3, 0.7)
    picked = data.draw(st.lists(st.sampled_from(known), max_size=60)) if known else []
    uniq = np.unique(np.array(picked + others, dtype=np.uint64))
    c = np.array(data.draw(st.lists(st.sampled_from([1, 2, 5, 4096, 4097]), min_size=uniq.size,
                                    max_size=uniq.size)), dtype=np.int64)
    tf = tf_table(mode)
    for t in (table, IdfTable.uniform()):
        a, b = np.empty(uniq.size), np.empty(uniq.size)
        ok_a = weights_by_directory(uniq, c, t.keys, t.values, t.directory, t.default_idf, tf, a)
        ok_b = weights_into(uniq, c, t.keys, t.values, t.default_idf, tf, b)
        assert ok_a == ok_b
        if ok_a:
            assert a.tobytes() == b.tobytes()
    d = table.directory  # every key in its bucket, the buckets in order
    bits = (d.size - 1).bit_length() - 1
    for x, k in enumerate(keys.tolist()):
        assert d[k >> (64 - bits)] <= x < d[(k >> (64 - bits)) + 1]
