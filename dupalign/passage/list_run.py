"""A run of query pages through the inverted lists in one call (issue 43): what
``PassageIndex.list_heads`` then ``stage``/``commit`` do page after page, for pages with no
removal between them, with one cache lookup, one store read of the lists not in memory, one
kernel and one batch for the whole run.

Per page the list stage's fixed cost was ~80 small array operations and a store write
(docs/performance/pipeline.md); here they are paid once a run. The results are the
per-page form's because the kernel keeps its order: page m's query, then page m's appends,
then page m + 1's query. So at page m's query a list holds the entries of the pages before
m and nothing else, and the stop-list rule (more than ``max_list`` entries of pages other
than the version the query replaces) is decided on exactly the count the per-page form
sees: no rule changes.

Two things the per-page form does at a page's query are done once for the run:
- the lists not in memory are read from the store before the run (the store then lacks
  the run's own entries; the kernel appends them in memory as it goes, which is what a
  per-page read would have found). A list read this way is not known to the per-page form
  before the first query that names it (``first``): a page before that writes its windows
  in it even if it is a marked stop list, as the per-page form does;
- packing a list read with many keys into its run covers the entries stored before the run
  (a layout choice: the lists read the same).

What may differ from the per-page form, none of it read by a query: the count a stop
list's mark holds (a lower bound, exact here), which lists are packed, and, when the cache
is over its budget, which stop-list windows a forward record leaves out (the per-page form
trims between pages, a run after it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.passage import forward
from dupalign.passage.index import PassageCounters, PassageIndex, StoredLists
from dupalign.passage.lists.cache import LONG, append_to
from dupalign.passage.sketch import I64, U64, PassageState, window_lists
from dupalign.store import lists, tables
from dupalign.store.database import Batch

Bools = npt.NDArray[np.bool_]


@dataclass
class RunPage:
    """A query page of a run: its store ordinal, the distinct lists its query reads
    (``bins``, ``keys``) and its windows (None: none in these lists)."""

    ordinal: int
    bins: I64
    keys: U64
    windows: PassageState | None


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


def query_run(index: PassageIndex, batch: Batch, pages: list[RunPage]) -> list[RunHeads]:
    """The heads of every page of ``pages`` (ordinals ascending, no removal between them),
    each as its own ``list_heads`` would give them after the pages before it were staged
    and committed; their writes (windows, forward records, stop-list marks, packed runs)
    staged into ``batch``. The lists in memory already hold the run's entries: the caller
    writes ``batch`` and then calls ``index.commit_run()`` (or, if the write fails,
    nothing: the next call finds the run uncommitted and drops the lists in memory)."""
    if index.pending is not None or index.trace is not None:
        raise ValueError("a run of pages needs each page's entries in its batch, no trace")
    index._forget_uncommitted()
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
        long, off, ords, to_pack = _read_lists(index, u_bins, u_keys)
        new = cache.insert(u_bins, u_keys, long, off, ords)
        slots[miss] = new[inv]
        first = np.searchsorted(q_off, miss[at], side="right") - 1
        first_of = np.full(cache.n_slots - n_before, -1, dtype=np.int64)
        first_of[new - n_before] = first
        first = first_of
        for y, prefix, replaced in to_pack:
            packs[int(new[y])] = (prefix, replaced, ords[off[y]:off[y + 1]])
    # the windows' distinct lists, page by page, and each window's among them
    w_lists = [window_lists(p.windows) if p.windows is not None and p.windows.rects is not None
               else (np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64))
               for p in pages]
    l_off = _offsets([len(w[0]) for w in w_lists])
    l_slots = cache.lookup(_concat([w[0] for w in w_lists], np.int64),
                           _concat([w[1] for w in w_lists], np.uint64), touch=False)
    w_off = _offsets([len(w[2]) for w in w_lists])
    w_slots = l_slots[_concat([w[2] + l_off[m] for m, w in enumerate(w_lists)], np.int64)]
    # room for every append: a run that fills moves with twice the room, so a list that
    # grows to n entries takes fewer than 4n + 4 rows of the arena in all
    appended = w_slots[w_slots >= 0]
    grown = np.unique(appended)
    room = 4 * (int(np.maximum(cache.s_len[grown], 0).sum()) + len(appended)) + 4 * len(grown)
    cache._reserve(0, room)
    cap = np.minimum(np.maximum(cache.s_len[slots], 0)
                     + np.bincount(appended, minlength=cache.n_slots)[slots],
                     cfg.max_list_read)
    heads = np.empty(int(cap.sum()), dtype=np.int64)
    long_out = np.zeros(len(slots), dtype=np.bool_)
    n_out = np.zeros(len(slots), dtype=np.int64)
    marks = np.full(len(slots), -1, dtype=np.int64)
    stop = np.zeros(len(l_slots), dtype=np.bool_)
    ordinals = np.array([p.ordinal for p in pages], dtype=np.int64)
    index._staged = int(ordinals[-1])  # the lists in memory change now: see ``commit_run``
    end, cut = _run_kernel(
        cache.s_start, cache.s_len, cache.s_cap, cache.ords, cache.end, ordinals, q_off,
        slots, first, n_before, l_off, l_slots, w_off, w_slots, cfg.max_list,
        cfg.max_list_read, long_out, n_out, heads, marks, stop)
    assert end >= 0, "the arena's room was reserved"
    cache.end = end
    c.entries_cut += cut
    marked = np.flatnonzero(marks >= 0)
    if len(marked):
        c.long_lists += len(marked)
        for prefix, n in zip(lists.prefixes(q_bins[marked], q_keys[marked]),
                             marks[marked].tolist(), strict=True):
            index._new_markers[prefix] = n
    index._write_markers(batch)
    for run in index._new_runs.values():  # (found by a query before the run)
        lists.put_run(batch, run)
    index._new_runs.clear()
    for s, (prefix, replaced, packed) in packs.items():
        if cache.s_len[s] != LONG and len(packed):  # (a stop list now: not packed)
            lists.put_run(batch, lists.packed(prefix, packed, replaced))
            c.runs_written += 1
    _stage_windows(batch, pages, w_lists, l_off, l_slots, stop, c)
    h_off = _offsets(n_out.tolist())
    return [RunHeads(long_out[q_off[m]:q_off[m + 1]], n_out[q_off[m]:q_off[m + 1]],
                     heads[h_off[q_off[m]]:h_off[q_off[m + 1]]]) for m in range(len(pages))]


def _unique_lists(bins: I64, keys: U64) -> tuple[I64, U64, I64]:
    """The distinct lists (bin, key) and the index of each input among them."""
    pairs = np.empty(len(bins), dtype=[("b", np.int64), ("k", np.uint64)])
    pairs["b"], pairs["k"] = bins, keys
    u, inv = np.unique(pairs, return_inverse=True)
    return u["b"].copy(), u["k"].copy(), inv.reshape(-1)


def _read_lists(index: PassageIndex, bins: I64, keys: U64
                ) -> tuple[Bools, I64, I64, list[tuple[int, bytes, list[bytes]]]]:
    """The lists (bin, key) as the store holds them: marked, or their entries (CSR), and
    those to pack. At most ``max_list + 2`` keys of each: a list with more is a stop list at
    the first query that reads it, whatever version that query replaces (each key holds at
    least one entry, the replaced version at most one key outside the run), so its entries
    past those are never read."""
    c = index.counters
    reads = StoredLists(len(bins))
    limit = index.cfg.max_list + 2
    prefixes = lists.prefixes(bins, keys)
    reader = lists.reader(index.store)
    for y in reader.present(prefixes):
        stored = lists.read(reader, prefixes[y], limit)
        if stored is None:
            continue
        c.keys_read += stored.keys_read()
        if stored.marked:
            c.entries_read += 1
            reads.long[y] = True
            continue
        singles = stored.windows()
        c.entries_read += len(stored.run) + singles
        reads.add(y, prefixes[y], stored, singles, index.pack_min)
    c.lists_read += len(bins)
    off, ords = reads.assemble()
    return reads.long, off, ords, reads.to_pack


def _stage_windows(batch: Batch, pages: list[RunPage],
                   w_lists: list[tuple[I64, U64, I64]], l_off: I64, l_slots: I64,
                   stop: Bools, c: PassageCounters) -> None:
    """Each page's forward record and its entries in the lists that were not stop lists
    it knew of (``stop``, the kernel's), as ``PassageIndex.stage`` writes them."""
    e_bins: list[I64] = []
    e_keys: list[U64] = []
    e_ords: list[I64] = []
    counts: list[I64] = []
    skipped = 0
    for m, p in enumerate(pages):
        st = p.windows
        if st is None or st.rects is None:
            continue
        r = st.rects
        nonempty = np.flatnonzero(~r.empty)
        l_bins, l_keys, inverse = w_lists[m]
        n_windows = np.bincount(inverse, minlength=len(l_bins))
        s = stop[l_off[m]:l_off[m + 1]]
        if s.any():
            stop_windows = s[inverse]
            skipped += int(np.count_nonzero(stop_windows))
            nonempty = nonempty[~stop_windows]
            live = ~s
            l_bins, l_keys, n_windows = l_bins[live], l_keys[live], n_windows[live]
        tables.forward.put(batch, p.ordinal, forward.pack_rects(
            r.bin, r.key, r.i_lo, r.i_hi, r.j_lo, r.j_hi, r.empty, nonempty))
        if st.positions:
            tables.positions.put(batch, p.ordinal, st.positions)
        e_bins.append(l_bins)
        e_keys.append(l_keys)
        e_ords.append(np.full(len(l_bins), p.ordinal, dtype=np.int64))
        counts.append(n_windows)
    if counts:  # (built at once: numpy concatenates records in native byte order)
        entries = lists.entries(np.concatenate(e_bins), np.concatenate(e_keys), 0)
        entries["ordinal"] = np.concatenate(e_ords)
        lists.put_entries(batch, entries, np.concatenate(counts))
    c.stop_entries_skipped += skipped


@njit(cache=True, nogil=True)
def _run_kernel(
    s_start: I64, s_len: I64, s_cap: I64, a_ord: I64, end: int, ordinals: I64, q_off: I64,
    q_slot: I64, first: I64, n_before: int, l_off: I64, l_slot: I64, w_off: I64,
    w_slot: I64, max_list: int, max_list_read: int, long_out: Bools, n_out: I64,
    heads: I64, marks: I64, stop: Bools,
) -> tuple[int, int]:  # fmt: skip
    """Page after page: its query (stop lists found, heads copied out), which of its
    window lists it knows to be stop lists, its appends. ``first[s - n_before]``: the page
    of the first query that names slot s, a list read for this run (slots below
    ``n_before`` were in memory before it). Returns the arena's end (-1: no room) and the
    entries cut by ``max_list_read``."""
    h = 0
    cut = 0
    for m in range(ordinals.shape[0]):
        o = ordinals[m]
        for i in range(q_off[m], q_off[m + 1]):
            s = q_slot[i]
            n = s_len[s]
            if n == LONG:
                long_out[i] = True
                continue
            if n > max_list:  # (the version replaced is never in a run: its removal cuts it)
                marks[i] = n
                s_start[s], s_len[s], s_cap[s] = 0, LONG, 0
                long_out[i] = True
                continue
            a = s_start[s]
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
