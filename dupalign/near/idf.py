"""Versioned idf tables: count document frequencies, freeze them, weight tokens tf × idf.

The rule: a token's weight must be the same when a page is indexed and when it is queried,
or simhash bits and ICWS samples of the same text differ. So idf never drifts: an
``IdfBuilder`` counts document frequencies of the corpus seen so far, and the engine decides
when to ``freeze(version)`` an immutable ``IdfTable``; every stored sketch records the
version it was made with. Version 0 is the uniform table (idf = 1 for all tokens) used on a
cold start.

Why sorted arrays and not a dict or a count-min sketch: the counts live in two sorted numpy
arrays (uint64 key, uint32 df), 12 bytes per distinct token, against ~100 bytes per entry of
a Python dict; new documents go to a buffer merged by ``searchsorted`` in O(table + buffer
log buffer). A count-min sketch would be smaller but over-counts, and it over-counts the rare
tokens most (relative to their df), which are exactly the tokens with the largest idf
weights; it also cannot list its keys, so it could not be frozen into the compact sorted
table that is stored and shipped. Memory is bounded by ``max_terms``: when the table grows
past it, the lowest-df tokens are dropped (ties: larger hash first). A dropped token counts
again from 0 if it reappears, and may be dropped again, so ``max_undercount`` adds up the
largest df dropped at each pruning: no df is under-counted by more than that. Dropped tokens
get the unknown-token idf, the largest idf, as fits tokens that are rare.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterable
from typing import Any, Literal

import msgpack
import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit

U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]
I32 = npt.NDArray[np.int32]
F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]

TfMode = Literal["log", "raw", "binary", "sqrt"]

_FORMAT = 1


def smoothed_idf(n_docs: int, df: npt.ArrayLike) -> F64:
    """log((N + 1) / (df + 1)) + 1: positive for every df ≤ N; df = 0 gives the largest."""
    return np.log((n_docs + 1) / (np.asarray(df, dtype=np.float64) + 1.0)) + 1.0


class IdfTable:
    """An immutable idf table: sorted uint64 token hashes with float32 idf values.

    ``idf(h)`` is the stored value for a known token and ``default_idf`` (the idf of df = 0,
    i.e. log(N + 1) + 1, the largest possible) for an unknown one. Values are float32 and
    returned as float64, so a table read back from bytes weighs tokens bit-identically.
    """

    __slots__ = ("_default32", "_directory", "_keys", "_values", "n_docs", "version")

    def __init__(
        self, version: int, n_docs: int, keys: U64, values: F32, default_idf: float
    ) -> None:
        k = np.ascontiguousarray(keys, dtype=np.uint64)
        v = np.ascontiguousarray(values, dtype=np.float32)
        if k.ndim != 1 or k.shape != v.shape:
            raise ValueError("keys and values must be 1-D arrays of equal length")
        if k.size > 1 and not np.all(k[1:] > k[:-1]):
            raise ValueError("keys must be strictly increasing")
        if version < 0 or n_docs < 0:
            raise ValueError("version and n_docs must be ≥ 0")
        k.setflags(write=False)
        v.setflags(write=False)
        self.version = int(version)
        self.n_docs = int(n_docs)
        self._keys = k
        self._values = v
        self._default32 = np.float32(default_idf)
        self._directory: I32 | None = None

    @classmethod
    def uniform(cls) -> IdfTable:
        """The version-0 cold-start table: idf = 1 for every token."""
        return cls(0, 0, np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.float32), 1.0)

    @property
    def keys(self) -> U64:
        return self._keys

    @property
    def values(self) -> F32:
        return self._values

    @property
    def directory(self) -> I32:
        """Where the keys of each bucket of hashes (their top bits) start in ``keys``, and
        the end last, for the kernels' lookups (``weights_by_directory``): a scan of ~2-4
        keys instead of a binary search of the table, which took about half of a Boost
        page's weights (~190 distinct tokens). Made on first use, 1-2 bytes a key."""
        if self._directory is None:  # (threads that race make the same array)
            self._directory = _directory_kernel(self._keys,
                                                max(1, int(self._keys.size).bit_length() - 2))
        return self._directory

    @property
    def default_idf(self) -> float:
        return float(self._default32)

    def __len__(self) -> int:
        return int(self._keys.size)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, IdfTable)
            and self.version == other.version
            and self.n_docs == other.n_docs
            and self._default32 == other._default32
            and np.array_equal(self._keys, other._keys)
            and np.array_equal(self._values, other._values)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"IdfTable(version={self.version}, n_docs={self.n_docs}, terms={len(self)})"

    def idf(self, hashes: npt.ArrayLike) -> F64:
        """idf of each token hash (float64 array of the same length)."""
        h = np.asarray(hashes, dtype=np.uint64)
        out = np.full(h.shape, self._default32, dtype=np.float32)
        if self._keys.size and h.size:
            idx = np.searchsorted(self._keys, h)
            idx_c = np.minimum(idx, self._keys.size - 1)
            found = self._keys[idx_c] == h
            out[found] = self._values[idx_c[found]]
        return out.astype(np.float64)

    def to_bytes(self) -> bytes:
        """msgpack map with little-endian raw arrays: 12 bytes per token plus a small header."""
        return msgpack.packb(
            {
                "format": _FORMAT,
                "kind": "idf",
                "version": self.version,
                "n_docs": self.n_docs,
                "default_idf": float(self._default32),
                "keys": self._keys.astype("<u8").tobytes(),
                "values": self._values.astype("<f4").tobytes(),
            },
            use_bin_type=True,
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> IdfTable:
        m = msgpack.unpackb(data, raw=False)
        if not isinstance(m, dict) or m.get("kind") != "idf" or m.get("format") != _FORMAT:
            raise ValueError("not an idf table of a known format")
        keys = np.frombuffer(m["keys"], dtype="<u8").astype(np.uint64)
        values = np.frombuffer(m["values"], dtype="<f4").astype(np.float32)
        return cls(int(m["version"]), int(m["n_docs"]), keys, values, float(m["default_idf"]))

    def digest(self) -> str:
        """Content hash (hex) of the serialized table, to record next to its version."""
        return hashlib.blake2b(self.to_bytes(), digest_size=16).hexdigest()


UNIFORM_IDF = IdfTable.uniform()


class IdfBuilder:
    """Document frequencies of token hashes over the documents added so far.

    ``add_document`` takes a document's token hashes (repeats are fine: each document counts
    once per token). Not thread-safe. See the module docstring for the memory bound.
    """

    def __init__(self, max_terms: int | None = 10_000_000, buffer_entries: int = 1 << 20) -> None:
        if max_terms is not None and max_terms < 1:
            raise ValueError("max_terms must be ≥ 1 or None")
        self.max_terms = max_terms
        self.buffer_entries = max(1, buffer_entries)
        self.n_docs = 0
        self.max_undercount = 0
        self._keys: U64 = np.zeros(0, dtype=np.uint64)
        self._df: U32 = np.zeros(0, dtype=np.uint32)
        self._pending: list[U64] = []
        self._pending_n = 0

    def add_document(self, token_hashes: npt.ArrayLike, distinct: bool = False) -> None:
        """``distinct``: the hashes are already distinct and ascending (no sort)."""
        u = np.asarray(token_hashes, dtype=np.uint64)
        if not distinct:
            u = np.unique(u)
        self.n_docs += 1
        if u.size:
            self._pending.append(u)
            self._pending_n += u.size
            if self._pending_n >= self.buffer_entries:
                self._merge()

    def add_documents(self, docs: Iterable[npt.ArrayLike]) -> None:
        for d in docs:
            self.add_document(d)

    def _merge(self) -> None:
        if not self._pending:
            return
        new_keys, new_df = np.unique(np.concatenate(self._pending), return_counts=True)
        self._pending = []
        self._pending_n = 0
        idx = np.searchsorted(self._keys, new_keys)
        hit = idx < self._keys.size
        hit[hit] = self._keys[idx[hit]] == new_keys[hit]
        self._df[idx[hit]] += new_df[hit].astype(np.uint32)
        miss = ~hit
        # np.insert at positions computed against the old array keeps the result sorted
        self._keys = np.insert(self._keys, idx[miss], new_keys[miss])
        self._df = np.insert(self._df, idx[miss], new_df[miss].astype(np.uint32))
        if self.max_terms is not None and self._keys.size > self.max_terms:
            self._prune(self.max_terms)

    def _prune(self, keep: int) -> None:
        # keep the `keep` largest df; among equal df keep smaller hashes (deterministic)
        order = np.lexsort((self._keys, -self._df.astype(np.int64)))
        dropped = order[keep:]
        self.max_undercount += int(self._df[dropped].max())
        kept = np.sort(order[:keep])
        self._keys = self._keys[kept]
        self._df = self._df[kept]

    def __len__(self) -> int:
        self._merge()
        return int(self._keys.size)

    def df(self, hashes: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """Current document frequency of each token hash (0 if never seen or pruned)."""
        self._merge()
        h = np.asarray(hashes, dtype=np.uint64)
        out = np.zeros(h.shape, dtype=np.int64)
        if self._keys.size and h.size:
            idx = np.minimum(np.searchsorted(self._keys, h), self._keys.size - 1)
            found = self._keys[idx] == h
            out[found] = self._df[idx[found]]
        return out

    def freeze(self, version: int, min_df: int = 1) -> IdfTable:
        """An immutable table of the counts so far. ``version`` ≥ 1 (0 is the uniform table).

        Tokens with df < ``min_df`` are left out (they get the unknown-token idf), which
        shrinks the table at a bounded cost: their idf rises by at most log(min_df).
        The builder keeps counting after a freeze.
        """
        if version < 1:
            raise ValueError("version 0 is reserved for the uniform table; use ≥ 1")
        self._merge()
        sel = self._df >= max(1, min_df)
        keys = self._keys[sel].copy()
        values = smoothed_idf(self.n_docs, self._df[sel]).astype(np.float32)
        default = float(smoothed_idf(self.n_docs, 0))
        return IdfTable(version, self.n_docs, keys, values, default)

    def to_bytes(self) -> bytes:
        """Checkpoint of the counts (msgpack), to resume counting after a restart."""
        self._merge()
        state: dict[str, Any] = {
            "format": _FORMAT,
            "kind": "idf-builder",
            "n_docs": self.n_docs,
            "max_undercount": self.max_undercount,
            "max_terms": self.max_terms,
            "keys": self._keys.astype("<u8").tobytes(),
            "df": self._df.astype("<u4").tobytes(),
        }
        return msgpack.packb(state, use_bin_type=True)

    @classmethod
    def from_bytes(cls, data: bytes, buffer_entries: int = 1 << 20) -> IdfBuilder:
        m = msgpack.unpackb(data, raw=False)
        if not isinstance(m, dict) or m.get("kind") != "idf-builder":
            raise ValueError("not an idf builder checkpoint")
        b = cls(max_terms=m["max_terms"], buffer_entries=buffer_entries)
        b.n_docs = int(m["n_docs"])
        b.max_undercount = int(m["max_undercount"])
        b._keys = np.frombuffer(m["keys"], dtype="<u8").astype(np.uint64)
        b._df = np.frombuffer(m["df"], dtype="<u4").astype(np.uint32)
        return b


def _tf(counts: npt.NDArray[np.int64], mode: TfMode) -> F64:
    c = counts.astype(np.float64)
    if mode == "log":
        return 1.0 + np.log(c)
    if mode == "raw":
        return c
    if mode == "binary":
        return np.ones_like(c)
    if mode == "sqrt":
        return np.sqrt(c)
    raise ValueError(f"tf_mode must be log, raw, binary or sqrt, got {mode!r}")


def tf_idf_weights(
    token_hashes: npt.ArrayLike,
    idf: IdfTable,
    tf_mode: TfMode = "log",
    normalize: bool = False,
) -> tuple[U64, F64]:
    """Distinct token hashes of a document (ascending) and their weights tf × idf.

    tf of a token occurring c times: "log" 1 + ln c, "raw" c, "binary" 1, "sqrt" √c.
    ``normalize`` divides the weights by their sum (the CWS paper's TF = n_ij / Σ_k n_kj
    with "raw"): simhash does not care, but weighted Jaccard does, e.g. a page repeated
    twice has J = 0.5 with its original under raw tf and J = 1 when normalized.
    """
    h = np.asarray(token_hashes, dtype=np.uint64).ravel()
    uniq, counts = np.unique(h, return_counts=True)
    return uniq, counted_weights(uniq, counts, idf, tf_mode, normalize)


def counted_weights(
    uniq: U64, counts: npt.NDArray[np.int64], idf: IdfTable, tf_mode: TfMode = "log",
    normalize: bool = False,
) -> F64:
    """``tf_idf_weights`` of a document given as its distinct token hashes (ascending) and
    their counts, which the sketch has already (no second sort)."""
    if not normalize:  # one kernel instead of ~15 numpy calls, which cost more than the work
        w = np.empty(uniq.shape[0], dtype=np.float64)
        if weights_by_directory(np.ascontiguousarray(uniq, dtype=np.uint64),
                                np.ascontiguousarray(counts, dtype=np.int64), idf.keys,
                                idf.values, idf.directory, np.float64(idf.default_idf),
                                tf_table(tf_mode), w):
            return w
    w = _tf(counts, tf_mode) * idf.idf(uniq)
    if normalize and w.size:
        w = w / math.fsum(w.tolist())
    return w


_TF_TABLE = 1 << 12  # counts with a tf in the table: more is rare in a page


@functools.lru_cache(maxsize=8)
def tf_table(mode: TfMode) -> F64:
    """``_tf`` of the counts 1.._TF_TABLE (count c at c - 1): the kernel looks it up, so its
    values are numpy's, bit for bit."""
    table = _tf(np.arange(1, _TF_TABLE + 1, dtype=np.int64), mode)
    table.flags.writeable = False
    return table


@njit(cache=True, nogil=True)
def weights_into(uniq: U64, counts: npt.NDArray[np.int64], keys: U64, values: F32,
                    default: float, tf: F64, out: F64) -> bool:
    """``_tf(counts) * idf.idf(uniq)`` into ``out`` by a binary search of ``keys``; False
    (``out`` unfinished) if a count is outside the table ``tf``. The engine looks tokens up
    with ``weights_by_directory``; this is its twin in the tests."""
    n = keys.shape[0]
    for i in range(uniq.shape[0]):
        c = counts[i]
        if c < 1 or c > tf.shape[0]:
            return False
        weight = default
        if n:
            at = np.searchsorted(keys, uniq[i])
            if at < n and keys[at] == uniq[i]:
                weight = np.float64(values[at])
        out[i] = tf[c - 1] * weight
    return True


@njit(cache=True, nogil=True)
def _directory_kernel(keys: U64, bits: int) -> I32:
    """``IdfTable.directory`` of the sorted ``keys`` in 2^``bits`` buckets (bits >= 1)."""
    n = keys.shape[0]
    shift = np.uint64(64 - bits)
    out = np.empty((1 << bits) + 1, dtype=np.int32)
    j = 0
    for b in range(1 << bits):
        while j < n and np.int64(keys[j] >> shift) < b:
            j += 1
        out[b] = j
    out[1 << bits] = n
    return out


@njit(cache=True, nogil=True)
def weights_by_directory(uniq: U64, counts: npt.NDArray[np.int64], keys: U64, values: F32,
                         directory: I32, default: float, tf: F64, out: F64) -> bool:
    """``weights_into`` (its twin in the tests), each token looked up in its bucket of
    ``directory`` (``IdfTable.directory`` of ``keys``)."""
    bits = 0
    while (1 << bits) < directory.shape[0] - 1:
        bits += 1
    shift = np.uint64(64 - bits)
    for i in range(uniq.shape[0]):
        c = counts[i]
        if c < 1 or c > tf.shape[0]:
            return False
        x = uniq[i]
        weight = default
        b = np.int64(x >> shift)
        for j in range(directory[b], directory[b + 1]):  # (ascending: stop at x or past it)
            if keys[j] >= x:
                if keys[j] == x:
                    weight = np.float64(values[j])
                break
        out[i] = tf[c - 1] * weight
    return True
