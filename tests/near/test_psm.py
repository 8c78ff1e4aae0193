"""PSM and BPHS against the brute-force scan; SimhashTable invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.near.bphs import BphsIndex
from dupalign.near.psm import (
    brute_force_batch,
    brute_force_search,
    psm_search,
    psm_search_batch,
    psm_search_one,
)
from dupalign.near.simhash_table import SimhashTable
from dupalign.near.volatility import VolatilityModel
from dupalign.near.vosh import vosh_sets


def clustered(seed: int, n: int, n_centers: int, max_flips: int) -> np.ndarray:
    """Fingerprints near a few centres, so that many pairs lie within small distances."""
    rng = np.random.default_rng(seed)
    centers = rng.integers(0, 2**63, n_centers, dtype=np.uint64) * np.uint64(2) + np.uint64(
        rng.integers(0, 2))
    fps = centers[rng.integers(0, n_centers, n)]
    for i in range(n):
        for b in rng.choice(64, int(rng.integers(0, max_flips + 1)), replace=False):
            fps[i] ^= np.uint64(1) << np.uint64(int(b))
    return fps


def queries_and_w(seed: int, fps: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    q = clustered(seed + 2, m, 3, 2)
    q[: m // 2] = fps[rng.integers(0, len(fps), m // 2)]
    for i in range(m // 2):
        for b in rng.choice(64, int(rng.integers(0, 5)), replace=False):
            q[i] ^= np.uint64(1) << np.uint64(int(b))
    # W consistent with the fingerprint's bits: sign(W_j) = bit j.
    bits = (q[:, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    W = np.where(bits == 1, 1.0, -1.0) * rng.exponential(size=(m, 64))
    return q, W


table_params = st.tuples(
    st.integers(0, 10_000),  # seed
    st.integers(1, 400),  # n
    st.integers(1, 6),  # centres
    st.integers(0, 4),  # max flips
    st.integers(0, 80),  # rows added through the buffer
)


def make_table(params: tuple[int, int, int, int, int], **kw: int) -> tuple[SimhashTable,
                                                                          np.ndarray]:
    seed, n, c, flips, n_buf = params
    fps = clustered(seed, n + n_buf, c, flips)
    ords = np.arange(n + n_buf, dtype=np.int64) * 7 + 5
    t = SimhashTable.from_arrays(fps[:n], ords[:n], **kw)
    t.add_many(fps[n:], ords[n:])
    return t, fps


@settings(max_examples=60, deadline=None)
@given(params=table_params, h=st.integers(0, 4), budget=st.integers(1, 40),
       mode=st.sampled_from(["first", "all"]), slack=st.integers(-3, 3))
def test_psm_is_subset_of_brute_force(params, h, budget, mode, slack) -> None:
    table, fps = make_table(params, header_slack=slack, buffer_min=16)
    allf, allo = table.all_arrays()
    q, W = queries_and_w(params[0], fps, 24)
    res = psm_search_batch(table, q, W, h=h, budget=budget, mode=mode)
    for i in range(len(q)):
        exact = brute_force_search(allf, allo, int(q[i]), h)
        got = res.get(i)
        assert set(got) <= set(exact)  # never a false positive, hamming correct
        assert len(got) == len(set(got))
        if mode == "first":
            assert len(got) <= 1
        assert res.probes[i] <= budget


@settings(max_examples=60, deadline=None)
@given(params=table_params, h=st.integers(0, 4), mode=st.sampled_from(["first", "all"]),
       slack=st.integers(-3, 3))
def test_psm_unlimited_budget_equals_brute_force(params, h, mode, slack) -> None:
    table, fps = make_table(params, header_slack=slack, buffer_min=16)
    allf, allo = table.all_arrays()
    q, W = queries_and_w(params[0], fps, 24)
    res = psm_search_batch(table, q, W, h=h, budget=None, mode=mode)
    for i in range(len(q)):
        exact = brute_force_search(allf, allo, int(q[i]), h)
        if mode == "all":
            assert res.get(i) == exact
        else:
            assert bool(res.get(i)) == bool(exact)
    bf = brute_force_batch(allf, allo, q, h)
    assert [bf.get(i) for i in range(len(q))] == [
        brute_force_search(allf, allo, int(x), h) for x in q]


@settings(max_examples=60, deadline=None)
@given(params=table_params, h=st.integers(0, 4), g=st.integers(1, 3))
def test_bphs_equals_brute_force(params, h, g) -> None:
    table, fps = make_table(params)
    allf, allo = table.all_arrays()
    index = BphsIndex.build(allf, allo, h=h, g=g)
    assert index.n_tables == math.comb(g + h, g)
    q, _ = queries_and_w(params[0], fps, 24)
    res = index.search_batch(q)
    first = index.search_batch(q, mode="first")
    for i in range(len(q)):
        exact = brute_force_search(allf, allo, int(q[i]), h)
        assert res.get(i) == exact
        assert len(first.get(i)) == min(1, len(exact)) and set(first.get(i)) <= set(exact)


@settings(max_examples=40, deadline=None)
@given(params=table_params, h=st.integers(0, 4), mode=st.sampled_from(["first", "all"]),
       budget=st.one_of(st.none(), st.integers(1, 20)))
def test_before_bound_filters_ordinals(params, h, mode, budget) -> None:
    table, fps = make_table(params, buffer_min=16)
    allf, allo = table.all_arrays()
    q, W = queries_and_w(params[0], fps, 16)
    bound = np.random.default_rng(params[0]).integers(0, 7 * len(allf) + 6, len(q))
    res = psm_search_batch(table, q, W, h=h, budget=budget, mode=mode, before=bound)
    for i in range(len(q)):
        exact = [r for r in brute_force_search(allf, allo, int(q[i]), h) if r[0] < bound[i]]
        got = res.get(i)
        assert set(got) <= set(exact)
        if budget is None:
            assert (got == exact) if mode == "all" else (bool(got) == bool(exact))


def test_replayed_page_does_not_stop_first_mode_on_itself() -> None:
    rng = np.random.default_rng(8)
    fps = rng.integers(0, 2**64, 1000, dtype=np.uint64)
    # Page 500 is a near copy of page 100 and sorts just before it (bit 3 clear).
    fps[500] &= ~np.uint64(1 << 3)
    fps[100] = fps[500] | np.uint64(1 << 3)
    table = SimhashTable.from_arrays(fps, np.arange(1000))
    W = np.ones(64)
    assert psm_search(table, int(fps[500]), W, budget=None) == [(500, 0)]  # stops on itself
    assert psm_search(table, int(fps[500]), W, mode="all") == [(500, 0), (100, 1)]
    assert psm_search(table, int(fps[500]), W, budget=None, before=500) == [(100, 1)]


def test_volatility_ordering_finds_the_volatile_flip_first() -> None:
    """One neighbour differing in the header bit with the smallest |W|: found by probe 2."""
    rng = np.random.default_rng(5)
    fps = rng.integers(0, 2**64, 4096, dtype=np.uint64)
    table = SimhashTable.from_arrays(fps, np.arange(4096))
    t = table.header_bits
    assert t == 10  # floor(log2 4096) - 2
    x = fps[17] ^ (np.uint64(1) << np.uint64(60))  # flip header bit 60
    bits = (x >> np.arange(64, dtype=np.uint64)) & np.uint64(1)
    W = np.where(bits == 1, 2.0, -2.0)
    W[60] = 0.01 if bits[60] else -0.01  # the nearly balanced bit is the volatile one
    res = psm_search_batch(table, [x], W[None, :], h=3, budget=2, mode="all")
    assert res.get(0) == [(17, 1)]
    assert res.probes[0] == 2  # the exact header, then the header with bit 60 flipped
    assert psm_search(table, int(x), W, budget=1) == []


def test_table_buffer_merge_invariants() -> None:
    rng = np.random.default_rng(1)
    table = SimhashTable(buffer_min=64)
    assert len(table) == 0 and table.header_bits == 0
    fps = rng.integers(0, 2**64, 5000, dtype=np.uint64)
    fps[100:110] = fps[50]  # duplicate fingerprints are kept, one row each
    for i in range(3000):
        table.add(int(fps[i]), i)
        assert len(table) == i + 1
        assert table.buffered <= max(64, math.isqrt(4 * len(table.fps)))
    table.add_many(fps[3000:], np.arange(3000, 5000))
    assert len(table) == 5000
    assert table.buffered > 0
    table.flush()
    assert table.buffered == 0
    assert np.all(np.diff(table.fps.astype(np.float64)) >= 0)
    assert np.all(table.fps[:-1] <= table.fps[1:])
    # Rows are the inserted (fp, ordinal) pairs, nothing lost or duplicated.
    assert sorted(zip(table.fps.tolist(), table.ordinals.tolist(), strict=True)) == sorted(
        zip(fps.tolist(), range(5000), strict=True))
    t = table.header_bits
    assert t == int(np.floor(np.log2(5000))) - 2
    d = table.directory.astype(np.int64)
    assert len(d) == (1 << t) + 1 and d[0] == 0 and d[-1] == 5000
    hdr = (table.fps >> np.uint64(64 - t)).astype(np.int64)
    for v in rng.integers(0, 1 << t, 50):
        assert np.all(hdr[d[v] : d[v + 1]] == v)
    assert table.nbytes == table.fingerprint_nbytes + table.ordinal_nbytes
    assert table.fingerprint_nbytes >= 8 * 5000


def test_from_arrays_matches_incremental_build() -> None:
    rng = np.random.default_rng(2)
    fps = rng.integers(0, 2**64, 1000, dtype=np.uint64)
    a = SimhashTable.from_arrays(fps, np.arange(1000))
    b = SimhashTable(buffer_min=16)
    b.add_many(fps, np.arange(1000))
    b.flush()
    assert np.array_equal(a.fps, b.fps) and np.array_equal(a.ordinals, b.ordinals)
    assert a.header_bits == b.header_bits and np.array_equal(a.directory, b.directory)
    c = SimhashTable.from_arrays(a.fps, a.ordinals, ordered=True)  # the store's key order
    assert np.array_equal(c.fps, a.fps) and np.array_equal(c.ordinals, a.ordinals)
    assert c.header_bits == a.header_bits and np.array_equal(c.directory, a.directory)
    with pytest.raises(ValueError):
        SimhashTable.from_arrays(fps, np.arange(3))


def test_psm_with_learned_model_and_bad_arguments() -> None:
    fps = clustered(4, 300, 4, 3)
    table = SimhashTable.from_arrays(fps, np.arange(300))
    q, W = queries_and_w(4, fps, 10)
    model = VolatilityModel()
    for w in W:
        model.update(w)
    res = psm_search_batch(table, q, W, budget=None, mode="all", model=model)
    for i in range(10):
        assert res.get(i) == brute_force_search(fps, np.arange(300), int(q[i]), 3)
    with pytest.raises(ValueError):
        psm_search_batch(table, q, W[:, :10])
    with pytest.raises(ValueError):
        psm_search_batch(table, q, W, mode="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        psm_search_batch(table, q, W, budget=0)


def test_empty_table_and_empty_batches() -> None:
    table = SimhashTable()
    assert psm_search(table, 5, np.zeros(64), budget=None, mode="all") == []
    assert len(psm_search_batch(table, [], np.zeros((0, 64)))) == 0
    table.add(5, 1)  # only in the buffer: header bits 0, its one bucket is probed
    assert psm_search(table, 4, np.ones(64), mode="all") == [(1, 1)]
    index = BphsIndex.build([], [], h=3)
    assert index.search(5) == [] and len(index.search_batch([])) == 0
    assert brute_force_search([], [], 3, 3) == []


@settings(max_examples=60, deadline=None)
@given(params=table_params, h=st.integers(0, 4), budget=st.integers(1, 40),
       mode=st.sampled_from(["first", "all"]),
       header_bits=st.one_of(st.none(), st.integers(0, 10)))
def test_an_answer_does_not_depend_on_which_rows_are_still_in_the_buffer(
        params, h, budget, mode, header_bits) -> None:
    """The same rows, some still in the append buffer, or all merged: the same answers for
    any budget and mode (docs/pipeline.md, rules 1 and 2: a table split by header prefix
    merges its parts' buffers at other times than one table). Without a fixed width, the
    buffered table's directory is narrower than the merged one's (built for fewer rows)."""
    table, fps = make_table(params, header_bits=header_bits, buffer_min=10_000)
    merged = SimhashTable.from_arrays(np.concatenate([table.fps, table.buffer_fps]),
                                      np.concatenate([table.ordinals, table.buffer_ordinals]),
                                      header_bits=header_bits)
    assert table.buffered == params[4] and merged.buffered == 0
    assert table.probe_bits == merged.probe_bits == merged.header_bits
    q, W = queries_and_w(params[0] + 1, fps, 25)
    for before in (None, int(table.ordinals.max(initial=0)) // 2):
        a = psm_search_batch(table, q, W, h=h, budget=budget, mode=mode, before=before)
        b = psm_search_batch(merged, q, W, h=h, budget=budget, mode=mode, before=before)
        for i in range(len(q)):
            assert sorted(a.get(i)) == sorted(b.get(i))


@settings(max_examples=25, deadline=None)
@given(params=table_params, h=st.integers(0, 4), mode=st.sampled_from(["first", "all"]),
       budget=st.one_of(st.none(), st.integers(1, 12), st.integers(60, 90)))
def test_pipelined_batch_equals_one_query_at_a_time(params, h, mode, budget) -> None:
    """The batch kernel interleaves queries (pipeline stages, chunked ranks, PSM_F prefix):
    every query must get exactly the probes and matches, in order, of a lookup on its own."""
    table, fps = make_table(params, buffer_min=16)
    q, W = queries_and_w(params[0], fps, 150)  # > 2 rank chunks of 64 queries
    bound = np.random.default_rng(params[0]).integers(0, 7 * len(fps) + 6, len(q))
    res = psm_search_batch(table, q, W, h=h, budget=budget, mode=mode, before=bound)
    for i in range(len(q)):
        one = psm_search_batch(table, q[i : i + 1], W[i : i + 1], h=h, budget=budget,
                               mode=mode, before=bound[i : i + 1])
        a, b = int(res.offsets[i]), int(res.offsets[i + 1])
        assert res.ordinals[a:b].tolist() == one.ordinals.tolist()
        assert res.hammings[a:b].tolist() == one.hammings.tolist()
        assert int(res.probes[i]) == int(one.probes[0])


@settings(max_examples=25, deadline=None)
@given(params=table_params, h=st.integers(0, 5), mode=st.sampled_from(["first", "all"]),
       budget=st.integers(1, 70))
def test_one_query_is_the_batch_of_one(params, h, mode, budget) -> None:
    """``psm_search_one`` (the index stage's lookup) answers as ``psm_search_batch``."""
    table, fps = make_table(params, buffer_min=16)
    q, W = queries_and_w(params[0], fps, 20)
    model = VolatilityModel()
    for w in W[:5]:
        model.update(w)
    bound = np.random.default_rng(params[0]).integers(0, 7 * len(fps) + 6, len(q))
    for i in range(len(q)):
        batch = psm_search_batch(table, q[i : i + 1], W[i : i + 1], h=h, budget=budget,
                                 mode=mode, model=model, before=int(bound[i]))
        found, probes = psm_search_one(table, int(q[i]), np.ascontiguousarray(W[i]), h, budget,
                                       mode == "first", model, int(bound[i]))
        assert found == batch.get(0)
        assert probes == int(batch.probes[0])


@settings(max_examples=15, deadline=None)
@given(a=table_params, b=table_params, h=st.integers(0, 5), budget=st.integers(1, 70),
       order=st.lists(st.tuples(st.booleans(), st.integers(0, 19)), min_size=1, max_size=30))
def test_one_query_work_kept_between_tables(a, b, h, budget, order) -> None:
    """``psm_search_one`` keeps its working arrays between lookups: lookups that alternate
    between two tables (two probe widths, as a table grows), two radii and both modes, some
    after one that scanned many rows and some before, each answer as the batch of one."""
    tables = [make_table(p, buffer_min=16) for p in (a, b)]
    queries = [queries_and_w(p[0], fps, 20) for p, (_, fps) in zip((a, b), tables, strict=True)]
    model = VolatilityModel()
    for which, i in order:
        table = tables[which][0]
        q, W = queries[which]
        hh = h if which else min(h, 2)
        for mode in ("all", "first"):
            batch = psm_search_batch(table, q[i:i + 1], W[i:i + 1], h=hh, budget=budget,
                                     mode=mode, model=model)
            found, probes = psm_search_one(table, int(q[i]), np.ascontiguousarray(W[i]), hh,
                                           budget, mode == "first", model, 2**62)
            assert found == batch.get(0)
            assert probes == int(batch.probes[0])


def test_psm_probes_follow_vosh_order() -> None:
    """Probe k of a query is its header flipped by the k-th VOSH set of the header bits."""
    rng = np.random.default_rng(3)
    fps = rng.integers(0, 2**64, 1 << 12, dtype=np.uint64)
    t = SimhashTable.from_arrays(fps, np.arange(len(fps))).header_bits
    W = rng.standard_normal(64)  # continuous: no ties in volatility
    x = int(rng.integers(0, 2**64, dtype=np.uint64))
    p = VolatilityModel().volatility(W)[63 - np.arange(t)]  # header bit r = bit 63 - r
    for k, (_key, s) in enumerate(vosh_sets(p, 3, 30)):
        y = x
        for r in s:
            y ^= 1 << (63 - r)
        table = SimhashTable.from_arrays(np.append(fps, np.uint64(y)), np.arange(len(fps) + 1))
        found = [len(fps) in psm_search_batch(table, [x], W[None, :], h=3, budget=b,
                                              mode="all").ordinals.tolist()
                 for b in (max(k, 1), k + 1)]
        assert found == ([False, True] if k > 0 else [True, True])


@settings(max_examples=80, deadline=None)
@given(params=table_params, h=st.integers(0, 4), budget=st.integers(1, 40),
       mode=st.sampled_from(["first", "all"]), data=st.data(),
       header_bits=st.sampled_from([None, 4]))
def test_removed_rows_answer_as_a_table_built_without_them(params, h, budget, mode,
                                                           data, header_bits) -> None:
    """Tombstones (``remove``), some merged away, some not, and removals from the buffer:
    every search answers as the table built from the rows left (exact search: as brute
    force over them). Without a fixed width the directory, built for more rows, can be
    wider than the probes of the rows left."""
    table, fps = make_table(params, header_bits=header_bits, buffer_min=16)
    allf, allo = table.all_arrays()
    gone = sorted(set(data.draw(st.lists(st.integers(0, len(allo) - 1), max_size=60))))
    for at in range(0, len(gone), 7):  # removals in a few calls (a merge may come between)
        part = gone[at:at + 7]
        table.remove(allf[part], allo[part])
    left = np.setdiff1d(np.arange(len(allo)), gone)
    assert len(table) == left.size
    livef, liveo = table.all_arrays()
    assert sorted(zip(livef.tolist(), liveo.tolist(), strict=True)) == sorted(
        zip(allf[left].tolist(), allo[left].tolist(), strict=True))
    fresh = SimhashTable.from_arrays(livef, liveo, header_bits=header_bits)
    assert fresh.probe_bits == table.probe_bits
    q, W = queries_and_w(params[0], fps, 16)
    got = psm_search_batch(table, q, W, h=h, budget=budget, mode=mode)
    want = psm_search_batch(fresh, q, W, h=h, budget=budget, mode=mode)
    exact = psm_search_batch(table, q, W, h=h, budget=None, mode="all")
    for i in range(len(q)):
        assert sorted(got.get(i)) == sorted(want.get(i))
        assert sorted(exact.get(i)) == sorted(
            brute_force_search(allf[left], allo[left], int(q[i]), h))


def test_a_directory_wider_than_the_probes_answers_as_the_table_of_the_rows_left() -> None:
    """Most rows removed and not merged away: the directory keeps the width of the 1,000
    rows it was built for, the probes take the width of the 300 left (rule 2)."""
    fps = clustered(7, 1000, 40, 3)
    ords = np.arange(1000, dtype=np.int64)
    table = SimhashTable.from_arrays(fps, ords, buffer_min=10_000)
    table.remove(fps[300:], ords[300:])
    fresh = SimhashTable.from_arrays(fps[:300], ords[:300])
    assert table.probe_bits == fresh.header_bits < table.header_bits
    q, W = queries_and_w(7, fps[:300], 64)
    for mode in ("first", "all"):
        for budget in (1, 8, None):
            got = psm_search_batch(table, q, W, h=4, budget=budget, mode=mode)
            want = psm_search_batch(fresh, q, W, h=4, budget=budget, mode=mode)
            assert [sorted(got.get(i)) for i in range(64)] == [
                sorted(want.get(i)) for i in range(64)]
            assert sum(len(got.get(i)) for i in range(64)) > 0


@settings(max_examples=200, deadline=None)
@given(n=st.one_of(st.integers(0, 1 << 20), st.integers(0, 1 << 47)),
       slack=st.integers(0, 4))
def test_header_width_is_floor_log2_less_the_slack(n: int, slack: int) -> None:
    """The probes' width from the row count: floor(log2 n) - slack within [0, 32], exactly
    (the float log2 it was computed with, read as the oracle, is exact at these sizes)."""
    table = SimhashTable(header_slack=slack)
    expected = min(max(0, math.floor(math.log2(n)) - slack), 32) if n > 0 else 0
    assert table.header_width(n) == expected
    for power in (1 << k for k in range(48)):  # (the edges: a power of two and one below)
        assert table.header_width(power) == min(max(0, power.bit_length() - 1 - slack), 32)
        assert table.header_width(power - 1) == (
            0 if power == 1 else min(max(0, math.floor(math.log2(power - 1)) - slack), 32))
