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

Empty bins. An element (t, m) with ``m ≤ M(1)`` (a "first" element: present wherever t
occurs) makes a position-level fact, so a bin's subsequences with no first element are the
gaps between its first elements' positions: OPH's empty windows, the (l, r) rows that
dupalign.passage.forward stores. An element that needs x ≥ 2 occurrences is present in a
subsequence only if it holds x copies of t, and the subsequences of a gap that hold one
would make a staircase, which those rows cannot hold. So the text side counts a bin as
empty when it has no FIRST element (``first_empty``) while the query side's bin is empty
when it has no element at all (``empty``): ``N_emp`` counts bins empty in the query and
without first element in the text. The two differ only when the text subsequence holds a
repeated unit whose extra element is alone in a bin the query leaves empty: then ``N_emp``
is one too high (the estimate slightly high); measured with the bias above.

Windows. Per bin b, the subsequences with a present element in b form MonoActive's
monotone case: with ``h_b(t, x)`` the smallest value of t's elements in b among its first
``M(x)``, non-increasing in x (∞ while none), the min of ``T[i..j]`` in b is
``min_t h_b(t, count)``. So each bin is the MonoActive partition
(:func:`dupalign.passage.monoactive._partition_kernel`: active entries, visited by value)
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
    _partition_kernel,
    entry_weights,
    layout,
)
from dupalign.passage.oph import oph_bins
from dupalign.text.hashing import mix64, to_unit

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
Sketch = tuple[U64, Bools, Bools]  # keys, empty (no element), first_empty (no first element)

BETA_SALT = 0x574F5048  # "WOPH": the rounding offset of each token
ELEM_SALT = 0x574F504845  # element values, independent of every other mix64 user


@dataclass(frozen=True)
class WOPHWindows:
    """Windows as rows: bin, key (0 for empty), empty, and the rectangle i ∈ [a, b],
    j ∈ [c, d] (0-based inclusive; an empty window is a gap a = c, b = d, i ≤ j).
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
              starts: I64, ends: I64, k: int) -> tuple[U64, Bools, Bools]:
    n_p = starts.shape[0]
    keys = np.zeros((n_p, k), dtype=np.uint64)
    empty = np.ones((n_p, k), dtype=np.bool_)
    first_empty = np.ones((n_p, k), dtype=np.bool_)
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
            m1 = m_of[off[t]]
            for m in range(m_of[off[t] + c - 1]):
                el = el_off[t] + m
                b = el_bin[el]
                if empty[p, b] or el_u[el] < keys[p, b]:
                    keys[p, b] = el_u[el]
                    empty[p, b] = False
                if m < m1:
                    first_empty[p, b] = False
    return keys, empty, first_empty


def sketches(s: Samples, starts: I64, ends: I64, k: int) -> Sketch:
    """The sketch of every range ``[starts[p], ends[p])`` of the text: ``(keys[P, k],
    empty[P, k], first_empty[P, k])`` (key 0 in empty bins)."""
    return _sketches(s.tid, s.off, s.m_of, s.el_off, s.el_u, s.el_bin,
                     np.ascontiguousarray(starts, dtype=np.int64),
                     np.ascontiguousarray(ends, dtype=np.int64), k)


def sketch(units: U64, k: int, tf: TfMode | TfFn = "log",
           idf: IdfFn | Mapping[int, float] | None = None) -> Sketch:
    """The sketch of a whole sequence: ``(keys[k], empty[k], first_empty[k])``."""
    n = len(units)
    if n == 0:
        return np.zeros(k, dtype=np.uint64), np.ones(k, np.bool_), np.ones(k, np.bool_)
    keys, empty, first = sketches(samples(units, k, tf, idf), np.zeros(1, np.int64),
                                  np.full(1, n, np.int64), k)
    return keys[0], empty[0], first[0]


def estimate(query: Sketch, text: Sketch) -> float:
    """The weighted Jaccard estimate ``N_mat / (k − N_emp)``: matches are equal keys,
    ``N_emp`` the bins empty in the query with no first element in the text (the module
    docstring); NaN if that is every bin."""
    (kq, eq, _), (kt, et, ft) = query, text
    n_emp = int(np.count_nonzero(eq & ft))
    n_mat = int(np.count_nonzero(~eq & ~et & (kq == kt)))
    k = kq.shape[0]
    return n_mat / (k - n_emp) if k > n_emp else float("nan")


def estimates(a: U64, b: U64, boxes: I64, k: int, tf: TfMode | TfFn = "log") -> F64:
    """``estimate`` of each box ``(q0, q1, t0, t1)``: query ``a[q0:q1]``, text ``b[t0:t1]``."""
    r = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)
    kq, eq, _ = sketches(samples(a, k, tf), r[:, 0], r[:, 1], k)
    kt, et, ft = sketches(samples(b, k, tf), r[:, 2], r[:, 3], k)
    n_emp = np.count_nonzero(eq & ft, axis=1)
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
def _windows(n: int, tid: I64, off: I64, m_of: I64, el_off: I64, el_u: U64, el_bin: I64,
             k: int) -> tuple[I64, U64, I64, I64, I64, I64, I64]:
    n_tok = off.shape[0] - 1
    # each token's distinct bins, and whether one of its first elements is in the bin
    tb_off = np.zeros(n_tok + 1, dtype=np.int64)
    tb_bin = np.empty(el_off[n_tok], dtype=np.int64)
    tb_first = np.zeros(el_off[n_tok], dtype=np.bool_)
    stamp = np.full(k, -1, dtype=np.int64)
    slot = np.zeros(k, dtype=np.int64)
    y = 0
    for t in range(n_tok):
        m1 = m_of[off[t]]
        for el in range(el_off[t], el_off[t + 1]):
            b = el_bin[el]
            if stamp[b] != t:
                stamp[b] = t
                slot[b] = y
                tb_bin[y] = b
                y += 1
            if el - el_off[t] < m1:
                tb_first[slot[b]] = True
        tb_off[t + 1] = y
    # each bin's positions, ascending, with their first flags (counting sort)
    start = np.zeros(k + 1, dtype=np.int64)
    for t in range(n_tok):
        f = off[t + 1] - off[t]
        for z in range(tb_off[t], tb_off[t + 1]):
            start[tb_bin[z] + 1] += f
    for b in range(k):
        start[b + 1] += start[b]
    fill = start[:k].copy()
    bpos = np.empty(start[k], dtype=np.int64)
    bfirst = np.empty(start[k], dtype=np.bool_)
    for p in range(n):
        t = tid[p]
        for z in range(tb_off[t], tb_off[t + 1]):
            b = tb_bin[z]
            bpos[fill[b]] = p
            bfirst[fill[b]] = tb_first[z]
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
        rows, m_w = _partition_kernel(nb, lpos, loff, ent_tok, ent_x, visit, 2 * n_keys + 1)
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
    for b in range(k):  # empty windows: the gaps between a bin's first elements
        prev = -1
        for r in range(start[b], start[b + 1] + 1):
            if r < start[b + 1] and not bfirst[r]:
                continue
            nxt = bpos[r] if r < start[b + 1] else n
            if nxt - prev >= 2:
                need = w + 1
                if need > ob.shape[0]:
                    ob, ok, oa = _grow(ob, need), _grow(ok, need), _grow(oa, need)
                    obb, oc, od = _grow(obb, need), _grow(oc, need), _grow(od, need)
                ob[w] = b
                ok[w] = 0
                oa[w] = prev + 1
                obb[w] = nxt - 1
                oc[w] = prev + 1
                od[w] = nxt - 1
                w += 1
            prev = nxt
    return ob[:w], ok[:w], np.full(1, n_full, np.int64), oa[:w], obb[:w], oc[:w], od[:w]


def compact_windows_of(s: Samples, k: int) -> WOPHWindows:
    """The compact windows of a text from its elements (``samples`` with the same k)."""
    if s.n == 0:
        z = np.empty(0, dtype=np.int64)
        return WOPHWindows(z, np.empty(0, np.uint64), np.empty(0, np.bool_), z, z, z, z)
    ob, ok, n_full, oa, obb, oc, od = _windows(s.n, s.tid, s.off, s.m_of, s.el_off, s.el_u,
                                               s.el_bin, k)
    empty = np.zeros(len(ob), dtype=np.bool_)
    empty[int(n_full[0]):] = True
    return WOPHWindows(ob, ok, empty, oa, obb, oc, od)


def compact_windows(units: U64, k: int, tf: TfMode | TfFn = "log",
                    idf: IdfFn | Mapping[int, float] | None = None) -> WOPHWindows:
    """All weighted-OPH compact windows of a text: every (subsequence, bin) with an element
    lies in exactly one non-empty window, whose key is the subsequence's smallest element
    value in the bin; every (subsequence, bin) with no first element in exactly one empty
    window."""
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
    keys, empty, _ = sketch(query_units, k, tf)
    w = text_windows
    qe = empty[w.bin]
    mask = np.where(w.empty, qe, ~qe & (keys[w.bin] == w.key))
    weights = np.where(w.empty[mask], p, q).astype(np.int64)
    if int(weights.sum()) < k * p:
        return []
    return scan_rectangles(w.a[mask], w.b[mask], w.c[mask], w.d[mask], weights, k * p,
                           min_len)
