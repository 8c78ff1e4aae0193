"""Forward records: the align stage's gather kernel against its obvious twin (unpack every
record with numpy, keep the windows whose (bin, key) names a list, in page then window
order; the empty windows of each wanted (page, bin) in order)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.passage import forward


def positions() -> st.SearchStrategy[st.SearchStrategy[int]]:
    """A record's positions: those of a page of fewer than 65,536 units (written narrow,
    as <u2), or any int32 (as <i4)."""
    return st.sampled_from([st.integers(0, 0xFFFF), st.integers(-2**31, 2**31 - 1)])


@st.composite
def records(draw: st.DrawFn) -> tuple[np.ndarray, list[bytes], np.ndarray, np.ndarray,
                                      np.ndarray]:
    pages = np.array(sorted(draw(st.sets(st.integers(0, 2**40), min_size=1, max_size=5))),
                     dtype=np.int64)
    recs = []
    names = set()
    for _ in pages:
        n, m = draw(st.integers(0, 12)), draw(st.integers(0, 6))
        bins = np.array(draw(st.lists(st.integers(0, 3), min_size=n + m, max_size=n + m)),
                        dtype=np.int64)
        # few distinct keys (so windows share lists), above 2^63 too
        keys = np.array([draw(st.sampled_from([0, 5, 2**63 + 7])) for _ in range(n)] + [0] * m,
                        dtype=np.uint64)
        rects = np.array(draw(st.lists(st.tuples(*[draw(positions())] * 4),
                                       min_size=n + m, max_size=n + m)),
                         dtype=np.int64).reshape(-1, 4)
        empty = np.arange(n + m) >= n
        if draw(st.booleans()):  # gaps (i_hi = j_hi: two columns), else steps (three)
            rects[empty, 1] = rects[empty, 3]
        recs.append(forward.pack_windows(bins, keys, rects, empty))
        names |= {(int(b), int(k)) for b, k in zip(bins[:n], keys[:n], strict=True)}
    lists = sorted(x for x in names | {(9, 1)} if draw(st.booleans()))
    list_bin = np.array([0] + [b for b, _ in lists], dtype=np.int64)
    list_key = np.array([0] + [k for _, k in lists], dtype=np.uint64)
    want = np.array(sorted({(int(o) << 16) | b for o in pages for b in range(4)
                            if draw(st.booleans())}), dtype=np.int64)
    return pages, recs, list_bin, list_key, want


@settings(max_examples=200, deadline=None)
@given(case=records())
def test_gather_equals_unpacking_every_record(case: tuple) -> None:
    pages, recs, list_bin, list_key, want = case
    start, count, ords, rects, empty_off, empty_lr = forward.gather(
        pages, list(recs), list_bin, list_key, want)
    parts = {int(o): forward.unpack_windows(r) for o, r in zip(pages, recs, strict=True)}
    assert count[0] == 0  # list 0 is the empty list
    for y in range(1, len(list_bin)):
        expect = [(o, rect.tolist()) for o, (bins, keys, rs, _, _) in parts.items()
                  for b, k, rect in zip(bins, keys, rs, strict=True)
                  if b == list_bin[y] and k == list_key[y]]
        got = [(int(ords[x]), rects[x].tolist()) for x in range(start[y], start[y] + count[y])]
        assert got == expect
    for q, key in enumerate(want.tolist()):
        _, _, _, e_bins, lr = parts[key >> 16]
        expect = lr[e_bins == (key & 0xFFFF)].tolist()
        assert empty_lr[empty_off[q] : empty_off[q + 1]].tolist() == expect


def test_a_missing_record_is_an_error() -> None:
    rec = forward.pack_windows(np.array([1]), np.array([5], dtype=np.uint64),
                               np.array([[0, 1, 1, 2]]), np.array([False]))
    with pytest.raises(KeyError, match=r"pages \[4\] have no forward record"):
        forward.gather(np.array([3, 4]), [rec, None], np.array([0, 1]),
                       np.array([0, 5], dtype=np.uint64), np.empty(0, dtype=np.int64))


@settings(max_examples=100, deadline=None)
@given(requests=st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=6, unique=True),
                         min_size=1, max_size=8),
       budget=st.sampled_from([40, 120, 400, 1 << 20]))
def test_record_cache_gives_the_records_it_is_asked_for(requests: list[list[int]],
                                                        budget: int) -> None:
    """Through refills, start-overs and requests larger than the whole budget, each page's
    record comes back as stored, and only records not held are read."""
    store = {o: forward.pack_windows(np.arange(o % 4, dtype=np.int64),
                                     np.full(o % 4, o, dtype=np.uint64),
                                     np.full((o % 4, 4), o, dtype=np.int64),
                                     np.zeros(o % 4, dtype=np.bool_)) for o in range(10)}
    cache = forward.RecordCache(budget)
    reads: list[int] = []

    def read(ordinals: list[int]) -> list[bytes | None]:
        reads.extend(ordinals)
        return [store[o] for o in ordinals]

    for pages in requests:
        pages = sorted(pages)
        held = set(cache.at)
        reads.clear()
        buf, at = cache.records(pages, read)
        assert [bytes(buf[a : a + len(store[o])]) for o, a in zip(pages, at, strict=True)] \
            == [store[o] for o in pages]
        assert reads == [o for o in pages if o not in held]
        assert cache.used <= budget


def test_record_cache_reports_a_missing_record() -> None:
    cache = forward.RecordCache(1 << 10)
    with pytest.raises(KeyError, match=r"pages \[4\] have no forward record"):
        cache.records([3, 4], lambda ordinals: [b"\0" * 8 if o == 3 else None
                                                for o in ordinals])


@given(st.integers(1, 6), st.integers(1, 8), st.data())
@settings(max_examples=200, deadline=None)
def test_empty_keys_are_the_distinct_sorted_keys(n_p: int, k: int, data: st.DataObject) -> None:
    """``forward.empty_keys``: the keys ``ordinal << 16 | bin`` of the tasks' empty bins, as
    ``np.unique`` of them (tasks naming one page through several passages give each key
    once)."""
    q_empty = np.array(data.draw(st.lists(st.lists(st.booleans(), min_size=k, max_size=k),
                                          min_size=n_p, max_size=n_p)), dtype=np.bool_)
    pairs = data.draw(st.lists(st.tuples(st.integers(0, n_p - 1), st.integers(0, 5)),
                               max_size=12, unique=True))
    t_p = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)[:, 0].copy()
    t_o = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)[:, 1].copy()
    tasks = np.array(sorted(data.draw(st.sets(st.integers(0, max(0, len(pairs) - 1)))))
                     if pairs else [], dtype=np.int64)
    want = sorted({(int(t_o[t]) << 16) | b for t in tasks.tolist() for b in range(k)
                   if q_empty[t_p[t], b]})
    assert forward.empty_keys(t_p, t_o, tasks, q_empty).tolist() == want


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_pack_rects_equals_pack_windows_of_the_windows_kept(data: st.DataObject) -> None:
    """The index stage packs a page's record from its window columns, leaving out the
    non-empty windows in stop lists: the same bytes as ``pack_windows`` of the windows
    kept (empty windows in any bin order, several per bin)."""
    n = data.draw(st.integers(0, 30))
    bins = np.array(data.draw(st.lists(st.integers(0, 1023), min_size=n, max_size=n)),
                    dtype=np.int64)
    empty = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)),
                     dtype=np.bool_)
    keys = np.array(data.draw(st.lists(st.sampled_from([0, 5, 2**63 + 7, 2**64 - 1]),
                                       min_size=n, max_size=n)), dtype=np.uint64)
    keys[empty] = 0
    rects = np.array(data.draw(st.lists(st.tuples(*[data.draw(positions())] * 4),
                                        min_size=n, max_size=n)),
                     dtype=np.int64).reshape(-1, 4)
    drop = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)),
                    dtype=np.bool_) & ~empty
    full = np.flatnonzero(~empty & ~drop)
    kept = ~drop
    expect = forward.pack_windows(bins[kept], keys[kept], rects[kept], empty[kept])
    got = forward.pack_rects(bins, keys, rects[:, 0], rects[:, 1], rects[:, 2], rects[:, 3],
                             empty, full)
    assert got == expect


@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_a_list_shards_record_has_the_bytes_of_pack_windows(data: st.DataObject) -> None:
    """A list shard's windows have no rectangles (zeros) and none is empty: ``pack_rects``
    packs them by a shorter path (``_packed_bare``), to the same bytes."""
    n = data.draw(st.integers(0, 30))
    bins = np.array(data.draw(st.lists(st.integers(0, 1023), min_size=n, max_size=n)),
                    dtype=np.int64)
    keys = np.array(data.draw(st.lists(st.integers(0, 2**64 - 1), min_size=n, max_size=n)),
                    dtype=np.uint64)
    z, empty = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.bool_)
    drop = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)),
                    dtype=np.bool_)
    full = np.flatnonzero(~drop)
    expect = forward.pack_windows(bins[full], keys[full], np.zeros((len(full), 4), np.int64),
                                  empty[full])
    assert forward.pack_rects(bins, keys, z, z, z, z, empty, full) == expect


def test_a_record_is_narrow_when_every_position_fits_two_bytes() -> None:
    """Positions 0..65535 are written as <u2 (a page of fewer than 65,536 units), others as
    <i4; either way the record reads back as written."""
    bins = np.array([1, 2, 2], dtype=np.int64)
    keys = np.array([5, 0, 0], dtype=np.uint64)
    empty = np.array([False, True, True])
    for top, narrow in ((0xFFFF, True), (0x10000, False), (-1, False)):
        rects = np.array([[0, 3, 3, top], [7, 9, 7, 9], [10, 12, 10, 12]], dtype=np.int64)
        raw = forward.pack_windows(bins, keys, rects, empty)
        assert bool(int.from_bytes(raw[:4], "little") & forward.NARROW) == narrow
        # head 8, key 8, 8 positions, 3 bins 6, to a multiple of 8
        assert len(raw) == (40 if narrow else 56)
        b, k, r, e_bins, lr = forward.unpack_windows(raw)
        assert (b.tolist(), k.tolist(), r.tolist()) == ([1], [5], [[0, 3, 3, top]])
        assert (e_bins.tolist(), lr.tolist()) == ([2, 2], [[7, 9, 9], [10, 12, 12]])


def test_a_record_of_steps_has_the_i_hi_column() -> None:
    """Empty windows that are steps (i ∈ [l, i_hi], j ∈ [i, j_hi], i_hi < j_hi: weighted
    OPH) are written with their i_hi (bit STAIRS), gaps without; both read back as
    (l, i_hi, j_hi)."""
    bins = np.array([1, 2, 2], dtype=np.int64)
    keys = np.array([5, 0, 0], dtype=np.uint64)
    empty = np.array([False, True, True])
    rects = np.array([[0, 3, 3, 4], [7, 8, 7, 9], [10, 12, 10, 12]], dtype=np.int64)
    raw = forward.pack_windows(bins, keys, rects, empty)
    assert int.from_bytes(raw[:4], "little") & forward.STAIRS
    assert int.from_bytes(raw[:4], "little") & forward.COUNT == 1
    assert len(raw) == 48  # head 8, key 8, 4 + 6 positions (u2), 3 bins 6, to 8
    _, _, _, e_bins, lr = forward.unpack_windows(raw)
    assert (e_bins.tolist(), lr.tolist()) == ([2, 2], [[7, 8, 9], [10, 12, 12]])
    off, got = forward.gather(np.array([3]), [raw], np.array([0]), np.zeros(1, np.uint64),
                              np.array([(3 << 16) | 2]))[4:]
    assert (off.tolist(), got.tolist()) == ([0, 2], [[7, 8, 9], [10, 12, 12]])
