"""A run of query pages through a list shard's inverted lists in one call (issue 43): what
``PassageIndex.list_heads`` then ``stage``/``commit`` do page after page, for pages with no
removal between them, with one cache lookup, one store read of the lists not in memory, one
kernel for the queries and appends, one for the windows' lists and one for the forward
records, and one batch for the whole run. A list shard has no other form: one page is a
run of one (dupalign.stages.list_shard).

The results are the per-page form's because the kernel keeps its order: page m's query,
then page m's appends, then page m + 1's query. So at page m's query a list holds the
entries of the pages before m and nothing else, and the stop-list rule (more than
``max_list`` entries of pages other than the version the query replaces) is decided on
exactly the count the per-page form sees: no rule changes. The last page of a run may
replace a version stored before the run: its query does not count that version's entries,
and the caller stages the removal into the run's batch after ``query_run`` (the order of
``list_heads``, ``stage_removal``, ``stage``).

Two things the per-page form does at a page's query are done once for the run:
- the lists not in memory are read from the store before the run (the store then lacks
  the run's own entries; the kernel appends them in memory as it goes, which is what a
  per-page read would have found). A list read this way is not known to the per-page form
  before the first query that names it (``first``): a page before that writes its windows
  in it even if it is a marked stop list, as the per-page form does;
- packing a list read with many keys into its run covers the entries stored before the run
  (a layout choice: the lists read the same; a run that ends with a removal packs none).

What may differ from the per-page form, none of it read by a query: the count a stop
list's mark holds (a lower bound, exact here), which lists are packed, and, when the cache
is over its budget, which stop-list windows a forward record leaves out (the per-page form
trims between pages, a run after it). A list shard's forward record keeps which lists hold
the page, not where: its rectangles are zeros (``forward.pack_rects`` of zero columns, the
same bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.passage import forward
from dupalign.passage.distinct import distinct_lists_kernel
from dupalign.passage.index import PassageIndex
from dupalign.passage.lists.cache import LONG, append_to
from dupalign.passage.sketch import I64, U64
from dupalign.store import lists, tables
from dupalign.store.database import Batch
from dupalign.store.keys import u64

Bools = npt.NDArray[np.bool_]


@dataclass
class RunPage:
    """A query page of a run: its store ordinal, the distinct lists its query reads
    (``bins``, ``keys``) and its non-empty windows' lists, one per window (``w_bins``,
    ``w_keys``; empty: none in these lists)."""

    ordinal: int
    bins: I64
    keys: U64
    w_bins: I64
    w_keys: U64


@dataclass
class RunHeads:
    """A page's answer, as ``list_heads`` gives it: per list, stop list or not, its head
    length, and the heads one after the other (``copy_heads``)."""

    long: Bools
    n: I64
    ords: I64


def _concat(parts: list[npt.NDArray], dtype: type) -> npt.NDArray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


def _offsets(sizes: list[int]) -> I64:
    off = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=off[1:])
    return off


def query_run(index: PassageIndex, batch: Batch, pages: list[RunPage],
              replaced: int | None = None) -> list[RunHeads]:
    """The heads of every page of ``pages`` (ordinals ascending, no removal between them),
    each as its own ``list_heads`` would give them after the pages before it were staged
    and committed; their writes (windows, forward records, stop-list marks, packed runs)
    staged into ``batch``. ``replaced``: the version the last page replaces, stored before
    the run (not counted towards a stop list; the caller stages its removal after this,
    into ``batch``). The lists in memory already hold the run's entries: the caller writes
    ``batch`` and then calls ``index.commit_run()`` (or, if the write fails, nothing: the
    next call finds the run uncommitted and drops the lists in memory)."""
    index.begin_run(pages[-1].ordinal)
    cache, cfg, c = index.cache, index.cfg, index.counters
    q_off = _offsets([len(p.bins) for p in pages])
    q_bins = _concat([p.bins for p in pages], np.int64)
    q_keys = _concat([p.keys for p in pages], np.uint64)
    slots = cache.lookup(q_bins, q_keys)
    miss = np.flatnonzero(slots < 0)
    c.lists_cached += len(slots) - len(miss)
    first = np.zeros(0, dtype=np.int64)  # (per new slot, from ``n_before``)
    n_before = cache.n_slots
    packs: dict[int, tuple[bytes, list[bytes], I64]] = {}
    if len(miss):
        # the distinct lists missed, each at its first position (pages in order)
        u_bins, u_keys, inv = _unique_lists(q_bins[miss], q_keys[miss])
        at = np.full(len(u_bins), len(miss), dtype=np.int64)
        np.minimum.at(at, inv, np.arange(len(miss)))
        # at most max_list + 2 keys of each: a list with more is a stop list at the first
        # query that reads it, whatever version that query replaces (each key holds at
        # least one entry, the replaced version at most one key outside the run)
        reads = index.read_stored(lists.prefixes(u_bins, u_keys), cfg.max_list + 2)
        off, ords = reads.assemble()
        new = cache.insert(u_bins, u_keys, reads.long, off, ords)
        slots[miss] = new[inv]
        first = np.searchsorted(q_off, miss[at], side="right") - 1
        first_of = np.full(cache.n_slots - n_before, -1, dtype=np.int64)
        first_of[new - n_before] = first
        first = first_of
        if replaced is None:  # (a removal's batch rewrites the runs it reaches)
            for y, prefix, keys in reads.to_pack:
                packs[int(new[y])] = (prefix, keys, ords[off[y]:off[y + 1]])
    # each page's distinct window lists, and each window's among them (``window_lists``)
    w_page = _offsets([len(p.w_bins) for p in pages])
    l_off, l_bins, l_keys, w_list = _run_lists(
        w_page, _concat([p.w_bins for p in pages], np.int64),
        _concat([p.w_keys for p in pages], np.uint64))
    l_slots = cache.lookup(l_bins, l_keys, touch=False)
    w_slots = l_slots[w_list]
    # room for every append: a run that fills moves with twice the room, so a list that
    # grows to n entries takes fewer than 4n + 4 rows of the arena in all
    appended = w_slots[w_slots >= 0]
    grown = np.unique(appended)
    cache.reserve_rows(4 * (int(np.maximum(cache.s_len[grown], 0).sum()) + len(appended))
                       + 4 * len(grown))
    cap = np.minimum(np.maximum(cache.s_len[slots], 0)
                     + np.bincount(appended, minlength=cache.n_slots)[slots],
                     cfg.max_list_read)
    heads = np.empty(int(cap.sum()), dtype=np.int64)
    long_out = np.zeros(len(slots), dtype=np.bool_)
    n_out = np.zeros(len(slots), dtype=np.int64)
    marks = np.full(len(slots), -1, dtype=np.int64)
    stop = np.zeros(len(l_slots), dtype=np.bool_)
    ordinals = np.array([p.ordinal for p in pages], dtype=np.int64)
    end, cut = _run_kernel(
        cache.s_start, cache.s_len, cache.s_cap, cache.ords, cache.end, ordinals, q_off,
        slots, first, n_before, l_off, l_slots, w_page, w_slots, cfg.max_list,
        cfg.max_list_read, -1 if replaced is None else replaced, long_out, n_out, heads,
        marks, stop)
    assert end >= 0, "the arena's room was reserved"
    cache.end = end
    c.entries_cut += cut
    marked = np.flatnonzero(marks >= 0)
    c.long_lists += len(marked)
    index.stage_found(batch, dict(zip(lists.prefixes(q_bins[marked], q_keys[marked]),
                                      marks[marked].tolist(), strict=True)))
    for s, (prefix, keys, packed) in packs.items():
        if cache.s_len[s] != LONG and len(packed):  # (a stop list now: not packed)
            lists.put_run(batch, lists.packed(prefix, packed, keys))
            c.runs_written += 1
    _stage_windows(batch, ordinals, w_page, l_off, l_bins, l_keys, w_list, stop)
    c.stop_entries_skipped += int(np.count_nonzero(stop[w_list]))
    h_off = _offsets(n_out.tolist())
    return [RunHeads(long_out[q_off[m]:q_off[m + 1]], n_out[q_off[m]:q_off[m + 1]],
                     heads[h_off[q_off[m]]:h_off[q_off[m + 1]]]) for m in range(len(pages))]


def _unique_lists(bins: I64, keys: U64) -> tuple[I64, U64, I64]:
    """The distinct lists (bin, key) and the index of each input among them."""
    pairs = np.empty(len(bins), dtype=[("b", np.int64), ("k", np.uint64)])
    pairs["b"], pairs["k"] = bins, keys
    u, inv = np.unique(pairs, return_inverse=True)
    return u["b"].copy(), u["k"].copy(), inv.reshape(-1)


def _stage_windows(batch: Batch, ordinals: I64, w_page: I64, l_off: I64, l_bins: I64,
                   l_keys: U64, w_list: I64, stop: Bools) -> None:
    """Each page's forward record and its entries in the lists that were not stop lists
    it knew of (``stop``, the kernel's), as ``PassageIndex.stage`` writes them (a page
    with no windows here has neither)."""
    n_lists = np.diff(l_off)
    live = ~stop
    counts = np.bincount(w_list, minlength=len(l_bins))
    entries = lists.entries(l_bins[live], l_keys[live], 0)
    entries["ordinal"] = np.repeat(ordinals, n_lists)[live]
    lists.put_entries(batch, entries, counts[live])
    buf, rec_off = _forward_records(w_page, l_keys, l_bins, w_list, live)
    raw = buf.astype("<u8", copy=False).tobytes()
    has = np.flatnonzero(np.diff(w_page) > 0).tolist()
    batch.put_many(tables.forward.family, [u64(int(ordinals[m])) for m in has],
                   [raw[8 * rec_off[m]:8 * rec_off[m + 1]] for m in has])


_NARROW = forward.NARROW  # (a record's head is two <u4: one word)


@njit(cache=True, nogil=True)
def _run_lists(w_page: I64, w_bins: I64, w_keys: U64) -> tuple[I64, I64, U64, I64]:
    """Each page's distinct lists of its windows (``distinct_lists``, in key order), one
    page after the other (``l_off``: page m's are ``l_off[m]:l_off[m + 1]``), and each
    window's list among all."""
    n_pages = w_page.shape[0] - 1
    l_off = np.zeros(n_pages + 1, dtype=np.int64)
    l_bins = np.empty(w_bins.shape[0], dtype=np.int64)
    l_keys = np.empty(w_bins.shape[0], dtype=np.uint64)
    w_list = np.empty(w_bins.shape[0], dtype=np.int64)
    at = 0
    for m in range(n_pages):
        a, b = w_page[m], w_page[m + 1]
        if b > a:
            lb, lk, inv = distinct_lists_kernel(w_bins[a:b], w_keys[a:b])
            k = lb.shape[0]
            l_bins[at:at + k] = lb
            l_keys[at:at + k] = lk
            for x in range(b - a):
                w_list[a + x] = at + inv[x]
            at += k
        l_off[m + 1] = at
    return l_off, l_bins[:at], l_keys[:at], w_list


@njit(cache=True, nogil=True)
def _forward_records(w_page: I64, l_keys: U64, l_bins: I64, w_list: I64, live: Bools
                     ) -> tuple[U64, I64]:
    """The forward records of the run's pages (little-endian words), ``rec_off[m]`` to
    ``rec_off[m + 1]`` page m's: ``forward.pack_rects`` of its windows in live lists, with
    zero rectangles and no empty window (the head, the keys, 8 zero bytes a window, the
    bins as <u2, padded to a word)."""
    n_pages = w_page.shape[0] - 1
    rec_off = np.zeros(n_pages + 1, dtype=np.int64)
    n_live = np.zeros(n_pages, dtype=np.int64)
    for m in range(n_pages):
        for x in range(w_page[m], w_page[m + 1]):
            n_live[m] += live[w_list[x]]
        n = n_live[m]
        rec_off[m + 1] = rec_off[m] + (0 if w_page[m + 1] == w_page[m]
                                       else 1 + 2 * n + (n + 3) // 4)
    buf = np.zeros(rec_off[n_pages], dtype=np.uint64)
    for m in range(n_pages):
        if w_page[m + 1] == w_page[m]:
            continue
        at, n = rec_off[m], n_live[m]
        buf[at] = np.uint64(n | _NARROW)  # (the head's second word: no empty window)
        k = at + 1
        b = at + 1 + 2 * n
        y = 0
        for x in range(w_page[m], w_page[m + 1]):
            s = w_list[x]
            if not live[s]:
                continue
            buf[k] = l_keys[s]
            k += 1
            buf[b + y // 4] |= np.uint64(l_bins[s] & 0xFFFF) << np.uint64(16 * (y % 4))
            y += 1
    return buf, rec_off


@njit(cache=True, nogil=True)
def _run_kernel(
    s_start: I64, s_len: I64, s_cap: I64, a_ord: I64, end: int, ordinals: I64, q_off: I64,
    q_slot: I64, first: I64, n_before: int, l_off: I64, l_slot: I64, w_off: I64,
    w_slot: I64, max_list: int, max_list_read: int, replaced: int, long_out: Bools,
    n_out: I64, heads: I64, marks: I64, stop: Bools,
) -> tuple[int, int]:  # fmt: skip
    """Page after page: its query (stop lists found, heads copied out), which of its
    window lists it knows to be stop lists, its appends. ``first[s - n_before]``: the page
    of the first query that names slot s, a list read for this run (slots below
    ``n_before`` were in memory before it). ``replaced`` (-1: none): the version the last
    page replaces, whose entries its query does not count towards a stop list. Returns
    the arena's end (-1: no room) and the entries cut by ``max_list_read``."""
    h = 0
    cut = 0
    last = ordinals.shape[0] - 1
    for m in range(ordinals.shape[0]):
        o = ordinals[m]
        for i in range(q_off[m], q_off[m + 1]):
            s = q_slot[i]
            n = s_len[s]
            if n == LONG:
                long_out[i] = True
                continue
            a = s_start[s]
            if n > max_list:
                own = 0
                if m == last and replaced >= 0:  # (entries sorted: the version's are a range)
                    lo = np.searchsorted(a_ord[a:a + n], replaced)
                    while lo + own < n and a_ord[a + lo + own] == replaced:
                        own += 1
                if n - own > max_list:
                    marks[i] = n
                    s_start[s], s_len[s], s_cap[s] = 0, LONG, 0
                    long_out[i] = True
                    continue
            k = np.searchsorted(a_ord[a:a + n], o)
            take = min(k, max_list_read)
            cut += k - take
            for r in range(take):
                heads[h + r] = a_ord[a + r]
            h += take
            n_out[i] = take
        for j in range(l_off[m], l_off[m + 1]):
            s = l_slot[j]
            stop[j] = (s >= 0 and s_len[s] == LONG
                       and (s < n_before or first[s - n_before] <= m))
        for x in range(w_off[m], w_off[m + 1]):
            s = w_slot[x]
            if s < 0 or s_len[s] == LONG:
                continue
            end = append_to(s, s_start, s_len, s_cap, a_ord, end, o)
            if end < 0:
                return -1, cut
    return end, cut
