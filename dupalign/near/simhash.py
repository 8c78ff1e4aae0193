"""Weighted 64-bit simhash that keeps the per-bit weight sums W (VOSH paper, Alg. 1 and §4.2).

For a document with distinct features i (token hashes h_i) and weights w_i (tf × idf),

    W_j = Σ_i w_i · (+1 if bit j of h_i is 1 else −1),      j = 0 … 63,

and bit j of the fingerprint is 1 iff W_j > 0. Bit order: bit j is ``(fp >> j) & 1``.

Note: Algorithm 1 of the paper sets the bit when W_j ≥ 0; we set it when W_j > 0 (the
difference is only W_j == 0 exactly, e.g. an empty document, whose fingerprint is then 0).
W is kept because the VOSH volatility p_j = P(Y > |W_j|) is computed from it.

The bits of h_i are used as given: pass ``hashing.mix64(h, salt)`` instead of ``h`` if the
simhash bits must be independent of other uses of the raw token hash.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit

U64 = npt.NDArray[np.uint64]
F64 = npt.NDArray[np.float64]

BITS = 64


@njit(cache=True, nogil=True)
def simhash_into(hashes: U64, weights: F64, w_out: F64) -> np.uint64:
    # Features outer, bits inner, ± per bit: the paper's order of additions, so a plain
    # Python twin reproduces W bit for bit (and this order measured fastest).
    for j in range(BITS):
        w_out[j] = 0.0
    for i in range(hashes.shape[0]):
        h = hashes[i]
        w = weights[i]
        for j in range(BITS):
            if (h >> np.uint64(j)) & np.uint64(1):
                w_out[j] += w
            else:
                w_out[j] -= w
    fp = np.uint64(0)
    for j in range(BITS):
        if w_out[j] > 0.0:
            fp |= np.uint64(1) << np.uint64(j)
    return fp


@njit(cache=True, nogil=True)
def _simhash_batch_kernel(
    hashes: U64, weights: F64, offsets: npt.NDArray[np.int64], fps: U64, w_out: F64
) -> None:
    for d in range(offsets.shape[0] - 1):
        a = offsets[d]
        b = offsets[d + 1]
        fps[d] = simhash_into(hashes[a:b], weights[a:b], w_out[d])


def _as_inputs(hashes: npt.ArrayLike, weights: npt.ArrayLike) -> tuple[U64, F64]:
    h = np.ascontiguousarray(hashes, dtype=np.uint64)
    w = np.ascontiguousarray(weights, dtype=np.float64)
    if h.ndim != 1 or h.shape != w.shape:
        raise ValueError(
            f"hashes and weights must be 1-D of equal length, got {h.shape}, {w.shape}"
        )
    return h, w


def weighted_simhash(hashes: npt.ArrayLike, weights: npt.ArrayLike) -> tuple[int, F64]:
    """Fingerprint (Python int in [0, 2^64)) and the 64 weight sums W_j of one document.

    ``hashes`` are the document's distinct token hashes (uint64), ``weights`` their weights.
    Duplicated hashes are not merged: each entry counts as one feature.
    """
    h, w = _as_inputs(hashes, weights)
    w_out = np.empty(BITS, dtype=np.float64)
    fp = simhash_into(h, w, w_out)
    return int(fp), w_out


def weighted_simhash_batch(
    hashes: npt.ArrayLike, weights: npt.ArrayLike, offsets: npt.ArrayLike
) -> tuple[U64, F64]:
    """Simhash of many documents at once (for micro-batches in the worker).

    Document d owns ``hashes[offsets[d]:offsets[d+1]]``; ``offsets`` has length m + 1,
    starts at 0 and is non-decreasing. Returns fingerprints uint64[m] and W float64[m, 64].
    """
    h, w = _as_inputs(hashes, weights)
    off = np.ascontiguousarray(offsets, dtype=np.int64)
    if (
        off.ndim != 1
        or off.size < 1
        or off[0] != 0
        or off[-1] != h.size
        or np.any(np.diff(off) < 0)
    ):
        raise ValueError("offsets must start at 0, end at len(hashes) and be non-decreasing")
    m = off.size - 1
    fps = np.empty(m, dtype=np.uint64)
    w_out = np.empty((m, BITS), dtype=np.float64)
    _simhash_batch_kernel(h, w, off, fps, w_out)
    return fps, w_out


def popcount64(values: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """Number of set bits of each uint64 (vectorized; numpy ≥ 2 ufunc)."""
    return np.bitwise_count(np.asarray(values, dtype=np.uint64))


def hamming(a: int | np.uint64, b: int | np.uint64) -> int:
    """Hamming distance between two 64-bit fingerprints."""
    return (int(a) ^ int(b)).bit_count()


def hamming_many(fp: int | np.uint64, others: npt.ArrayLike) -> npt.NDArray[np.uint8]:
    """Hamming distance from one fingerprint to each fingerprint of an array."""
    return popcount64(np.asarray(others, dtype=np.uint64) ^ np.uint64(int(fp)))
