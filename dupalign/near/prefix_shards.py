"""The PSM table split by header prefix: the near stage of the partitioned pipeline
(docs/pipeline.md).

Shard s of ``2^b`` holds the fingerprints whose top b bits are s, in a table of its own. A
query's VOSH probes (t-bit headers, t the width of all the rows together:
``SimhashTable.header_width`` of their count) are computed once, where the query is
(``dupalign.near.psm_probes.probe_headers``); each probe goes to the shards its range meets
(``route``: one when t >= b, 2^(b - t) when t < b), and a shard answers the probes it gets from
its own rows (``PrefixShard.answer``). ``combine`` joins the answers into the one table's:
a row counts only in a bucket the query probes (docs/pipeline.md, rule 1) and the probes do
not depend on how the rows are split, so each row is found by the shard that holds it exactly
when one table would find it. PSM_F (``first``): each shard reports its best row of its first
probe with one, and the best over shards by (probe, Hamming distance, ordinal) is the one
table's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.near.psm import PsmBatchResult, bit_count64, grow, probe_rows
from dupalign.near.simhash_table import SimhashTable

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


def shard_of_fingerprint(fps: npt.ArrayLike, b: int) -> I64:
    """The shard of each fingerprint: its top b bits."""
    f = np.asarray(fps, dtype=np.uint64)
    if b == 0:
        return np.zeros(f.shape, dtype=np.int64)
    return (f >> np.uint64(64 - b)).astype(np.int64)


@dataclass(frozen=True)
class ShardProbes:
    """The probes one shard answers: for probe j, its query ``query[j]``, its place in that
    query's probe order ``rank[j]`` and its t-bit ``header[j]``; sorted by (query, rank)."""

    query: I64
    rank: I64
    header: U64


def route(offsets: I64, headers: U64, t: int, b: int) -> list[ShardProbes]:
    """Split the probes of a batch of queries (query q: ``headers[offsets[q]:offsets[q+1]]``,
    in probe order) between the 2^b shards."""
    n = 1 << b
    query = np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
    rank = np.arange(len(headers), dtype=np.int64) - np.repeat(offsets[:-1], np.diff(offsets))
    if t >= b:
        owner = (headers >> np.uint64(t - b)).astype(np.int64) if b else np.zeros(
            len(headers), dtype=np.int64)
        return [ShardProbes(query[owner == s], rank[owner == s], headers[owner == s])
                for s in range(n)]
    # a probe narrower than the shards' prefix meets 2^(b - t) of them, its own rank in each
    span = 1 << (b - t)
    first = headers.astype(np.int64) << (b - t)
    out = []
    for s in range(n):
        mine = (first <= s) & (s < first + span)
        out.append(ShardProbes(query[mine], rank[mine], headers[mine]))
    return out


class PrefixShard:
    """One shard: a ``SimhashTable`` of the rows of its prefix."""

    def __init__(self, shard: int, b: int, table: SimhashTable | None = None) -> None:
        self.shard, self.b = shard, b
        self.table = table if table is not None else SimhashTable()

    def check(self, fps: npt.ArrayLike) -> None:
        """Raise ValueError unless every fingerprint of ``fps`` is of this shard's prefix."""
        if (shard_of_fingerprint(fps, self.b) != self.shard).any():
            raise ValueError(f"a fingerprint outside shard {self.shard}'s prefix")

    def add(self, fps: npt.ArrayLike, ordinals: npt.ArrayLike) -> None:
        self.check(fps)
        self.table.add_many(fps, ordinals)

    def remove(self, fps: npt.ArrayLike, ordinals: npt.ArrayLike) -> None:
        self.table.remove(fps, ordinals)

    def answer(self, probes: ShardProbes, qfps: npt.ArrayLike, t: int, h: int,
               before: npt.ArrayLike | int | None = None, first: bool = False) -> ShardAnswer:
        """The rows within ``h`` of the queries ``qfps`` in the buckets of ``probes`` (t-bit
        headers) and with an ordinal below ``before``; with ``first``, per query only the
        best row (distance, then ordinal) of its first probe that has one."""
        q = np.ascontiguousarray(qfps, dtype=np.uint64).ravel()
        # a writable copy, as in psm_search_batch: one signature of the kernel
        bound = np.broadcast_to(np.asarray(
            np.iinfo(np.int64).max if before is None else before, dtype=np.int64), q.shape).copy()
        tb = self.table
        out = _answer_kernel(tb.fps, tb.ordinals, tb.directory, tb.header_bits, t,
                             tb.buffer_fps, tb.buffer_ordinals, q, bound,
                             np.ascontiguousarray(probes.query),
                             np.ascontiguousarray(probes.rank),
                             np.ascontiguousarray(probes.header, dtype=np.uint64), h, first)
        return ShardAnswer(*out)


@dataclass(frozen=True)
class ShardAnswer:
    """Rows found by one shard: row i is ``ordinal[i]`` at distance ``hamming[i]`` from
    query ``query[i]``, in the bucket of its probe ``rank[i]``."""

    query: I64
    ordinal: I64
    hamming: I64
    rank: I64


def combine(answers: list[ShardAnswer], n_queries: int, first: bool = False
            ) -> PsmBatchResult:
    """The shards' answers as the one table's: every row (PSM_A), or per query the best by
    (probe rank, distance, ordinal) (PSM_F). ``probes`` in the result is 0: spent where the
    probes were made."""
    q = np.concatenate([a.query for a in answers] + [np.empty(0, np.int64)])
    o = np.concatenate([a.ordinal for a in answers] + [np.empty(0, np.int64)])
    d = np.concatenate([a.hamming for a in answers] + [np.empty(0, np.int64)])
    r = np.concatenate([a.rank for a in answers] + [np.empty(0, np.int64)])
    order = np.lexsort((o, d, r, q))
    q, o, d = q[order], o[order], d[order]
    if first:
        keep = np.ones(len(q), dtype=bool)
        keep[1:] = q[1:] != q[:-1]
        q, o, d = q[keep], o[keep], d[keep]
    offsets = np.zeros(n_queries + 1, dtype=np.int64)
    np.cumsum(np.bincount(q, minlength=n_queries), out=offsets[1:])
    return PsmBatchResult(offsets, o, d, np.zeros(n_queries, dtype=np.int64))


@njit(cache=True, inline="always")
def _better(r, d, o, best_r, best_d, best_o):
    """(probe rank, distance, ordinal) before the best so far (none yet: best_r < 0)."""
    if best_r < 0 or r < best_r:
        return True
    if r > best_r:
        return False
    return d < best_d or (d == best_d and o < best_o)


@njit(cache=True, inline="always")
def _push(out_q, out_o, out_d, out_r, n, q, o, d, r):
    """Append a found row (growing the arrays when full); returns them and the new count."""
    if n >= out_q.shape[0]:
        out_q, out_o, out_d, out_r = grow(out_q), grow(out_o), grow(out_d), grow(out_r)
    out_q[n], out_o[n], out_d[n], out_r[n] = q, o, d, r
    return out_q, out_o, out_d, out_r, n + 1


@njit(cache=True)
def _answer_kernel(fps, ords, directory, td, t, buf_fps, buf_ords, qfps, before, pq, pr, hv,
                   h, first):
    """``PrefixShard.answer``: the probes are grouped by query (``pq`` sorted)."""
    n_out = 0
    out_q = np.empty(16, dtype=np.int64)
    out_o = np.empty(16, dtype=np.int64)
    out_d = np.empty(16, dtype=np.int64)
    out_r = np.empty(16, dtype=np.int64)
    shift = np.uint64(64 - t) if t > 0 else np.uint64(0)
    nb = buf_fps.shape[0]
    j = 0
    while j < pq.shape[0]:
        qi = pq[j]
        end = j
        while end < pq.shape[0] and pq[end] == qi:
            end += 1
        x = qfps[qi]
        bound = before[qi]
        best_r = np.int64(-1)
        best_o = np.int64(0)
        best_d = np.int64(0)
        # the buffer once per query: its rows within h, each in its probe (if probed)
        for rb in range(nb):
            d = bit_count64(x ^ buf_fps[rb])
            if d <= h and buf_ords[rb] < bound:
                hb = buf_fps[rb] >> shift if t > 0 else np.uint64(0)
                for k in range(j, end):
                    if hv[k] == hb:
                        if first:
                            if _better(pr[k], d, buf_ords[rb], best_r, best_d, best_o):
                                best_r, best_d, best_o = pr[k], np.int64(d), buf_ords[rb]
                        else:
                            out_q, out_o, out_d, out_r, n_out = _push(
                                out_q, out_o, out_d, out_r, n_out, qi, buf_ords[rb], d, pr[k])
                        break
        for k in range(j, end):
            if first and 0 <= best_r < pr[k]:
                break  # a row at an earlier probe already: no later probe wins
            lo, hi = probe_rows(fps, directory, hv[k], t, td)
            for r in range(lo, hi):
                d = bit_count64(x ^ fps[r])
                if d <= h and ords[r] < bound:
                    if first:
                        if _better(pr[k], d, ords[r], best_r, best_d, best_o):
                            best_r, best_d, best_o = pr[k], np.int64(d), ords[r]
                    else:
                        out_q, out_o, out_d, out_r, n_out = _push(
                            out_q, out_o, out_d, out_r, n_out, qi, ords[r], d, pr[k])
        if first and best_r >= 0:
            out_q, out_o, out_d, out_r, n_out = _push(
                out_q, out_o, out_d, out_r, n_out, qi, best_o, best_d, best_r)
        j = end
    return out_q[:n_out], out_o[:n_out], out_d[:n_out], out_r[:n_out]
