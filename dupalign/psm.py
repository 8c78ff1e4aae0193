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

Speed (batch kernel, one core): ranking the header bits is a branch-free counting rank;
the VOSH frontier is an insertion-ordered list for budgets <= 64 (a heap above); probes
are issued in rounds whose directory entries and first rows are loaded in tight loops so
that their cache misses overlap; the first probe of the next queries is prefetched.

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
from numba import njit

from dupalign.vosh import (
    LINEAR_MAX_BUDGET,
    MAX_H,
    VolatilityModel,
    bit_volatility,
    heap_pop,
    heap_push,
    list_pop,
    packed_children,
    packed_elem,
    packed_key,
    packed_root,
    packed_size,
    rms_of,
)

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

Mode = Literal["first", "all"]
DEFAULT_BUDGET = 64
_NO_BOUND = np.iinfo(np.int64).max
_PREFETCH = 8  # lookahead (queries) of the software prefetch in the batch kernel


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
        self.header_bits = 0
        self.directory: npt.NDArray[Any] = np.array([0, 0], dtype=np.uint32)
        self._rebuild_directory()

    # -- building -------------------------------------------------------------------------
    @classmethod
    def from_arrays(
        cls, fps: npt.ArrayLike, ordinals: npt.ArrayLike, header_bits: int | None = None,
        header_slack: int = 2, buffer_min: int = 1024,
    ) -> SimhashTable:
        """Build at start-up from (unsorted) fingerprints and their ordinals."""
        f = np.asarray(fps, dtype=np.uint64).ravel()
        o = np.asarray(ordinals, dtype=np.int64).ravel()
        if f.shape != o.shape:
            raise ValueError("fps and ordinals must have the same length")
        t = cls(header_bits, header_slack, buffer_min)
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

    def flush(self) -> None:
        """Merge the buffer into the sorted arrays and re-derive t and the directory."""
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
        return len(self.fps) + self._nbuf

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
        return (np.concatenate([self.fps, self.buffer_fps]),
                np.concatenate([self.ordinals, self.buffer_ordinals]))


# ---------------------------------------------------------------------------------------
# search
# ---------------------------------------------------------------------------------------


@njit(cache=True)
def popcount64(x: np.uint64) -> int:
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
        d = popcount64(x ^ fps[i])
        if d <= h and ords[i] < before:
            if n == out_o.shape[0]:
                return n, i
            out_o[n] = ords[i]
            out_h[n] = d
            n += 1
            if first:
                return n, i + 1
    return n, hi


@njit(cache=True)
def _psm_one(fps, ords, directory, t, buf_fps, buf_ords, x, w, before, surv, y_max,
             prior_scale, h, budget, first, out_o, out_h, n, keys, seqs, sets, ph, ck, order,
             ratio, hbit, hvs, los, his):
    """One PSM lookup; returns (n, probes, ok, sink); ok is False when out_* overflowed.

    ``sink`` only keeps the prefetching loads alive.
    """
    nb = buf_fps.shape[0]
    # The buffer is small and unsorted: scan it exactly.
    n2, stop = scan_range(buf_fps, buf_ords, 0, nb, x, h, out_o, out_h, n, first,
                          before)
    if first and n2 > n:
        return n2, 0, True, np.uint64(0)
    if stop < nb:
        return n2, 0, False, np.uint64(0)
    n = n2
    # Rank the header bits (the r-th from the top is bit 63 - r) by |W_j| / rms ascending,
    # i.e. by p_j non-increasing (p is monotone in |W_j|): the bits of a non-negative double
    # order like the double, and the low five mantissa bits carry the header index (t <= 32)
    # so that every key is distinct and ties go by index; a counting rank on such keys is
    # branch-free.
    rms = rms_of(w)
    inv = 1.0 / rms if rms > 0 else 0.0
    for r in range(t):
        ph[r] = abs(w[63 - r]) * inv
    phi = ph.view(np.int64)
    for r in range(t):
        ck[r] = (phi[r] & ~np.int64(31)) | r
    for i in range(t):
        v = ck[i]
        rk = 0
        for j in range(t):
            rk += ck[j] < v
        order[rk] = i
    base = 1.0
    one = np.uint64(1)
    for r in range(t):
        pr = bit_volatility(ph[order[r]], surv, y_max, prior_scale)
        ratio[r] = pr / (1.0 - pr)
        base *= 1.0 - pr
        hbit[r] = one << np.uint64(63 - order[r])
    shift = np.uint64(64 - t) if t > 0 else np.uint64(0)
    # VOSH frontier: an insertion-ordered list for small budgets, a heap otherwise (the same
    # order either way: largest p(u, S), then earliest insertion).
    linear = budget <= LINEAR_MAX_BUDGET
    m = 0
    used = 0
    seq = 0
    for size in range(min(h, t) + 1):
        root = packed_root(size)
        key = packed_key(base, ratio, root)
        if linear:
            keys[used] = key
            sets[used] = root
            used += 1
            m += 1
        else:
            m = heap_push(keys, seqs, sets, m, key, seq, root)
        seq += 1
    # Probes go in rounds: VOSH yields the round's header values, their directory entries
    # and first rows are loaded in tight independent loops (so the cache misses overlap),
    # then the buckets are scanned. PSM_F rounds double in size (1, 2, 4, ...) since it
    # usually stops after one or two probes; PSM_A takes the whole budget in one round.
    k = 0
    sink = np.uint64(0)
    rnd = budget if not first else 1
    while k < budget and m > 0:
        kk = 0
        while kk < rnd and k + kk < budget and m > 0:
            if linear:
                i = list_pop(keys, used)
                s = sets[i]
                keys[i] = -2.0
                m -= 1
            else:
                m, _key, s = heap_pop(keys, seqs, sets, m)
            mask = np.uint64(0)
            for e in range(packed_size(s)):
                mask |= hbit[packed_elem(s, e)]
            hvs[kk] = (x ^ mask) >> shift if t > 0 else np.uint64(0)
            kk += 1
            left, right = packed_children(s, t)
            for c in (left, right):
                if c >= 0:
                    key = packed_key(base, ratio, c)
                    if linear:
                        keys[used] = key
                        sets[used] = c
                        used += 1
                        m += 1
                    else:
                        m = heap_push(keys, seqs, sets, m, key, seq, c)
                    seq += 1
        for i in range(kk):
            los[i] = np.int64(directory[hvs[i]])
            his[i] = np.int64(directory[hvs[i] + one])
        for i in range(kk):
            if los[i] < his[i]:
                sink ^= fps[los[i]]
        for i in range(kk):
            n2, stop = scan_range(fps, ords, los[i], his[i], x, h, out_o, out_h, n, first,
                                  before)
            if first and n2 > n:
                return n2, k + i + 1, True, sink
            if stop < his[i]:
                return n2, k + i + 1, False, sink
            n = n2
        k += kk
        rnd *= 2
    return n, k, True, sink


@njit(cache=True)
def _psm_batch_kernel(fps, ords, directory, t, buf_fps, buf_ords, qfps, W, before, surv,
                      y_max, prior_scale, h, budget, first):
    m = qfps.shape[0]
    offsets = np.zeros(m + 1, dtype=np.int64)
    probes = np.zeros(m, dtype=np.int64)
    res_ord = np.empty(max(16, m), dtype=np.int64)
    res_ham = np.empty(max(16, m), dtype=np.int64)
    nres = 0
    cap = 2 * budget + min(h, t) + 2
    keys = np.empty(cap)
    seqs = np.empty(cap, dtype=np.int64)
    sets = np.empty(cap, dtype=np.int64)
    ph = np.empty(max(t, 1))
    ck = np.empty(max(t, 1), dtype=np.int64)
    order = np.empty(max(t, 1), dtype=np.int64)
    ratio = np.empty(max(t, 1))
    hbit = np.empty(max(t, 1), dtype=np.uint64)  # rank -> mask of that header bit
    hvs = np.empty(budget, dtype=np.uint64)
    los = np.empty(budget, dtype=np.int64)
    his = np.empty(budget, dtype=np.int64)
    sink = np.uint64(0)
    shift = np.uint64(64 - t) if t > 0 else np.uint64(63)
    hmask = np.uint64(0) if t == 0 else ~np.uint64(0)
    for q in range(m):
        # Every lookup's first probe is its own header (the empty flip set has the largest
        # p(u, S) since p_j <= 1/2): touch the directory entry PREFETCH queries ahead and
        # the first row of the bucket half as far ahead, so those misses overlap with work.
        if q + _PREFETCH < m:
            sink ^= np.uint64(directory[(qfps[q + _PREFETCH] >> shift) & hmask])
        if q + _PREFETCH // 2 < m:
            lo = directory[(qfps[q + _PREFETCH // 2] >> shift) & hmask]
            if lo < fps.shape[0]:
                sink ^= fps[lo]
        while True:
            n2, k, ok, sk = _psm_one(fps, ords, directory, t, buf_fps, buf_ords, qfps[q], W[q],
                                     before[q], surv, y_max, prior_scale, h, budget, first, res_ord,
                                     res_ham, nres, keys, seqs, sets, ph, ck, order, ratio,
                                     hbit, hvs, los, his)
            sink ^= sk
            if ok:
                break
            res_ord = grow(res_ord)  # rare: redo this query with more room
            res_ham = grow(res_ham)
        nres = n2
        probes[q] = k
        offsets[q + 1] = nres
    return offsets, res_ord[:nres], res_ham[:nres], probes, sink


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
    offsets, ords, hams, probes, _sink = _psm_batch_kernel(
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
