"""The OPH passage sketch of a page (``passage.mode = "oph"``, the default) in one kernel.

``PassageSketcher.sketch_page_steps`` computes it as a dozen numpy and kernel calls (units,
OPH values and bins twice, the passages' sketches, the windows, the positions record, the
distinct lists of the passages and of the windows): on Boost pages (~375 tokens) the calls
cost more than the work, and the values and bins were computed twice. Here the same steps
run in one kernel, each the same arithmetic in the same order, so the state is the same
bytes (``sketch_page_steps`` is its oracle in the tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.passage.distinct import distinct_lists_kernel
from dupalign.passage.oph import OPH_SALT, oph_sketch_kernel, windows_kernel
from dupalign.text.hashing import mix_one, salt_key

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
Bools = npt.NDArray[np.bool_]


@njit(cache=True, inline="always")
def _bin(h: np.uint64, kk: np.uint64) -> np.int64:
    """``oph.oph_bins`` of one value."""
    s32 = np.uint64(32)
    hi = h >> s32
    lo = h & np.uint64(0xFFFFFFFF)
    return np.int64((hi * kk + ((lo * kk) >> s32)) >> s32)


@njit(cache=True, nogil=True)
def _units(hashes: U64, unit_keys: U64) -> U64:
    """``PassageSketcher.units`` for w = len(unit_keys) >= 2 and at least w hashes (w = 1,
    no keys: the hashes themselves)."""
    w = unit_keys.shape[0]
    if w == 0:
        return hashes
    n = hashes.shape[0] - w + 1
    units = np.empty(n, dtype=np.uint64)
    for i in range(n):
        acc = np.uint64(0)
        for x in range(w):
            acc = mix_one(acc ^ hashes[i + x], unit_keys[x])
        units[i] = acc
    return units


@njit(cache=True, nogil=True)
def _starts(n: int, length: int, stride: int) -> I64:
    """``passage_starts`` as an array."""
    if n <= length:
        return np.zeros(1, dtype=np.int64)
    m = (n - length) // stride + 1
    last = (m - 1) * stride
    out = np.empty(m + (last != n - length), dtype=np.int64)
    for p in range(m):
        out[p] = p * stride
    if last != n - length:
        out[m] = n - length
    return out


@njit(cache=True, inline="always")
def _put(out: npt.NDArray[np.uint8], at: int, value: int | np.int64, size: int) -> int:
    """``value`` as ``size`` little-endian bytes into ``out`` at ``at``; the next place."""
    for x in range(size):
        out[at + x] = (value >> (8 * x)) & 0xFF
    return at + size


@njit(cache=True, nogil=True)
def _record(starts: I64, ends: I64, units: U64) -> tuple[bool, npt.NDArray[np.uint8]]:
    """The positions record of ``pack_positions`` but its closing mark: whether every
    token's step fits <u2 (then the steps, else int32 (start, end) pairs), the low 32 bits
    of the units, their number."""
    n = starts.shape[0]
    narrow = True
    prev = 0
    for t in range(n):
        a, b = starts[t] - prev, ends[t] - starts[t]
        narrow = narrow and 0 <= a <= 0xFFFF and 0 <= b <= 0xFFFF
        prev = ends[t]
    size = 4 if narrow else 8
    out = np.empty(size * n + 4 * units.shape[0] + 4, dtype=np.uint8)
    at = 0
    prev = 0
    for t in range(n):
        if narrow:
            at = _put(out, at, starts[t] - prev, 2)
            at = _put(out, at, ends[t] - starts[t], 2)
            prev = ends[t]
        else:  # (offsets are below 2^31: a page has at most max_page_bytes)
            at = _put(out, at, starts[t], 4)
            at = _put(out, at, ends[t], 4)
    for i in range(units.shape[0]):
        at = _put(out, at, np.int64(units[i] & np.uint64(0xFFFFFFFF)), 4)
    _put(out, at, units.shape[0], 4)
    return narrow, out


@njit(cache=True, nogil=True)
def _cells(keys: U64, empty: Bools) -> tuple[I64, U64]:
    """The bins and keys of the non-empty cells of ``keys[P, k]``, row by row (as
    ``np.nonzero``)."""
    n_p, k = keys.shape
    bins = np.empty(n_p * k, dtype=np.int64)
    vals = np.empty(n_p * k, dtype=np.uint64)
    m = 0
    for p in range(n_p):
        for b in range(k):
            if not empty[p, b]:
                bins[m], vals[m] = b, keys[p, b]
                m += 1
    return bins[:m], vals[:m]


@njit(cache=True, nogil=True)
def _nonempty(bins: I64, keys: U64, empty: Bools) -> tuple[I64, U64]:
    """The bins and keys of the non-empty windows, in order."""
    m = 0
    for x in range(bins.shape[0]):
        m += not empty[x]
    out_bins = np.empty(m, dtype=np.int64)
    out_keys = np.empty(m, dtype=np.uint64)
    m = 0
    for x in range(bins.shape[0]):
        if not empty[x]:
            out_bins[m], out_keys[m] = bins[x], keys[x]
            m += 1
    return out_bins, out_keys


@njit(cache=True, nogil=True)
def _oph_page_kernel(hashes: U64, unit_keys: U64, oph_key: np.uint64, k: int, query_len: int,
                     stride: int, tok_starts: I64, tok_ends: I64) -> tuple[Any, ...]:
    """Everything of ``sketch_page`` from the page's token hashes on (at least one unit), in
    four arrays (numba boxes each array it returns for about as long as a short page's
    windows take: ``oph_page`` cuts them) and their parts' sizes."""
    units = _units(hashes, unit_keys)
    n = units.shape[0]
    kk = np.uint64(k)
    hvals = np.empty(n, dtype=np.uint64)
    bins = np.empty(n, dtype=np.int64)
    for i in range(n):
        hvals[i] = mix_one(units[i], oph_key)
        bins[i] = _bin(hvals[i], kk)
    starts = _starts(n, query_len, stride)
    n_p = starts.shape[0]
    ends = np.empty(n_p, dtype=np.int64)
    keys = np.zeros((n_p, k), dtype=np.uint64)
    empty = np.ones((n_p, k), dtype=np.bool_)
    for p in range(n_p):
        ends[p] = min(n, starts[p] + query_len)
        keys[p], empty[p] = oph_sketch_kernel(hvals[starts[p]:ends[p]], bins[starts[p]:ends[p]],
                                              k)
    ob, ov, oe, ol, oc, orr = windows_kernel(hvals, bins, k)
    q_bins, q_keys, q_inverse = distinct_lists_kernel(*_cells(keys, empty))
    w_bins, w_keys, w_inverse = distinct_lists_kernel(*_nonempty(ob, ov, oe))
    fit, record = _record(tok_starts, tok_ends, units)
    ints = np.concatenate((starts, ends, ob, ol, np.where(oe, orr, oc), np.where(oe, ol, oc),
                           orr, q_bins, q_inverse, w_bins, w_inverse))
    words = np.concatenate((units, keys.ravel(), ov, q_keys, w_keys))
    flags = np.concatenate((empty.ravel(), oe))
    return (ints, words, flags, record, fit, n_p, ob.shape[0], q_bins.shape[0],
            q_inverse.shape[0], w_bins.shape[0], w_inverse.shape[0])


def unit_keys(shingle: int, salt: int) -> U64:
    """The mixes of ``PassageSketcher.units``' steps (``salt_key(salt + x)``; none for
    words, w = 1: the units are the token hashes)."""
    return np.array([salt_key(salt + x) for x in range(shingle)] if shingle > 1 else [],
                    dtype=np.uint64)


@dataclass
class OphPage:
    """The kernel's answer, cut: the page's units, its passages' bounds and sketches, its
    windows as rectangles, its positions record but the closing mark, whether its offsets
    are <u2 steps (``fit``), the distinct lists of its passages and of its windows."""

    units: U64
    starts: I64
    ends: I64
    keys: U64
    empty: Bools
    windows: tuple[I64, U64, I64, I64, I64, I64, Bools]  # bin, key, i_lo, i_hi, j_lo, j_hi, empty
    record: npt.NDArray[np.uint8]
    fit: bool
    lists: tuple[I64, U64, I64]
    window_lists: tuple[I64, U64, I64]


def oph_page(hashes: U64, unit_keys: U64, k: int, query_len: int, stride: int,
             tok_starts: I64, tok_ends: I64) -> OphPage:
    """The OPH passage sketch of a page of at least one unit (views of the kernel's four
    arrays)."""
    ints, words, flags, record, fit, n_p, m, a, c, b, d = _oph_page_kernel(
        hashes, unit_keys, _OPH_KEY, k, query_len, stride, tok_starts, tok_ends)
    n = len(words) - n_p * k - m - a - b
    starts, ends, w_bin, i_lo, i_hi, j_lo, j_hi, ql_bins, ql_inv, wl_bins, wl_inv = _cut(
        ints, (n_p, n_p, m, m, m, m, m, a, c, b, d))
    units, keys, w_key, ql_keys, wl_keys = _cut(words, (n, n_p * k, m, a, b))
    empty, w_empty = _cut(flags, (n_p * k, m))
    return OphPage(units, starts, ends, keys.reshape(n_p, k), empty.reshape(n_p, k),
                   (w_bin, w_key, i_lo, i_hi, j_lo, j_hi, w_empty), record, fit,
                   (ql_bins, ql_keys, ql_inv), (wl_bins, wl_keys, wl_inv))


def _cut(buf: npt.NDArray[Any], sizes: tuple[int, ...]) -> list[npt.NDArray[Any]]:
    out, at = [], 0
    for size in sizes:
        out.append(buf[at:at + size])
        at += size
    return out


_OPH_KEY = salt_key(OPH_SALT)
