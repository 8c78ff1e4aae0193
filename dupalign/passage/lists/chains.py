"""The list entries of pending pages, chained per list, for reads that miss the list cache.

A committed page's entries wait in memory until they are written to a table file
(dupalign.passage.lists.files); a list read from the store meanwhile must see them. The table here
takes a page's entries with one hash probe each and a write at the arena's end: an entry
(the page's ordinal, its number of windows in the list) points back at the list's entry
before it, and the hash table row of the list holds its last entry. Nothing moves when a
list grows (the list cache's runs move and double: kept there, the pending entries cost
the index stage more than the list cache itself), and a page's windows in one list are
one entry. Reads, rarer (only lists
the cache misses), walk the chains back and lay them out in page order.

The hash table is the list cache's (``probe``): a row is the key, and the list's last
entry << 16 | bin.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.passage.lists.cache import BIN_BITS, EMPTY, probe

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]


class ListChains:
    """Entries of pages added in ascending ordinal order, read per list (module docstring)."""

    def __init__(self) -> None:
        self.table = np.full((1 << 10, 2), EMPTY, dtype=np.int64)
        self.ords = np.zeros(1 << 12, dtype=np.int64)
        self.windows = np.zeros(1 << 12, dtype=np.int64)
        self.prev = np.zeros(1 << 12, dtype=np.int64)
        self.end = 0  # entries in use
        self.n_lists = 0

    def reset(self) -> None:
        """Forget every entry, keeping the arrays' room."""
        self.end = self.n_lists = 0
        self.table[:, 1] = EMPTY

    def add(self, bins: I64, keys: U64, windows: I64, ordinal: int) -> None:
        """Page ``ordinal``'s entries: ``windows[x]`` windows in list (bins[x], keys[x]),
        the lists distinct; ``ordinal`` above every ordinal added before."""
        need = self.end + len(bins)
        if need > len(self.ords):
            size = max(2 * len(self.ords), need)
            for name in ("ords", "windows", "prev"):
                old = getattr(self, name)
                new = np.empty(size, dtype=np.int64)
                new[: self.end] = old[: self.end]
                setattr(self, name, new)
        if 2 * (self.n_lists + len(bins)) > len(self.table):  # keep the table half empty
            size = len(self.table)
            while 2 * (self.n_lists + len(bins)) > size:
                size *= 2
            old_table, self.table = self.table, np.full((size, 2), EMPTY, dtype=np.int64)
            _rehash(old_table, self.table)
        self.end, self.n_lists = _add(
            self.table, self.ords, self.windows, self.prev, self.end, self.n_lists,
            np.ascontiguousarray(bins, dtype=np.int64),
            np.ascontiguousarray(keys, dtype=np.uint64).view(np.int64),
            np.ascontiguousarray(windows, dtype=np.int64), ordinal)

    def entries(self, bins: I64, keys: U64) -> tuple[I64, I64]:
        """Per list (bin, key): its number of entries as the list cache counts them (one per
        window), and them all in one array, list by list, each in page order (a page's
        ordinal once per window)."""
        return _gather(self.table, self.ords, self.windows, self.prev,
                       np.ascontiguousarray(bins, dtype=np.int64),
                       np.ascontiguousarray(keys, dtype=np.uint64).view(np.int64))


@njit(cache=True)
def _rehash(old: I64, new: I64) -> None:
    for r in range(old.shape[0]):
        v = old[r, 1]
        if v != EMPTY:
            _, i = probe(new, v & ((1 << BIN_BITS) - 1), old[r, 0])
            new[i, 0], new[i, 1] = old[r, 0], v


@njit(cache=True)
def _add(
    table: I64, ords: I64, windows: I64, prev: I64, end: int, n_lists: int, bins: I64,
    keys: I64, n_windows: I64, ordinal: int,
) -> tuple[int, int]:  # fmt: skip
    for x in range(bins.shape[0]):
        last, i = probe(table, bins[x], keys[x])
        if last < 0:
            table[i, 0] = keys[x]
            n_lists += 1
        ords[end], windows[end], prev[end] = ordinal, n_windows[x], last
        table[i, 1] = (end << BIN_BITS) | bins[x]
        end += 1
    return end, n_lists


@njit(cache=True)
def _gather(table: I64, ords: I64, windows: I64, prev: I64, bins: I64,
            keys: I64) -> tuple[I64, I64]:
    m = bins.shape[0]
    lasts = np.empty(m, dtype=np.int64)
    n = np.zeros(m, dtype=np.int64)
    for x in range(m):
        e, _ = probe(table, bins[x], keys[x])
        lasts[x] = e
        while e >= 0:
            n[x] += windows[e]
            e = prev[e]
    out = np.empty(n.sum(), dtype=np.int64)
    w = 0
    for x in range(m):
        w += n[x]
        r = w  # fill the list from its end: the chain runs from the last page back
        e = lasts[x]
        while e >= 0:
            for _ in range(windows[e]):
                r -= 1
                out[r] = ords[e]
            e = prev[e]
    return n, out
