"""Seeded 64-bit hashing of tokens and vectorized mixing of hash values.

Every random choice in the engine (simhash bits, OPH min-hashes, ICWS samples) derives
from these two functions, so that the same token gets the same value on every page,
in every process, with no vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable

import mmh3
import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]

_MASK64 = (1 << 64) - 1


def token_hashes(tokens: Iterable[str], seed: int = 0) -> U64:
    """64-bit murmur3 hash of each token (UTF-8), as an unsigned array."""
    seed32 = seed & 0xFFFFFFFF
    toks = tokens if isinstance(tokens, list) else list(tokens)
    # Words repeat (a page has ~5 tokens per distinct word): hash each distinct token once,
    # then look the sequence up through a dict at C speed.
    h64 = mmh3.hash64
    table = {t: h64(t, seed32, signed=False)[0] for t in set(toks)}
    return np.fromiter(map(table.__getitem__, toks), dtype=np.uint64, count=len(toks))


def content_hash(tokens: Iterable[str], seed: int = 0) -> bytes:
    """128-bit hash of a token sequence; tokens are joined with a separator no token holds."""
    return mmh3.hash_bytes("\x1f".join(tokens).encode("utf-8"), seed & 0xFFFFFFFF)


def mix64(values: U64 | int, salt: int = 0) -> U64:
    """splitmix64 finalizer of ``values`` xor a salted constant: a fast vectorized re-hash.

    ``mix64(h, i)`` for i = 0, 1, 2, ... gives independent-looking hash functions of h.
    """
    with np.errstate(over="ignore"):
        x = np.asarray(values, dtype=np.uint64) ^ np.uint64(
            (0x9E3779B97F4A7C15 * (salt + 1)) & _MASK64
        )
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def to_unit(values: U64) -> npt.NDArray[np.float64]:
    """Map uint64 hash values to floats uniform in the open interval (0, 1)."""
    top53 = (np.asarray(values, dtype=np.uint64) >> np.uint64(11)).astype(np.float64)
    return (top53 + 0.5) / float(1 << 53)


def shingle_hashes(hashes: U64, w: int, salt: int = 0) -> U64:
    """One order-sensitive 64-bit hash per run of ``w`` consecutive token hashes.

    Shingle i covers ``hashes[i:i + w]``: acc = h_i, then acc = mix64(acc) ^ h_{i+j} for
    j = 1 … w − 1, and a final mix64 with salt + 1. A sequence shorter than ``w`` gives one
    shingle over all of it (so short pages still have a feature); an empty one gives none.
    """
    if w < 1:
        raise ValueError(f"w must be ≥ 1, got {w}")
    h = np.asarray(hashes, dtype=np.uint64)
    n = h.size
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    span = min(w, n)
    m = n - span + 1
    acc = h[:m].copy()
    for j in range(1, span):
        acc = mix64(acc, salt) ^ h[j : j + m]
    return mix64(acc, salt + 1)
