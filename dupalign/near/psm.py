"""Probabilistic Simhash Matching (PSM, Sood & Loguinov CIKM'11 §6.2, §7.3) on one sorted table.

The table (:class:`dupalign.near.simhash_table.SimhashTable`, where its header width, RAM and
append buffer are described) holds 64-bit fingerprints sorted as unsigned integers, a
directory over their top ``t`` "header" bits, and a small unsorted append buffer whose rows
count as if they were merged: only in the buckets a query probes. So the answer depends on the
rows, never on when the buffer merges (or, with the table split by header prefix, on which
part holds a row).

Volatility versus the fixed sort order. The sort order cannot depend on the query, so bits
are never permuted in the table: the header is always the top t bits of the fingerprint
(bits 63 … 64-t). Volatility only decides the ORDER OF PROBES: VOSH runs over the t header
bits ranked by the query's p_j, and each yielded set S (|S| = i <= h) is one probe of the
bucket ``(x >> (64-t)) ^ mask(S)``; the bucket is scanned linearly and a row y is reported
when popcount(x ^ y) <= h, i.e. when its remaining 64-t bits are within h - i (§6.2).
Flips outside the header cost no probe (the scan covers them exactly), so PSM misses a true
neighbour only when the header flips it needs come after the probe budget is spent.
With an unlimited budget every set of <= h header bits is probed and PSM is exact.

Speed (batch kernel, one core): the header bits of 64 queries at a time are ranked by a
counting rank vectorized across queries, and their volatilities are computed the same way;
only the L = budget - 1 most volatile header bits enter VOSH (no set holding a lower rank
can come within the budget, see :func:`_probes`), so the probe order is exactly that of VOSH
on all t bits. For h <= 3 and small budgets the frontier is a fixed 32-slot list popped
with branch-free reductions; otherwise :func:`dupalign.near.vosh.vosh_enumerate` (shared with
:func:`dupalign.near.vosh.vosh_order_kernel`, so the oracle tests cover it). Queries are
software-pipelined in three stages (probes + directory prefetch, bucket prefetch, scan) so
that a probe's two dependent cache misses overlap with other queries' work. Each query's
result equals a lookup on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from dupalign.kernel_cache import njit
from dupalign.near.simhash_table import NO_BOUND, SimhashTable
from dupalign.near.vosh import (
    MAX_H,
    SENTINEL,
    VolatilityModel,
    bit_volatility,
    packed_mask,
    packed_root,
    rms_of,
    vosh_enumerate,
)

I64 = npt.NDArray[np.int64]

Mode = Literal["first", "all"]
DEFAULT_BUDGET = 64


@njit(cache=True)
def bit_count64(x: np.uint64) -> int:
    """The set bits of one uint64 inside a kernel (numba has no ``int.bit_count``; arrays:
    ``simhash.popcount64``)."""
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return int((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(cache=True)
def grow(a):
    b = np.empty(2 * a.shape[0] + 16, dtype=a.dtype)
    b[: a.shape[0]] = a
    return b


@njit(cache=True)
def scan_range(fps, ords, lo, hi, x, h, out_o, out_h, n, first, before):
    """Report rows lo..hi-1 within h of x and ordinal < before into out_*[n:].

    Returns (n, stop).
    ``stop < hi`` means the output is full (grow it and resume at ``stop``) or, with
    ``first``, that a match was found. Kept free of array reassignment: numba then keeps
    this loop at ~2 ns per row (reassigning arrays in a hot loop costs ~30×).
    """
    for i in range(lo, hi):
        d = bit_count64(x ^ fps[i])
        if d <= h and ords[i] < before:
            if n == out_o.shape[0]:
                return n, i
            out_o[n] = ords[i]
            out_h[n] = d
            n += 1
            if first:
                return n, i + 1
    return n, hi


def _prefetch(typingctx: Any, arr: Any, idx: Any) -> Any:
    """Software prefetch of ``arr[idx]`` into all cache levels (LLVM ``llvm.prefetch``).

    A plain load would stall retirement once the reorder buffer fills; a prefetch lets the
    miss proceed while the core keeps working on other queries.
    """
    sig = types.void(arr, types.intp)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]],
                                       wraparound=False, boundscheck=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


prefetch: Any = intrinsic(_prefetch)


def _cttz(typingctx: Any, x: Any) -> Any:
    """Index of the lowest set bit of a non-zero int64 (one ``tzcnt``)."""
    sig = types.int64(types.int64)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.cttz(args[0], ir.IntType(1)(1))

    return sig, codegen


cttz: Any = intrinsic(_cttz)


@njit(cache=True, inline="always")
def _key3(base, ratio_ext, s):
    """packed_key for sets of <= 3 elements: the factors of the empty slots are exactly 1."""
    k = base * ratio_ext[s & 255]
    k *= ratio_ext[(s >> 8) & 255]
    return k * ratio_ext[(s >> 16) & 255]


@njit(cache=True, inline="always")
def _children3(s, b):
    """packed_children for sets of <= 3 elements (only gaps 0 and 1 can count)."""
    size = s >> 56
    sh = 8 * max(size - 1, 0)
    last = (s >> sh) & 255
    left = s + (1 << sh) if (size > 0) & (last <= b - 2) else -1
    e0 = s & 255
    e1 = (s >> 8) & 255
    e2 = (s >> 16) & 255
    g0 = e1 - e0
    g1 = e2 - e1
    c1 = (size >= 3) & (g1 >= 2)
    c0 = (size >= 2) & (g0 >= 2)
    jstar = 1 if c1 else (0 if c0 else -1)
    gstar = g1 if c1 else g0
    right = s + (1 << (8 * max(jstar, 0))) if (jstar >= 0) & (gstar == 2) else -1
    return left, right

_CHUNK = 64  # queries whose header bits are ranked together (vectorized across queries)
_FRONTIER = 32  # slots of the fixed-size VOSH frontier (budgets with 2k + h - 1 <= 32)


@njit(cache=True)
def _prepare_chunk(W, q0, c, t, L, surv, y_max, prior_scale, absT, ckf, rkT, pT, order,
                   ratioT, base):
    """Rank the header bits of queries q0..q0+c-1 and compute their volatility ratios.

    ``order[i, rho]`` (rho < L) = the header bit (r-th from the top: bit 63 - r) of rank
    rho, by |W| ascending (p_j is non-increasing in |W_j|; the RMS scale is common to all
    bits of a query, so it does not change the rank); ties go by r. ``ratioT[r, i]`` =
    p / (1 - p) of header bit r; ``base[i]`` = prod_r (1 - p). Every loop runs across
    queries (the innermost index), so that it vectorizes; per query, ranking ~20 bits or
    evaluating their volatility one at a time does not.
    """
    n_bins = surv.shape[0] - 1
    inv = np.empty(c)
    for i in range(c):
        rms = rms_of(W[q0 + i])
        inv[i] = 1.0 / rms if rms > 0 else 0.0
    for r in range(t):
        for i in range(c):
            absT[r, i] = abs(W[q0 + i, 63 - r])
    # The bits of a non-negative double order like the double; the low five mantissa bits
    # carry r so that keys are distinct and ties go by r.
    ck = ckf.view(np.int64)
    for r in range(t):
        for i in range(c):
            ckf[r, i] = absT[r, i]
    for r in range(t):
        for i in range(c):
            ck[r, i] = (ck[r, i] & ~np.int64(31)) | r
    for r in range(t):
        for i in range(c):
            rkT[r, i] = 0
    for j in range(t):
        for r in range(t):
            for i in range(c):
                rkT[r, i] += ck[j, i] < ck[r, i]
    for r in range(t):
        for i in range(c):
            rho = rkT[r, i]
            if rho < L:
                order[i, rho] = r
    # bit_volatility inlined without its branch (c >= y_max is checked afterwards), so the
    # loop vectorizes; same expressions, hence the same doubles.
    over = 0
    for r in range(t):
        for i in range(c):
            cc = absT[r, i] * inv[i]
            x = cc * n_bins / y_max
            j = min(int(x), n_bins - 1)
            f = x - j
            pT[r, i] = 0.5 * (surv[j] * (1.0 - f) + surv[j + 1] * f)
            over |= cc >= y_max
    if over:
        for r in range(t):
            for i in range(c):
                cc = absT[r, i] * inv[i]
                if cc >= y_max:
                    pT[r, i] = bit_volatility(cc, surv, y_max, prior_scale)
    for i in range(c):
        base[i] = 1.0
    for r in range(t):
        for i in range(c):
            pr = pT[r, i]
            ratioT[r, i] = pr / (1.0 - pr)
            base[i] *= 1.0 - pr


@njit(cache=True, inline="always")
def _probes(x, t, L, h, budget, base, order, ratioT, i, ratio_ext, bits_ext, keys, seqs,
            sets, packed, pkeys, fkeys, ik, fsets, hv, row):
    """The first ``budget`` VOSH probes of query i of its chunk: header values into hv[row].

    Only the L = min(t, budget - 1) most volatile header bits are ranked: a set whose
    largest rank is r comes after its r - |S| + 1 ancestors in its VOSH tree and after the
    roots of smaller sizes (keys never grow down a tree since p <= 1/2, and earlier
    insertions win ties), i.e. at position >= r + 1, so ranks >= budget - 1 are never
    reached; dropping the sets that hold them leaves the order of the others unchanged.
    For 2 * budget + h - 1 <= _FRONTIER the frontier is a fixed-size list whose pop (first
    largest key) is two branch-free reductions over all slots, which vectorize; keys are
    non-negative doubles, compared as their int64 bits. Returns the number of probes.
    """
    one = np.uint64(1)
    for rho in range(L):
        b = order[i, rho]
        ratio_ext[rho] = ratioT[b, i]
        bits_ext[rho] = one << np.uint64(63 - b)
    shift = np.uint64(64 - t) if t > 0 else np.uint64(0)
    hh = min(h, L)
    if 2 * budget + hh - 1 > _FRONTIER or hh > 3:
        k = vosh_enumerate(base, ratio_ext, L, h, budget, keys, seqs, sets, packed, pkeys)
        for j in range(k):
            hv[row, j] = (x ^ packed_mask(bits_ext, packed[j])) >> shift if t > 0 else np.uint64(0)
        return k
    for s in range(_FRONTIER):
        ik[s] = -2
    n = 0
    for size in range(hh + 1):
        root = packed_root(size)
        fkeys[n] = _key3(base, ratio_ext, root)
        fsets[n] = root
        n += 1
    k = 0
    while k < budget:
        # max of the 32 slots in eight independent chains (a single chain is ~64 cycles)
        m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = np.int64(-3)
        for s in range(0, _FRONTIER, 8):
            m0 = max(m0, ik[s])
            m1 = max(m1, ik[s + 1])
            m2 = max(m2, ik[s + 2])
            m3 = max(m3, ik[s + 3])
            m4 = max(m4, ik[s + 4])
            m5 = max(m5, ik[s + 5])
            m6 = max(m6, ik[s + 6])
            m7 = max(m7, ik[s + 7])
        mx = max(max(max(m0, m1), max(m2, m3)), max(max(m4, m5), max(m6, m7)))
        if mx < 0:
            break
        b0 = b1 = b2 = b3 = np.int64(0)
        for s in range(0, _FRONTIER, 4):
            b0 |= np.int64(ik[s] == mx) << s
            b1 |= np.int64(ik[s + 1] == mx) << (s + 1)
            b2 |= np.int64(ik[s + 2] == mx) << (s + 2)
            b3 |= np.int64(ik[s + 3] == mx) << (s + 3)
        at = cttz((b0 | b1) | (b2 | b3))  # first slot of the largest key
        st = fsets[at]
        ik[at] = -1
        hv[row, k] = (x ^ packed_mask(bits_ext, st)) >> shift if t > 0 else np.uint64(0)
        k += 1
        if k == budget:
            break
        left, right = _children3(st, L)
        kl = _key3(base, ratio_ext, left)
        kr = _key3(base, ratio_ext, right)
        fsets[n] = left
        fkeys[n] = kl
        if left < 0:
            ik[n] = -2
        n += left >= 0
        fsets[n] = right
        fkeys[n] = kr
        if right < 0:
            ik[n] = -2
        n += right >= 0
    return k


@njit(cache=True)
def _psm_batch_kernel(fps, ords, directory, t, buf_fps, buf_ords, qfps, W, before, surv,
                      y_max, prior_scale, h, budget, first):
    """PSM lookups of a batch, software-pipelined over queries; results in query order.

    Query q goes through three stages in consecutive iterations: (A) its VOSH probes are
    computed and their directory entries prefetched; (B) the entries are read (they have
    arrived meanwhile) and the buckets' rows prefetched; (C) the buffer and the buckets are
    scanned. Stage A of query q, B of q-1 and C of q-2 run in one iteration, so the two
    dependent cache misses of every probe overlap with other queries' computation. Every
    query's probes, scan order and matches are exactly those of a lookup on its own.
    """
    m = qfps.shape[0]
    offsets = np.zeros(m + 1, dtype=np.int64)
    probes = np.zeros(m, dtype=np.int64)
    res_ord = np.empty(max(16, m), dtype=np.int64)
    res_ham = np.empty(max(16, m), dtype=np.int64)
    nres = 0
    L = min(t, budget - 1)
    cap = 2 * budget + min(h, t) + 2
    keys = np.empty(cap)
    seqs = np.empty(cap, dtype=np.int64)
    sets = np.empty(cap, dtype=np.int64)
    packed = np.empty(budget, dtype=np.int64)
    pkeys = np.empty(budget)
    fkeys = np.empty(_FRONTIER)
    ik = fkeys.view(np.int64)  # the same slots: keys >= 0 order like their int64 bits
    fsets = np.empty(_FRONTIER, dtype=np.int64)
    tt = max(t, 1)
    absT = np.empty((tt, _CHUNK))
    ckf = np.empty((tt, _CHUNK))
    rkT = np.empty((tt, _CHUNK), dtype=np.int64)
    pT = np.empty((tt, _CHUNK))
    order = np.empty((_CHUNK, max(L, 1)), dtype=np.int64)
    ratioT = np.empty((tt, _CHUNK))
    base = np.empty(_CHUNK)
    ratio_ext = np.ones(SENTINEL + 1)
    bits_ext = np.zeros(SENTINEL + 1, dtype=np.uint64)
    hv = np.empty((3, budget), dtype=np.uint64)
    los = np.empty((3, budget), dtype=np.int64)
    his = np.empty((3, budget), dtype=np.int64)
    nk = np.zeros(3, dtype=np.int64)
    nb = buf_fps.shape[0]
    bo = np.empty(nb, dtype=np.int64)  # a query's buffer rows within h in a probed bucket
    bd = np.empty(nb, dtype=np.int64)
    bp = np.empty(nb, dtype=np.int64)
    shift = np.uint64(64 - t) if t > 0 else np.uint64(0)
    one = np.uint64(1)
    for it in range(m + 2):
        qa = it
        if qa < m:  # stage A
            sa = qa % 3
            ci = qa % _CHUNK
            if ci == 0:
                _prepare_chunk(W, qa, min(_CHUNK, m - qa), t, L, surv, y_max, prior_scale,
                               absT, ckf, rkT, pT, order, ratioT, base)
            k = _probes(qfps[qa], t, L, h, budget, base[ci], order, ratioT, ci, ratio_ext,
                        bits_ext, keys, seqs, sets, packed, pkeys, fkeys, ik, fsets, hv, sa)
            nk[sa] = k
            for i in range(k):
                prefetch(directory, np.intp(hv[sa, i]))
        qb = it - 1
        if 0 <= qb < m:  # stage B
            sb = qb % 3
            for i in range(nk[sb]):
                lo = np.int64(directory[hv[sb, i]])
                hi = np.int64(directory[hv[sb, i] + one])
                los[sb, i] = lo
                his[sb, i] = hi
                if lo < hi:
                    prefetch(fps, lo)
                    prefetch(fps, hi - 1)
        qc = it - 2
        if 0 <= qc < m:  # stage C
            sc = qc % 3
            x = qfps[qc]
            bound = before[qc]
            kq = nk[sc]
            rows = nb
            for i in range(kq):
                rows += his[sc, i] - los[sc, i]
            while nres + rows > res_ord.shape[0]:  # room for every row scanned
                res_ord = grow(res_ord)
                res_ham = grow(res_ham)
            # The buffer is small and unsorted: its rows count as if merged into the sorted
            # table, i.e. only in the buckets probed (their probe index in pb), so an answer
            # never depends on when the buffer merges (nor, in a table split by header
            # prefix, on which part holds a row: docs/pipeline.md, rule 1)
            n = nres
            nbh = 0
            for r in range(nb):
                d = bit_count64(x ^ buf_fps[r])
                if d <= h and buf_ords[r] < bound:
                    hb = buf_fps[r] >> shift if t > 0 else np.uint64(0)
                    for i in range(kq):
                        if hv[sc, i] == hb:
                            bo[nbh] = buf_ords[r]
                            bd[nbh] = d
                            bp[nbh] = i
                            nbh += 1
                            break
            used = kq
            if not first:  # every row within h in the probed buckets
                for j in range(nbh):
                    res_ord[n] = bo[j]
                    res_ham[n] = bd[j]
                    n += 1
                for i in range(kq):  # the buckets, inline: a scan_range call per probe ~10%
                    for r in range(los[sc, i], his[sc, i]):
                        d = bit_count64(x ^ fps[r])
                        if d <= h and ords[r] < bound:
                            res_ord[n] = ords[r]
                            res_ham[n] = d
                            n += 1
            else:  # the first probe with a row within h; in it, the closest, then smallest ordinal
                for i in range(kq):
                    best = NO_BOUND
                    best_d = h + 1
                    for r in range(los[sc, i], his[sc, i]):
                        d = bit_count64(x ^ fps[r])
                        if d <= h and ords[r] < bound and (
                                d < best_d or (d == best_d and ords[r] < best)):
                            best = ords[r]
                            best_d = d
                    for j in range(nbh):
                        if bp[j] == i and (bd[j] < best_d or (bd[j] == best_d and bo[j] < best)):
                            best = bo[j]
                            best_d = bd[j]
                    if best != NO_BOUND:
                        res_ord[n] = best
                        res_ham[n] = best_d
                        n += 1
                        used = i + 1
                        break
            nres = n
            probes[qc] = used
            offsets[qc + 1] = nres
    return offsets, res_ord[:nres], res_ham[:nres], probes


@dataclass(frozen=True)
class PsmBatchResult:
    """Matches of query q: ``ordinals[offsets[q]:offsets[q+1]]`` (and ``hammings``)."""

    offsets: I64
    ordinals: I64
    hammings: I64
    probes: I64  # header probes spent per query

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def get(self, q: int) -> list[tuple[int, int]]:
        a, b = int(self.offsets[q]), int(self.offsets[q + 1])
        return sorted(zip(self.ordinals[a:b].tolist(), self.hammings[a:b].tolist(),
                          strict=True), key=lambda r: (r[1], r[0]))


_DEFAULT_MODEL = VolatilityModel()


def psm_search_batch(
    table: SimhashTable, fps: npt.ArrayLike, Ws: npt.ArrayLike, h: int = 3,
    budget: int | None = DEFAULT_BUDGET, mode: Mode = "first",
    model: VolatilityModel | None = None, before: npt.ArrayLike | None = None,
) -> PsmBatchResult:
    """PSM lookups of many fingerprints (with their weight sums W, shape (m, 64)).

    ``budget`` is the number of header probes per query, the exact header included;
    ``None`` means all sets of <= h header bits (exact search). ``mode="first"`` stops at
    the first probe with a row within h and reports its closest row, the smallest ordinal
    among equals (PSM_F),
    ``"all"`` reports every row within h in the probed buckets (PSM_A).
    ``before`` (an int, or one per query): only rows with a smaller ordinal count, so that
    PSM_F does not stop on a later page or on the query page itself when it is replayed.
    """
    q = np.ascontiguousarray(fps, dtype=np.uint64).ravel()
    W = np.asarray(Ws, dtype=np.float64)
    if W.shape != (q.size, 64):
        raise ValueError(f"Ws must have shape ({q.size}, 64), got {W.shape}")
    if mode not in ("first", "all"):
        raise ValueError("mode must be 'first' or 'all'")
    if not 0 <= h <= MAX_H:
        raise ValueError(f"h must be in [0, {MAX_H}]")
    mdl = model if model is not None else _DEFAULT_MODEL
    t = table.header_bits
    if budget is None:
        budget = sum(math.comb(t, i) for i in range(min(h, t) + 1))
    if budget < 1:
        raise ValueError("budget must be >= 1")
    bound = np.broadcast_to(
        np.asarray(NO_BOUND if before is None else before, dtype=np.int64), q.shape)
    surv, y_max, prior_scale = mdl.kernel_params()
    offsets, ords, hams, probes = _psm_batch_kernel(
        table.fps, table.ordinals, table.directory, t, table.buffer_fps, table.buffer_ordinals,
        q, np.ascontiguousarray(W), np.ascontiguousarray(bound), surv, y_max, prior_scale, h,
        int(budget), mode == "first")
    return PsmBatchResult(offsets, ords, hams, probes)


def psm_search(
    table: SimhashTable, fp: int, W: npt.ArrayLike, h: int = 3,
    budget: int | None = DEFAULT_BUDGET, mode: Mode = "first",
    model: VolatilityModel | None = None, before: int | None = None,
) -> list[tuple[int, int]]:
    """PSM lookup of one fingerprint: [(ordinal, hamming)] sorted by (hamming, ordinal)."""
    w = np.asarray(W, dtype=np.float64).reshape(1, 64)
    return psm_search_batch(table, [fp], w, h, budget, mode, model, before).get(0)


def brute_force_search(
    fps_array: npt.ArrayLike, ordinals: npt.ArrayLike, fp: int, h: int
) -> list[tuple[int, int]]:
    """Exact search by scanning every fingerprint: [(ordinal, hamming)] by (hamming, ordinal)."""
    f = np.asarray(fps_array, dtype=np.uint64)
    o = np.asarray(ordinals, dtype=np.int64)
    d = np.bitwise_count(f ^ np.uint64(fp)).astype(np.int64)
    hit = np.flatnonzero(d <= h)
    return sorted(zip(o[hit].tolist(), d[hit].tolist(), strict=True), key=lambda r: (r[1], r[0]))


@njit(cache=True)
def _brute_batch_kernel(fps, ords, qfps, h):
    m = qfps.shape[0]
    offsets = np.zeros(m + 1, dtype=np.int64)
    res_ord = np.empty(16, dtype=np.int64)
    res_ham = np.empty(16, dtype=np.int64)
    nres = 0
    for q in range(m):
        i = 0
        while True:
            nres, i = scan_range(fps, ords, i, fps.shape[0], qfps[q], h, res_ord, res_ham,
                                 nres, False, NO_BOUND)
            if i >= fps.shape[0]:
                break
            res_ord = grow(res_ord)
            res_ham = grow(res_ham)
        offsets[q + 1] = nres
    return offsets, res_ord[:nres], res_ham[:nres]


def brute_force_batch(
    fps_array: npt.ArrayLike, ordinals: npt.ArrayLike, qfps: npt.ArrayLike, h: int
) -> PsmBatchResult:
    """Exact search of many queries by a full scan each (numba; the benchmark's baseline)."""
    f = np.ascontiguousarray(fps_array, dtype=np.uint64)
    o = np.ascontiguousarray(ordinals, dtype=np.int64)
    q = np.ascontiguousarray(qfps, dtype=np.uint64).ravel()
    offsets, ords, hams = _brute_batch_kernel(f, o, q, h)
    return PsmBatchResult(offsets, ords, hams, np.zeros(q.size, dtype=np.int64))
