"""The sorted fingerprint table that PSM (:mod:`dupalign.near.psm`) searches (CIKM'11 §7.3).

The table is ONE array of 64-bit fingerprints sorted as unsigned integers, with a parallel
array of ordinals, a directory over its top ``t`` "header" bits (``directory[v]`` = first
row whose top t bits are >= v, so the rows of header v are ``directory[v]:directory[v+1]``),
and a small unsorted append buffer.

Header width. §7.3 finds t = d = log2(n) optimal with a 2^t-entry hash table, i.e. 2× the
RAM of the fingerprints. Here t = floor(log2 n) - ``header_slack`` (default 2) for the n rows
in the table at each query (``probe_bits``: the probes' width, so the answer is a function of
the rows alone); the directory is built at every merge over the width of the rows then
(``header_bits``), and a lookup maps a probe onto it either way (dupalign.near.psm). The
directory (uint32 offsets) then costs 4 B × 2^t <= n B, at most 1/8 of the 8n B fingerprint
array (1.105× in all at n = 10^7), and a bucket holds 4–8 rows on average. A smaller
directory than the paper's costs a few more rows per probe, which are sequential and cheap
next to the probe's cache misses.

RAM. ``fingerprint_nbytes`` = sorted fingerprints + directory + buffer; ordinals are a
separate int64 array (``ordinal_nbytes``): they are arbitrary store ordinals, and after
sorting by fingerprint they cannot be implicit positions. ``nbytes`` is the sum.

Append buffer. New rows go to an unsorted buffer that every query scans (its rows count in
the buckets the query probes, as if merged: dupalign.near.psm); it is
merged into the sorted array (linear merge, then directory rebuild) when it holds
``max(buffer_min, isqrt(4 n))`` rows, which balances the O(n) merge per buffer-full against
the O(buffer) scan per query (both ≈ 2·sqrt(n) per page when a page is one insert and one
lookup).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]

# The ordinal bound that admits every row (searches count rows with ordinal < bound); a
# removed row's ordinal is set to it, so that no bound admits the row.
NO_BOUND = np.iinfo(np.int64).max


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
        self._buf_fps[self._nbuf] = fp  # (a Python int: numpy checks its range)
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
        sorted part becomes a tombstone (its ordinal ``NO_BOUND``: no query's bound admits
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
                self.ordinals[a + at] = NO_BOUND
                self._dead += int(at.size)
        if self._dead >= max(self.buffer_min, math.isqrt(4 * len(self.fps))):
            self.flush()  # O(n), after ~2 sqrt(n) removals: O(sqrt(n)) each

    def flush(self) -> None:
        """Merge the buffer into the sorted arrays (dropping tombstones) and re-derive t and
        the directory."""
        if self._dead:
            keep = self.ordinals != NO_BOUND
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

    def header_width(self, n: int) -> int:
        """The header width for ``n`` rows: floor(log2 n) - ``header_slack`` (or the fixed
        one), between 0 and 32."""
        if self._fixed_t is not None:
            return self._fixed_t
        # (floor(log2 n) exactly, from the int: the float log was a tenth of a lookup's calls)
        return min(max(0, int(n).bit_length() - 1 - self.header_slack), 32) if n > 0 else 0

    @property
    def probe_bits(self) -> int:
        """The header width of the queries' probes: that of the rows in the table now, so an
        answer depends on the rows, never on when the directory was last built (whose own
        width, ``header_bits``, only speeds the lookups up; docs/pipeline.md, rule 2)."""
        return self.header_width(len(self))

    def _rebuild_directory(self) -> None:
        n = len(self.fps)
        t = self.header_bits = self.header_width(n)
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
        live = self.ordinals != NO_BOUND
        return (np.concatenate([self.fps[live], self.buffer_fps]),
                np.concatenate([self.ordinals[live], self.buffer_ordinals]))
