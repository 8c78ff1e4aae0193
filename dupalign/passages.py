"""Copied passages: a RocksDB index of compact windows and the streaming passage query.

Every page's compact windows are indexed: non-empty windows in inverted lists keyed by
(bin, min-hash), empty windows (OPH only) by (page, bin). A new page is cut into query
passages of ``query_len`` tokens with a ``stride``; each passage is aligned against the
earlier pages whose windows collide with its sketch:

1. read the inverted lists of the passage's min-hashes (cached per page: passages overlap);
2. count distinct collided bins per earlier page and drop the pages that cannot reach the
   threshold even if every empty bin of the passage collided (DESIGN.md: this order is what
   makes queries scale, since empty windows are read only for the pages left);
3. read those pages' empty windows in the passage's empty bins, and run the interval scan
   over the colliding rectangles: the longest subsequences whose estimate is ≥ θ.

Hits on one earlier page are merged into maximal spans. Thresholds are exact integers:
θ = p/q, a matched non-empty window weighs q, a jointly empty bin weighs p, and a
subsequence is similar when its weight reaches k·p (OPH: N_mat / (k − N_emp) ≥ θ).
MonoActive (``mode = "weighted"``) has no empty windows: weight 1 each, threshold ⌈kθ⌉.
"""

from __future__ import annotations

import struct
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from dupalign import monoactive
from dupalign.config import EngineConfig
from dupalign.hashing import mix64
from dupalign.interval_scan import scan_rectangles
from dupalign.match import Span
from dupalign.oph import compact_windows, oph_sketch, oph_values
from dupalign.store import Batch, Store, u64
from dupalign.text import Tokens

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
_BIN = struct.Struct(">H")
_SEQ = struct.Struct(">I")
_RECT = np.dtype("<i4")
# key of an inverted-list entry: bin ‖ min-hash ‖ ordinal ‖ window number, big-endian
_LIST_KEY = np.dtype([("bin", ">u2"), ("key", ">u8"), ("ordinal", ">u8"), ("seq", ">u4")])
_SHINGLE_SALT = 0x5348494E
_MAX_LONG_MEMO = 1 << 20  # long-list keys remembered (≈100 MB at most)
_HOT_ENTRIES = 1 << 21  # list entries kept in memory (≈ 80 MB)


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
    """What one page adds to the index, computed by ``search`` and written by ``stage``."""

    rects: Rects | None
    n_units: int
    positions: bytes = b""  # the page's token character offsets, for spans that cite it


@dataclass
class PassageCounters:
    passages: int = 0
    lists_read: int = 0
    entries_read: int = 0
    candidates_pruned: int = 0
    candidates_scanned: int = 0
    long_lists: int = 0
    lists_cached: int = 0
    inexact_passages: int = 0  # passages with >= m_min long lists (candidates may be missed)


@dataclass
class _Hit:
    q_start: int
    q_end: int
    t_start: int
    t_end: int
    est: float


@dataclass
class _PageCache:
    """Per-query-page caches: passages overlap, so lists and empty windows repeat."""

    lists: dict[tuple[int, int], tuple[I64, I64] | None] = field(default_factory=dict)
    page_lists: dict[tuple[int, int, int], I64] = field(default_factory=dict)
    empties: dict[tuple[int, int], npt.NDArray[np.int32]] = field(default_factory=dict)


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
        self._long: set[tuple[int, int]] = set()  # (bin, key) lists known to be long
        # Recently read short lists, kept equal to the store by ``commit`` (LRU by entries).
        self._hot: OrderedDict[tuple[int, int], tuple[I64, I64]] = OrderedDict()
        self._hot_entries = 0

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
    def search(
        self, hashes: U64, tokens: Tokens, ordinal: int, exclude: frozenset[int] = frozenset()
    ) -> tuple[list[tuple[int, list[Span]]], PassageState]:
        """Spans of this page copied from pages before ``ordinal``, per earlier page; pages
        in ``exclude`` (already matched as near duplicates) are not aligned."""
        units = self.units(hashes)
        n = len(units)
        if not self.cfg.enabled or n == 0 or n + self.cfg.shingle - 1 < self.cfg.min_len:
            return [], PassageState(None, n)
        rects = self.windows(units)
        state = PassageState(rects, n, _pack_positions(tokens))
        cache = _PageCache()
        hits: dict[int, list[_Hit]] = defaultdict(list)
        for start in _passage_starts(n, self.cfg.query_len, self.cfg.stride):
            end = min(n, start + self.cfg.query_len)
            self.counters.passages += 1
            for other, t_start, t_end, est in self._align_passage(units[start:end], ordinal,
                                                                   cache, exclude):
                hits[other].append(_Hit(start, end, t_start, t_end, est))
        out = []
        for other in sorted(hits):
            spans = self._spans(other, hits[other], tokens)
            if spans:
                out.append((other, spans))
        return out, state

    def _align_passage(
        self, q_units: U64, before: int, cache: _PageCache,
        exclude: frozenset[int] = frozenset(),
    ) -> list[tuple[int, int, int, float]]:
        keys, empty = self.sketch(q_units)
        lists: list[tuple[I64, I64]] = []
        long_keys: list[tuple[int, int]] = []
        for b in np.flatnonzero(~empty).tolist():
            found = self._list(b, int(keys[b]), before, cache)
            if found is None:
                long_keys.append((b, int(keys[b])))
            elif len(found[0]):
                lists.append(found)
        n_empty = int(np.count_nonzero(empty))
        # A page reaching the threshold matches at least m_min bins; while fewer than m_min
        # lists are long, it must appear in a short one, so the candidates are exact.
        m_min = -(-(self.need - self.w_empty * n_empty) // self.w_match)
        if len(long_keys) >= m_min:
            self.counters.inexact_passages += 1
        if not lists:
            return []  # only common units collide: boilerplate, not a copied passage
        ords = np.concatenate([o for o, _ in lists])
        rects = np.concatenate([r for _, r in lists])
        # distinct collided bins per earlier page: a page may hold several windows of one
        # (bin, key) list, so count (page, list) pairs once; long lists may add one each
        list_no = np.repeat(np.arange(len(lists)), [len(o) for o, _ in lists])
        pairs = np.unique(ords * len(lists) + list_no)
        pages, n_mat = np.unique(pairs // len(lists), return_counts=True)
        n_mat = n_mat + len(long_keys)
        reach = self.w_match * n_mat + self.w_empty * n_empty
        ok = reach >= self.need
        if exclude:
            ok &= ~np.isin(pages, np.fromiter(exclude, dtype=np.int64))
        self.counters.candidates_pruned += int(np.count_nonzero(~ok))
        pages, n_mat = pages[ok], n_mat[ok]
        if len(pages) > self.cfg.max_candidates:
            top = np.argsort(-n_mat, kind="stable")[: self.cfg.max_candidates]
            pages = np.sort(pages[top])
        if not len(pages):
            return []
        order = np.argsort(ords, kind="stable")
        ords, rects = ords[order], rects[order]
        lo = np.searchsorted(ords, pages, side="left")
        hi = np.searchsorted(ords, pages, side="right")
        empty_bins = np.flatnonzero(empty).tolist()
        results = []
        for page, a, b in zip(pages.tolist(), lo.tolist(), hi.tolist(), strict=True):
            self.counters.candidates_scanned += 1
            matched = rects[a:b]
            if long_keys:
                extra = [self._page_windows(lb, lk, page, cache) for lb, lk in long_keys]
                matched = np.concatenate([matched, *extra])
            results.extend(self._scan_page(page, matched, empty_bins, cache))
        return results

    def _scan_page(
        self, page: int, matched: I64, empty_bins: list[int], cache: _PageCache
    ) -> list[tuple[int, int, int, float]]:
        """Align against one earlier page: its matched non-empty windows (rectangles) plus
        its empty windows in the passage's empty bins."""
        rect = matched
        is_empty = np.zeros(len(rect), dtype=np.bool_)
        if self.w_empty and empty_bins:
            emp = self._empty_windows(page, empty_bins, cache)
            if len(emp):
                rect = np.concatenate((rect, emp[:, [0, 1, 0, 1]]))
                is_empty = np.concatenate((is_empty, np.ones(len(emp), dtype=np.bool_)))
        weights = np.where(is_empty, self.w_empty, self.w_match).astype(np.int64)
        if int(weights.sum()) < self.need:
            return []
        ranges = scan_rectangles(rect[:, 0], rect[:, 1], rect[:, 2], rect[:, 3], weights,
                                 self.need, self.cfg.min_len)
        if not ranges:
            return []
        # estimate of each reported subsequence: the windows covering cell (start, end - 1)
        bounds = np.asarray(ranges, dtype=np.int64)
        i, j = bounds[:, :1], bounds[:, 1:] - 1
        cover = ((rect[:, 0] <= i) & (i <= rect[:, 1]) & (rect[:, 2] <= j) & (j <= rect[:, 3]))
        n_emp = np.count_nonzero(cover & is_empty, axis=1)
        n_match = np.count_nonzero(cover, axis=1) - n_emp
        denom = self.k - n_emp
        est = np.where(denom > 0, n_match / np.maximum(denom, 1), 0.0)
        return [(page, int(s), int(e), float(x))
                for (s, e), x in zip(ranges, est.tolist(), strict=True)]

    # -- store reads ------------------------------------------------------------------------
    def _list(
        self, b: int, key: int, before: int, cache: _PageCache
    ) -> tuple[I64, I64] | None:
        """The inverted list (bin, key): ordinals and rectangles of pages < ``before``, or
        None when it is longer than ``max_list`` (a common unit: navigation, boilerplate,
        stop phrases), which is then read per candidate page by ``_page_windows``."""
        if (b, key) in cache.lists:
            return cache.lists[(b, key)]
        if (b, key) in self._long:  # lists only grow: once long, always long
            cache.lists[(b, key)] = None
            return None
        full = self._hot.get((b, key))
        if full is not None:
            self._hot.move_to_end((b, key))
            self.counters.lists_cached += 1
        else:
            full = self._read_list(b, key)
        hit: tuple[I64, I64] | None = None
        if full is not None:
            o, r = full
            keep = o < before
            hit = (o, r) if keep.all() else (o[keep], r[keep])
        cache.lists[(b, key)] = hit
        return hit

    def _read_list(self, b: int, key: int) -> tuple[I64, I64] | None:
        """A whole inverted list from the store (None if long), remembered in ``_hot``."""
        entries = self.store.prefix_items("oph", _BIN.pack(b) + u64(key), self.cfg.max_list + 1)
        self.counters.lists_read += 1
        self.counters.entries_read += len(entries)
        if len(entries) > self.cfg.max_list:
            self.counters.long_lists += 1
            self._mark_long(b, key)
            return None
        keys = np.frombuffer(b"".join(k for k, _ in entries), dtype=_LIST_KEY)
        full = (keys["ordinal"].astype(np.int64), _unpack_rects([v for _, v in entries]))
        self._hot[(b, key)] = full
        self._hot_entries += len(entries)
        while self._hot_entries > _HOT_ENTRIES:
            _, (old, _) = self._hot.popitem(last=False)
            self._hot_entries -= len(old)
        return full

    def _mark_long(self, b: int, key: int) -> None:
        if len(self._long) >= _MAX_LONG_MEMO:
            self._long.clear()
        self._long.add((b, key))

    def _page_windows(self, b: int, key: int, page: int, cache: _PageCache) -> I64:
        """One page's windows in a long inverted list: a seek to (bin, key, page)."""
        found = cache.page_lists.get((b, key, page))
        if found is None:
            prefix = _BIN.pack(b) + u64(key) + u64(page)
            found = _unpack_rects([v for _, v in self.store.prefix_items("oph", prefix)])
            cache.page_lists[(b, key, page)] = found
        return found

    def _empty_windows(self, page: int, bins: list[int], cache: _PageCache) -> I64:
        """The page's empty windows in ``bins`` as (l, r) rows (one multi-get for the misses)."""
        missing = [b for b in bins if (page, b) not in cache.empties]
        if missing:
            raws = self.store.multi_get("oph_empty", [u64(page) + _BIN.pack(b) for b in missing])
            for b, raw in zip(missing, raws, strict=True):
                cache.empties[(page, b)] = (np.frombuffer(raw, dtype=_RECT) if raw
                                            else np.empty(0, dtype=_RECT))
        parts = [cache.empties[(page, b)] for b in bins]
        return np.concatenate(parts).reshape(-1, 2).astype(np.int64)

    # -- spans ------------------------------------------------------------------------------
    def _spans(self, other: int, hits: list[_Hit], tokens: Tokens) -> list[Span]:
        """Merge hits on one page into maximal spans (overlapping or touching on both sides)."""
        raw = self.store.get("positions", u64(other))
        if raw is None:
            return []
        o_starts, o_ends = _unpack_positions(raw)
        merged = _merge_hits(hits)
        spans = []
        for h in merged:
            qs, qe = self._word_range(h.q_start, h.q_end)
            ts, te = self._word_range(h.t_start, h.t_end)
            spans.append(Span(
                tokens=(qs, qe), chars=tokens.char_range(qs, qe),
                match_tokens=(ts, te),
                match_chars=(int(o_starts[ts]), int(o_ends[te - 1])) if te > ts else (0, 0),
                est_jaccard=round(h.est, 4),
            ))
        spans.sort(key=lambda s: s.tokens)
        return spans

    # -- writes -----------------------------------------------------------------------------
    def stage(self, batch: Batch, ordinal: int, state: PassageState | None) -> None:
        if state is None or state.rects is None:
            return
        r = state.rects
        prefix_ord = u64(ordinal)
        batch.put("positions", prefix_ord, state.positions)
        nonempty = np.flatnonzero(~r.empty)
        packed = np.stack((r.i_lo, r.i_hi, r.j_lo, r.j_hi), axis=1).astype(_RECT)
        for seq, x in enumerate(nonempty.tolist()):
            key = _BIN.pack(int(r.bin[x])) + u64(int(r.key[x])) + prefix_ord + _SEQ.pack(seq)
            batch.put("oph", key, packed[x].tobytes())
        emp = np.flatnonzero(r.empty)
        if len(emp):
            bins = r.bin[emp]
            for b in np.unique(bins).tolist():
                rows = emp[bins == b]
                pairs = np.stack((r.i_lo[rows], r.j_hi[rows]), axis=1).astype(_RECT)
                batch.put("oph_empty", prefix_ord + _BIN.pack(b), pairs.tobytes())

    def commit(self, ordinal: int, state: PassageState | None) -> None:
        """After the page's batch is written: append its windows to the remembered lists,
        so that ``_hot`` stays equal to the store for every list it holds."""
        if state is None or state.rects is None or not self._hot:
            return
        r = state.rects
        for x in np.flatnonzero(~r.empty).tolist():
            k = (int(r.bin[x]), int(r.key[x]))
            full = self._hot.get(k)
            if full is None:
                continue
            o, rect = full
            row = np.array([[r.i_lo[x], r.i_hi[x], r.j_lo[x], r.j_hi[x]]], dtype=np.int64)
            if len(o) + 1 > self.cfg.max_list:
                del self._hot[k]
                self._hot_entries -= len(o)
                self._mark_long(*k)
            else:
                self._hot[k] = (np.append(o, ordinal), np.concatenate((rect, row)))
                self._hot_entries += 1

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {
            "passage_queries": c.passages,
            "passage_lists_read": c.lists_read,
            "passage_entries_read": c.entries_read,
            "passage_candidates_pruned": c.candidates_pruned,
            "passage_candidates_scanned": c.candidates_scanned,
            "passage_long_lists": c.long_lists,
            "passage_lists_cached": c.lists_cached,
            "passage_inexact_passages": c.inexact_passages,
        }


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


def _pack_positions(tokens: Tokens) -> bytes:
    both = np.empty(2 * len(tokens), dtype="<i4")
    both[0::2] = tokens.starts
    both[1::2] = tokens.ends
    return both.tobytes()


def _unpack_positions(data: bytes) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    both = np.frombuffer(data, dtype="<i4")
    return both[0::2], both[1::2]


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
