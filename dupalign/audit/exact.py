"""The exact answers the audit compares the index with.

Near: every stored fingerprint within the Hamming bound, by a popcount over the whole table
(``within_hamming``). Passages: the interval scan of a page's query passages against every
window of another page (``aligned``), with none of the index's cuts: no stop lists, no
``max_list_read``, no ``max_candidates``, no ``max_matches``. Its rectangles and weights are
those of the align stage (OPH: a matched non-empty window weighs q, a jointly empty bin p,
the threshold is k·p), so a pair it finds and the index does not is a pair a cut lost, not
sketch noise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dupalign.passage.forward import unpack_windows
from dupalign.passage.interval_scan import scan_kernel

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


def within_hamming(fps: U64, ordinals: I64, fp: int, h: int, before: int) -> I64:
    """Ordinals (ascending) of the rows with ordinal < ``before`` whose fingerprint is within
    Hamming distance ``h`` of ``fp``: one vectorized popcount over the table."""
    near = np.bitwise_count(fps ^ np.uint64(fp)) <= h
    return np.sort(ordinals[near & (ordinals < before)])


@dataclass
class Windows:
    """A page's compact windows, all of them: non-empty ``(bins, keys, rects[n, 4])`` with
    rects ``i_lo, i_hi, j_lo, j_hi`` (inclusive) and empty ``(e_bins, e_lr[m, 3])`` with
    rows ``l, i_hi, j_hi`` (i ∈ [l, i_hi], j ∈ [i, j_hi])."""

    bins: I64
    keys: U64
    rects: I64
    e_bins: I64
    e_lr: I64

    @classmethod
    def from_record(cls, raw: bytes) -> Windows:
        """From a windows value (dupalign.passage.forward ``pack_windows``)."""
        bins, keys, rects, e_bins, lr = unpack_windows(raw)
        return cls(bins, keys.astype(np.uint64), rects.astype(np.int64), e_bins,
                   lr.astype(np.int64))


def aligned(q_keys: U64, q_empty: Bools, w: Windows, p: int, q: int, min_len: int,
            stopped: Bools | None = None) -> bool:
    """Whether some query passage (row of ``q_keys``/``q_empty``, OPH sketches of k bins)
    has a subsequence of the page ``w`` of ``min_len`` or more units whose estimate reaches
    θ = p/q. ``stopped[row, bin]``: the passage's bins whose list is a stop list, counted
    as neither a collision nor an empty bin (the index's rule; None: no stop lists)."""
    n_p, k = q_keys.shape
    need = k * p
    if not n_p:
        return False
    # (passage, window) collisions, all at once: a page's windows against every passage
    hit = q_keys[:, w.bins] == w.keys[None, :]
    hit &= ~q_empty[:, w.bins]
    if stopped is not None:
        hit &= ~stopped[:, w.bins]
    # a cell is covered by one window per bin: at most every bin with a colliding non-empty
    # window (weight q) and every empty bin of the passage (p), the bound of the index's
    # viability filter, which leaves unrelated pages unscanned
    rows, cols = np.nonzero(hit)
    bins_hit = np.zeros((n_p, k), dtype=np.bool_)
    bins_hit[rows, w.bins[cols]] = True
    bound = q * bins_hit.sum(axis=1) + p * q_empty.sum(axis=1)
    viable = np.flatnonzero(bound >= need)
    if not viable.size:
        return False
    e_hit = q_empty[:, w.e_bins]
    r, lr = w.rects, w.e_lr
    for row in viable:
        mine, emp = hit[row], e_hit[row]
        il = np.concatenate((r[mine, 0], lr[emp, 0]))
        ih = np.concatenate((r[mine, 1], lr[emp, 1]))
        jl = np.concatenate((r[mine, 2], lr[emp, 0]))
        jh = np.concatenate((r[mine, 3], lr[emp, 2]))
        wt = np.full(len(il), p, np.int64)
        wt[:int(np.count_nonzero(mine))] = q
        keep = (il <= ih) & (jl <= jh)
        if keep.any() and len(scan_kernel(il[keep], ih[keep], jl[keep], jh[keep], wt[keep],
                                           need, min_len)[0]):
            return True
    return False


def aligned_brute(q_keys: U64, q_empty: Bools, w: Windows, p: int, q: int, min_len: int,
                  n_units: int, stopped: Bools | None = None) -> bool:
    """``aligned``'s twin: every passage, every subsequence ``[i..j]`` of the page's
    ``n_units`` units, the weights of the colliding windows that contain it summed."""
    n_p, k = q_keys.shape
    for row in range(n_p):
        for i in range(n_units):
            for j in range(i + min_len - 1, n_units):
                total = 0
                for x in range(len(w.bins)):
                    b = int(w.bins[x])
                    if (q_empty[row, b] or q_keys[row, b] != w.keys[x]
                            or (stopped is not None and stopped[row, b])):
                        continue
                    i_lo, i_hi, j_lo, j_hi = (int(v) for v in w.rects[x])
                    if i_lo <= i <= i_hi and j_lo <= j <= j_hi:
                        total += q
                for x in range(len(w.e_bins)):
                    lo, i_hi, j_hi = (int(v) for v in w.e_lr[x])
                    if q_empty[row, int(w.e_bins[x])] and lo <= i <= i_hi and j <= j_hi:
                        total += p
                if total >= k * p:
                    return True
    return False


def within_hamming_brute(fps: list[int], ordinals: list[int], fp: int, h: int,
                         before: int) -> list[int]:
    """``within_hamming``'s twin: one pair at a time."""
    return sorted(o for f, o in zip(fps, ordinals, strict=True)
                  if o < before and bin(f ^ fp).count("1") <= h)
