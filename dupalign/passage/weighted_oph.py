"""Weighted one-permutation hashing: OPH over a token's weight cut into elements, and its
compact windows (``passage.mode = "weighted_oph"``).

The scheme. A token t of weight w (``w = tf(x) · idf(t)`` for x occurrences; idf 1 in the
engine) stands for ``M = floor(w + β_t)`` elements (t, 1), ..., (t, M), with ``β_t`` uniform
in [0, 1) from the token's hash (randomized rounding: ``E[M] = w``, and M never decreases
as w grows, so a larger weight keeps the elements of a smaller one). Element (t, m) has
the 64-bit value ``u = mix64(mix64(th, ELEM_SALT) ^ m, ELEM_SALT + 1)``; its bin is
``oph_bins(u, k)`` (OPH's contiguous ranges) and its key is u. The sketch of a sequence is
plain OPH of its element set: per bin the smallest present value, or empty. One
permutation, k bins; a token of weight 1 is one element, so with binary tf (idf 1) this is
exactly OPH on a fresh hash.

Why it estimates weighted Jaccard. Two sequences' element sets A, B share
``Σ_t min(M_A(t), M_B(t))`` elements out of ``Σ_t max(M_A(t), M_B(t))`` (elements of one
token are nested). OPH's ``N_mat / (k − N_emp)`` is unbiased for the Jaccard of the element
sets (Li, Owen, Zhang 2012), and ``E[M] = w`` makes numerator and denominator unbiased for
``Σ min(w_A, w_B)`` and ``Σ max(w_A, w_B)``: the weighted Jaccard, up to the ratio of the
rounded sums (measured: tests/bench/bench_woph_bias.py). Every element, heavy token or
light, lands in its own random bin: weight buys bins, as it must for a weight average.

Empty bins. Both sides count a bin empty when the sequence has no element in it, as OPH
does, so ``N_emp`` is the bins empty in both. On the text side the subsequences with no
element in bin b are a staircase, not the gaps between positions that OPH's empty windows
are: an element (t, m) with ``m > M(1)`` is present only where t occurs x_t ≥ 2 times
(x_t the smallest count with an element of t in b). For a start i, T[i..j] is empty in b
for ``j ≤ J(i)``: J(i) + 1 is the nearest position, from i on, of the x_t-th occurrence
of some token t of the bin, and J does not decrease with i. J is the same for every start
between two consecutive positions of the bin's tokens, so each bin's empty windows are its
steps ``i ∈ [a, b], j ∈ [i, J]`` (rows ``(a, b, a, J)``, ``i ≤ j`` implied as in OPH's
gaps), one per position at most; with no repeats (every x_t = 1) they are OPH's gaps.
Gaps alone (a text bin counted empty when no element present at count 1 is in it) made a
bin whose text elements all need repeats jointly empty: a bias of +0.04 on repetitive sets
(tests/bench/bench_woph_bias.py).

Windows. Per bin b, the subsequences with a present element in b form MonoActive's
monotone case: with ``h_b(t, x)`` the smallest value of t's elements in b among its first
``M(x)``, non-increasing in x (∞ while none), the min of ``T[i..j]`` in b is
``min_t h_b(t, count)``. So each bin is the MonoActive partition
(:func:`dupalign.passage.monoactive.partition_kernel`: active entries, visited by value)
of the text restricted to the positions of the tokens with an element in b, mapped back
(a restricted range ``[a..b] × [c..d]`` is ``i ∈ [P[a−1]+1, P[b]], j ∈ [P[c], P[d+1]−1]``
with P the bin's sorted positions, guards −1 and n). A position is in as many bins as its
token has elements in distinct bins, about 1 with log tf: O(n + k) windows, OPH's shape,
not MonoActive's k per token.

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
    entry_weights,
    layout,
    partition_kernel,
)
from dupalign.passage.oph import oph_bins
from dupalign.text.hashing import mix64, to_unit

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
Sketch = tuple[U64, Bools]  # keys (0 in empty bins), empty (no element in the bin)

BETA_SALT = 0x574F5048  # "WOPH": the rounding offset of each token
ELEM_SALT = 0x574F504845  # element values, independent of every other mix64 user


@dataclass(frozen=True)
class WOPHWindows:
    """Windows as rows: bin, key (0 for empty), empty, and the rectangle i ∈ [a, b],
    j ∈ [c, d] (0-based inclusive; an empty window is a step a = c, b ≤ d, i ≤ j).
    Order: each bin's non-empty windows, bin by bin, then every bin's empty windows by
    (bin, a)."""

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
    """A text's tokens and elements: the layout (``monoactive.layout``: entry
    ``off[t] + x - 1`` is token t at count x), ``tid`` each position's token, ``m_of`` each
    entry's element count M(x), and token t's elements m = 1..M(f_t) at
    ``el_off[t]:el_off[t + 1]`` with their values (keys) and bins."""

    n: int
    pos: I64
    off: I64
    tid: I64
    m_of: I64
    el_off: I64
    el_u: U64
    el_bin: I64


def samples(units: U64, k: int, tf: TfMode | TfFn = "log",
            idf: IdfFn | Mapping[int, float] | None = None) -> Samples:
    """The elements of a text (for counts up to each token's frequency in it)."""
    lay = layout(np.asarray(units, dtype=np.uint64))
    tid = np.empty(lay.n, dtype=np.int64)
    tid[lay.pos] = lay.ent_tok
    if lay.n == 0:
        z = np.zeros(1, dtype=np.int64)
        return Samples(0, lay.pos, lay.off, tid, tid, z, np.empty(0, np.uint64), tid)
    beta = to_unit(mix64(lay.uniq, BETA_SALT))
    m_of = np.floor(entry_weights(lay, tf, idf) + beta[lay.ent_tok]).astype(np.int64)
    m_max = m_of[lay.off[1:] - 1]
    el_off = np.zeros(len(lay.uniq) + 1, dtype=np.int64)
    np.cumsum(m_max, out=el_off[1:])
    el_tok = np.repeat(np.arange(len(lay.uniq), dtype=np.int64), m_max)
    el_m = np.arange(int(el_off[-1]), dtype=np.int64) - el_off[el_tok] + 1
    el_u = mix64(mix64(lay.uniq[el_tok], ELEM_SALT) ^ el_m.astype(np.uint64), ELEM_SALT + 1)
    return Samples(lay.n, lay.pos, lay.off, tid, m_of, el_off, el_u, oph_bins(el_u, k))


# ---------------------------------------------------------------------------------------------
# sketches and the estimator


@njit(cache=True, nogil=True)
def _sketches(tid: I64, off: I64, m_of: I64, el_off: I64, el_u: U64, el_bin: I64,
              starts: I64, ends: I64, k: int) -> tuple[U64, Bools]:
    n_p = starts.shape[0]
    keys = np.zeros((n_p, k), dtype=np.uint64)
    empty = np.ones((n_p, k), dtype=np.bool_)
    cnt = np.zeros(off.shape[0] - 1, dtype=np.int64)
    for p in range(n_p):
        for x in range(starts[p], ends[p]):
            cnt[tid[x]] += 1
        for x in range(starts[p], ends[p]):
            t = tid[x]
            c = cnt[t]
            if c == 0:  # (seen already)
                continue
            cnt[t] = 0
            for m in range(m_of[off[t] + c - 1]):
                el = el_off[t] + m
                b = el_bin[el]
                if empty[p, b] or el_u[el] < keys[p, b]:
                    keys[p, b] = el_u[el]
                    empty[p, b] = False
    return keys, empty


def sketches(s: Samples, starts: I64, ends: I64, k: int) -> Sketch:
    """The sketch of every range ``[starts[p], ends[p])`` of the text: ``(keys[P, k],
    empty[P, k])`` (key 0 in empty bins)."""
    return _sketches(s.tid, s.off, s.m_of, s.el_off, s.el_u, s.el_bin,
                     np.ascontiguousarray(starts, dtype=np.int64),
                     np.ascontiguousarray(ends, dtype=np.int64), k)


def sketch(units: U64, k: int, tf: TfMode | TfFn = "log",
           idf: IdfFn | Mapping[int, float] | None = None) -> Sketch:
    """The sketch of a whole sequence: ``(keys[k], empty[k])``."""
    n = len(units)
    if n == 0:
        return np.zeros(k, dtype=np.uint64), np.ones(k, np.bool_)
    keys, empty = sketches(samples(units, k, tf, idf), np.zeros(1, np.int64),
                           np.full(1, n, np.int64), k)
    return keys[0], empty[0]


def estimate(query: Sketch, text: Sketch) -> float:
    """The weighted Jaccard estimate ``N_mat / (k − N_emp)``: matches are equal keys,
    ``N_emp`` the bins empty on both sides; NaN if that is every bin."""
    (kq, eq), (kt, et) = query, text
    n_emp = int(np.count_nonzero(eq & et))
    n_mat = int(np.count_nonzero(~eq & ~et & (kq == kt)))
    k = kq.shape[0]
    return n_mat / (k - n_emp) if k > n_emp else float("nan")


def estimates(a: U64, b: U64, boxes: I64, k: int, tf: TfMode | TfFn = "log") -> F64:
    """``estimate`` of each box ``(q0, q1, t0, t1)``: query ``a[q0:q1]``, text ``b[t0:t1]``."""
    r = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)
    kq, eq = sketches(samples(a, k, tf), r[:, 0], r[:, 1], k)
    kt, et = sketches(samples(b, k, tf), r[:, 2], r[:, 3], k)
    n_emp = np.count_nonzero(eq & et, axis=1)
    n_mat = np.count_nonzero(~eq & ~et & (kq == kt), axis=1)
    return np.where(n_emp < k, n_mat / np.maximum(k - n_emp, 1), np.nan)


# ---------------------------------------------------------------------------------------------
# windows


@njit(cache=True, nogil=True)
def _grow(a: npt.NDArray[np.generic], need: int) -> npt.NDArray[np.generic]:
    if need <= a.shape[0]:
        return a
    out = np.empty(max(need, 2 * a.shape[0]), dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


@njit(cache=True, nogil=True)
def _windows(n: int, pos: I64, tid: I64, off: I64, m_of: I64, el_off: I64, el_u: U64,
             el_bin: I64, k: int) -> tuple[I64, U64, I64, I64, I64, I64, I64]:
    n_tok = off.shape[0] - 1
    # each token's distinct bins, and the smallest count x_t with an element in the bin
    tb_off = np.zeros(n_tok + 1, dtype=np.int64)
    tb_bin = np.empty(el_off[n_tok], dtype=np.int64)
    tb_x = np.empty(el_off[n_tok], dtype=np.int64)
    stamp = np.full(k, -1, dtype=np.int64)
    y = 0
    for t in range(n_tok):
        m = 0
        for x in range(1, off[t + 1] - off[t] + 1):
            while m < m_of[off[t] + x - 1]:
                b = el_bin[el_off[t] + m]
                if stamp[b] != t:
                    stamp[b] = t
                    tb_bin[y] = b
                    tb_x[y] = x
                    y += 1
                m += 1
        tb_off[t + 1] = y
    rank = np.empty(n, dtype=np.int64)  # each position's occurrence number in its token
    for e in range(n):
        rank[pos[e]] = e - off[tid[pos[e]]]
    # each bin's positions, ascending, with their x_t (counting sort)
    start = np.zeros(k + 1, dtype=np.int64)
    for t in range(n_tok):
        f = off[t + 1] - off[t]
        for z in range(tb_off[t], tb_off[t + 1]):
            start[tb_bin[z] + 1] += f
    for b in range(k):
        start[b + 1] += start[b]
    fill = start[:k].copy()
    bpos = np.empty(start[k], dtype=np.int64)
    bx = np.empty(start[k], dtype=np.int64)
    for p in range(n):
        t = tid[p]
        for z in range(tb_off[t], tb_off[t + 1]):
            b = tb_bin[z]
            bpos[fill[b]] = p
            bx[fill[b]] = tb_x[z]
            fill[b] += 1
    cap = 2 * start[k] + 2 * k + 16
    ob = np.empty(cap, dtype=np.int64)
    ok = np.zeros(cap, dtype=np.uint64)
    oa = np.empty(cap, dtype=np.int64)
    obb = np.empty(cap, dtype=np.int64)
    oc = np.empty(cap, dtype=np.int64)
    od = np.empty(cap, dtype=np.int64)
    w = 0
    loc = np.full(n_tok, -1, dtype=np.int64)
    ltok = np.empty(n_tok, dtype=np.int64)
    for b in range(k):
        lo, nb = start[b], start[b + 1] - start[b]
        if nb == 0:
            continue
        # the bin's tokens (local ids) and their positions as ranks in the bin
        nt = 0
        for r in range(nb):
            t = tid[bpos[lo + r]]
            if loc[t] < 0:
                loc[t] = nt
                ltok[nt] = t
                nt += 1
        loff = np.zeros(nt + 1, dtype=np.int64)
        for a in range(nt):
            t = ltok[a]
            loff[a + 1] = loff[a] + off[t + 1] - off[t]
        lfill = loff[:nt].copy()
        lpos = np.empty(nb, dtype=np.int64)
        for r in range(nb):
            a = loc[tid[bpos[lo + r]]]
            lpos[lfill[a]] = r
            lfill[a] += 1
        # entries (t, x): the value of t in this bin at count x; active where it drops
        ent_tok = np.empty(nb, dtype=np.int64)
        ent_x = np.empty(nb, dtype=np.int64)
        val = np.zeros(nb, dtype=np.uint64)
        act = np.empty(nb, dtype=np.int64)
        n_act = 0
        n_keys = 0
        for a in range(nt):
            t = ltok[a]
            f = off[t + 1] - off[t]
            has = False
            cur = np.uint64(0)
            m = 0
            for x in range(1, f + 1):
                e = loff[a] + x - 1
                ent_tok[e] = a
                ent_x[e] = x
                dropped = False
                while m < m_of[off[t] + x - 1]:
                    el = el_off[t] + m
                    if el_bin[el] == b and (not has or el_u[el] < cur):
                        cur = el_u[el]
                        has = True
                        dropped = True
                    m += 1
                val[e] = cur
                if dropped:
                    act[n_act] = e
                    n_act += 1
                    n_keys += f - x + 1
        visit = act[:n_act][np.argsort(val[act[:n_act]])]
        rows, m_w = partition_kernel(nb, lpos, loff, ent_tok, ent_x, visit, 2 * n_keys + 1)
        need = w + m_w
        if need > ob.shape[0]:
            ob, ok, oa = _grow(ob, need), _grow(ok, need), _grow(oa, need)
            obb, oc, od = _grow(obb, need), _grow(oc, need), _grow(od, need)
        for r in range(m_w):
            ob[w] = b
            ok[w] = val[rows[r, 0]]
            ra, rb, rc, rd = rows[r, 1], rows[r, 2], rows[r, 3], rows[r, 4]
            oa[w] = bpos[lo + ra - 1] + 1 if ra > 0 else 0
            obb[w] = bpos[lo + rb]
            oc[w] = bpos[lo + rc]
            od[w] = bpos[lo + rd + 1] - 1 if rd + 1 < nb else n - 1
            w += 1
        for a in range(nt):
            loc[ltok[a]] = -1
    n_full = w
    # empty windows: each bin's steps, found right to left (the module docstring)
    sa = np.empty(n + 1, dtype=np.int64)
    sb = np.empty(n + 1, dtype=np.int64)
    sd = np.empty(n + 1, dtype=np.int64)
    for b in range(k):
        ns = 0
        reach = n  # J + 1 for the starts in [bpos[r] + 1, top]
        top = n - 1
        for r in range(start[b + 1] - 1, start[b] - 2, -1):
            lo_i = int(bpos[r]) + 1 if r >= start[b] else 0
            if reach - 1 >= lo_i:
                sa[ns], sb[ns], sd[ns] = lo_i, min(top, reach - 1), reach - 1
                ns += 1
            if r < start[b]:
                break
            t = tid[bpos[r]]
            e = rank[bpos[r]] + bx[r] - 1  # the x_t-th occurrence from this one
            if e < off[t + 1] - off[t]:
                reach = min(reach, int(pos[off[t] + e]))
            top = int(bpos[r])
        need = w + ns
        if need > ob.shape[0]:
            ob, ok, oa = _grow(ob, need), _grow(ok, need), _grow(oa, need)
            obb, oc, od = _grow(obb, need), _grow(oc, need), _grow(od, need)
        for z in range(ns - 1, -1, -1):
            ob[w] = b
            ok[w] = 0
            oa[w] = sa[z]
            obb[w] = sb[z]
            oc[w] = sa[z]
            od[w] = sd[z]
            w += 1
    return ob[:w], ok[:w], np.full(1, n_full, np.int64), oa[:w], obb[:w], oc[:w], od[:w]


def compact_windows_of(s: Samples, k: int) -> WOPHWindows:
    """The compact windows of a text from its elements (``samples`` with the same k)."""
    if s.n == 0:
        z = np.empty(0, dtype=np.int64)
        return WOPHWindows(z, np.empty(0, np.uint64), np.empty(0, np.bool_), z, z, z, z)
    ob, ok, n_full, oa, obb, oc, od = _windows(s.n, s.pos, s.tid, s.off, s.m_of, s.el_off,
                                               s.el_u, s.el_bin, k)
    empty = np.zeros(len(ob), dtype=np.bool_)
    empty[int(n_full[0]):] = True
    return WOPHWindows(ob, ok, empty, oa, obb, oc, od)


def compact_windows(units: U64, k: int, tf: TfMode | TfFn = "log",
                    idf: IdfFn | Mapping[int, float] | None = None) -> WOPHWindows:
    """All weighted-OPH compact windows of a text: every (subsequence, bin) with an element
    lies in exactly one non-empty window, whose key is the subsequence's smallest element
    value in the bin; every (subsequence, bin) without one in exactly one empty window."""
    return compact_windows_of(samples(units, k, tf, idf), k)


def select(w: WOPHWindows, mask: Bools) -> WOPHWindows:
    """The windows ``mask`` keeps."""
    return WOPHWindows(w.bin[mask], w.key[mask], w.empty[mask], w.a[mask], w.b[mask],
                       w.c[mask], w.d[mask])


def align(query_units: U64, text_windows: WOPHWindows, k: int, theta: tuple[int, int],
          tf: TfMode | TfFn = "log", min_len: int = 1) -> list[tuple[int, int]]:
    """Pairwise alignment: the longest subsequences ``T[s:e]`` (half-open) of a text, given
    by its windows, whose estimate against the query's sketch is ≥ θ = p/q (a collided
    non-empty window weighs q, an empty window in a bin empty in the query p, the threshold
    is k·p: OPH's scan)."""
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
