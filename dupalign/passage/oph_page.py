"""The OPH passage sketch of a page (``passage.mode = "oph"``, the default) in one kernel.

``PassageSketcher.sketch_page_steps`` computes it as a dozen numpy and kernel calls (units,
OPH values and bins twice, the passages' sketches, the windows, the positions record, the
distinct lists of the passages and of the windows): on Boost pages (~375 tokens) the calls
cost more than the work, and the values and bins were computed twice. Here the same steps
run in one kernel, each the same arithmetic in the same order, so the state is the same
bytes (``sketch_page_steps`` is its oracle in the tests).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.passage.oph import OPH_SALT, _windows, oph_sketch_kernel
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


@njit(cache=True, nogil=True)
def _offsets(starts: I64, ends: I64) -> tuple[bool, npt.NDArray[np.uint16],
                                              npt.NDArray[np.int32]]:
    """The token offsets of ``pack_positions``: whether every step fits <u2, the steps
    as <u2 if so, else the int32 (start, end) pairs (the other array empty)."""
    n = starts.shape[0]
    steps = np.empty(2 * n, dtype=np.int64)
    prev = 0
    narrow = True
    for t in range(n):
        a, b = starts[t] - prev, ends[t] - starts[t]
        steps[2 * t], steps[2 * t + 1] = a, b
        narrow = narrow and 0 <= a <= 0xFFFF and 0 <= b <= 0xFFFF
        prev = ends[t]
    if narrow:
        return True, steps.astype(np.uint16), np.empty(0, dtype=np.int32)
    both = np.empty(2 * n, dtype=np.int32)
    for t in range(n):
        both[2 * t], both[2 * t + 1] = starts[t], ends[t]
    return False, np.empty(0, dtype=np.uint16), both


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
    """Everything of ``sketch_page`` from the page's token hashes on (at least one unit)."""
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
    ob, ov, oe, ol, oc, orr = _windows(hvals, bins, k)
    i_hi = np.where(oe, orr, oc)
    j_lo = np.where(oe, ol, oc)
    fit, narrow, wide = _offsets(tok_starts, tok_ends)
    low = np.empty(n, dtype=np.uint32)
    for i in range(n):
        low[i] = np.uint32(units[i] & np.uint64(0xFFFFFFFF))
    q_bins, q_keys = _cells(keys, empty)
    w_bins, w_keys = _nonempty(ob, ov, oe)
    return (units, starts, ends, keys, empty, ob, ov, oe, ol, i_hi, j_lo, orr, fit, narrow,
            wide, low, q_bins, q_keys, w_bins, w_keys)


def unit_keys(shingle: int, salt: int) -> U64:
    """The mixes of ``PassageSketcher.units``' steps (``salt_key(salt + x)``; none for
    words, w = 1: the units are the token hashes)."""
    return np.array([salt_key(salt + x) for x in range(shingle)] if shingle > 1 else [],
                    dtype=np.uint64)


def oph_page(hashes: U64, unit_keys: U64, k: int, query_len: int, stride: int,
             tok_starts: I64, tok_ends: I64) -> tuple[Any, ...]:
    """The kernel's answer for a page of at least one unit: units, passage starts, ends,
    keys, empty, the windows' bin, key, empty, i_lo, i_hi, j_lo, j_hi, the offsets
    (``pack_offsets``' arguments but the units), and the cells of the passages' and of the
    windows' lists (bins, keys each)."""
    return _oph_page_kernel(hashes, unit_keys, _OPH_KEY, k, query_len, stride, tok_starts,
                            tok_ends)


_OPH_KEY = salt_key(OPH_SALT)
