"""The distinct inverted lists (bin, key) that a set of cells names, in key order, and the
list of each cell: what the passage sketch finds for a page's passages and windows
(dupalign.passage.sketch, dupalign.passage.oph_page) and the index for its batches."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]


def distinct_lists(bins: I64, keys: U64) -> tuple[I64, U64, I64]:
    """The distinct lists (bin, key) in key order, and the index of each input among them
    (np.unique on a structured array sorts several times slower, np.lexsort twice)."""
    return distinct_lists_kernel(np.ascontiguousarray(bins, dtype=np.int64),
                                  np.ascontiguousarray(keys, dtype=np.uint64))


_SHORT_RUN = 32  # distinct lists of one bin sorted by insertion up to this many


@njit(cache=True, nogil=True)
def distinct_lists_kernel(bins: I64, keys: U64) -> tuple[I64, U64, I64]:
    """The distinct (bin, key) found with a hash table (a page's passages name each list
    several times: on llvm pages ~2.5 cells per list), then only those sorted: by bin
    (counting sort: bins are small), then by key within each bin. Half the time of sorting
    every cell on llvm pages."""
    n = bins.shape[0]
    size = 16
    while size < 2 * n:
        size <<= 1
    mask = size - 1
    table = np.full(size, -1, dtype=np.int64)
    d_bin = np.empty(n, dtype=np.int64)
    d_key = np.empty(n, dtype=np.uint64)
    cell = np.empty(n, dtype=np.int64)  # each input's distinct list, in finding order
    m = 0
    n_bins = 0
    for x in range(n):
        b, key = bins[x], keys[x]
        # min-hash keys: their low bits are as good as any
        h = (np.int64(key & np.uint64(0x7FFFFFFFFFFFFFFF)) ^ (b * 0x9E3779B1)) & mask
        while True:
            d = table[h]
            if d < 0:
                table[h] = m
                d_bin[m], d_key[m] = b, key
                cell[x] = m
                m += 1
                n_bins = max(n_bins, b + 1)
                break
            if d_bin[d] == b and d_key[d] == key:
                cell[x] = d
                break
            h = (h + 1) & mask
    off = np.zeros(n_bins + 1, dtype=np.int64)
    for d in range(m):
        off[d_bin[d] + 1] += 1
    for b in range(n_bins):
        off[b + 1] += off[b]
    at = off[:-1].copy()
    order = np.empty(m, dtype=np.int64)
    out_keys = np.empty(m, dtype=np.uint64)
    for d in range(m):
        y = at[d_bin[d]]
        order[y], out_keys[y] = d, d_key[d]
        at[d_bin[d]] += 1
    for b in range(n_bins):
        lo, hi = off[b], off[b + 1]
        if hi - lo > _SHORT_RUN:
            by_key = np.argsort(out_keys[lo:hi])
            order[lo:hi] = order[lo:hi][by_key]
            out_keys[lo:hi] = out_keys[lo:hi][by_key]
            continue
        for y in range(lo + 1, hi):  # keys are distinct within a bin
            kv, ov = out_keys[y], order[y]
            z = y - 1
            while z >= lo and out_keys[z] > kv:
                out_keys[z + 1], order[z + 1] = out_keys[z], order[z]
                z -= 1
            out_keys[z + 1], order[z + 1] = kv, ov
    rank = np.empty(m, dtype=np.int64)
    out_bins = np.empty(m, dtype=np.int64)
    for y in range(m):
        rank[order[y]] = y
        out_bins[y] = d_bin[order[y]]
    inverse = np.empty(n, dtype=np.int64)
    for x in range(n):
        inverse[x] = rank[cell[x]]
    return out_bins, out_keys, inverse
