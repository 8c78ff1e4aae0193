"""A page's forward record: its compact windows, read by the align stage.

The passage index is split as search engines split theirs: inverted lists of page ordinals
only (key → pages, dupalign.passages) to find candidate pages, and one forward record per
page (page → windows) to align against them. The record of page ``o`` is two values keyed
by ``u64(o)``: ``forward`` (its windows, this module) and ``positions`` (its token
character offsets and unit hashes, dupalign.passages ``_pack_positions``). Align reads the
records of a page's candidates (from the store, a secondary instance of it, or the wire)
and gathers the rectangles its interval scan needs (``gather``); the index never reads
them.

The windows value: ``<II`` (n non-empty windows, m empty windows), then the non-empty
windows' min-hash keys (``<u8[n]``), rectangles (``<i4[n, 4]``: i_lo, i_hi, j_lo, j_hi,
inclusive), the empty windows' rows (``<i4[m, 2]``: l, r), the non-empty windows' bins
(``<u2[n]``) and the empty windows' bins (``<u2[m]``, ascending; rows of one bin in
order). Non-empty windows are in window order, so a list's entries gathered from records
come in the order the lists had when they held rectangles. The (bin, key) pairs of the
non-empty windows name every inverted list that holds the page: removing a page deletes
``bin ‖ key ‖ ordinal`` from each (and rewrites the packed runs that hold it).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from numba import njit

from dupalign.passage_align import EMPTY_KEY_SHIFT  # empty windows: ordinal << 16 | bin

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
I32 = npt.NDArray[np.int32]
_HEAD = struct.Struct("<II")

# ordinals -> their forward (windows) values, None where a page has none
ReadForward = Callable[[list[int]], list[bytes | None]]


def pack_windows(bins: I64, keys: U64, rects: I64, empty: npt.NDArray[np.bool_]) -> bytes:
    """The windows value of a page (``rects[x]``: window x's i_lo, i_hi, j_lo, j_hi)."""
    full = np.flatnonzero(~empty)
    emp = np.flatnonzero(empty)
    emp = emp[np.argsort(bins[emp], kind="stable")]
    return b"".join((
        _HEAD.pack(len(full), len(emp)),
        keys[full].astype("<u8").tobytes(),
        rects[full].astype("<i4").tobytes(),
        rects[emp][:, [0, 3]].astype("<i4").tobytes(),
        bins[full].astype("<u2").tobytes(),
        bins[emp].astype("<u2").tobytes(),
    ))


def unpack_windows(raw: bytes) -> tuple[I64, U64, I32, I64, I32]:
    """``(bins, keys, rects[n, 4], empty_bins, empty_lr[m, 2])`` of a windows value."""
    n, m = _HEAD.unpack_from(raw)
    at = _HEAD.size
    keys = np.frombuffer(raw, "<u8", n, at)
    at += 8 * n
    rects = np.frombuffer(raw, "<i4", 4 * n, at).reshape(n, 4)
    at += 16 * n
    lr = np.frombuffer(raw, "<i4", 2 * m, at).reshape(m, 2)
    at += 8 * m
    bins = np.frombuffer(raw, "<u2", n, at).astype(np.int64)
    e_bins = np.frombuffer(raw, "<u2", m, at + 2 * n).astype(np.int64)
    return bins, keys, rects, e_bins, lr


def gather(pages: I64, records: list[bytes | None], list_bin: I64, list_key: U64,
           empty_want: I64) -> tuple[I64, I64, I64, I32, I64, I64]:
    """What the interval scan reads of the candidate ``pages`` (ascending), from their
    windows values ``records``: per list ``(list_bin[y], list_key[y])`` (sorted by bin,
    then key; list 0 is the empty list) the windows of those pages in it, as CSR
    ``(start, count)`` into ``(ords, rects)`` sorted by page then window; and their empty
    windows under the keys ``empty_want`` (``ordinal << 16 | bin``, ascending) as CSR
    ``(empty_off, empty_lr)``."""
    parts = []
    for o, raw in zip(pages.tolist(), records, strict=True):
        if raw is None:
            raise KeyError(f"page {o} has no forward record")
        parts.append(unpack_windows(raw))
    n_w = np.array([len(p[0]) for p in parts], dtype=np.int64)
    w_off = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(n_w, out=w_off[1:])

    def cat(x: int, dtype: type, shape: tuple[int, ...]) -> Any:
        if not parts:
            return np.empty(shape, dtype=dtype)
        return np.ascontiguousarray(np.concatenate([p[x] for p in parts]), dtype=dtype)

    start, count, ords, rects = _gather_lists(
        list_bin, list_key, pages, w_off, cat(0, np.int64, (0,)), cat(1, np.uint64, (0,)),
        cat(2, np.int32, (0, 4)))
    # empty windows: every page's rows keyed ordinal << 16 | bin, ascending like the want
    n_e = np.array([len(p[3]) for p in parts], dtype=np.int64)
    e_keys = (np.repeat(pages, n_e) << EMPTY_KEY_SHIFT) | cat(3, np.int64, (0,))
    e_lr = cat(4, np.int32, (0, 2))
    lo = np.searchsorted(e_keys, empty_want, "left")
    hi = np.searchsorted(e_keys, empty_want, "right")
    empty_off = np.zeros(len(empty_want) + 1, dtype=np.int64)
    np.cumsum(hi - lo, out=empty_off[1:])
    rows = np.repeat(lo - empty_off[:-1], hi - lo) + np.arange(int(empty_off[-1]))
    return start, count, ords, rects, empty_off, e_lr[rows].astype(np.int64)


@njit(cache=True, nogil=True)
def _gather_lists(
    list_bin: I64, list_key: U64, pages: I64, w_off: I64, w_bin: I64, w_key: U64,
    w_rect: I32,
) -> tuple[I64, I64, I64, I32]:  # fmt: skip
    n_l = list_bin.shape[0]
    list_of = np.zeros(w_bin.shape[0], dtype=np.int64)
    count = np.zeros(n_l, dtype=np.int64)
    for i in range(w_bin.shape[0]):
        b, key = w_bin[i], w_key[i]
        lo, hi = 1, n_l  # binary search over lists 1.. by (bin, key)
        while lo < hi:
            mid = (lo + hi) >> 1
            if list_bin[mid] < b or (list_bin[mid] == b and list_key[mid] < key):
                lo = mid + 1
            else:
                hi = mid
        if lo < n_l and list_bin[lo] == b and list_key[lo] == key:
            list_of[i] = lo
            count[lo] += 1
    start = np.cumsum(count) - count
    fill = start.copy()
    total = count.sum()
    ords = np.empty(total, dtype=np.int64)
    rects = np.empty((total, 4), dtype=np.int32)
    for y in range(pages.shape[0]):
        for i in range(w_off[y], w_off[y + 1]):
            x = list_of[i]
            if x:
                ords[fill[x]] = pages[y]
                rects[fill[x]] = w_rect[i]
                fill[x] += 1
    return start, count, ords, rects
