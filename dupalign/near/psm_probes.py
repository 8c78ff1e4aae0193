"""The probes of a PSM lookup: the t-bit header values a query visits, in VOSH order
(Sood & Loguinov CIKM'11 §6.2), a function of the query's fingerprint and weight sums, the
volatility model, h and the budget alone (not of the table's rows). Made here for the lookup
on one table (dupalign.near.psm) and, apart, for a table split by header prefix
(``probe_headers``, dupalign.near.prefix_shards).

Speed: the header bits of 64 queries at a time are ranked by a counting rank vectorized
across queries, and their volatilities computed the same way; only the L = budget - 1 most
volatile header bits enter VOSH (no set holding a lower rank can come within the budget, see
:func:`vosh_probes`), so the probe order is exactly that of VOSH on all t bits. For h <= 3
and small budgets the frontier is a fixed 32-slot list popped with branch-free reductions;
otherwise :func:`dupalign.near.vosh.vosh_enumerate`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from dupalign.kernel_cache import njit
from dupalign.near.volatility import VolatilityModel, bit_volatility, rms_of
from dupalign.near.vosh import SENTINEL, packed_mask, packed_root, vosh_enumerate

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]

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

CHUNK = 64  # queries whose header bits are ranked together (vectorized across queries)
FRONTIER = 32  # slots of the fixed-size VOSH frontier (budgets with 2k + h - 1 <= 32)


@njit(cache=True)
def prepare_chunk(W, q0, c, t, L, surv, y_max, prior_scale, absT, ckf, rkT, pT, order,
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
def vosh_probes(x, t, L, h, budget, base, order, ratioT, i, ratio_ext, bits_ext, keys, seqs,
            sets, packed, pkeys, fkeys, ik, fsets, hv, row):
    """The first ``budget`` VOSH probes of query i of its chunk: header values into hv[row].

    Only the L = min(t, budget - 1) most volatile header bits are ranked: a set whose
    largest rank is r comes after its r - |S| + 1 ancestors in its VOSH tree and after the
    roots of smaller sizes (keys never grow down a tree since p <= 1/2, and earlier
    insertions win ties), i.e. at position >= r + 1, so ranks >= budget - 1 are never
    reached; dropping the sets that hold them leaves the order of the others unchanged.
    For 2 * budget + h - 1 <= FRONTIER the frontier is a fixed-size list whose pop (first
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
    if 2 * budget + hh - 1 > FRONTIER or hh > 3:
        k = vosh_enumerate(base, ratio_ext, L, h, budget, keys, seqs, sets, packed, pkeys)
        for j in range(k):
            hv[row, j] = (x ^ packed_mask(bits_ext, packed[j])) >> shift if t > 0 else np.uint64(0)
        return k
    for s in range(FRONTIER):
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
        for s in range(0, FRONTIER, 8):
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
        for s in range(0, FRONTIER, 4):
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
def scratch_sizes(t, h, budget):
    """(float64 slots, int64 slots) of ``next_probes``'s working arrays (``probe_views``)."""
    L = min(t, budget - 1)
    cap = 2 * budget + min(h, t) + 2
    tt = max(t, 1)
    return (cap + budget + FRONTIER + 4 * tt * CHUNK + CHUNK + SENTINEL + 1,
            2 * cap + budget + FRONTIER + tt * CHUNK + CHUNK * max(L, 1) + SENTINEL + 1)


@njit(cache=True)
def probe_work(t, h, budget, extra):
    """The two arrays ``probe_views`` cuts the working arrays from (and ``extra`` int64
    slots after them for the caller), filled where a probe reads before it writes (the
    sentinel rank's ratio 1 and bit 0). Reusable: a lookup reads no slot it did not write
    but those."""
    nf, ni = scratch_sizes(t, h, budget)
    fw = np.empty(nf)
    iw = np.empty(ni + extra, dtype=np.int64)
    views = probe_views(fw, iw, t, h, budget)
    views[16][:] = 1.0  # ratio_ext
    views[17][:] = 0  # bits_ext
    return fw, iw


@njit(cache=True)
def probe_views(fw, iw, t, h, budget):
    """The working arrays of ``next_probes`` for queries of width t, radius h, budget, as
    views of ``probe_work``'s two arrays (made once, a one-query lookup's 18 allocations
    cost more than its probes: docs/performance/scan.md)."""
    L = min(t, budget - 1)
    cap = 2 * budget + min(h, t) + 2
    tt = max(t, 1)
    g = tt * CHUNK
    keys, pkeys = fw[:cap], fw[cap:cap + budget]
    f = cap + budget
    fkeys = fw[f:f + FRONTIER]
    f += FRONTIER
    absT = fw[f:f + g].reshape((tt, CHUNK))
    ckf = fw[f + g:f + 2 * g].reshape((tt, CHUNK))
    pT = fw[f + 2 * g:f + 3 * g].reshape((tt, CHUNK))
    ratioT = fw[f + 3 * g:f + 4 * g].reshape((tt, CHUNK))
    f += 4 * g
    base, ratio_ext = fw[f:f + CHUNK], fw[f + CHUNK:f + CHUNK + SENTINEL + 1]
    seqs, sets, packed = iw[:cap], iw[cap:2 * cap], iw[2 * cap:2 * cap + budget]
    i = 2 * cap + budget
    fsets = iw[i:i + FRONTIER]
    i += FRONTIER
    rkT = iw[i:i + g].reshape((tt, CHUNK))
    i += g
    order = iw[i:i + CHUNK * max(L, 1)].reshape((CHUNK, max(L, 1)))
    i += CHUNK * max(L, 1)
    bits_ext = iw[i:i + SENTINEL + 1].view(np.uint64)
    return (L, keys, seqs, sets, packed, pkeys, fkeys,
            fkeys.view(np.int64),  # the same slots: keys >= 0 order like their int64 bits
            fsets, absT, ckf, rkT, pT, order, ratioT, base, ratio_ext, bits_ext)


@njit(cache=True)
def probe_scratch(t, h, budget):
    """The working arrays of ``next_probes`` for queries of width t, radius h, budget."""
    fw, iw = probe_work(t, h, budget, 0)
    return probe_views(fw, iw, t, h, budget)


@njit(cache=True, inline="always")
def next_probes(W, q, m, x, t, h, budget, surv, y_max, prior_scale, scratch, hv, row):
    """The probes of query q (of m, fingerprint x) into ``hv[row]``; queries must come in
    order (each chunk of CHUNK is ranked at its first query). Returns their number."""
    (L, keys, seqs, sets, packed, pkeys, fkeys, ik, fsets, absT, ckf, rkT, pT, order, ratioT,
     base, ratio_ext, bits_ext) = scratch
    ci = q % CHUNK
    if ci == 0:
        prepare_chunk(W, q, min(CHUNK, m - q), t, L, surv, y_max, prior_scale, absT, ckf, rkT,
                      pT, order, ratioT, base)
    return vosh_probes(x, t, L, h, budget, base[ci], order, ratioT, ci, ratio_ext, bits_ext,
                       keys, seqs, sets, packed, pkeys, fkeys, ik, fsets, hv, row)


@njit(cache=True)
def _probe_headers_kernel(qfps, W, t, surv, y_max, prior_scale, h, budget):
    m = qfps.shape[0]
    offsets = np.zeros(m + 1, dtype=np.int64)
    out = np.empty(m * budget, dtype=np.uint64)
    scratch = probe_scratch(t, h, budget)
    hv = np.empty((1, budget), dtype=np.uint64)
    for q in range(m):
        k = next_probes(W, q, m, qfps[q], t, h, budget, surv, y_max, prior_scale, scratch,
                        hv, 0)
        out[offsets[q]:offsets[q] + k] = hv[0, :k]
        offsets[q + 1] = offsets[q] + k
    return offsets, out[:offsets[m]]


def full_budget(t: int, h: int) -> int:
    """Every set of <= h of the t header bits: the budget of an exact search."""
    return sum(math.comb(t, i) for i in range(min(h, t) + 1))


def probe_headers(fps: npt.ArrayLike, Ws: npt.ArrayLike, t: int, h: int,
                  budget: int | None, model: VolatilityModel | None = None
                  ) -> tuple[I64, U64]:
    """The probes of each query (fingerprints ``fps``, weight sums ``Ws`` of shape (m, 64))
    at header width t: query q's are ``headers[offsets[q]:offsets[q+1]]``, in probe order,
    as a lookup on one table of that width visits them (``budget`` None: all, exact)."""
    q = np.ascontiguousarray(fps, dtype=np.uint64).ravel()
    W = np.ascontiguousarray(Ws, dtype=np.float64)
    if W.shape != (q.size, 64):
        raise ValueError(f"Ws must have shape ({q.size}, 64), got {W.shape}")
    budget = full_budget(t, h) if budget is None else budget
    if budget < 1:
        raise ValueError("budget must be >= 1")
    surv, y_max, prior_scale = (model or VolatilityModel()).kernel_params()
    offsets, headers = _probe_headers_kernel(q, W, t, surv, y_max, prior_scale, h,
                                             int(budget))
    return offsets, headers
