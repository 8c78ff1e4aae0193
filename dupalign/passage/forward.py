"""A page's forward record: its compact windows, read by the align stage.

The passage index is split as search engines split theirs: inverted lists of page ordinals
only (key → pages, dupalign.passage.index) to find candidate pages, and one forward record per
page (page → windows) to align against them. The record of a page is two values stored
by its ordinal: ``forward`` (its windows, this module) and ``positions`` (its token
character offsets and unit hashes, dupalign.passage.positions). Align reads the
records of a page's candidates (from the store, a secondary instance of it, or the wire)
and gathers the rectangles its interval scan needs (``gather``); the index never reads
them.

The windows of a page in lists that were already stop lists when it was written are left
out (they are in no list, and a stop list stays one). The windows value: ``<II`` (n
non-empty windows, m empty windows; the first word's top bit ``NARROW`` set: the positions
below are ``<u2``, not ``<i4``), then the non-empty windows' min-hash keys (``<u8[n]``),
rectangles (``[n, 4]``: i_lo, i_hi, j_lo, j_hi, inclusive), the empty windows' rows
(``[m, 2]``: l, r for i, j ∈ [l, r]; with the first word's bit ``STAIRS`` set ``[m, 3]``:
l, i_hi, j_hi for i ∈ [l, i_hi], j ∈ [i, j_hi], the steps of dupalign.passage.weighted_oph),
the non-empty windows' bins (``<u2[n]``) and the empty windows' bins (``<u2[m]``,
ascending; rows of one bin in order). Read back, empty rows are always ``[m, 3]``.
Positions are units of the page, so a page of fewer than 65,536 units is written narrow:
a third fewer bytes (26 to 18 per non-empty window, 10 to 6 per empty one) in the store,
in its log (replayed by every pool process's secondary instance) and in the records sent
to an align stage without the store (store format 7; the records of format 6 stores are
all ``<i4``, read as they are).
Non-empty windows are in window order, so a list's entries gathered from records come in
the order the lists had when they held rectangles. The (bin, key) pairs of the non-empty
windows name every inverted list that holds the page: removing a page deletes ``bin ‖ key
‖ ordinal`` from each (and rewrites the packed runs that hold it).
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.passage.batch_align import EMPTY_KEY_SHIFT  # empty windows: ordinal << 16 | bin

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
I32 = npt.NDArray[np.int32]
U8 = npt.NDArray[np.uint8]
_HEAD = struct.Struct("<II")
NARROW = 1 << 31  # in the first word of a record whose positions are <u2
STAIRS = 1 << 30  # in the first word of a record whose empty rows have an i_hi column
COUNT = STAIRS - 1  # the first word's window count

# ordinals -> their forward (windows) values, None where a page has none
ReadForward = Callable[[list[int]], list[bytes | None]]


def pack_windows(bins: I64, keys: U64, rects: I64, empty: npt.NDArray[np.bool_]) -> bytes:
    """The windows value of a page (``rects[x]``: window x's i_lo, i_hi, j_lo, j_hi)."""
    full = np.flatnonzero(~empty)
    emp = np.flatnonzero(empty)
    emp = emp[np.argsort(bins[emp], kind="stable")]
    return _packed(keys[full], rects[full], rects[emp][:, [0, 1, 3]], bins[full], bins[emp])


def pack_rects(bins: I64, keys: U64, i_lo: I64, i_hi: I64, j_lo: I64, j_hi: I64,
               empty: npt.NDArray[np.bool_], full: I64) -> bytes:
    """``pack_windows`` of the non-empty windows ``full`` (ascending indices) and every
    empty window of a page given as columns (the same bytes, without building the
    rectangles of the windows left out)."""
    emp = np.flatnonzero(empty)
    if not len(emp) and not (i_lo.any() or i_hi.any() or j_lo.any() or j_hi.any()):
        return _packed_bare(keys[full], bins[full])
    # (bins fit in <u2: a stable sort of them is a radix sort)
    emp = emp[np.argsort(bins[emp].astype(np.uint16), kind="stable")]
    rects = np.empty((len(full), 4), dtype=np.int64)
    for c, col in enumerate((i_lo, i_hi, j_lo, j_hi)):
        rects[:, c] = col[full]
    lr = np.empty((len(emp), 3), dtype=np.int64)
    lr[:, 0], lr[:, 1], lr[:, 2] = i_lo[emp], i_hi[emp], j_hi[emp]
    return _packed(keys[full], rects, lr, bins[full], bins[emp])


def fits(dtype: str, *arrays: npt.NDArray[Any]) -> bool:
    """Whether every value of ``arrays`` is in the range of the integer ``dtype``: what a
    record (or a message carrying records' data) may be written narrow in."""
    lo, hi = _int_range(dtype)
    return all(not a.size or (a.min() >= lo and a.max() <= hi) for a in arrays)


@functools.cache
def _int_range(dtype: str) -> tuple[int, int]:
    """(made once a dtype: ``np.iinfo`` cost as much as the page's reductions)"""
    info = np.iinfo(np.dtype(dtype))
    return int(info.min), int(info.max)


def _packed(keys: U64, rects: I64, lr: I64, bins: I64, e_bins: I64) -> bytes:
    """The windows value of the given columns (``lr[m, 3]``: l, i_hi, j_hi), narrow when
    every position fits <u2, with the i_hi column only if some row is not a gap."""
    narrow = fits("<u2", rects, lr)
    positions = "<u2" if narrow else "<i4"
    stairs = bool(np.any(lr[:, 1] != lr[:, 2]))
    if not stairs:
        lr = lr[:, [0, 2]]
    raw = b"".join((
        _HEAD.pack(len(keys) | (NARROW if narrow else 0) | (STAIRS if stairs else 0), len(lr)),
        keys.astype("<u8").tobytes(),
        rects.astype(positions).tobytes(),
        lr.astype(positions).tobytes(),
        bins.astype("<u2").tobytes(),
        e_bins.astype("<u2").tobytes(),
    ))
    return raw + bytes(-len(raw) % 8)  # 8-byte multiples: records concatenate aligned


def _packed_bare(keys: U64, bins: I64) -> bytes:
    """``_packed`` of non-empty windows whose rectangles are all zeros and no empty window
    (a list shard's: it keeps which lists hold the page, not where): the same bytes in a
    few array operations, for a list partition pays them for every page."""
    n = len(keys)
    raw = b"".join((_HEAD.pack(n | NARROW, 0), keys.astype("<u8").tobytes(),
                    bytes(8 * n), bins.astype("<u2").tobytes()))
    return raw + bytes(-len(raw) % 8)


def unpack_windows(raw: bytes) -> tuple[I64, U64, I32, I64, I32]:
    """``(bins, keys, rects[n, 4], empty_bins, empty_lr[m, 3])`` of a windows value (empty
    rows l, i_hi, j_hi)."""
    first, m = _HEAD.unpack_from(raw)
    n, positions = first & COUNT, np.dtype("<u2" if first & NARROW else "<i4")
    cols = 3 if first & STAIRS else 2
    at = _HEAD.size
    keys = np.frombuffer(raw, "<u8", n, at)
    at += 8 * n
    rects = np.frombuffer(raw, positions, 4 * n, at).reshape(n, 4).astype(np.int32)
    at += 4 * positions.itemsize * n
    lr = np.frombuffer(raw, positions, cols * m, at).reshape(m, cols).astype(np.int32)
    at += cols * positions.itemsize * m
    if cols == 2:
        lr = lr[:, [0, 1, 1]]
    bins = np.frombuffer(raw, "<u2", n, at).astype(np.int64)
    e_bins = np.frombuffer(raw, "<u2", m, at + 2 * n).astype(np.int64)
    return bins, keys, rects, e_bins, lr


def gather(pages: I64, records: list[bytes | None], list_bin: I64, list_key: U64,
           empty_want: I64) -> tuple[I64, I64, I64, I32, I64, I64]:
    """What the interval scan reads of the candidate ``pages`` (ascending), from their
    windows values ``records``: per list ``(list_bin[y], list_key[y])`` (list 0 is the
    empty list) the windows of those pages in it, as CSR ``(start, count)`` into ``(ords,
    rects)`` sorted by page then window; and their empty windows under the keys
    ``empty_want`` (``ordinal << 16 | bin``, ascending) as CSR ``(empty_off, empty_lr)``
    (rows l, i_hi, j_hi).
    One kernel over the records as stored (a page's windows are looked up in a hash
    table of the lists: most are in none)."""
    _check_found(pages.tolist(), records)
    buf, at = _joined(cast(list[bytes], records))
    return gather_at(buf, at, pages, list_bin, list_key, empty_want)


def joined_records(pages: list[int], read: ReadForward) -> tuple[U8, I64]:
    """The records of ``pages`` read and joined in one buffer, and where each starts (as
    ``RecordCache.records``, without keeping them)."""
    records = read(pages)
    _check_found(pages, records)
    return _joined(cast(list[bytes], records))


def gather_at(buf: U8, at: I64, pages: I64, list_bin: I64, list_key: U64,
              empty_want: I64) -> tuple[I64, I64, I64, I32, I64, I64]:
    """``gather`` of records already in one buffer: page ``pages[y]``'s at ``buf[at[y]:]``
    (8-byte aligned), as ``RecordCache.records`` returns them."""
    return (*gather_lists_at(buf, at, pages, list_bin, list_key),
            *gather_empty_at(buf, at, pages, empty_want))


def gather_lists_at(buf: U8, at: I64, pages: I64, list_bin: I64,
                    list_key: U64) -> tuple[I64, I64, I64, I32]:
    """The lists' part of ``gather_at``: ``(start, count, ords, rects)``."""
    return _gather_lists(buf, at, pages, list_bin, list_key.view(np.int64))


def gather_empty_at(buf: U8, at: I64, pages: I64, empty_want: I64) -> tuple[I64, I64]:
    """The empty windows' part of ``gather_at``: ``(empty_off, empty_lr)``. Apart from
    the lists' part, so that align reads them only for the tasks left by its viability
    filter."""
    return _gather_empty(buf, at, pages, empty_want)


def _check_found(pages: list[int], records: list[bytes | None]) -> None:
    missing = [o for o, raw in zip(pages, records, strict=True) if raw is None]
    if missing:
        raise KeyError(f"pages {missing[:5]} have no forward record")


def _joined(records: list[bytes]) -> tuple[U8, I64]:
    """Records in one buffer, and where each starts."""
    at = np.zeros(len(records), dtype=np.int64)
    np.cumsum(np.array([len(r) for r in records[:-1]], dtype=np.int64), out=at[1:])
    # writable, as RecordCache's buffer is: a read-only one would be another signature of
    # the gather kernels, compiled and cached again (bytearray's join copies as bytes' does)
    return np.frombuffer(bytearray().join(records), dtype=np.uint8), at


class RecordCache:
    """The forward records of recent candidate pages, in one preallocated buffer, so that
    ``gather_at`` reads them where they are. A record never changes once written (it goes
    with its page's ordinal, and removal only deletes it), so nothing is ever stale. On
    llvm-13/14 the align stage asked for 4,059 records (2.2 GB) of 313 distinct pages
    (39 MB): templated pages keep naming the same candidates, and reading and joining
    those megabytes per request cost more than the kernel that uses them.

    The buffer fills in order and starts over when a request's records no longer fit
    (keeping that request's own): simpler than an LRU, and one request's records are
    used together. A request larger than the whole budget is joined aside, uncached."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.buf = np.empty(0, dtype=np.uint8)  # allocated at the first request
        self.used = 0
        self.at: dict[int, int] = {}  # ordinal -> its record's offset in buf
        self.size: dict[int, int] = {}
        self.hits = self.misses = 0

    def records(self, pages: list[int], read: ReadForward) -> tuple[U8, I64]:
        """The buffer holding the records of ``pages`` and the offset of each; ``read``
        fetches those not held (KeyError if a page has none)."""
        missing = [o for o in pages if o not in self.at]
        self.hits += len(pages) - len(missing)
        self.misses += len(missing)
        found = read(missing) if missing else []
        _check_found(missing, found)
        fetched = {o: np.frombuffer(cast(bytes, raw), dtype=np.uint8)
                   for o, raw in zip(missing, found, strict=True)}
        need = sum(len(raw) for raw in fetched.values())
        if sum(self.size[o] for o in pages if o in self.at) + need > self.max_bytes:
            # more than the whole budget: joined aside, not cached
            return _joined([self._held(o).tobytes() if o in self.at else fetched[o].tobytes()
                            for o in pages])
        if not len(self.buf):
            self.buf = np.empty(self.max_bytes, dtype=np.uint8)
        if self.used + need > self.max_bytes:  # start over, keeping this request's records
            keep = [(o, self._held(o).copy()) for o in pages if o in self.at]
            self.at.clear()
            self.size.clear()
            self.used = 0
            for o, raw in keep:
                self._put(o, raw)
        for o, raw in fetched.items():
            self._put(o, raw)
        return self.buf, np.array([self.at[o] for o in pages], dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return int(self.buf.nbytes)

    def _held(self, ordinal: int) -> U8:
        return self.buf[self.at[ordinal] : self.at[ordinal] + self.size[ordinal]]

    def _put(self, ordinal: int, raw: U8) -> None:
        self.buf[self.used : self.used + len(raw)] = raw
        self.at[ordinal], self.size[ordinal] = self.used, len(raw)
        self.used += len(raw)


@njit(cache=True, inline="always")
def _record(buf: npt.NDArray[np.uint8], at: Any) -> Any:
    """Views of one windows value at ``buf[at]`` (8-byte aligned): keys (as int64), bins,
    empty bins, whether its positions are narrow, then its rects and empty rows as int32
    and as uint16 (those of the other width empty), and the empty rows' columns (2: l, r;
    3: l, i_hi, j_hi)."""
    head = buf[at : at + 8].view(np.uint32)
    n, m = np.int64(head[0]) & COUNT, np.int64(head[1])
    narrow = (np.int64(head[0]) & NARROW) != 0
    cols = 3 if (np.int64(head[0]) & STAIRS) != 0 else 2
    width = 2 if narrow else 4
    at += 8
    keys = buf[at : at + 8 * n].view(np.int64)
    at += 8 * n
    rects = buf[at : at + 4 * width * n]
    at += 4 * width * n
    lr = buf[at : at + cols * width * m]
    at += cols * width * m
    bins = buf[at : at + 2 * n].view(np.uint16)
    e_bins = buf[at + 2 * n : at + 2 * n + 2 * m].view(np.uint16)
    none = buf[at:at]
    if narrow:
        return (keys, bins, e_bins, narrow, none.view(np.int32), rects.view(np.uint16),
                none.view(np.int32), lr.view(np.uint16), cols)
    return (keys, bins, e_bins, narrow, rects.view(np.int32), none.view(np.uint16),
            lr.view(np.int32), none.view(np.uint16), cols)


@njit(cache=True, inline="always")
def _slot(key: Any, b: Any, mask: int) -> Any:
    h = (np.uint64(key) ^ (np.uint64(b) * np.uint64(0x9E3779B97F4A7C15))) * np.uint64(
        0xBF58476D1CE4E5B9)
    return np.int64(h >> np.uint64(32)) & mask


@njit(cache=True, nogil=True)
def _gather_lists(
    buf: U8, at: I64, pages: I64, list_bin: I64, list_key: I64,
) -> tuple[I64, I64, I64, I32]:  # fmt: skip
    n_l = list_bin.shape[0]
    size = 1
    while size < 2 * n_l:
        size *= 2
    mask = size - 1
    t_key = np.zeros(size, dtype=np.int64)
    t_val = np.full(size, -1, dtype=np.int64)  # bin << 32 | list, -1: free
    for y in range(1, n_l):  # list 0 is the empty list: no window is in it
        i = _slot(list_key[y], list_bin[y], mask)
        while t_val[i] >= 0:
            i = (i + 1) & mask
        t_key[i], t_val[i] = list_key[y], (list_bin[y] << 32) | y
    n_pages = pages.shape[0]
    # pass 1: the list of every window (0: none) and the lists' counts. The found arrays
    # are sized for every window up front: growing them inside the loop made it 3x slower
    n_windows = 0
    for y in range(n_pages):
        n_windows += int(buf[at[y] : at[y] + 4].view(np.uint32)[0]) & COUNT
    count = np.zeros(n_l, dtype=np.int64)
    found = np.empty(n_windows, dtype=np.int32)  # (window, list, page) of those in a list
    found_list = np.empty(n_windows, dtype=np.int32)
    found_page = np.empty(n_windows, dtype=np.int32)
    n_found = 0
    for y in range(n_pages):
        keys, bins, _, _, _, _, _, _, _ = _record(buf, at[y])
        for x in range(keys.shape[0]):
            key, b = keys[x], np.int64(bins[x])
            i = _slot(key, b, mask)
            while t_val[i] >= 0:
                if t_key[i] == key and (t_val[i] >> 32) == b:
                    q = t_val[i] & 0xFFFFFFFF
                    found[n_found], found_list[n_found], found_page[n_found] = x, q, y
                    n_found += 1
                    count[q] += 1
                    break
                i = (i + 1) & mask
    # pass 2: fill in page then window order
    start = np.cumsum(count) - count
    fill = start.copy()
    ords = np.empty(n_found, dtype=np.int64)
    rects = np.empty((n_found, 4), dtype=np.int32)
    last = -1
    for f in range(n_found):
        y = found_page[f]
        if y != last:
            _, _, _, narrow, wide_rects, narrow_rects, _, _, _ = _record(buf, at[y])
            last = y
        q, x = found_list[f], found[f]
        ords[fill[q]] = pages[y]
        if narrow:
            for c in range(4):
                rects[fill[q], c] = narrow_rects[4 * x + c]
        else:
            rects[fill[q]] = wide_rects[4 * x : 4 * x + 4]
        fill[q] += 1
    return start, count, ords, rects


@njit(cache=True, nogil=True)
def _gather_empty(buf: U8, at: I64, pages: I64, empty_want: I64) -> tuple[I64, I64]:
    n_pages = pages.shape[0]
    # empty windows: the wanted keys of each page (ascending bins) against its empty
    # windows (sorted by bin)
    n_want = empty_want.shape[0]
    lo = np.zeros(n_want, dtype=np.int64)
    hi = np.zeros(n_want, dtype=np.int64)
    q = 0
    for y in range(n_pages):
        _, _, e_bins, _, _, _, _, _, _ = _record(buf, at[y])
        e = 0
        while q < n_want and (empty_want[q] >> EMPTY_KEY_SHIFT) == pages[y]:
            b = empty_want[q] & ((1 << EMPTY_KEY_SHIFT) - 1)
            e = np.searchsorted(e_bins[e:], b) + e
            lo[q] = e
            e = np.searchsorted(e_bins[e:], b, side="right") + e
            hi[q] = e
            q += 1
    empty_off = np.zeros(n_want + 1, dtype=np.int64)
    empty_off[1:] = np.cumsum(hi - lo)
    empty_lr = np.empty((empty_off[-1], 3), dtype=np.int64)
    q = 0
    for y in range(n_pages):
        _, _, _, narrow, _, _, wide_lr, narrow_lr, cols = _record(buf, at[y])
        while q < n_want and (empty_want[q] >> EMPTY_KEY_SHIFT) == pages[y]:
            r = empty_off[q]
            for e in range(lo[q], hi[q]):
                for c in range(3):  # (a gap's i_hi is its j_hi)
                    x = cols * e + min(c, cols - 1)
                    empty_lr[r, c] = narrow_lr[x] if narrow else wide_lr[x]
                r += 1
            q += 1
    return empty_off, empty_lr


@njit(cache=True, nogil=True)
def empty_keys(t_p: I64, t_o: I64, tasks: I64, q_empty: npt.NDArray[np.bool_]) -> I64:
    """The keys ``ordinal << 16 | bin`` of the empty bins of ``tasks`` (indices into the
    tasks ``(t_p, t_o)``; ``q_empty[p, b]``: bin b of passage p is empty), sorted and
    distinct: ``np.unique`` of them in one pass and a sort (it was half the cost of
    gathering the candidates' records on the dense stream)."""
    k = q_empty.shape[1]
    n = 0
    for t in tasks:
        for b in range(k):
            if q_empty[t_p[t], b]:
                n += 1
    keys = np.empty(n, dtype=np.int64)
    n = 0
    for t in tasks:
        p, o = t_p[t], t_o[t]
        for b in range(k):
            if q_empty[p, b]:
                keys[n] = (o << EMPTY_KEY_SHIFT) | b
                n += 1
    keys.sort()
    d = 0
    for x in range(n):
        if d == 0 or keys[x] != keys[d - 1]:
            keys[d] = keys[x]
            d += 1
    return keys[:d].copy()
