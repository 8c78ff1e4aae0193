"""The in-memory inverted lists against a plain dict of Python lists (the obvious twin)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.passage.lists.cache import MIN_BYTES, ListCache

Entry = int  # a page ordinal (one per window of the page in the list)


def _cached(cache: ListCache, twin: dict[tuple[int, int], list[Entry] | None]) -> None:
    """Every list in the cache equals its twin (entries, or the long flag)."""
    names = list(twin)
    if not names:
        return
    bins = np.array([b for b, _ in names], dtype=np.int64)
    keys = np.array([k for _, k in names], dtype=np.uint64)
    slots = cache.lookup(bins, keys)
    long = cache.is_long(slots)
    for (name, want), slot, is_long in zip(twin.items(), slots.tolist(), long.tolist(),
                                           strict=True):
        if slot < 0:
            continue  # evicted: allowed
        if want is None:
            assert is_long, name
            continue
        got = [int(o) for o in cache.entries(slot)]
        assert got == want, name


ops = st.lists(
    st.tuples(
        st.sampled_from(["read", "page"]),
        st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), min_size=1, max_size=12),
    ),
    min_size=1, max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, max_list=st.integers(1, 6), budget=st.sampled_from([300, 2_000, 1 << 20]))
def test_cache_equals_dict_of_lists(ops: list, max_list: int, budget: int) -> None:
    """Reads insert the store's current list (or the long flag) and flag the cached lists
    grown past ``max_list``, pages append their windows to the cached lists in order; after
    every step each cached list equals the store's."""
    store: dict[tuple[int, int], list[Entry]] = {}
    twin: dict[tuple[int, int], list[Entry] | None] = {}
    cache = ListCache(budget)
    for ordinal, (kind, names) in enumerate(ops):
        if kind == "read":
            uniq = sorted(set(names))
            bins = np.array([b for b, _ in uniq], dtype=np.int64)
            keys = np.array([k for _, k in uniq], dtype=np.uint64)
            slots = cache.lookup(bins, keys)
            # a read finds cached lists long as the store would (the passage index's rule)
            over = [x for x in range(len(uniq)) if slots[x] >= 0
                    and twin[uniq[x]] is not None and len(twin[uniq[x]] or ()) > max_list]
            cache.mark_long(slots[over])
            for x in over:
                twin[uniq[x]] = None
            miss = [x for x in range(len(uniq)) if slots[x] < 0]
            rows = [store.get(uniq[x], []) for x in miss]
            long = np.array([len(r) > max_list for r in rows], dtype=np.bool_)
            kept = [[] if lg else r for r, lg in zip(rows, long.tolist(), strict=True)]
            off = np.zeros(len(miss) + 1, dtype=np.int64)
            np.cumsum([len(r) for r in kept], out=off[1:])
            ords = np.array([o for r in kept for o in r], dtype=np.int64)
            if miss:
                cache.insert(bins[miss], keys[miss], long, off, ords)
            for x, r, lg in zip(miss, rows, long.tolist(), strict=True):
                twin[uniq[x]] = None if lg else list(r)
        else:
            for b, k in names:
                store.setdefault((b, k), []).append(ordinal)
                if twin.get((b, k)) is not None:
                    lst = twin[(b, k)]
                    assert lst is not None
                    lst.append(ordinal)  # appends never make a stop list: queries do
            cache.append_page(np.array([b for b, _ in names], dtype=np.int64),
                              np.array([k for _, k in names], dtype=np.uint64), ordinal)
            cache.trim()
            assert cache.bytes_used <= max(budget, 0) or len(cache) == 0
        _cached(cache, twin)


def test_lists_move_when_they_outgrow_their_run() -> None:
    cache = ListCache(1 << 20)
    bins = np.array([0, 1], dtype=np.int64)
    keys = np.array([7, 2**63 + 5], dtype=np.uint64)  # keys above 2^63 too
    cache.insert(bins, keys, np.zeros(2, dtype=np.bool_), np.array([0, 1, 2]),
                 np.array([0, 0]))
    for ordinal in range(1, 20):
        cache.append_page(bins, keys, ordinal)
    for slot in cache.lookup(bins, keys).tolist():
        assert cache.entries(slot).tolist() == list(range(20))


def test_many_lists_grow_the_table_and_survive_trims() -> None:
    """Thousands of lists (the hash table doubles several times; keys share bins and bins
    share keys, keys above 2^63 too), then trims that drop the least recently used: every
    list left is found with its entries, every dropped or unknown one is not."""
    rng = np.random.default_rng(3)
    n = 20_000
    bins = rng.integers(0, 1024, size=n).astype(np.int64)
    keys = rng.integers(0, 1 << 20, size=n).astype(np.uint64) << np.uint64(44)
    keys[::3] = np.uint64(12345)  # one key in many bins
    uniq = sorted(set(zip(bins.tolist(), keys.tolist(), strict=True)))
    bins = np.array([b for b, _ in uniq], dtype=np.int64)
    keys = np.array([k for _, k in uniq], dtype=np.uint64)
    cache = ListCache(1 << 30)
    for lo in range(0, len(uniq), 1000):  # insert in batches, one entry per list
        hi = min(len(uniq), lo + 1000)
        rows = np.arange(lo, hi, dtype=np.int64)
        cache.insert(bins[lo:hi], keys[lo:hi], np.zeros(hi - lo, dtype=np.bool_),
                     np.arange(hi - lo + 1, dtype=np.int64), rows)
    assert len(cache) == len(uniq) and len(cache.table) >= 2 * len(uniq)

    def check() -> int:
        slots = cache.lookup(bins, keys)
        for x in np.flatnonzero(slots >= 0).tolist():
            assert cache.entries(int(slots[x])).tolist() == [x]
        return int(np.count_nonzero(slots >= 0))

    assert check() == len(uniq)
    recent = np.arange(len(uniq) - 500, len(uniq))
    cache.lookup(bins[recent], keys[recent])  # used last: these survive the trims
    cache.budget = cache.bytes_used // 5
    cache.trim()
    left = check()
    assert 500 <= left < len(uniq) // 2 and len(cache) == left
    assert (cache.lookup(bins[recent], keys[recent]) >= 0).all()
    absent = cache.lookup(bins[:50] + 1024, keys[:50])  # bins no list uses
    assert (absent == -1).all()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), budget=st.integers(MIN_BYTES // 2, 4 * MIN_BYTES),
       names=st.integers(50, 5_000), max_len=st.integers(1, 400))
def test_cache_room_stays_within_its_budget(seed: int, budget: int, names: int,
                                            max_len: int) -> None:
    """Fed far more than it holds (reads of lists up to ``max_len`` entries, pages that
    append to them), the cache's arrays, not only the bytes in use, are within the budget
    after every trim (or at their smallest room), and every cached list stays the store's."""
    rng = np.random.default_rng(seed)
    store: dict[int, list[int]] = {}
    cache = ListCache(budget)
    for ordinal in range(120):
        picked = np.unique(rng.integers(0, names, size=int(rng.integers(1, 300))))
        bins, keys = picked % 1024, (picked // 1024).astype(np.uint64)
        miss = np.flatnonzero(cache.lookup(bins, keys) < 0)
        rows = [store.setdefault(int(n), list(range(int(rng.integers(0, max_len)))))
                for n in picked[miss]]
        off = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in rows], out=off[1:])
        cache.insert(bins[miss], keys[miss], np.zeros(len(rows), dtype=np.bool_), off,
                     np.array([o for r in rows for o in r], dtype=np.int64))
        for n in picked.tolist():  # the page's windows: one in each list it read
            store[n].append(1000 + ordinal)
        cache.append_page(bins, keys, 1000 + ordinal)
        cache.trim()
        assert cache.bytes_used <= budget or len(cache) == 0
        assert cache.nbytes <= max(budget, MIN_BYTES)
        every = np.arange(names)
        slots = cache.lookup(every % 1024, (every // 1024).astype(np.uint64), touch=False)
        for n in np.flatnonzero(slots >= 0).tolist():
            assert cache.entries(int(slots[n])).tolist() == store[n]
