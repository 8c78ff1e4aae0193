"""Probabilistic Simhash Matching (PSM, Sood & Loguinov CIKM'11 §6.2, §7.3) on one sorted table.

The table (:class:`SimhashTable`) is ONE array of 64-bit fingerprints sorted as unsigned
integers, with a parallel array of ordinals, a directory over its top ``t`` "header" bits
(``directory[v]`` = first row whose top t bits are >= v, so the rows of header v are
``directory[v]:directory[v+1]``), and a small unsorted append buffer.

Volatility versus the fixed sort order. The sort order cannot depend on the query, so bits
are never permuted in the table: the header is always the top t bits of the fingerprint
(bits 63 … 64-t). Volatility only decides the ORDER OF PROBES: VOSH runs over the t header
bits ranked by the query's p_j, and each yielded set S (|S| = i <= h) is one probe of the
bucket ``(x >> (64-t)) ^ mask(S)``; the bucket is scanned linearly and a row y is reported
when popcount(x ^ y) <= h, i.e. when its remaining 64-t bits are within h - i (§6.2).
Flips outside the header cost no probe (the scan covers them exactly), so PSM misses a true
neighbour only when the header flips it needs come after the probe budget is spent.
With an unlimited budget every set of <= h header bits is probed and PSM is exact.

Header width. §7.3 finds t = d = log2(n) optimal with a 2^t-entry hash table, i.e. 2× the
RAM of the fingerprints. Here t = floor(log2 n) - ``header_slack`` (default 2), tracked as
the table grows (recomputed at every merge): the directory (uint32 offsets) then costs
4 B × 2^t <= n B, at most 1/8 of the 8n B fingerprint array (1.105× in all at n = 10^7),
and a bucket holds 4–8 rows on average. A smaller directory than the paper's costs a few
more rows per probe, which are sequential and cheap next to the probe's cache misses.

RAM. ``fingerprint_nbytes`` = sorted fingerprints + directory + buffer; ordinals are a
separate int64 array (``ordinal_nbytes``): they are arbitrary store ordinals, and after
sorting by fingerprint they cannot be implicit positions. ``nbytes`` is the sum.

Speed (batch kernel, one core): the header bits of 64 queries at a time are ranked by a
counting rank vectorized across queries, and their volatilities are computed the same way;
only the L = budget - 1 most volatile header bits enter VOSH (no set holding a lower rank
can come within the budget, see :func:`_probes`), so the probe order is exactly that of VOSH
on all t bits. For h <= 3 and small budgets the frontier is a fixed 32-slot list popped
with branch-free reductions; otherwise :func:`dupalign.vosh.vosh_enumerate` (shared with
:func:`dupalign.vosh.vosh_order_kernel`, so the oracle tests cover it). Queries are
software-pipelined in three stages (probes + directory prefetch, bucket prefetch, scan) so
that a probe's two dependent cache misses overlap with other queries' work. Each query's
result equals a lookup on its own.

Append buffer. New rows go to an unsorted buffer that every query scans exactly; it is
merged into the sorted array (linear merge, then directory rebuild) when it holds
``max(buffer_min, isqrt(4 n))`` rows, which balances the O(n) merge per buffer-full against
the O(buffer) scan per query (both ≈ 2·sqrt(n) per page when a page is one insert and one
lookup).
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
from dupalign.vosh import (
    MAX_H,
    SENTINEL,
    VolatilityModel,
    bit_volatility,
    packed_mask,
    packed_root,
    rms_of,
    vosh_enumerate,
)

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

Mode = Literal["first", "all"]
DEFAULT_BUDGET = 64
_NO_BOUND = np.iinfo(np.int64).max


class SimhashTable:
    """Sorted uint64 fingerprints + int64 ordinals + header directory + append buffer."""

    def __init__(
        self, header_bits: int | None = None, header_slack: int = 2, buffer_min: int = 1024
    ) -> None:
        if header_bits is not None and not 0 <= header_bits <= 32:
            raise ValueError("header_bits must be in [0, 32]")
        self._fixed_t = header_bits
        self.header_slack = int(header_slack)
        self.buffer_min = int(buffer_min)
        self.fps: U64 = np.empty(0, dtype=np.uint64)
        self.ordinals: I64 = np.empty(0, dtype=np.int64)
        self._buf_fps: U64 = np.empty(self.buffer_min, dtype=np.uint64)
        self._buf_ords: I64 = np.empty(self.buffer_min, dtype=np.int64)
        self._nbuf = 0
        self._dead = 0  # tombstones in the sorted part (``remove``)
        self.header_bits = 0
        self.directory: npt.NDArray[Any] = np.array([0, 0], dtype=np.uint32)
        self._rebuild_directory()

    # -- building -------------------------------------------------------------------------
    @classmethod
    def from_arrays(
        cls, fps: npt.ArrayLike, ordinals: npt.ArrayLike, header_bits: int | None = None,
        header_slack: int = 2, buffer_min: int = 1024, ordered: bool = False,
    ) -> SimhashTable:
        """Build at start-up from fingerprints and their ordinals; ``ordered``: they are
        sorted by (fingerprint, ordinal) already (as the store's keys are), so no sort and
        no copy."""
        f = np.asarray(fps, dtype=np.uint64).ravel()
        o = np.asarray(ordinals, dtype=np.int64).ravel()
        if f.shape != o.shape:
            raise ValueError("fps and ordinals must have the same length")
        t = cls(header_bits, header_slack, buffer_min)
        if ordered:
            t.fps, t.ordinals = np.ascontiguousarray(f), np.ascontiguousarray(o)
        else:
            order = np.lexsort((o, f))
            t.fps = np.ascontiguousarray(f[order])
            t.ordinals = np.ascontiguousarray(o[order])
        t._rebuild_directory()
        return t

    def add(self, fp: int, ordinal: int) -> None:
        if self._nbuf == self._buf_fps.shape[0]:
            self.flush()
        self._buf_fps[self._nbuf] = np.uint64(fp)
        self._buf_ords[self._nbuf] = ordinal
        self._nbuf += 1

    def add_many(self, fps: npt.ArrayLike, ordinals: npt.ArrayLike) -> None:
        f = np.asarray(fps, dtype=np.uint64).ravel()
        o = np.asarray(ordinals, dtype=np.int64).ravel()
        if f.shape != o.shape:
            raise ValueError("fps and ordinals must have the same length")
        i = 0
        while i < f.size:
            if self._nbuf == self._buf_fps.shape[0]:
                self.flush()
            take = min(f.size - i, self._buf_fps.shape[0] - self._nbuf)
            self._buf_fps[self._nbuf : self._nbuf + take] = f[i : i + take]
            self._buf_ords[self._nbuf : self._nbuf + take] = o[i : i + take]
            self._nbuf += take
            i += take

    def remove(self, fps: npt.ArrayLike, ordinals: npt.ArrayLike) -> None:
        """Drop the rows (fingerprint, ordinal) of pages removed from the store. A row of the
        sorted part becomes a tombstone (its ordinal ``_NO_BOUND``: no query's bound admits
        it, so searches answer as without it) found by its fingerprint in O(log n); the
        tombstones leave at the next merge, which comes early once there are ~2 sqrt(n) of
        them. (Dropping rows at once cost O(n) a page: 1.04 s at 5e7 rows,
        tests/bench/bench_removal.py.)"""
        f = np.asarray(fps, dtype=np.uint64).ravel()
        o = np.asarray(ordinals, dtype=np.int64).ravel()
        if f.shape != o.shape:
            raise ValueError("fps and ordinals must have the same length")
        if not o.size:
            return
        buffered = np.isin(self._buf_ords[: self._nbuf], o)
        if buffered.any():  # the buffer is small: drop them, keeping the others' order
            keep = np.flatnonzero(~buffered)
            n = keep.size
            self._buf_fps[:n] = self._buf_fps[keep]
            self._buf_ords[:n] = self._buf_ords[keep]
            self._nbuf = n
        lo = np.searchsorted(self.fps, f, side="left")
        hi = np.searchsorted(self.fps, f, side="right")
        for a, b, ordinal in zip(lo.tolist(), hi.tolist(), o.tolist(), strict=True):
            at = np.flatnonzero(self.ordinals[a:b] == ordinal)
            if at.size:
                self.ordinals[a + at] = _NO_BOUND
                self._dead += int(at.size)
        if self._dead >= max(self.buffer_min, math.isqrt(4 * len(self.fps))):
            self.flush()  # O(n), after ~2 sqrt(n) removals: O(sqrt(n)) each

    def flush(self) -> None:
        """Merge the buffer into the sorted arrays (dropping tombstones) and re-derive t and
        the directory."""
        if self._dead:
            keep = self.ordinals != _NO_BOUND
            self.fps = np.ascontiguousarray(self.fps[keep])
            self.ordinals = np.ascontiguousarray(self.ordinals[keep])
            self._dead = 0
        if self._nbuf:
            bf = self._buf_fps[: self._nbuf]
            bo = self._buf_ords[: self._nbuf]
            order = np.lexsort((bo, bf))
            bf, bo = bf[order], bo[order]
            # Buffered rows go after equal fingerprints already in the table.
            pos = np.searchsorted(self.fps, bf, side="right")
            self.fps = np.insert(self.fps, pos, bf)
            self.ordinals = np.insert(self.ordinals, pos, bo)
            self._nbuf = 0
        cap = max(self.buffer_min, math.isqrt(4 * len(self.fps)))
        if cap != self._buf_fps.shape[0]:
            self._buf_fps = np.empty(cap, dtype=np.uint64)
            self._buf_ords = np.empty(cap, dtype=np.int64)
        self._rebuild_directory()

    def _rebuild_directory(self) -> None:
        n = len(self.fps)
        if self._fixed_t is not None:
            t = self._fixed_t
        else:
            t = max(0, math.floor(math.log2(n)) - self.header_slack) if n > 0 else 0
            t = min(t, 32)
        self.header_bits = t
        dtype = np.uint32 if n < 2**32 else np.int64
        if t == 0:
            self.directory = np.array([0, n], dtype=dtype)
            return
        counts = np.bincount((self.fps >> np.uint64(64 - t)).astype(np.int64), minlength=1 << t)
        d = np.zeros((1 << t) + 1, dtype=dtype)
        np.cumsum(counts, out=d[1:])
        self.directory = d

    # -- introspection --------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.fps) - self._dead + self._nbuf

    @property
    def buffered(self) -> int:
        return self._nbuf

    @property
    def buffer_fps(self) -> U64:
        return self._buf_fps[: self._nbuf]

    @property
    def buffer_ordinals(self) -> I64:
        return self._buf_ords[: self._nbuf]

    @property
    def fingerprint_nbytes(self) -> int:
        return int(self.fps.nbytes + self.directory.nbytes + self._buf_fps.nbytes)

    @property
    def ordinal_nbytes(self) -> int:
        return int(self.ordinals.nbytes + self._buf_ords.nbytes)

    @property
    def nbytes(self) -> int:
        return self.fingerprint_nbytes + self.ordinal_nbytes

    def all_arrays(self) -> tuple[U64, I64]:
        """Every (fingerprint, ordinal), sorted part then buffer (for exact baselines)."""
        live = self.ordinals != _NO_BOUND
        return (np.concatenate([self.fps[live], self.buffer_fps]),
                np.concatenate([self.ordinals[live], self.buffer_ordinals]))


# ---------------------------------------------------------------------------------------
# search
# ---------------------------------------------------------------------------------------


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
            # The buffer is small and unsorted: scan it exactly. Room is reserved above, so
            # scan_range stops early only on a PSM_F match.
            n, _ = scan_range(buf_fps, buf_ords, 0, nb, x, h, res_ord, res_ham, nres, first,
                              bound)
            used = 0
            found = first and n > nres
            if not found:  # the buckets, inline: a scan_range call per probe costs ~10%
                for i in range(kq):
                    used = i + 1
                    for r in range(los[sc, i], his[sc, i]):
                        d = bit_count64(x ^ fps[r])
                        if d <= h and ords[r] < bound:
                            res_ord[n] = ords[r]
                            res_ham[n] = d
                            n += 1
                            found = first
                            if found:
                                break
                    if found:
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
    the first row within h (PSM_F), ``"all"`` reports every row found (PSM_A).
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
        np.asarray(_NO_BOUND if before is None else before, dtype=np.int64), q.shape)
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
                                 nres, False, _NO_BOUND)
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
