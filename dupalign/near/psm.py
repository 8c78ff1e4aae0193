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

Speed (batch kernel, one core): the probes come from dupalign.near.psm_probes (VOSH order,
ranked 64 queries at a time). Queries are software-pipelined in three stages (probes +
directory prefetch, bucket prefetch, scan) so that a probe's two dependent cache misses
overlap with other queries' work. Each query's result equals a lookup on its own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from dupalign.kernel_cache import njit
from dupalign.near.psm_probes import (
    full_budget,
    next_probes,
    probe_scratch,
    probe_views,
    probe_work,
)
from dupalign.near.simhash_table import NO_BOUND, SimhashTable
from dupalign.near.volatility import VolatilityModel
from dupalign.near.vosh import MAX_H

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


@njit(cache=True, inline="always")
def dir_entry(v, t, td):
    """The directory entry where probe ``v`` (a t-bit header) starts."""
    if t >= td:
        return v >> np.uint64(t - td)
    return v << np.uint64(td - t)


@njit(cache=True, nogil=True)
def lower_bound(fps, lo, hi, v):
    """The first row of lo..hi-1 whose fingerprint is >= v (hi if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if fps[mid] < v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def probe_rows(fps, directory, v, t, td):
    """The sorted rows whose top t bits are ``v``, with a directory over the top td bits.

    The probes' width t and the directory's td are independent: t is the table's row count's
    (``SimhashTable.probe_bits``), td is set when the directory was last built. A narrower
    directory gives a bucket holding the probe's rows, narrowed by binary search; a wider one
    gives them as a run of its buckets."""
    one = np.uint64(1)
    if t == td:
        return np.int64(directory[v]), np.int64(directory[v + one])
    if t < td:
        d = np.uint64(td - t)
        return np.int64(directory[v << d]), np.int64(directory[(v + one) << d])
    b = v >> np.uint64(t - td)
    lo = np.int64(directory[b])
    hi = np.int64(directory[b + one])
    shift = np.uint64(64 - t)
    first = lower_bound(fps, lo, hi, v << shift)
    if v + one == one << np.uint64(t):  # the last header: no upper value fits in 64 bits
        return first, hi
    return first, lower_bound(fps, first, hi, (v + one) << shift)


@njit(cache=True, inline="always")
def _bucket_rows(fps, directory, hv, los, his, row, k, t, td):
    """Stage B of a query: the rows of each of its ``k`` probes into los/his[row], their
    first and last rows prefetched."""
    for i in range(k):
        lo, hi = probe_rows(fps, directory, hv[row, i], t, td)
        los[row, i] = lo
        his[row, i] = hi
        if lo < hi:
            prefetch(fps, lo)
            prefetch(fps, hi - 1)


@njit(cache=True, inline="always")
def _scan_query(fps, ords, buf_fps, buf_ords, x, bound, hv, los, his, row, kq, shift, t, h,
                first, bo, bd, bp, res_ord, res_ham, n):
    """Stage C of a query: its matches into res_*[n:] (room for every row scanned: the
    caller's check). Returns (n, probes used)."""
    # The buffer is small and unsorted: its rows count as if merged into the sorted
    # table, i.e. only in the buckets probed (their probe index in pb), so an answer
    # never depends on when the buffer merges (nor, in a table split by header
    # prefix, on which part holds a row: docs/pipeline.md, rule 1)
    nbh = 0
    for r in range(buf_fps.shape[0]):
        d = bit_count64(x ^ buf_fps[r])
        if d <= h and buf_ords[r] < bound:
            hb = buf_fps[r] >> shift if t > 0 else np.uint64(0)
            for i in range(kq):
                if hv[row, i] == hb:
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
            for r in range(los[row, i], his[row, i]):
                d = bit_count64(x ^ fps[r])
                if d <= h and ords[r] < bound:
                    res_ord[n] = ords[r]
                    res_ham[n] = d
                    n += 1
    else:  # the first probe with a row within h; in it, the closest, then smallest ordinal
        for i in range(kq):
            best = NO_BOUND
            best_d = h + 1
            for r in range(los[row, i], his[row, i]):
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
    return n, used


@njit(cache=True, inline="always")
def _scanned(los, his, row, kq, nb):
    """The rows stage C of a query scans: the buffer's and its buckets'."""
    rows = nb
    for i in range(kq):
        rows += his[row, i] - los[row, i]
    return rows


@njit(cache=True)
def _psm_batch_kernel(fps, ords, directory, td, t, buf_fps, buf_ords, qfps, W, before, surv,
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
    scratch = probe_scratch(t, h, budget)
    hv = np.empty((3, budget), dtype=np.uint64)
    los = np.empty((3, budget), dtype=np.int64)
    his = np.empty((3, budget), dtype=np.int64)
    nk = np.zeros(3, dtype=np.int64)
    nb = buf_fps.shape[0]
    bo = np.empty(nb, dtype=np.int64)  # a query's buffer rows within h in a probed bucket
    bd = np.empty(nb, dtype=np.int64)
    bp = np.empty(nb, dtype=np.int64)
    shift = np.uint64(64 - t) if t > 0 else np.uint64(0)
    for it in range(m + 2):
        qa = it
        if qa < m:  # stage A
            sa = qa % 3
            k = next_probes(W, qa, m, qfps[qa], t, h, budget, surv, y_max, prior_scale,
                            scratch, hv, sa)
            nk[sa] = k
            for i in range(k):
                prefetch(directory, np.intp(dir_entry(hv[sa, i], t, td)))
        qb = it - 1
        if 0 <= qb < m:  # stage B
            _bucket_rows(fps, directory, hv, los, his, qb % 3, nk[qb % 3], t, td)
        qc = it - 2
        if 0 <= qc < m:  # stage C
            sc = qc % 3
            rows = _scanned(los, his, sc, nk[sc], nb)
            while nres + rows > res_ord.shape[0]:  # room for every row scanned
                res_ord = grow(res_ord)
                res_ham = grow(res_ham)
            nres, probes[qc] = _scan_query(fps, ords, buf_fps, buf_ords, qfps[qc], before[qc],
                                           hv, los, his, sc, nk[sc], shift, t, h, first, bo,
                                           bd, bp, res_ord, res_ham, nres)
            offsets[qc + 1] = nres
    return offsets, res_ord[:nres], res_ham[:nres], probes


@njit(cache=True)
def _psm_one_kernel(fps, ords, directory, td, t, buf_fps, buf_ords, x, W, before, surv,
                    y_max, prior_scale, h, budget, first, fw, iw, out):
    """``_psm_batch_kernel`` of one query (fingerprint x, W of shape (64,)) with no array
    made or returned: the probes' working arrays are views of ``fw`` and ``iw``
    (``psm_probes.probe_work`` and 3 * budget more int64 slots), its matches go into
    out[0] (ordinals) and out[1] (hammings), out[2:5] hold its buffer rows. Returns
    (matches, probes), or (-rows, 0) when out has fewer columns than the rows it would
    scan: give it that many and call again."""
    scratch = probe_views(fw, iw, t, h, budget)
    a = iw.shape[0] - 3 * budget
    hv = iw[a:a + budget].view(np.uint64).reshape((1, budget))
    los = iw[a + budget:a + 2 * budget].reshape((1, budget))
    his = iw[a + 2 * budget:].reshape((1, budget))
    k = next_probes(W.reshape((1, 64)), 0, 1, x, t, h, budget, surv, y_max, prior_scale,
                    scratch, hv, 0)
    _bucket_rows(fps, directory, hv, los, his, 0, k, t, td)
    rows = _scanned(los, his, 0, k, buf_fps.shape[0])
    if rows > out.shape[1]:
        return -rows, 0
    shift = np.uint64(64 - t) if t > 0 else np.uint64(0)
    return _scan_query(fps, ords, buf_fps, buf_ords, x, before, hv, los, his, 0, k, shift, t,
                       h, first, out[2], out[3], out[4], out[0], out[1], 0)


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
    t = table.probe_bits
    if budget is None:
        budget = full_budget(t, h)
    if budget < 1:
        raise ValueError("budget must be >= 1")
    # a writable copy whatever the number of queries: a read-only view (one query) would
    # be another signature of the kernel, compiled and cached again
    bound = np.broadcast_to(
        np.asarray(NO_BOUND if before is None else before, dtype=np.int64), q.shape).copy()
    surv, y_max, prior_scale = mdl.kernel_params()
    offsets, ords, hams, probes = _psm_batch_kernel(
        table.fps, table.ordinals, table.directory, table.header_bits, t, table.buffer_fps,
        table.buffer_ordinals,
        q, np.ascontiguousarray(W), bound, surv, y_max, prior_scale, h,
        int(budget), mode == "first")
    return PsmBatchResult(offsets, ords, hams, probes)


def psm_search_one(table: SimhashTable, fp: int, W: npt.NDArray[np.float64], h: int,
                   budget: int, first: bool, model: VolatilityModel, before: int
                   ) -> tuple[list[tuple[int, int]], int]:
    """``psm_search_batch`` of one query, ``.get(0)`` and its probes, for a caller whose
    arguments are valid already (the index stage, once a page: the batch call's checks and
    conversions cost it more than the kernel). ``W``: float64, contiguous, shape (64,)."""
    surv, y_max, prior_scale = model.kernel_params()
    t = table.probe_bits
    work = _WORK
    if work.key != (t, h, budget):
        work.fw, work.iw = probe_work(t, h, budget, 3 * budget)
        work.key = (t, h, budget)
    while True:
        n, probes = _psm_one_kernel(
            table.fps, table.ordinals, table.directory, table.header_bits, t,
            table.buffer_fps, table.buffer_ordinals, np.uint64(fp), W, before, surv, y_max,
            prior_scale, h, budget, first, work.fw, work.iw, work.out)
        if n >= 0:
            break
        work.out = np.empty((5, 2 * -n), dtype=np.int64)
    if not n:
        return [], probes
    found = list(zip(work.out[0, :n].tolist(), work.out[1, :n].tolist(), strict=True))
    if n > 1:
        found.sort(key=lambda r: (r[1], r[0]))
    return found, probes


class _OneWork(threading.local):
    """``psm_search_one``'s working arrays, kept for the next lookup of this thread at the
    same probe width, h and budget (the width grows with the table: rarely made again)."""

    key: tuple[int, int, int] | None = None
    fw: npt.NDArray[np.float64]
    iw: I64
    out: I64 = np.empty((5, 0), dtype=np.int64)


_WORK = _OneWork()


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
