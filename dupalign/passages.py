"""Copied passages: a RocksDB index of compact windows and the streaming passage query.

Every page's compact windows are indexed: non-empty windows in inverted lists keyed by
(bin, min-hash), empty windows (OPH only) by (page, bin). A new page is cut into query
passages of ``query_len`` tokens with a ``stride``; each passage is aligned against the
earlier pages whose windows collide with its sketch:

1. read the inverted lists of the passages' min-hashes (all passages of the page at once,
   from memory (dupalign.list_cache) or the store); a list longer than ``max_list`` is a
   stop list, only flagged: a unit that common (navigation, licence text, stop phrases)
   says nothing about copying, so its bin counts as neither a collision nor an empty bin,
   as search engines and plagiarism detectors (MOSS) drop their most frequent
   fingerprints. Without it the common lists grow with the store, and so do the pages
   that collide with a passage in them and must be checked. ``max_list`` is frozen with
   the store, since results depend on it;
2. count distinct collided bins per earlier page and drop the pages that cannot reach the
   threshold even if every empty bin of the passage collided (DESIGN.md: this order is what
   makes queries scale, since empty windows are read only for the pages left);
3. read those pages' empty windows in the passage's empty bins, and run the interval scan
   over the colliding rectangles: the longest subsequences whose estimate is ≥ θ.
The numba kernels of steps 2-3 are in dupalign.passage_align.

Hits on one earlier page are merged into maximal spans; with ``refine`` (the default) the
spans reported are the tight alignments inside them (dupalign.span_refine), and every span
carries the exact Jaccard and containments of its units. Thresholds are exact integers:
θ = p/q, a matched non-empty window weighs q, a jointly empty bin weighs p, and a
subsequence is similar when its weight reaches k·p (OPH: N_mat / (k − N_emp) ≥ θ).
MonoActive (``mode = "weighted"``) has no empty windows: weight 1 each, threshold ⌈kθ⌉.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from dupalign import monoactive, passage_align, span_refine
from dupalign.config import EngineConfig
from dupalign.hashing import mix64
from dupalign.list_cache import ListCache
from dupalign.match import Span
from dupalign.oph import compact_windows, oph_bins, oph_sketch, oph_values
from dupalign.store import (
    Batch,
    PrefixReader,
    Store,
    delete_ordinals,
    ordinal_ranges,
    read_u64,
    u64,
)
from dupalign.text import Tokens

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
_BIN = struct.Struct(">H")
_SEQ = struct.Struct(">I")
_RECT = np.dtype("<i4")
# key of an inverted-list entry: bin ‖ min-hash ‖ ordinal ‖ window number, big-endian
_LIST_KEY = np.dtype([("bin", ">u2"), ("key", ">u8"), ("ordinal", ">u8"), ("seq", ">u4")])
# A run: every entry of a list up to some ordinal packed in one value, under the key
# bin ‖ min-hash ‖ last ordinal ‖ _RUN_SEQ (no page has 2^32 windows). Pages append their
# windows one key each; a list read from the store with PACK_MIN or more of those (and at
# least a quarter of its run's length, so that a list is repacked O(log n) times) is packed
# by the next page's batch, which deletes the keys it replaces: a later read takes one key
# instead of hundreds (reading an entry through the iterator costs about a microsecond,
# unpacking it from a run a few nanoseconds). A list is: [long mark] [run] [entries of
# later pages].
_RUN_SEQ = b"\xff\xff\xff\xff"
_RUN = np.dtype([("ordinal", "<i8"), ("rect", "<i4", (4,))])
# a list's name, the prefix of its keys: bin ‖ min-hash (a page's ``lists_of`` record)
_LIST_ID = np.dtype([("bin", ">u2"), ("key", ">u8")])
PACK_MIN = 8
_SHINGLE_SALT = 0x5348494E


@dataclass
class Rects:
    """Windows as rectangles: subsequences T[i..j] with i in [i_lo, i_hi], j in [j_lo, j_hi]
    (0-based, inclusive), sharing min-hash ``key`` in ``bin`` (OPH bin or MonoActive hash
    function). ``empty`` marks OPH empty windows (their key is 0)."""

    bin: I64
    key: U64
    i_lo: I64
    i_hi: I64
    j_lo: I64
    j_hi: I64
    empty: npt.NDArray[np.bool_]

    def __len__(self) -> int:
        return int(self.bin.shape[0])


@dataclass
class PassageState:
    """The page's passage sketch (``PassageIndex.sketch_page``: pure) and what it adds to the
    index (written by ``stage``): its windows, its query passages ``[starts, ends)`` (units)
    with their sketches ``keys[P, k]`` / ``empty[P, k]``, its token character offsets."""

    rects: Rects | None
    n_units: int
    positions: bytes = b""  # the page's token character offsets, for spans that cite it
    starts: I64 | None = None
    ends: I64 | None = None
    keys: U64 | None = None
    empty: npt.NDArray[np.bool_] | None = None


@dataclass
class Tasks:
    """A page's alignment tasks with everything ``passage_align.scan_tasks`` reads and
    nothing from the store: pairs (passage ``t_p``, earlier page ``t_o``) sorted by passage
    then page; ``lid[p, b]``, the list named by passage p's min-hash in bin b (-1: none),
    and ``q_empty[p, b]``, its empty bins; the lists restricted to the entries of the task
    pages (CSR ``start``/``count`` into ``ords``/``rects``, sorted by ordinal); and those
    pages' empty windows in the passages' empty bins (CSR keyed by ``ordinal << 16 | bin``
    with (l, r) rows). Lists left without entries are merged into one empty list, which
    holds as much information (a list, not an empty bin). Every entry and empty window is
    keyed by its page, so the tasks split by earlier page for shards of align."""

    t_p: I64
    t_o: I64
    lid: I64
    q_empty: npt.NDArray[np.bool_]
    start: I64
    count: I64
    ords: I64
    rects: npt.NDArray[np.int32]
    empty_keys: I64
    empty_off: I64
    empty_lr: I64

    def __len__(self) -> int:
        return int(self.t_p.shape[0])


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


@dataclass
class _Hit:
    q_start: int
    q_end: int
    t_start: int
    t_end: int
    est: float


class PassageIndex:
    def __init__(self, store: Store, config: EngineConfig) -> None:
        self.store = store
        self.cfg = config.passage
        self.seed = config.seed
        theta = self.cfg.theta_fraction
        self.p, self.q = theta.numerator, theta.denominator
        self.k = self.cfg.k
        if self.cfg.mode == "oph":
            self.w_match, self.w_empty, self.need = self.q, self.p, self.k * self.p
        else:
            self.w_match, self.w_empty = 1, 0
            self.need = monoactive.threshold_count(self.k, (self.p, self.q))
        self.counters = PassageCounters()
        self._tf = cast(monoactive.TfMode, self.cfg.tf_mode)  # validated by PassageConfig
        self.cache = ListCache(config.cache.lists_mb << 20, self.cfg.max_list)
        self._staged: int | None = None  # a page staged but not committed yet
        # lists found long by reading them, marked by the next page staged, so that a later
        # read (after the list left memory) learns it from one entry, not max_list + 1
        self._new_markers: dict[bytes, int] = {}
        # lists read with many unpacked entries, packed by the next page staged:
        # prefix -> (run key, run, keys it replaces)
        self._new_runs: dict[bytes, tuple[bytes, bytes, list[bytes]]] = {}
        self.pack_min = PACK_MIN  # runtime only: packing changes the layout, not the lists
        self.chain_params = span_refine.DEFAULT  # how spans are refined (reporting only)

    # -- units: the tokens the alignment sees ------------------------------------------------
    def units(self, hashes: U64) -> U64:
        """Word hashes, or hashes of w-word shingles (unit i covers words [i, i + w))."""
        w = self.cfg.shingle
        if w == 1 or len(hashes) < w:
            return hashes if w == 1 else np.empty(0, dtype=np.uint64)
        acc = np.zeros(len(hashes) - w + 1, dtype=np.uint64)
        for x in range(w):
            acc = mix64(acc ^ hashes[x : len(hashes) - w + 1 + x], _SHINGLE_SALT + x)
        return acc

    def _word_range(self, start: int, end: int) -> tuple[int, int]:
        return start, end - 1 + self.cfg.shingle

    # -- windows and sketches ---------------------------------------------------------------
    def windows(self, units: U64) -> Rects:
        if self.cfg.mode == "oph":
            w = compact_windows(oph_values(units), self.k)
            emp = w.empty
            return Rects(w.bin, w.value, w.l, np.where(emp, w.r, w.c), np.where(emp, w.l, w.c),
                         w.r, emp)
        mw = monoactive.compact_windows(units, self.k, "weighted", tf=self._tf)
        return Rects(mw.fn.astype(np.int64), mw.key, mw.a.astype(np.int64),
                     mw.b.astype(np.int64), mw.c.astype(np.int64), mw.d.astype(np.int64),
                     np.zeros(len(mw), dtype=np.bool_))

    def sketch(self, units: U64) -> tuple[U64, npt.NDArray[np.bool_]]:
        if self.cfg.mode == "oph":
            return oph_sketch(oph_values(units), self.k)
        keys = monoactive.query_minhashes(units, self.k, "weighted", tf=self._tf)
        return keys, np.zeros(self.k, dtype=np.bool_)

    # -- the query --------------------------------------------------------------------------
    def sketch_page(self, hashes: U64, tokens: Tokens) -> PassageState:
        """Everything the passage index needs from the page alone (no store access)."""
        if not self.cfg.enabled:
            return PassageState(None, 0)
        units = self.units(hashes)
        n = len(units)
        if not self.cfg.enabled or n == 0 or n + self.cfg.shingle - 1 < self.cfg.min_len:
            return PassageState(None, n)
        starts = np.asarray(_passage_starts(n, self.cfg.query_len, self.cfg.stride),
                            dtype=np.int64)
        ends = np.minimum(n, starts + self.cfg.query_len)
        keys, empty = self._sketches(units, starts, ends)
        return PassageState(self.windows(units), n, _pack_positions(tokens, units), starts, ends,
                            keys, empty)

    def search(
        self, hashes: U64, tokens: Tokens, ordinal: int, exclude: frozenset[int] = frozenset()
    ) -> tuple[list[tuple[int, list[Span]]], PassageState]:
        """Spans of this page copied from pages before ``ordinal``, per earlier page; pages
        in ``exclude`` (already matched as near duplicates) are not aligned."""
        from dupalign.align import spans_of_hits  # align builds on this module

        state = self.sketch_page(hashes, tokens)
        hits = self.align_state(state, ordinal, exclude)
        units = None if state.positions is None else _unpack_positions(state.positions)[2]
        return spans_of_hits(self, hits, state.starts, state.ends, tokens, units), state

    def align_state(
        self, state: PassageState, before: int, exclude: frozenset[int] = frozenset()
    ) -> list[tuple[int, int, int, int, float]]:
        """``(passage, page, start, end, estimate)`` of ``state``'s passages (see
        ``align_passages``)."""
        if state.rects is None:
            return []
        return self._align(state, self.find_tasks(state, before, exclude))

    def align_passages(
        self, units: U64, starts: I64, ends: I64, before: int,
        exclude: frozenset[int] = frozenset(),
    ) -> list[tuple[int, int, int, int, float]]:
        """Align the passages ``units[starts[p]:ends[p]]`` against the pages before
        ``before``: ``(passage, page, start, end, estimate)`` for every longest range
        ``[start, end)`` of the page's units whose estimate is ≥ θ (dupalign.passage_align
        has the steps)."""
        keys, empty = self._sketches(units, starts, ends)
        state = PassageState(None, len(units), b"", starts, ends, keys, empty)
        return self._align(state, self.find_tasks(state, before, exclude))

    def _align(self, state: PassageState, t: Tasks | None
               ) -> list[tuple[int, int, int, int, float]]:
        if t is None:
            return []
        h_t, h_s, h_e, h_x = self.scan(t)
        return list(zip(t.t_p[h_t].tolist(), t.t_o[h_t].tolist(), h_s.tolist(), h_e.tolist(),
                        h_x.tolist(), strict=True))

    def scan(self, t: Tasks) -> tuple[I64, I64, I64, npt.NDArray[np.float64]]:
        """The align stage's kernels: the viability filter (from the matched windows alone:
        on llvm-13/14 it drops 62 % of the tasks before their empty windows are gathered),
        then the interval scan of the tasks left; hits name tasks of ``t``."""
        keep = np.flatnonzero(passage_align.viable_tasks(
            t.t_p, t.t_o, t.lid, t.count, t.start, t.ords, t.rects, t.q_empty, self.w_match,
            self.w_empty, self.need))
        h_t, h_s, h_e, h_x = passage_align.scan_tasks(
            t.t_p[keep], t.t_o[keep], t.lid, t.count, t.start, t.ords, t.rects, t.q_empty,
            t.empty_keys, t.empty_off, t.empty_lr, self.w_match, self.w_empty, self.need,
            self.cfg.min_len, self.k)
        return keep[h_t], h_s, h_e, h_x

    def find_tasks(
        self, state: PassageState, before: int, exclude: frozenset[int] = frozenset()
    ) -> Tasks | None:
        """The index's part of the passage query: the inverted lists named by the passages'
        sketches, candidate pages per passage, the candidates' empty windows
        (dupalign.passage_align has the steps). None if no task is left."""
        assert state.keys is not None and state.empty is not None
        keys, empty = state.keys, state.empty
        self.counters.passages += len(keys)
        n_p, k = keys.shape
        # the distinct inverted lists named by the sketches, in key order
        rows, bins = np.nonzero(~empty)
        l_bins, l_keys, inverse = _distinct_lists(bins.astype(np.int64), keys[rows, bins])
        lid = np.full((n_p, k), -1, dtype=np.int64)
        lid[rows, bins] = inverse
        reader = self.store.prefix_reader("oph")  # made now: sees every earlier page
        slots = self._list_slots(reader, l_bins, l_keys)
        # a stop list is cached as a flag with no entries (n_before 0 below): its bin is
        # neither a collision nor an empty bin
        named = lid >= 0
        self.counters.stopped_bins += int(np.count_nonzero(self.cache.is_long(slots)[lid[named]]))
        start, length = self.cache.s_start[slots], self.cache.s_len[slots]
        ords, rects = self.cache.ords, self.cache.rects
        n_before = passage_align.entries_before(start, length, ords, before)
        excl = np.array(sorted(exclude), dtype=np.int64)
        t_p, t_o, pruned = passage_align.select_candidates(
            lid, n_before, start, ords, empty, excl, self.w_match, self.w_empty, self.need,
            self.cfg.max_candidates)
        # the viability filter runs in align (``scan``), off this thread: the index reads
        # the empty windows of every candidate left here, which costs less than the filter
        self.counters.candidates_pruned += pruned
        self.counters.candidates_scanned += len(t_p)
        if not len(t_p):
            return None
        empty_keys, empty_off, empty_lr = self._empty_windows(t_p, t_o, empty)
        # the lists cut down to the task pages' entries: all that align reads of them
        entries = _ranks(start, n_before)
        list_of = np.repeat(np.arange(len(start)), n_before)
        keep = np.isin(ords[entries], t_o)
        entries, list_of = entries[keep], list_of[keep]
        used, list_of = np.unique(list_of, return_inverse=True)
        remap = np.zeros(len(start), dtype=np.int64)  # lists left empty share list 0
        remap[used] = np.arange(1, len(used) + 1)
        count = np.concatenate(([0], np.bincount(list_of, minlength=len(used))))
        lid = np.where(lid >= 0, remap[np.maximum(lid, 0)], -1)
        return Tasks(t_p, t_o, lid, empty, np.cumsum(count) - count, count, ords[entries],
                     rects[entries].astype(np.int32), empty_keys, empty_off, empty_lr)

    def _sketches(self, units: U64, starts: I64, ends: I64) -> tuple[U64, npt.NDArray[np.bool_]]:
        """The sketch of every passage: ``(mins[P, k], empty[P, k])``."""
        if self.cfg.mode == "oph":
            hvals = oph_values(units)
            return passage_align.passage_sketches(hvals, oph_bins(hvals, self.k), starts, ends,
                                                  self.k)
        keys = np.stack([self.sketch(units[s:e])[0] for s, e in
                         zip(starts.tolist(), ends.tolist(), strict=True)])
        return keys, np.zeros(keys.shape, dtype=np.bool_)

    # -- store reads ------------------------------------------------------------------------
    def _list_slots(self, reader: PrefixReader, bins: I64, keys: U64) -> I64:
        """Cache slots of the inverted lists (bin, key); the lists not in memory are read
        from the store (whole, or only flagged when longer than ``max_list``: a stop
        list)."""
        self._forget_uncommitted()
        slots = self.cache.lookup(bins, keys)
        miss = np.flatnonzero(slots < 0)
        self.counters.lists_cached += len(slots) - len(miss)
        if not len(miss):
            return slots
        long = np.zeros(len(miss), dtype=np.bool_)
        n_run = np.zeros(len(miss), dtype=np.int64)
        n_single = np.zeros(len(miss), dtype=np.int64)
        runs: list[npt.NDArray[Any]] = []
        key_bytes: list[bytes] = []
        values: list[bytes] = []
        to_pack: list[tuple[int, bytes, list[bytes]]] = []
        max_list = self.cfg.max_list
        for y, (b, key) in enumerate(zip(bins[miss].tolist(), keys[miss].tolist(),
                                         strict=True)):
            prefix = _BIN.pack(b) + u64(key)
            ks, vs = reader.items(prefix, max_list + 1, header=True)
            self.counters.keys_read += len(ks)
            if ks and len(ks[0]) == len(prefix):  # the list's long marker
                self.counters.entries_read += 1
                if read_u64(vs[0]) > max_list:
                    long[y] = True
                    self.counters.long_lists += 1
                    continue
                # marked by a store of format <= 4, where max_list was not frozen and may
                # have been smaller: read the list after all
                ks, vs = reader.items(prefix, max_list + 2)
                ks, vs = ks[1:], vs[1:]
                self.counters.keys_read += len(ks)
            replaced: list[bytes] = []
            run = np.empty(0, dtype=_RUN)
            if ks and ks[0][-4:] == _RUN_SEQ:
                run = np.frombuffer(vs[0], dtype=_RUN)
                replaced = ks[:1]
                ks, vs = ks[1:], vs[1:]
            n = len(run) + len(ks)
            self.counters.entries_read += n
            if n > max_list:
                long[y] = True
                self.counters.long_lists += 1
                self._new_markers[prefix] = n
                continue
            if len(run):
                runs.append(run)
            if len(ks) >= max(self.pack_min, len(run) // 4):
                to_pack.append((y, prefix, replaced + ks))
            n_run[y] = len(run)
            n_single[y] = len(ks)
            key_bytes += ks
            values += vs
        self.counters.lists_read += len(miss)
        off, ords, rects = _assemble_lists(n_run, runs, n_single, key_bytes, values)
        for y, prefix, replaced in to_pack:
            packed = np.empty(int(off[y + 1] - off[y]), dtype=_RUN)
            packed["ordinal"] = ords[off[y] : off[y + 1]]
            packed["rect"] = rects[off[y] : off[y + 1]]
            last = int(packed["ordinal"][-1])
            self._new_runs[prefix] = (prefix + u64(last) + _RUN_SEQ, packed.tobytes(), replaced)
        slots[miss] = self.cache.insert(bins[miss], keys[miss], long, off, ords, rects)
        return slots

    def _empty_windows(
        self, t_p: I64, t_o: I64, empty: npt.NDArray[np.bool_]
    ) -> tuple[I64, I64, I64]:
        """The candidates' empty windows in their passages' empty bins, as a CSR array keyed
        by ``page << 16 | bin`` with (l, r) rows: one multi-get for the whole page."""
        none = np.empty((0, 2), dtype=np.int64)
        if not self.w_empty:
            return np.empty(0, dtype=np.int64), np.zeros(1, dtype=np.int64), none
        task, b = np.nonzero(empty[t_p])
        want = np.unique((t_o[task] << passage_align.EMPTY_KEY_SHIFT) | b)
        return (want, *self.read_empty_windows(want))

    def read_empty_windows(self, want: I64) -> tuple[I64, I64]:
        """The empty windows under the keys ``page << 16 | bin`` (ascending), as CSR
        ``(off, rows)``: one multi-get."""
        ids = np.empty(len(want), dtype=[("ordinal", ">u8"), ("bin", ">u2")])
        ids["ordinal"] = want >> passage_align.EMPTY_KEY_SHIFT
        ids["bin"] = want & ((1 << passage_align.EMPTY_KEY_SHIFT) - 1)
        raw = ids.tobytes()
        size = ids.dtype.itemsize
        found = self.store.multi_get(
            "oph_empty", [raw[x : x + size] for x in range(0, len(raw), size)])
        values = [v or b"" for v in found]
        off = np.zeros(len(values) + 1, dtype=np.int64)
        np.cumsum([len(v) // (2 * _RECT.itemsize) for v in values], out=off[1:])
        rows = np.frombuffer(b"".join(values), dtype=_RECT).reshape(-1, 2).astype(np.int64)
        return off, rows

    # -- spans ------------------------------------------------------------------------------
    def _spans(self, other: int, hits: list[_Hit], tokens: Tokens, units: U64) -> list[Span]:
        """The spans reported against one earlier page: the scan's hits merged into maximal
        spans or, with ``refine``, the tight alignments inside them (dupalign.span_refine);
        each with its estimate and the exact similarity of its units."""
        raw = self.store.get("positions", u64(other))
        if raw is None:
            return []
        o_starts, o_ends, o_units = _unpack_positions(raw)
        # both sides' units as stored: their hashes' low 32 bits
        q_units = units & np.uint64(0xFFFFFFFF)
        t_units = None if o_units is None else o_units.astype(np.uint64)
        refined = self.cfg.refine and t_units is not None
        if self.cfg.refine and t_units is not None:
            # never empty: a hit's estimate reaches θ only through a unit both sides share
            pieces = span_refine.refine(
                q_units, t_units, np.array([(h.q_start, h.q_end, h.t_start, h.t_end)
                                            for h in hits], dtype=np.int64), self.chain_params)
            boxes = [(p.q_start, p.q_end, p.t_start, p.t_end) for p in pieces]
            ests = self._estimates(q_units, t_units, boxes)
        else:  # (pages indexed before units were kept have the scan's spans only)
            merged = _merge_hits(hits)
            boxes = [(h.q_start, h.q_end, h.t_start, h.t_end) for h in merged]
            ests = [h.est for h in merged]
        spans = []
        for x, ((q0, q1, t0, t1), est) in enumerate(zip(boxes, ests, strict=True)):
            qs, qe = self._word_range(q0, q1)
            ts, te = self._word_range(t0, t1)
            if refined and x + 1 < len(boxes):  # pieces are disjoint in units, and in
                qe = min(qe, boxes[x + 1][0])  # words too: a last shingle's tail is cut
            sim = (None if t_units is None
                   else span_refine.similarity(q_units[q0:q1], t_units[t0:t1]))
            spans.append(Span(
                tokens=(qs, qe), chars=tokens.char_range(qs, qe),
                match_tokens=(ts, te),
                match_chars=(int(o_starts[ts]), int(o_ends[te - 1])) if te > ts else (0, 0),
                est_jaccard=round(est, 4),
                jaccard=None if sim is None else round(sim.jaccard, 4),
                containment=None if sim is None else round(sim.containment, 4),
                match_containment=None if sim is None else round(sim.match_containment, 4),
            ))
        spans.sort(key=lambda s: s.tokens)
        return spans

    def _estimates(self, a: U64, b: U64, boxes: list[tuple[int, int, int, int]]) -> list[float]:
        """The sketch estimate of each box's two unit ranges ``a[q0:q1]``, ``b[t0:t1]`` (as
        the scan's, without stop lists): OPH N_mat / (k - N_emp), MonoActive matched hash
        functions / k."""
        if self.cfg.mode == "oph":
            return span_refine.oph_estimates(a, b, np.array(boxes, dtype=np.int64), self.k)
        out = []
        for q0, q1, t0, t1 in boxes:
            ka, kb = self.sketch(a[q0:q1])[0], self.sketch(b[t0:t1])[0]
            out.append(int(np.count_nonzero(ka == kb)) / self.k)
        return out

    # -- writes -----------------------------------------------------------------------------
    def stage(self, batch: Batch, ordinal: int, state: PassageState | None) -> None:
        self._forget_uncommitted()
        if state is None or state.rects is None:
            return
        self._staged = ordinal
        for prefix, n in self._new_markers.items():  # true whenever written: lists only grow
            batch.put("oph", prefix, u64(n))
        self._new_markers.clear()
        # entries never change once written, so a run stays true too (and writing it again
        # after a failed page is harmless: same key, same value, deletes of deleted keys)
        for run_key, run, replaced in self._new_runs.values():
            batch.put("oph", run_key, run)
            for key in replaced:
                batch.delete("oph", key)
        self.counters.runs_written += len(self._new_runs)
        self._new_runs.clear()
        r = state.rects
        prefix_ord = u64(ordinal)
        batch.put("positions", prefix_ord, state.positions)
        # windows in lists known to be stop lists are not written: a stop list stays one
        # (it already holds more than max_list entries), and nothing reads its entries
        nonempty = np.flatnonzero(~r.empty)
        known_stop = self.cache.is_long(self.cache.lookup(r.bin[nonempty], r.key[nonempty],
                                                          touch=False))
        self.counters.stop_entries_skipped += int(np.count_nonzero(known_stop))
        seq = np.flatnonzero(~known_stop)  # window numbers stay those of all the windows
        nonempty = nonempty[seq]
        keys = np.empty(len(nonempty), dtype=_LIST_KEY)
        keys["bin"], keys["key"] = r.bin[nonempty], r.key[nonempty]
        keys["ordinal"], keys["seq"] = ordinal, seq
        packed = np.stack((r.i_lo, r.i_hi, r.j_lo, r.j_hi), axis=1)[nonempty].astype(_RECT)
        ks, vs = keys.tobytes(), packed.tobytes()
        kw, vw = _LIST_KEY.itemsize, packed.itemsize * 4
        batch.put_many("oph", [ks[x * kw : (x + 1) * kw] for x in range(len(nonempty))],
                       [vs[x * vw : (x + 1) * vw] for x in range(len(nonempty))])
        # the forward record: the lists the page's windows went into, for its removal
        l_bins, l_keys, _ = _distinct_lists(r.bin[nonempty], r.key[nonempty])
        fwd = np.empty(len(l_bins), dtype=_LIST_ID)
        fwd["bin"], fwd["key"] = l_bins, l_keys
        batch.put("lists_of", prefix_ord, fwd.tobytes())
        emp = np.flatnonzero(r.empty)
        if len(emp):
            emp = emp[np.argsort(r.bin[emp], kind="stable")]  # one value per bin, rows in order
            bins = r.bin[emp]
            cuts = np.flatnonzero(np.diff(bins)) + 1
            lo = np.concatenate(([0], cuts)).tolist()
            hi = np.concatenate((cuts, [len(emp)])).tolist()
            data = np.stack((r.i_lo[emp], r.j_hi[emp]), axis=1).astype(_RECT).tobytes()
            w = 2 * _RECT.itemsize
            for a, z, b in zip(lo, hi, bins[lo].tolist(), strict=True):
                batch.put("oph_empty", prefix_ord + _BIN.pack(b), data[a * w : z * w])

    def _forget_uncommitted(self) -> None:
        """A page staged but never committed (its processing failed after ``stage``) may or
        may not be in the store, so the lists in memory may lack its windows: drop them
        (they are read again)."""
        if self._staged is not None:
            self.cache.clear()
            self._staged = None

    def commit(self, ordinal: int, state: PassageState | None) -> None:
        """After the page's batch is written: append its windows to the lists in memory,
        so that they stay equal to the store, then keep the memory budget."""
        if state is not None and state.rects is not None:
            r = state.rects
            nonempty = np.flatnonzero(~r.empty)
            rects = np.stack((r.i_lo, r.i_hi, r.j_lo, r.j_hi), axis=1)[nonempty]
            self.counters.long_lists += self.cache.append_page(
                np.ascontiguousarray(r.bin[nonempty]), np.ascontiguousarray(r.key[nonempty]),
                ordinal, rects)
        self._staged = None
        self.cache.trim()

    # -- removal (revisits, deletes, retention) --------------------------------------------
    def stage_removal(self, batch: Batch, ordinals: list[int]) -> Removal:
        """Delete every entry of the pages ``ordinals`` from ``batch``: their windows in the
        inverted lists (entries of their own and inside packed runs, which are rewritten
        without them), their empty windows, token offsets and forward records. The lists
        come from the pages' ``lists_of`` records; a page indexed before them (store
        format <= 5) is found by a scan of every list. ``commit_removal`` then updates the
        lists in memory. THE one place that knows how a page sits in the passage layout.

        Exact except for stop lists: a list that once grew past ``max_list`` stays a stop
        list (its later windows were never written), whatever is removed from it."""
        dead = np.unique(np.asarray(ordinals, dtype=np.int64))
        keys = [u64(int(o)) for o in dead]
        records = self.store.multi_get("lists_of", keys)
        positions = self.store.multi_get("positions", keys)
        # per list, the first and last removed page in it: the entries between are read
        # (those of pages still stored among them are left; retention removes the oldest
        # pages, so there are none then)
        w = _LIST_ID.itemsize
        span: dict[bytes, tuple[int, int]] = {}
        for o, r in zip(dead.tolist(), records, strict=True):
            for i in range(0, len(r or b""), w):
                p = r[i : i + w]  # type: ignore[index]
                lo, _ = span.get(p, (o, o))
                span[p] = (lo, o)  # ordinals ascend
        if any(r is None and p is not None for r, p in zip(records, positions, strict=True)):
            for p in self._lists_holding(dead):  # pages of an older format
                span[p] = (int(dead[0]), int(dead[-1]))
        reader = self.store.prefix_reader("oph")
        gone = set(dead.tolist())
        for prefix, (lo, hi) in sorted(span.items()):
            self._new_runs.pop(prefix, None)  # read before the removal: they hold the pages
            # the range's own entries, and the list's run if it reaches the range
            # (a run is keyed by its last ordinal: at most one, then later pages)
            list_keys, values = reader.items_between(prefix, prefix + u64(lo),
                                                     prefix + u64(hi + 1))
            for key, value in zip(list_keys, values, strict=True):
                if key.endswith(_RUN_SEQ):
                    run = np.frombuffer(value, dtype=_RUN)
                    keep = ~np.isin(run["ordinal"], dead)
                    if keep.all():
                        continue
                    batch.delete("oph", key)
                    if keep.any():  # its key names its last ordinal
                        last = int(run["ordinal"][keep][-1])
                        batch.put("oph", prefix + u64(last) + _RUN_SEQ,
                                  run[keep].tobytes())
                elif read_u64(key, len(prefix)) in gone:
                    batch.delete("oph", key)
        for lo, hi in ordinal_ranges(dead):
            delete_ordinals(batch, ("positions", "lists_of"), lo, hi)
            batch.delete_range("oph_empty", u64(lo), u64(hi + 1))
        named = np.frombuffer(b"".join(sorted(span)), dtype=_LIST_ID)
        return Removal(dead, named["bin"].astype(np.int64), named["key"].astype(np.uint64))

    def commit_removal(self, removal: Removal) -> None:
        """After the removal's batch is written: the cached lists without those pages."""
        self.cache.remove_entries(removal.bins, removal.keys, removal.ordinals)

    def _lists_holding(self, dead: I64) -> set[bytes]:
        """Every list with an entry of the pages ``dead`` (a scan of the whole index: for
        pages indexed without a forward record)."""
        found = set()
        for key, value in self.store.items("oph"):
            if len(key) <= 10:
                continue
            ords = (np.frombuffer(value, dtype=_RUN)["ordinal"] if key.endswith(_RUN_SEQ)
                    else np.array([read_u64(key, 10)]))
            if np.isin(ords, dead).any():
                found.add(bytes(key[:10]))
        return found

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
        }


def _distinct_lists(bins: I64, keys: U64) -> tuple[I64, U64, I64]:
    """The distinct lists (bin, key) in key order, and the index of each input among them
    (np.unique on a structured array sorts several times slower)."""
    order = np.lexsort((keys, bins))
    b, k = bins[order], keys[order]
    first = np.ones(len(order), dtype=np.bool_)
    first[1:] = (b[1:] != b[:-1]) | (k[1:] != k[:-1])
    inverse = np.empty(len(order), dtype=np.int64)
    inverse[order] = np.cumsum(first) - 1
    return np.ascontiguousarray(b[first]), np.ascontiguousarray(k[first]), inverse


def _merge_hits(hits: list[_Hit]) -> list[_Hit]:
    """Maximal spans: hits whose query ranges and text ranges both overlap or touch are
    merged, transitively (repeated sweeps until nothing merges; each sweep keeps the spans
    still open on the text axis and merges a hit into every open one it overlaps)."""
    spans = [_Hit(h.q_start, h.q_end, h.t_start, h.t_end, h.est) for h in hits]
    while True:
        spans.sort(key=lambda h: (h.t_start, h.q_start))
        merged: list[_Hit] = []
        open_: list[_Hit] = []
        for h in spans:
            open_ = [o for o in open_ if o.t_end >= h.t_start]
            into = [o for o in open_ if h.q_start <= o.q_end and h.q_end >= o.q_start]
            if not into:
                merged.append(h)
                open_.append(h)
                continue
            target = into[0]
            for o in [h, *into[1:]]:
                target.q_start = min(target.q_start, o.q_start)
                target.q_end = max(target.q_end, o.q_end)
                target.t_start = min(target.t_start, o.t_start)
                target.t_end = max(target.t_end, o.t_end)
                target.est = max(target.est, o.est)
            for o in into[1:]:
                merged.remove(o)
                open_.remove(o)
        if len(merged) == len(spans):
            return merged
        spans = merged


# The positions record of a page: its tokens' (start, end) character offsets as int32
# pairs, then the low 32 bits of its unit hashes (for span refinement and exact similarity),
# their number and this marker; records written before units were kept end with an offset
# (never -1).
_UNITS_MARK = b"\xff\xff\xff\xff"


def _pack_positions(tokens: Tokens, units: U64) -> bytes:
    both = np.empty(2 * len(tokens), dtype="<i4")
    both[0::2] = tokens.starts
    both[1::2] = tokens.ends
    low = (units & np.uint64(0xFFFFFFFF)).astype("<u4")
    return both.tobytes() + low.tobytes() + struct.pack("<i", len(low)) + _UNITS_MARK


def _unpack_positions(data: bytes) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32],
                                            npt.NDArray[np.uint32] | None]:
    """Token starts, ends and unit hashes (None in records without them)."""
    units = None
    if data.endswith(_UNITS_MARK):
        (n_units,) = struct.unpack_from("<i", data, len(data) - 8)
        at = len(data) - 8 - 4 * n_units
        units = np.frombuffer(data, dtype="<u4", offset=at, count=n_units)
        data = data[:at]
    both = np.frombuffer(data, dtype="<i4")
    return both[0::2], both[1::2], units


def _assemble_lists(n_run: I64, runs: list[npt.NDArray[Any]], n_single: I64,
                    keys: list[bytes], values: list[bytes]) -> tuple[I64, I64, I64]:
    """Lists read from the store as CSR ``(offsets, ordinals, rectangles)``: list y is its
    run's ``n_run[y]`` entries (``runs`` holds those of the lists that have one, in order),
    then its ``n_single[y]`` entries stored one per key (``keys``/``values``, in order)."""
    off = np.zeros(len(n_run) + 1, dtype=np.int64)
    np.cumsum(n_run + n_single, out=off[1:])
    single_ords = np.frombuffer(b"".join(keys), dtype=_LIST_KEY)["ordinal"].astype(np.int64)
    single_rects = _unpack_rects(values)
    if not runs:
        return off, single_ords, single_rects
    ords = np.empty(int(off[-1]), dtype=np.int64)
    rects = np.empty((int(off[-1]), 4), dtype=np.int64)
    run = np.concatenate(runs)
    at_run = _ranks(off[:-1], n_run)
    at_single = _ranks(off[:-1] + n_run, n_single)
    ords[at_run], rects[at_run] = run["ordinal"], run["rect"]
    ords[at_single], rects[at_single] = single_ords, single_rects
    return off, ords, rects


def _ranks(starts: I64, counts: I64) -> I64:
    """``starts[y] + i`` for i in range(counts[y]), for every y in order."""
    first = np.cumsum(counts) - counts
    return np.repeat(starts - first, counts) + np.arange(int(counts.sum()), dtype=np.int64)


def _unpack_rects(values: list[bytes]) -> I64:
    if not values:
        return np.empty((0, 4), dtype=np.int64)
    return np.frombuffer(b"".join(values), dtype=_RECT).reshape(-1, 4).astype(np.int64)


def _passage_starts(n: int, length: int, stride: int) -> list[int]:
    """Starts of query passages covering [0, n): every ``stride``, the last one flush right."""
    if n <= length:
        return [0]
    starts = list(range(0, n - length + 1, stride))
    if starts[-1] != n - length:
        starts.append(n - length)
    return starts
