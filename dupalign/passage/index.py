"""Copied passages: a RocksDB index of compact windows and the streaming passage query.

Every page's compact windows are indexed in two parts: inverted lists keyed by (bin,
min-hash) that hold page ordinals only (one entry per window of the page in the list: 8
bytes in memory, a varint delta in a packed run), and the page's forward record
(dupalign.passage.forward: its non-empty and empty windows, token offsets, unit hashes). A new
page is cut into query
passages of ``query_len`` tokens with a ``stride``; each passage is aligned against the
earlier pages whose windows collide with its sketch:

1. read the inverted lists of the passages' min-hashes (all passages of the page at once,
   from memory (dupalign.passage.lists.cache) or the store); a list longer than ``max_list`` is a
   stop list, only flagged: a unit that common (navigation, licence text, stop phrases)
   says nothing about copying, so its bin counts as neither a collision nor an empty bin,
   as search engines and plagiarism detectors (MOSS) drop their most frequent
   fingerprints. Without it the common lists grow with the store, and so do the pages
   that collide with a passage in them and must be checked. ``max_list`` is frozen with
   the store, since results depend on it. When a list is a stop list (one definition, for
   memory and store alike, so that results never depend on the list cache): from the
   first query that reads it holding more than ``max_list`` entries (not counting the
   version the page replaces), and from then on, whatever removals take from it later:
   that query's batch writes the list's mark, and pages written afterwards keep their
   windows out of it. The entries it held before are left (removal still deletes them);
2. count distinct collided bins per earlier page, from the first ``max_list_read`` entries
   (the earliest pages) of each list only, and drop the pages that cannot reach the
   threshold even if every empty bin of the passage collided (DESIGN.md: this order is what
   makes queries scale, since empty windows are read only for the pages left);
3. (the align stage, dupalign.stages.align) read those pages' forward records: their windows in
   the named lists and their empty windows in the passage's empty bins, and run the
   interval scan over the colliding rectangles: the longest subsequences whose estimate
   is ≥ θ.
Steps 1-2 are this module's (``find_tasks``), step 3 the align stage's (``Tasks.gather``,
``Aligner.scan``). The numba kernels of steps 2-3 are in dupalign.passage.batch_align; the
page's passages and their sketches come from the sketch stage (dupalign.passage.sketch).
Thresholds are exact integers (dupalign.passage.tasks.Weights).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dupalign.config import EngineConfig
from dupalign.passage import batch_align as passage_align
from dupalign.passage import forward
from dupalign.passage.lists import files as list_files
from dupalign.passage.lists.cache import ListCache
from dupalign.passage.sketch import (
    I64,
    U64,
    PassageState,
    distinct_lists,
    query_lists,
    window_lists,
)
from dupalign.passage.tasks import PassageTrace, Tasks, Weights
from dupalign.store import lists, tables
from dupalign.store.database import Batch, PrefixReader, Store

# Pages append one entry per list they are in; a list read from the store with PACK_MIN or
# more of those (and at least a quarter of its run's length, so that a list is repacked
# O(log n) times) is packed into its run (dupalign.store.lists) by the next page's batch,
# which deletes the keys it replaces: a later read takes one key instead of hundreds
# (reading an entry through the iterator costs about a microsecond, unpacking it from a run
# a few nanoseconds).
PACK_MIN = 8


@dataclass
class Removal:
    """Pages removed from the passage index (``ordinals``, ascending) and the lists that
    held their windows, for ``PassageIndex.commit_removal``."""

    ordinals: I64
    bins: I64
    keys: U64


@dataclass
class PassageCounters:
    passages: int = 0
    lists_read: int = 0
    entries_read: int = 0  # list entries read from the store (those in runs included)
    keys_read: int = 0  # store keys read for them (a run is one key)
    runs_written: int = 0
    candidates_pruned: int = 0
    candidates_scanned: int = 0
    long_lists: int = 0  # lists found to be stop lists (read from the store, or grown so)
    lists_cached: int = 0
    stopped_bins: int = 0  # passage bins whose list is a stop list (not a collision)
    stop_entries_skipped: int = 0  # windows not written: their list is a known stop list
    entries_cut: int = 0  # list entries past passage.max_list_read, not counted


class PassageIndex:
    """The inverted lists of the passage index and the forward records, in the store and
    (the lists) in memory: the index stage's part of the passage query, and the writes."""

    def __init__(self, store: Store, config: EngineConfig) -> None:
        self.store = store
        self.cfg = config.passage
        self.weights = Weights.of(self.cfg)
        self.counters = PassageCounters()
        self.cache = ListCache(config.cache.budgets_mb()["lists"] << 20)
        self._staged: int | None = None  # a page staged but not committed yet
        # the staged page's ordinal and the cache slot of the list of each of its non-empty
        # windows (-1: not cached), for ``commit``
        self._append: tuple[int, I64] | None = None
        # lists found long by a query, marked by the next batch (the query's page, or a
        # removal): once marked a list stays a stop list (module docstring, step 1)
        self._new_markers: dict[bytes, int] = {}
        # lists read with many unpacked entries, packed by the next page staged:
        # prefix -> (run key, run, keys it replaces) (``lists.packed``)
        self._new_runs: dict[bytes, tuple[bytes, bytes, list[bytes]]] = {}
        self.pack_min = PACK_MIN  # runtime only: packing changes the layout, not the lists
        # the entries of committed pages not in the store yet (``write_lists_behind``; None:
        # each page's entries are in its batch, as a list partition's store keeps them)
        self.pending: list_files.PendingLists | None = None
        self._entries: tuple[int, npt.NDArray[Any], I64] | None = None  # staged, for commit
        self._mark: int | None = None  # the pending lists' mark in the staged batch
        # set by the recall audit for the one query it samples: filled by ``find_tasks``
        self.trace: PassageTrace | None = None

    def find_tasks(
        self, state: PassageState, before: int, exclude: frozenset[int] = frozenset(),
        replaced: int | None = None,
    ) -> Tasks | None:
        """The index's part of the passage query: the inverted lists named by the passages'
        sketches and the candidate pages per passage, from the lists alone (their windows
        are gathered by align: ``Tasks.gather``). None if no task is left. ``replaced``: the
        ordinal of the version the page replaces (its batch removes it), which does not
        count towards making a list a stop list."""
        _, _, l_bins, l_keys, _ = query_lists(state)
        return self.tasks_of(state, self.list_heads(l_bins, l_keys, before, replaced),
                             exclude)

    def tasks_of(self, state: PassageState,
                 heads: tuple[npt.NDArray[np.bool_], I64, I64, I64],
                 exclude: frozenset[int] = frozenset()) -> Tasks | None:
        """``find_tasks`` from the heads of the page's lists (``list_heads`` of its
        ``query_lists``, or their join from the list shards' partials:
        dupalign.stages.list_shard ``combine_lists``)."""
        assert state.keys is not None and state.empty is not None
        keys, empty = state.keys, state.empty
        self.counters.passages += len(keys)
        n_p, k = keys.shape
        rows, bins, l_bins, l_keys, inverse = query_lists(state)
        lid = np.full((n_p, k), -1, dtype=np.int64)
        lid[rows, bins] = inverse
        long, start, n_before, ords = heads
        # a stop list has no entries counted (n_before 0): its bin is neither a collision
        # nor an empty bin
        named = lid >= 0
        self.counters.stopped_bins += int(np.count_nonzero(long[lid[named]]))
        excl = np.array(sorted(exclude), dtype=np.int64)
        w = self.weights
        t_p, t_o, pruned = passage_align.select_candidates(
            lid, n_before, start, ords, empty, excl, w.w_match, w.w_empty, w.need,
            self.cfg.max_candidates)
        # the viability filter runs in align (``scan``), off this thread, with the
        # candidates' windows (their forward records)
        self.counters.candidates_pruned += pruned
        self.counters.candidates_scanned += len(t_p)
        if self.trace is not None:
            self.trace.stopped = named & long[np.maximum(lid, 0)]
            self.trace.tasks = frozenset(t_o.tolist())
        if not len(t_p):
            return None
        # stop lists become the empty list 0; the others keep their (bin, key) order
        kept = ~long
        remap = np.zeros(len(l_bins), dtype=np.int64)
        remap[kept] = np.arange(1, int(np.count_nonzero(kept)) + 1)
        lid = np.where(lid >= 0, remap[np.maximum(lid, 0)], -1)
        return Tasks(t_p, t_o, lid, empty, np.concatenate(([0], l_bins[kept])),
                     np.concatenate((np.zeros(1, np.uint64), l_keys[kept])))

    def list_heads(self, bins: I64, keys: U64, before: int, replaced: int | None = None
                   ) -> tuple[npt.NDArray[np.bool_], I64, I64, I64]:
        """The inverted lists (bin, key) as a query counts them: per list whether it is a
        stop list (step 1: found so now, its mark written by the next batch), and its
        counted entries ``ords[start:start + n]``: those of pages before ``before``, at
        most ``max_list_read`` (none for a stop list)."""
        reader = lists.reader(self.store)  # made now: sees every earlier page
        slots = self._list_slots(reader, bins, keys, old_version=replaced)
        start, length = self.cache.s_start[slots], self.cache.s_len[slots]
        ords = self.cache.ords
        n_before = passage_align.entries_before(start, length, ords, before)
        # pages are counted from each list's earliest max_list_read entries only
        # (entries are sorted by ordinal): the counting work stays bounded as copies grow
        head = np.minimum(n_before, self.cfg.max_list_read)
        self.counters.entries_cut += int(n_before.sum() - head.sum())
        if self.trace is not None:
            self.trace.heads = frozenset(_segments(ords, start, head).tolist())
            self.trace.beyond = frozenset(_segments(ords, start + head, n_before - head).tolist())
            self.trace.heads_known = True
        return self.cache.is_long(slots), start, head, ords

    def read_forward(self, ordinals: list[int]) -> list[bytes | None]:
        """The windows values of pages' forward records (dupalign.passage.forward)."""
        return tables.forward.get_many(self.store, ordinals)

    # -- store reads ------------------------------------------------------------------------
    def _list_slots(self, reader: PrefixReader, bins: I64, keys: U64,
                    old_version: int | None = None) -> I64:
        """Cache slots of the inverted lists (bin, key); the lists not in memory are read
        from the store (whole, or only flagged when a stop list: marked so, or holding
        more than ``max_list`` entries of pages other than ``old_version``)."""
        self._forget_uncommitted()
        slots = self.cache.lookup(bins, keys)
        self._stop_cached(slots, old_version)
        miss = np.flatnonzero(slots < 0)
        self.counters.lists_cached += len(slots) - len(miss)
        if not len(miss):
            return slots
        max_list = self.cfg.max_list
        # at most max_list + 1 keys of pages other than ``old_version``: each key holds at
        # least one entry, and ``old_version`` has at most one key outside the run
        limit = max_list + 1 + (old_version is not None)
        prefixes = lists.prefixes(bins[miss], keys[miss])
        # the entries of committed pages not in the store yet come after the store's
        n_recent, recent = (self.pending.recent_entries(bins[miss], keys[miss])
                            if self.pending is not None else (np.zeros(len(miss), np.int64),
                                                              np.zeros(0, np.int64)))
        extra = n_recent.copy()  # counted towards a stop list: not the old version's
        if old_version is not None and len(recent):
            seen = np.concatenate(([0], np.cumsum(recent == old_version)))
            ends = np.cumsum(n_recent)
            extra -= seen[ends] - seen[ends - n_recent]

        def too_long(y: int, stored: lists.StoredList, n: int) -> bool:
            # not counting the old version's entries
            n_own = 0 if old_version is None else stored.windows_of(old_version)
            if n - n_own + extra[y] <= max_list:
                return False
            self.counters.long_lists += 1
            self._new_markers[prefixes[y]] = n + int(n_recent[y])
            return True

        reads = self.read_stored(prefixes, limit, reader, too_long)
        long, n_run, n_single = reads.long, reads.n_run, reads.n_single
        off, ords = reads.assemble()
        for y, prefix, replaced in reads.to_pack:  # (the store's entries only)
            packed = ords[off[y] : off[y + 1]]
            self._new_runs[prefix] = lists.packed(prefix, packed, replaced)
        if len(recent):
            # a list only pending can be long too (more than max_list pages of one file)
            for y in np.flatnonzero(~long & (n_run + n_single == 0) & (extra > max_list)).tolist():
                long[y] = True
                self.counters.long_lists += 1
                self._new_markers[prefixes[y]] = int(n_recent[y])
            kept = np.repeat(~long, n_recent)
            off, ords = _append_lists(off, ords, np.where(long, 0, n_recent), recent[kept])
        slots[miss] = self.cache.insert(bins[miss], keys[miss], long, off, ords)
        return slots

    def _stop_cached(self, slots: I64, old_version: int | None) -> None:
        """Cached lists (``slots``, -1: not cached) that hold more than ``max_list``
        entries of pages other than ``old_version`` become stop lists, marked by the next
        batch, as they would be if they were read from the store now."""
        max_list = self.cfg.max_list
        s_len = self.cache.s_len
        over = slots[(slots >= 0) & (s_len[np.maximum(slots, 0)] > max_list)]
        if old_version is not None and len(over):
            n_own = np.array([np.count_nonzero(self.cache.entries(s) == old_version)
                              for s in over.tolist()], dtype=np.int64)
            over = over[s_len[over] - n_own > max_list]
        if not len(over):
            return
        for s, n in zip(over.tolist(), s_len[over].tolist(), strict=True):
            key = int(self.cache.s_key[s]) % 2**64  # stored as int64
            self._new_markers[lists.prefix(int(self.cache.s_bin[s]), key)] = n
        self.cache.mark_long(over)
        self.counters.long_lists += len(over)


    def read_stored(self, prefixes: list[bytes], limit: int,
                    reader: PrefixReader | None = None,
                    too_long: Callable[[int, lists.StoredList, int], bool] | None = None
                    ) -> StoredLists:
        """The lists ``prefixes`` as the store holds them (at most ``limit`` keys each, one
        seek for an absent one): marked ones flagged long, the others' entries to
        ``assemble``; ``too_long(y, list, entries)``: whether list y, read, is a stop list
        instead (flagged, not kept)."""
        c = self.counters
        reads = StoredLists(len(prefixes))
        reader = reader or lists.reader(self.store)
        # most lists a page names are new: found absent by one seek, nothing more to do
        for y in reader.present(prefixes):
            stored = lists.read(reader, prefixes[y], limit)
            if stored is None:
                continue
            c.keys_read += stored.keys_read()
            if stored.marked:
                c.entries_read += 1
                reads.long[y] = True
                c.long_lists += 1
                continue
            singles = stored.windows()
            c.entries_read += len(stored.run) + singles
            if too_long is not None and too_long(y, stored, len(stored.run) + singles):
                reads.long[y] = True
                continue
            reads.add(y, prefixes[y], stored, singles, self.pack_min)
        c.lists_read += len(prefixes)
        return reads

    def begin_run(self, last: int) -> None:
        """A run of pages up to ordinal ``last`` (dupalign.passage.list_run) is about to
        change the lists in memory: they are dropped if its batch is never committed
        (``commit_run``). A run needs each page's entries in its batch, and no trace."""
        if self.pending is not None or self.trace is not None:
            raise ValueError("a run of pages needs each page's entries in its batch, no trace")
        self._forget_uncommitted()
        self._staged = last

    def stage_found(self, batch: Batch, marks: dict[bytes, int]) -> None:
        """Into ``batch``: the stop-list marks ``marks`` (prefix -> entries) a run found,
        and those and the packed runs earlier queries left to the next batch."""
        self._new_markers.update(marks)
        self._write_markers(batch)
        for run in self._new_runs.values():
            lists.put_run(batch, run)
        self.counters.runs_written += len(self._new_runs)
        self._new_runs.clear()

    # -- writes -----------------------------------------------------------------------------
    def stage(self, batch: Batch, ordinal: int, state: PassageState | None) -> None:
        self._forget_uncommitted()
        self._write_markers(batch)  # (the page's own query may have found them)
        if state is None or state.rects is None:
            return
        self._staged = ordinal
        if self.pending is not None:  # (this batch may pack the marked entries into runs)
            self._mark = self.pending.mark_into(batch)
        # entries never change once written, so a run stays true too (and writing it again
        # after a failed page is harmless: same key, same value, deletes of deleted keys)
        for run in self._new_runs.values():
            lists.put_run(batch, run)
        self.counters.runs_written += len(self._new_runs)
        self._new_runs.clear()
        r = state.rects
        # the page's lists: the distinct (bin, key) of its non-empty windows. Windows in
        # lists known to be stop lists are written nowhere: a stop list stays one (it
        # already holds more than max_list entries), and nothing reads its entries
        nonempty = np.flatnonzero(~r.empty)
        l_bins, l_keys, inverse = window_lists(state)
        slots = self.cache.lookup(l_bins, l_keys, touch=False)
        n_windows = np.bincount(inverse, minlength=len(l_bins))
        stop = self.cache.is_long(slots)
        # ``commit`` appends the page to the cached lists by these slots (valid until the
        # next trim or clear: nothing between this batch and its commit moves them)
        self._append = (ordinal, slots[inverse])
        if stop.any():
            stop_windows = stop[inverse]
            self.counters.stop_entries_skipped += int(np.count_nonzero(stop_windows))
            nonempty = nonempty[~stop_windows]
            live = ~stop
            l_bins, l_keys, n_windows = l_bins[live], l_keys[live], n_windows[live]
        # the forward record: the other windows (their (bin, key) pairs name every list
        # that holds the page) and the token offsets
        tables.forward.put(batch, ordinal, forward.pack_rects(
            r.bin, r.key, r.i_lo, r.i_hi, r.j_lo, r.j_hi, r.empty, nonempty))
        if state.positions:  # (a list shard's windows come without: it reads none)
            tables.positions.put(batch, ordinal, state.positions)
        # the page in each list of its non-empty windows, with its number of windows there
        entries = lists.entries(l_bins, l_keys, ordinal)
        # written behind, once committed (dupalign.passage.lists.files)
        if self.pending is not None:
            self._entries = (ordinal, entries, n_windows)
        else:
            lists.put_entries(batch, entries, n_windows)

    def _write_markers(self, batch: Batch) -> None:
        """Mark the lists found long since the last batch (a mark is never taken back)."""
        lists.put_marks(batch, self._new_markers)
        self._new_markers.clear()

    def _forget_uncommitted(self) -> None:
        """A page staged but never committed (its processing failed after ``stage``) may or
        may not be in the store, so the lists in memory may lack its windows: drop them
        (they are read again)."""
        if self._staged is not None:
            entries = self._entries
            if (entries is not None and entries[0] == self._staged and self.pending is not None
                    and tables.forward.get(self.store, self._staged) is not None):
                self.pending.marked(self._mark)  # its batch is in the store: as committed
                self.pending.add(*entries)
            self.cache.clear()
            self._staged = None
        self._append = None
        self._entries = None
        self._mark = None  # (still due: the next batch writes it)

    def commit(self, ordinal: int, state: PassageState | None) -> None:
        """After the page's batch is written: append its windows to the lists in memory,
        so that they stay equal to the store, then keep the memory budget (a page without
        windows read no list and adds none: the cache is as the last trim left it)."""
        if state is None or state.rects is None:
            self._staged = self._append = self._entries = self._mark = None
            return
        if self._append is not None and self._append[0] == ordinal:
            self.cache.append_slots(self._append[1], ordinal)  # as ``stage`` found them
        else:
            r = state.rects
            nonempty = np.flatnonzero(~r.empty)
            self.cache.append_page(np.ascontiguousarray(r.bin[nonempty]),
                                   np.ascontiguousarray(r.key[nonempty]), ordinal)
        if self.pending is not None and self._staged == ordinal:
            self.pending.marked(self._mark)
            if self._entries is not None and self._entries[0] == ordinal:
                self.pending.add(*self._entries)
        self._staged = None
        self._append = None
        self._entries = None
        self._mark = None
        self.cache.trim()

    def commit_run(self) -> None:
        """After the batch of a run of pages is written (dupalign.passage.list_run
        ``query_run``, which appended their windows to the lists in memory): keep the
        memory budget."""
        self._staged = None
        self.cache.trim()

    def write_lists_behind(self, read_only: bool = False) -> None:
        """From now on, committed pages' list entries are written behind the index thread
        (dupalign.passage.lists.files), after those of the pages from the store's mark on are read
        back from their forward records (a crash left them unwritten): into the store, or
        (``read_only``) into memory only. A store without the mark has every entry in it."""
        pending = list_files.PendingLists(self.store)
        through = tables.lists_through.count(self.store)
        if through is None:
            if read_only:
                return
            last = tables.forward.last(self.store)
            tables.lists_through.put_count(self.store, 0 if last is None else last + 1)
        else:
            if not read_only:  # files a crash left before their ingest: read again below
                shutil.rmtree(pending.incoming, ignore_errors=True)
            for page in list_files.forward_entries(self.store, through):
                pending.remember(*page)
            if not read_only:
                pending.drain()
        self.pending = pending
        self.cache.clear()  # (lists read before are without the pending entries)

    # -- removal (revisits, deletes, retention) --------------------------------------------
    def stage_removal(self, batch: Batch, ordinals: list[int]) -> Removal:
        """Delete every entry of the pages ``ordinals`` from ``batch``: the page in each
        inverted list its forward record names (its own key ``bin ‖ min-hash ‖ ordinal``,
        and inside a packed run, which is rewritten without it), then its forward record
        (windows and ``positions``). A page with no forward record is in no list (it had
        no passages). ``commit_removal`` then updates the lists in memory. THE one place
        that knows how a page sits in the passage layout.

        Exact except for stop lists: a list marked as one stays one (the windows of pages
        written since are in no list and no forward record), whatever is removed from it;
        the marks of lists found long since the last batch are written here, before the
        removal can shrink them."""
        if self.pending is not None and self.pending.holds_any(ordinals):
            # (a file ingested after this batch would bring their entries back; the entries
            # of stored pages are deleted below whatever is pending)
            self.pending.drain()
        self._write_markers(batch)
        dead = np.unique(np.asarray(ordinals, dtype=np.int64))
        records = self.read_forward(dead.tolist())
        # per list, the first and last removed page in it: the entries between are read
        # (those of pages still stored among them are left; retention removes the oldest
        # pages, so there are none then)
        span: dict[bytes, tuple[int, int]] = {}
        for o, raw in zip(dead.tolist(), records, strict=True):
            if raw is None:
                continue
            bins, keys, _, _, _ = forward.unpack_windows(raw)
            l_bins, l_keys, _ = distinct_lists(bins, keys.astype(np.uint64))
            for prefix in lists.prefixes(l_bins, l_keys):
                lo, _ = span.get(prefix, (o, o))
                span[prefix] = (lo, o)  # ordinals ascend
        reader = lists.reader(self.store)
        gone = set(dead.tolist())
        for prefix, (lo, hi) in sorted(span.items()):
            self._new_runs.pop(prefix, None)  # read before the removal: they hold the pages
            lists.remove_pages(batch, reader, prefix, lo, hi, dead, gone)
        tables.forward.remove(batch, dead.tolist())
        tables.positions.remove(batch, dead.tolist())
        named_bins, named_keys = lists.names(sorted(span))
        return Removal(dead, named_bins, named_keys)

    def commit_removal(self, removal: Removal) -> None:
        """After the removal's batch is written: the cached lists without those pages."""
        self.cache.remove_entries(removal.bins, removal.keys, removal.ordinals)

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {
            "passage_queries": c.passages,
            "passage_lists_read": c.lists_read,
            "passage_entries_read": c.entries_read,
            "passage_keys_read": c.keys_read,
            "passage_runs_written": c.runs_written,
            "passage_candidates_pruned": c.candidates_pruned,
            "passage_candidates_scanned": c.candidates_scanned,
            "passage_long_lists": c.long_lists,
            "passage_lists_cached": c.lists_cached,
            "passage_stopped_bins": c.stopped_bins,
            "passage_stop_entries_skipped": c.stop_entries_skipped,
            "passage_entries_cut": c.entries_cut,
        }


def _segments(values: I64, start: I64, length: I64) -> I64:
    """``values[start[i]:start[i] + length[i]]`` of every i, joined."""
    total = int(length.sum())
    if not total:
        return np.zeros(0, dtype=values.dtype)
    ends = np.cumsum(length)
    at = np.arange(total) - np.repeat(ends - length, length) + np.repeat(start, length)
    return values[at]


class StoredLists:
    """Lists read from the store, by their place y among those asked for: marked long
    (``long``), or their entries (``add``), then assembled at once (``assemble``)."""

    def __init__(self, n: int) -> None:
        self.long = np.zeros(n, dtype=np.bool_)
        self.n_run = np.zeros(n, dtype=np.int64)
        self.n_single = np.zeros(n, dtype=np.int64)
        self.runs: list[I64] = []
        self.keys: list[bytes] = []
        self.values: list[bytes] = []
        # (y, prefix, keys): lists with many keys, packed into a run by the next batch
        self.to_pack: list[tuple[int, bytes, list[bytes]]] = []

    def add(self, y: int, prefix: bytes, stored: lists.StoredList, singles: int,
            pack_min: int) -> None:
        """The entries of list y (not marked): its run's, then ``singles`` more."""
        if len(stored.run):
            self.runs.append(stored.run)
        if len(stored.keys) >= max(pack_min, len(stored.run) // 4):
            self.to_pack.append((y, prefix, stored.stored_keys()))
        self.n_run[y], self.n_single[y] = len(stored.run), singles
        self.keys += stored.keys
        self.values += stored.values

    def assemble(self) -> tuple[I64, I64]:
        """``(offsets, ordinals)`` of every list (``assemble_lists``)."""
        return assemble_lists(self.n_run, self.runs, self.n_single, self.keys, self.values)


def assemble_lists(n_run: I64, runs: list[I64], n_single: I64, keys: list[bytes],
                    values: list[bytes]) -> tuple[I64, I64]:
    """Lists read from the store as CSR ``(offsets, ordinals)``: list y is its run's
    ``n_run[y]`` entries (``runs`` holds those of the lists that have one, in order), then
    its ``n_single[y]`` entries stored one key per page (``keys``/``values``, in order; a
    page with n windows in the list counts n times)."""
    off = np.zeros(len(n_run) + 1, dtype=np.int64)
    np.cumsum(n_run + n_single, out=off[1:])
    single_ords = lists.entry_ordinals(keys, values)
    if not runs:
        return off, single_ords
    ords = np.empty(int(off[-1]), dtype=np.int64)
    ords[list_files.ranks(off[:-1], n_run)] = np.concatenate(runs)
    ords[list_files.ranks(off[:-1] + n_run, n_single)] = single_ords
    return off, ords


def _append_lists(off: I64, ords: I64, n_more: I64, more: I64) -> tuple[I64, I64]:
    """CSR lists ``(off, ords)`` with list y's ``n_more[y]`` entries of ``more`` (list by
    list) after its own."""
    n_own = np.diff(off)
    new_off = np.zeros_like(off)
    np.cumsum(n_own + n_more, out=new_off[1:])
    out = np.empty(int(new_off[-1]), dtype=np.int64)
    out[list_files.ranks(new_off[:-1], n_own)] = ords
    out[list_files.ranks(new_off[:-1] + n_own, n_more)] = more
    return new_off, out
