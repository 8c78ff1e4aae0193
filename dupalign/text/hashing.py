"""Seeded 64-bit hashing of tokens and vectorized mixing of hash values.

Every random choice in the engine (simhash bits, OPH min-hashes, ICWS samples) derives
from these two functions, so that the same token gets the same value on every page,
in every process, with no vocabulary.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import mmh3
import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit, vectorize

U64 = npt.NDArray[np.uint64]

_MASK64 = (1 << 64) - 1
# Between tokens wherever they are joined: the content hash's separator (stored content
# hashes depend on it), so the tokenizer's joined bytes are hashed as they are. A control
# character, in no word token.
SEP = "\x1f"
_SEP_BYTE = np.uint8(0x1F)


def token_hashes(tokens: Iterable[str], seed: int = 0) -> U64:
    """64-bit murmur3 hash of each token (UTF-8), as an unsigned array: the first half of
    MurmurHash3_x64_128 with a 32-bit seed, ``mmh3.hash64(t, seed, signed=False)[0]``
    (the oracle in the tests), computed by one kernel over the tokens' bytes."""
    toks = tokens if isinstance(tokens, list) else list(tokens)
    n = len(toks)
    joined = SEP.join(toks)  # the tokens' bytes, the separator after each but the last
    if joined.count(SEP) != max(0, n - 1):  # a token holds one: hash them one by one
        seed32 = seed & 0xFFFFFFFF
        return np.array([mmh3.hash64(t, seed32, signed=False)[0] for t in toks],
                        dtype=np.uint64)
    return hash_joined(joined.encode("utf-8"), n, seed)


def hash_joined(joined: bytes, n: int, seed: int = 0) -> U64:
    """``token_hashes`` of ``n`` tokens given as their UTF-8 bytes joined by ``SEP`` (no
    token holds one)."""
    out = np.empty(n, dtype=np.uint64)
    if n:
        _murmur3_64_kernel(np.frombuffer(joined, dtype=np.uint8), np.uint64(seed & 0xFFFFFFFF),
                           out)
    return out


_C1 = np.uint64(0x87C37B91114253D5)
_C2 = np.uint64(0x4CF5AD432745937F)


@njit(cache=True, inline="always")
def _rotl(x: np.uint64, r: int) -> np.uint64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@njit(cache=True, inline="always")
def _fmix(k: np.uint64) -> np.uint64:
    k ^= k >> np.uint64(33)
    k *= np.uint64(0xFF51AFD7ED558CCD)
    k ^= k >> np.uint64(33)
    k *= np.uint64(0xC4CEB9FE1A85EC53)
    k ^= k >> np.uint64(33)
    return k


@njit(cache=True, inline="always")
def _bytes_le(buf: npt.NDArray[np.uint8], a: int, n: int) -> np.uint64:
    """``n`` <= 8 bytes from ``buf[a]`` on, little-endian."""
    k = np.uint64(0)
    for i in range(n):
        k |= np.uint64(buf[a + i]) << np.uint64(8 * i)
    return k


@njit(cache=True, nogil=True)
def _murmur3_64_kernel(buf: npt.NDArray[np.uint8], seed: np.uint64, out: U64) -> None:
    # MurmurHash3_x64_128 (Austin Appleby, public domain), h1 only, of each SEP-separated
    # run of ``buf`` (token t goes to out[t]); uint64 arithmetic wraps as in C
    c1, c2 = _C1, _C2
    a = 0
    for t in range(out.shape[0]):
        b = a
        while b < buf.shape[0] and buf[b] != _SEP_BYTE:
            b += 1
        length = b - a
        h1 = seed
        h2 = seed
        p = a
        for _ in range(length // 16):
            k1 = _bytes_le(buf, p, 8)
            k2 = _bytes_le(buf, p + 8, 8)
            p += 16
            k1 = _rotl(k1 * c1, 31) * c2
            h1 ^= k1
            h1 = (_rotl(h1, 27) + h2) * np.uint64(5) + np.uint64(0x52DCE729)
            k2 = _rotl(k2 * c2, 33) * c1
            h2 ^= k2
            h2 = (_rotl(h2, 31) + h1) * np.uint64(5) + np.uint64(0x38495AB5)
        rest = b - p
        if rest > 8:
            k2 = _bytes_le(buf, p + 8, rest - 8)
            h2 ^= _rotl(k2 * c2, 33) * c1
        if rest > 0:
            k1 = _bytes_le(buf, p, min(rest, 8))
            h1 ^= _rotl(k1 * c1, 31) * c2
        h1 ^= np.uint64(length)
        h2 ^= np.uint64(length)
        h1 += h2
        h2 += h1
        h1 = _fmix(h1)
        h2 = _fmix(h2)
        out[t] = h1 + h2
        a = b + 1


def content_hash(tokens: Iterable[str], seed: int = 0) -> bytes:
    """128-bit hash of a token sequence; tokens are joined with a separator no token holds."""
    return mmh3.hash_bytes(SEP.join(tokens).encode("utf-8"), seed & 0xFFFFFFFF)


def content_hash_joined(joined: bytes, seed: int = 0) -> bytes:
    """``content_hash`` of tokens given as their UTF-8 bytes joined by ``SEP`` (no token
    holds one): those bytes as they are."""
    return mmh3.hash_bytes(joined, seed & 0xFFFFFFFF)


@njit(cache=True, inline="always")
def mix_one(x: np.uint64, key: np.uint64) -> np.uint64:
    """``mix64`` of one value, for numba kernels: ``key`` is ``salt_key(salt)``."""
    # (uint64 constants throughout: mixing in a signed int would make numba compute in
    # float64)
    x = x ^ key
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True, inline="always")
def unit_one(x: np.uint64) -> float:
    """``to_unit`` of one value, for numba kernels: the top 53 bits, + 0.5, / 2^53."""
    return (np.float64(x >> np.uint64(11)) + 0.5) / 9007199254740992.0


@functools.lru_cache(maxsize=4096)
def salt_key(salt: int) -> np.uint64:
    """The constant ``mix64(., salt)`` xors into its input."""
    return np.uint64((0x9E3779B97F4A7C15 * (salt + 1)) & _MASK64)


def _mix_element(x: np.uint64, key: np.uint64) -> np.uint64:  # pragma: no cover (compiled)
    return mix_one(x, key)


def _unit_element(x: np.uint64) -> float:  # pragma: no cover (compiled)
    return unit_one(x)


@functools.cache
def _ufuncs() -> tuple[np.ufunc, np.ufunc]:
    """The plain numpy ufuncs of mix64 and to_unit (numba's DUFunc wrappers cost ~3 µs more
    per call), built on first use: a ufunc with signatures is compiled, or loaded from the
    cache, when it is made, which starts numba's code generator, about 1 s of CPU that a
    command stopping at a configuration error would spend for nothing."""
    mix = vectorize(["uint64(uint64, uint64)"], cache=True)(_mix_element)
    unit = vectorize(["float64(uint64)"], cache=True)(_unit_element)
    return mix.ufunc, unit.ufunc


def mix64(values: U64 | int, salt: int = 0) -> U64:
    """splitmix64 finalizer of ``values`` xor a salted constant: a fast vectorized re-hash.

    ``mix64(h, i)`` for i = 0, 1, 2, ... gives independent-looking hash functions of h.
    One compiled pass (a numba ufunc): as numpy expressions it was nine array passes and a
    floating-point error context per call, most of the time of a short array's call
    (profile of the weighted passage sketches).
    """
    return _ufuncs()[0](np.asarray(values, dtype=np.uint64), salt_key(salt))


def to_unit(values: U64) -> npt.NDArray[np.float64]:
    """Map uint64 hash values to floats uniform in the open interval (0, 1)."""
    return _ufuncs()[1](np.asarray(values, dtype=np.uint64))


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
