"""Weighted one-permutation hashing: OPH's k bins with a consistent weighted sample per bin,
and its compact windows (``passage.mode = "weighted_oph"``).

The scheme. One permutation splits the tokens into k bins: token t (unit hash ``th``) lives
in bin ``oph_bins(mix64(th, BIN_SALT), k)`` wherever it occurs, as in OPH. Inside its bin
a token does not offer one fixed value but an ICWS sample (Ioffe 2010, the same hash as
MonoActive's weighted mode, :func:`dupalign.passage.monoactive.icws_hash`, with one fixed
function index ``FN``) at its weight in the sequence, ``w = tf(x) · idf(t)`` for x
occurrences. The sketch of a sequence is, per bin, the key of the smallest sample among
the bin's tokens (order: ``ln a``, then larger ``z``, then token hash) or "empty".

Why it estimates weighted Jaccard. ICWS is a consistent weighted sample: for two weight
vectors restricted to the tokens of one bin, the smallest samples have the same key with
probability ``J_b = Σ_b min(w_A, w_B) / Σ_b max(w_A, w_B)`` (Ioffe's theorem; it needs
only that the randomness is per token, which it is, and independent of the bin, which
``BIN_SALT`` makes it). The estimator is OPH's: ``N_mat / (k − N_emp)`` (matches over the
bins that are not empty in both), so its expectation is the mean of ``J_b`` over the
non-empty bins, averaged over the random partition. With equal weights (binary tf) every
``J_b`` is a plain Jaccard and this is OPH's unbiased estimator of Jaccard. With unequal
weights it is the bin-average of the weighted Jaccards rather than their weight-average:
when most bins hold a single token (k ≥ the number of distinct tokens, as with k = 64
and 48-unit passages) it approaches the mean over the union's tokens of
``min(w_A, w_B) / max(w_A, w_B)``. For passages with tf weights (idf 1, which is what the
engine uses) the weights are 1 except for repeated units, and the gap is small: it is
measured, not assumed (tests/passage/test_weighted_oph.py, tests/bench/bench_woph_bias.py).

Windows. Since a token's bin does not depend on its weight, a bin's empty subsequences are
the gaps between the bin's token positions, exactly OPH's empty windows (the rows
dupalign.passage.forward stores). Inside a bin the min-sample of ``T[i..j]`` depends on
the counts of the bin's tokens in it, the monotone case MonoActive solves: the value of
(t, x) never increases with x. So each bin is the MonoActive partition
(:func:`dupalign.passage.monoactive._partition_kernel`, the same active entries and visit
order) of the text restricted to that bin's positions, mapped back to text positions
(a restricted range ``[a..b] × [c..d]`` is ``i ∈ [P[a−1]+1, P[b]], j ∈ [P[c], P[d+1]−1]``
with ``P`` the bin's sorted positions, guards −1 and n). Each position is in one bin, so
the windows number O(n + k) (about 2 non-empty per token plus OPH's gaps), not O(n·k).

Positions: 0-based, inclusive rectangles as in :class:`dupalign.passage.sketch.Rects`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.passage.interval_scan import scan_rectangles
from dupalign.passage.monoactive import (
    IdfFn,
    TfFn,
    TfMode,
    _partition_kernel,
    entry_weights,
    icws_hash,
    layout,
)
from dupalign.passage.oph import oph_bins
from dupalign.text.hashing import mix64

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]

BIN_SALT = 0x574F5048  # "WOPH": the bin hash, independent of the ICWS randomness
FN = 0x574F  # the ICWS function index: independent of weighted mode's 0..k-1


@dataclass(frozen=True)
class WOPHWindows:
    """Windows as rows: bin, key (0 for empty), empty, and the rectangle i ∈ [a, b],
    j ∈ [c, d] (0-based inclusive; an empty window is the gap a = c, b = d, i ≤ j).
    Order: each bin's non-empty windows, then every bin's empty windows by (bin, a)."""

    bin: I64
    key: U64
    empty: Bools
    a: I64
    b: I64
    c: I64
    d: I64

    def __len__(self) -> int:
        return int(self.bin.shape[0])


@dataclass(frozen=True)
class Samples:
    """The per-(token, count) samples of one text: entry ``off[t] + x - 1`` is token t at
    count x (``monoactive.layout``), with its ``ln_a``, ``z`` and ``key``; ``tid`` is each
    position's token, ``bin`` each token's bin."""

    n: int
    uniq: U64
    pos: I64
    off: I64
    ent_tok: I64
    ent_x: I64
    tid: I64
    bin: I64
    ln_a: F64
    z: I64
    key: U64


def samples(units: U64, k: int, tf: TfMode | TfFn = "log",
            idf: IdfFn | Mapping[int, float] | None = None) -> Samples:
    """Every (token, count) sample of a text (counts up to the token's frequency in it)."""
    lay = layout(np.asarray(units, dtype=np.uint64))
    tid = np.empty(lay.n, dtype=np.int64)
    tid[lay.pos] = lay.ent_tok
    if lay.n == 0:
        z = np.empty(0, dtype=np.int64)
        return Samples(0, lay.uniq, lay.pos, lay.off, lay.ent_tok, lay.ent_x, tid,
                       np.empty(0, np.int64), np.empty(0), z, np.empty(0, np.uint64))
    weights = entry_weights(lay, tf, idf)
    ln_a, z, key = icws_hash(lay.uniq[lay.ent_tok], weights, FN)
    bins = oph_bins(mix64(lay.uniq, BIN_SALT), k)
    return Samples(lay.n, lay.uniq, lay.pos, lay.off, lay.ent_tok, lay.ent_x, tid, bins,
                   ln_a, z, key)


# ---------------------------------------------------------------------------------------------
# sketches


@njit(cache=True, nogil=True)
def _sketches(tid: I64, off: I64, ent_tok: I64, tbin: I64, uniq: U64, ln_a: F64, z: I64,
              key: U64, starts: I64, ends: I64, k: int) -> tuple[U64, Bools]:
    n_p = starts.shape[0]
    keys = np.zeros((n_p, k), dtype=np.uint64)
    empty = np.ones((n_p, k), dtype=np.bool_)
    cnt = np.zeros(off.shape[0] - 1, dtype=np.int64)
    best = np.empty(k, dtype=np.int64)  # the winning entry of each bin
    for p in range(n_p):
        for x in range(starts[p], ends[p]):
            cnt[tid[x]] += 1
        for x in range(starts[p], ends[p]):
            t = tid[x]
            if cnt[t] == 0:  # (seen already)
                continue
            e = off[t] + cnt[t] - 1
            cnt[t] = 0
            b = tbin[t]
            if empty[p, b]:
                empty[p, b] = False
                best[b] = e
                continue
            f = best[b]
            if (ln_a[e] < ln_a[f] or (ln_a[e] == ln_a[f] and (
                    z[e] > z[f] or (z[e] == z[f] and uniq[t] < uniq[ent_tok[f]])))):
                best[b] = e
        for b in range(k):
            if not empty[p, b]:
                keys[p, b] = key[best[b]]
    return keys, empty


def sketches(s: Samples, starts: I64, ends: I64, k: int) -> tuple[U64, Bools]:
    """The sketch of every range ``[starts[p], ends[p])`` of the text: ``(keys[P, k],
    empty[P, k])`` (key 0 in empty bins)."""
    return _sketches(s.tid, s.off, s.ent_tok, s.bin, s.uniq, s.ln_a, s.z, s.key,
                     np.ascontiguousarray(starts, dtype=np.int64),
                     np.ascontiguousarray(ends, dtype=np.int64), k)


def sketch(units: U64, k: int, tf: TfMode | TfFn = "log",
           idf: IdfFn | Mapping[int, float] | None = None) -> tuple[U64, Bools]:
    """The sketch of a whole sequence: ``(keys[k], empty[k])``."""
    n = len(units)
    if n == 0:
        return np.zeros(k, dtype=np.uint64), np.ones(k, dtype=np.bool_)
    keys, empty = sketches(samples(units, k, tf, idf), np.zeros(1, np.int64),
                           np.full(1, n, np.int64), k)
    return keys[0], empty[0]


def estimate(a: tuple[U64, Bools], b: tuple[U64, Bools]) -> float:
    """The weighted Jaccard estimate ``N_mat / (k − N_emp)`` (NaN if every bin is empty in
    both)."""
    (ka, ea), (kb, eb) = a, b
    n_emp = int(np.count_nonzero(ea & eb))
    n_mat = int(np.count_nonzero(~ea & ~eb & (ka == kb)))
    k = ka.shape[0]
    return n_mat / (k - n_emp) if k > n_emp else float("nan")


def estimates(a: U64, b: U64, boxes: I64, k: int, tf: TfMode | TfFn = "log") -> F64:
    """The estimate of each box ``(q0, q1, t0, t1)``: ranges ``a[q0:q1]`` and ``b[t0:t1]``."""
    r = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)
    ka, ea = sketches(samples(a, k, tf), r[:, 0], r[:, 1], k)
    kb, eb = sketches(samples(b, k, tf), r[:, 2], r[:, 3], k)
    n_emp = np.count_nonzero(ea & eb, axis=1)
    n_mat = np.count_nonzero(~ea & ~eb & (ka == kb), axis=1)
    return np.where(n_emp < k, n_mat / np.maximum(k - n_emp, 1), np.nan)


# ---------------------------------------------------------------------------------------------
# windows


@njit(cache=True, nogil=True)
def _windows(n: int, pos: I64, off: I64, ent_tok: I64, ent_x: I64, tbin: I64, visit: I64,
             key: U64, k: int) -> tuple[I64, U64, Bools, I64, I64, I64, I64]:
    n_tok = off.shape[0] - 1
    pbin = np.empty(n, dtype=np.int64)
    for t in range(n_tok):
        for e in range(off[t], off[t + 1]):
            pbin[pos[e]] = tbin[t]
    # each bin's positions, ascending (counting sort), and each position's rank in its bin
    start = np.zeros(k + 1, dtype=np.int64)
    for p in range(n):
        start[pbin[p] + 1] += 1
    for b in range(k):
        start[b + 1] += start[b]
    fill = start[:k].copy()
    bpos = np.empty(n, dtype=np.int64)
    rank = np.empty(n, dtype=np.int64)
    for p in range(n):
        b = pbin[p]
        bpos[fill[b]] = p
        rank[p] = fill[b] - start[b]
        fill[b] += 1
    pos_c = np.empty(n, dtype=np.int64)
    for e in range(n):
        pos_c[e] = rank[pos[e]]
    # the visit order split by bin (stable), and each bin's active keys (window bound)
    vstart = np.zeros(k + 1, dtype=np.int64)
    keys_in = np.zeros(k, dtype=np.int64)
    for e in visit:
        t = ent_tok[e]
        vstart[tbin[t] + 1] += 1
        keys_in[tbin[t]] += off[t + 1] - off[t] - ent_x[e] + 1
    for b in range(k):
        vstart[b + 1] += vstart[b]
    vfill = vstart[:k].copy()
    vis = np.empty(visit.shape[0], dtype=np.int64)
    for e in visit:
        b = tbin[ent_tok[e]]
        vis[vfill[b]] = e
        vfill[b] += 1
    cap = 0
    for b in range(k):
        cap += 2 * keys_in[b] + 1
    cap += n + k
    ob = np.empty(cap, dtype=np.int64)
    ok = np.zeros(cap, dtype=np.uint64)
    oe = np.zeros(cap, dtype=np.bool_)
    oa = np.empty(cap, dtype=np.int64)
    obb = np.empty(cap, dtype=np.int64)
    oc = np.empty(cap, dtype=np.int64)
    od = np.empty(cap, dtype=np.int64)
    w = 0
    for b in range(k):
        nb = start[b + 1] - start[b]
        if nb == 0:
            continue
        rows, m = _partition_kernel(nb, pos_c, off, ent_tok, ent_x,
                                    vis[vstart[b]:vstart[b + 1]], 2 * keys_in[b] + 1)
        base = start[b]
        for r in range(m):
            ob[w] = b
            ok[w] = key[rows[r, 0]]
            ra, rb, rc, rd = rows[r, 1], rows[r, 2], rows[r, 3], rows[r, 4]
            oa[w] = bpos[base + ra - 1] + 1 if ra > 0 else 0
            obb[w] = bpos[base + rb]
            oc[w] = bpos[base + rc]
            od[w] = bpos[base + rd + 1] - 1 if rd + 1 < nb else n - 1
            w += 1
    for b in range(k):  # empty windows: the gaps between a bin's positions
        prev = -1
        for x in range(start[b], start[b + 1] + 1):
            nxt = bpos[x] if x < start[b + 1] else n
            if nxt - prev >= 2:
                ob[w] = b
                oe[w] = True
                oa[w] = prev + 1
                obb[w] = nxt - 1
                oc[w] = prev + 1
                od[w] = nxt - 1
                w += 1
            prev = nxt
    return ob[:w], ok[:w], oe[:w], oa[:w], obb[:w], oc[:w], od[:w]


def _visit(s: Samples) -> I64:
    """Active entries (the sample changes: count 1, or z grew) in MonoActive's visit order:
    ``ln a`` ascending, then larger z, then token hash, then larger count."""
    active = np.ones(s.n, dtype=np.bool_)
    active[1:] = (s.ent_x[1:] == 1) | (s.z[1:] > s.z[:-1])
    idx = np.flatnonzero(active)
    th = s.uniq[s.ent_tok]
    return idx[np.lexsort((-s.ent_x[idx], th[idx], -s.z[idx], s.ln_a[idx]))].astype(np.int64)


def compact_windows_of(s: Samples, k: int) -> WOPHWindows:
    """The compact windows of a text from its samples (``samples`` with the same k)."""
    if s.n == 0:
        z = np.empty(0, dtype=np.int64)
        return WOPHWindows(z, np.empty(0, np.uint64), np.empty(0, np.bool_), z, z, z, z)
    ob, ok, oe, oa, obb, oc, od = _windows(s.n, s.pos, s.off, s.ent_tok, s.ent_x, s.bin,
                                           _visit(s), s.key, k)
    return WOPHWindows(ob, ok, oe, oa, obb, oc, od)


def compact_windows(units: U64, k: int, tf: TfMode | TfFn = "log",
                    idf: IdfFn | Mapping[int, float] | None = None) -> WOPHWindows:
    """All weighted-OPH compact windows of a text: every (subsequence, bin) pair lies in
    exactly one window, whose key is that subsequence's sample in the bin (or empty)."""
    return compact_windows_of(samples(units, k, tf, idf), k)


def select(w: WOPHWindows, mask: Bools) -> WOPHWindows:
    """The windows ``mask`` keeps."""
    return WOPHWindows(w.bin[mask], w.key[mask], w.empty[mask], w.a[mask], w.b[mask],
                       w.c[mask], w.d[mask])


def align(query_units: U64, text_windows: WOPHWindows, k: int, theta: tuple[int, int],
          tf: TfMode | TfFn = "log", min_len: int = 1) -> list[tuple[int, int]]:
    """Pairwise alignment: the longest subsequences ``T[s:e]`` (half-open) of a text, given
    by its windows, whose estimate against the query's sketch is ≥ θ = p/q (a collided
    non-empty window weighs q, a jointly empty bin p, the threshold is k·p: OPH's scan)."""
    p, q = int(theta[0]), int(theta[1])
    keys, empty = sketch(query_units, k, tf)
    w = text_windows
    qe = empty[w.bin]
    mask = np.where(w.empty, qe, ~qe & (keys[w.bin] == w.key))
    weights = np.where(w.empty[mask], p, q).astype(np.int64)
    if int(weights.sum()) < k * p:
        return []
    return scan_rectangles(w.a[mask], w.b[mask], w.c[mask], w.d[mask], weights, k * p,
                           min_len)
