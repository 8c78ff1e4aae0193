"""Block-Permuted Hamming Search (BPHS, Manku, Jain & Das Sarma WWW'07), the exact baseline.

As modelled in Sood & Loguinov §7.1: the 64 bits are split into G = g + h blocks (the
optimal G of eq. 13). If H(x, y) <= h, at most h blocks differ, so some g blocks agree
exactly. For each of the T = C(G, g) choices of g blocks, one table holds every fingerprint
with those blocks moved to the top (the "header") and the other blocks after them, sorted.
A lookup permutes x the same way, binary-searches the range of rows whose header equals
x's, and scans it; popcount is permutation-invariant, so ``popcount(pi(x) ^ pi(y)) <= h``
is the exact test. Search is exact for every g in [1, G - h].

Duplicates: a neighbour whose header agrees in several tables is reported only by the first
table (in table order) whose header blocks all agree with the query, so results are a set.

Batch lookups loop over the queries against the T in-memory tables (the online algorithm).
The paper's disk-based batch variant (tables built around the query batch, §7.2) answers the
same question and is not needed for an in-memory index.

RAM: T permuted copies of the fingerprints (``fingerprint_nbytes`` = T · 8n) plus T parallel
int64 ordinal arrays (``ordinal_nbytes``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.near.psm import PsmBatchResult, bit_count64, grow, lower_bound

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


def _block_bounds(G: int) -> list[tuple[int, int]]:
    """(shift, width) of blocks 0..G-1, block 0 holding the most significant bits."""
    widths = [64 // G + (1 if i < 64 % G else 0) for i in range(G)]
    out, top = [], 64
    for w in widths:
        top -= w
        out.append((top, w))
    return out


def _mask(width: int) -> int:
    return (1 << width) - 1


@njit(cache=True, nogil=True)
def _permute(x, src_shift, widths, dst_shift):
    y = np.uint64(0)
    for k in range(src_shift.shape[0]):
        m = (np.uint64(1) << np.uint64(widths[k])) - np.uint64(1)
        y |= ((x >> np.uint64(src_shift[k])) & m) << np.uint64(dst_shift[k])
    return y


@njit(cache=True, nogil=True)
def _permute_all(fps, src_shift, widths, dst_shift):
    out = np.empty_like(fps)
    for i in range(fps.shape[0]):
        out[i] = _permute(fps[i], src_shift, widths, dst_shift)
    return out


@njit(cache=True, nogil=True)
def _bphs_one(tables, tords, src_shift, widths, dst_shift, low_masks, prior_masks, x, h, first,
              out_o, out_h, n):
    """One lookup in all T tables; returns (n, ok), ok False when out_* overflowed."""
    for i in range(tables.shape[0]):
        px = _permute(x, src_shift[i], widths[i], dst_shift[i])
        low = low_masks[i]
        tab = tables[i]
        for r in range(lower_bound(tab, 0, tab.shape[0], px & ~low), tab.shape[0]):
            diff = px ^ tab[r]
            if diff & ~low:
                break  # header mismatch: past the range
            d = bit_count64(diff)
            if d <= h:
                dup = False
                for i2 in range(i):
                    if diff & prior_masks[i, i2] == 0:
                        dup = True  # an earlier table already reports this row
                        break
                if not dup:
                    if n == out_o.shape[0]:
                        return n, False
                    out_o[n] = tords[i, r]
                    out_h[n] = d
                    n += 1
                    if first:
                        return n, True
    return n, True


@njit(cache=True, nogil=True)
def _bphs_batch_kernel(tables, tords, src_shift, widths, dst_shift, low_masks, prior_masks,
                       qfps, h, first):
    m = qfps.shape[0]
    offsets = np.zeros(m + 1, dtype=np.int64)
    res_ord = np.empty(max(16, m), dtype=np.int64)
    res_ham = np.empty(max(16, m), dtype=np.int64)
    nres = 0
    for q in range(m):
        while True:
            n2, ok = _bphs_one(tables, tords, src_shift, widths, dst_shift, low_masks,
                               prior_masks, qfps[q], h, first, res_ord, res_ham, nres)
            if ok:
                break
            res_ord = grow(res_ord)  # rare: redo this query with more room
            res_ham = grow(res_ham)
        nres = n2
        offsets[q + 1] = nres
    return offsets, res_ord[:nres], res_ham[:nres]


@dataclass
class BphsIndex:
    """T = C(g + h, g) block-permuted sorted copies of the fingerprints."""

    h: int
    g: int
    tables: U64  # (T, n) permuted fingerprints, each row sorted
    ordinals: I64  # (T, n)
    src_shift: I64  # (T, G)
    widths: I64  # (T, G)
    dst_shift: I64  # (T, G)
    low_masks: U64  # (T,) bits below the header, in permuted coordinates
    prior_masks: U64  # (T, T): header of table i2, in table i's coordinates

    @classmethod
    def build(cls, fps: npt.ArrayLike, ordinals: npt.ArrayLike, h: int = 3, g: int = 1
              ) -> BphsIndex:
        f = np.ascontiguousarray(fps, dtype=np.uint64).ravel()
        o = np.ascontiguousarray(ordinals, dtype=np.int64).ravel()
        if f.shape != o.shape:
            raise ValueError("fps and ordinals must have the same length")
        if h < 0 or g < 1:
            raise ValueError("need h >= 0 and g >= 1")
        G = g + h
        if G > 64:
            raise ValueError("g + h must be <= 64")
        blocks = _block_bounds(G)
        combos = list(itertools.combinations(range(G), g))
        T = len(combos)
        src = np.zeros((T, G), dtype=np.int64)
        wid = np.zeros((T, G), dtype=np.int64)
        dst = np.zeros((T, G), dtype=np.int64)
        low = np.zeros(T, dtype=np.uint64)
        header_orig = []  # header mask of each table in original bit positions
        for i, chosen in enumerate(combos):
            seq = list(chosen) + [b for b in range(G) if b not in chosen]
            top = 64
            for k, b in enumerate(seq):
                s, w = blocks[b]
                top -= w
                src[i, k], wid[i, k], dst[i, k] = s, w, top
            hbits = sum(blocks[b][1] for b in chosen)
            low[i] = np.uint64(_mask(64 - hbits))
            header_orig.append(sum(_mask(blocks[b][1]) << blocks[b][0] for b in chosen))
        prior = np.zeros((T, T), dtype=np.uint64)
        for i in range(T):
            for i2 in range(T):
                prior[i, i2] = _permute(np.uint64(header_orig[i2]), src[i], wid[i], dst[i])
        tables = np.empty((T, f.size), dtype=np.uint64)
        tords = np.empty((T, f.size), dtype=np.int64)
        for i in range(T):
            pf = _permute_all(f, src[i], wid[i], dst[i])
            order = np.argsort(pf, kind="stable")
            tables[i] = pf[order]
            tords[i] = o[order]
        return cls(h, g, tables, tords, src, wid, dst, low, prior)

    @property
    def n_tables(self) -> int:
        return int(self.tables.shape[0])

    @property
    def fingerprint_nbytes(self) -> int:
        return int(self.tables.nbytes)

    @property
    def ordinal_nbytes(self) -> int:
        return int(self.ordinals.nbytes)

    @property
    def nbytes(self) -> int:
        return self.fingerprint_nbytes + self.ordinal_nbytes

    def search_batch(self, qfps: npt.ArrayLike, mode: Literal["first", "all"] = "all"
                     ) -> PsmBatchResult:
        """Every row within h of each query (``"first"``: stop at the first one found)."""
        q = np.ascontiguousarray(qfps, dtype=np.uint64).ravel()
        offsets, ords, hams = _bphs_batch_kernel(
            self.tables, self.ordinals, self.src_shift, self.widths, self.dst_shift,
            self.low_masks, self.prior_masks, q, self.h, mode == "first")
        return PsmBatchResult(offsets, ords, hams, np.zeros(q.size, dtype=np.int64))

    def search(self, fp: int, mode: Literal["first", "all"] = "all") -> list[tuple[int, int]]:
        """[(ordinal, hamming)] sorted by (hamming, ordinal)."""
        return self.search_batch(np.array([fp], dtype=np.uint64), mode).get(0)
