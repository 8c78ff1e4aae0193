"""MonoActive compact windows for multiset and weighted Jaccard (Zhang et al., VLDB'26).

Every subsequence ``T[i..j]`` of a text has, for each of k hash functions, a min-hash; the
compact windows group the O(n^2) subsequences into O(n + n log f) rectangles that share one
min-hash, so that the subsequences similar to a query are found by looking up the query's k
min-hashes and sweeping the colliding rectangles (the query side:
:mod:`dupalign.passage.monoactive_query`). This module builds the windows.

Conventions (all public functions):

* positions are 0-based; a window's rectangle ``i in [a, b], j in [c, d]`` is INCLUSIVE on both
  axes and stands for the subsequences ``T[i..j]`` (inclusive, i.e. half-open ``[i, j + 1)``);
  alignment results are half-open ``(start, end)`` token ranges;
* a "hash value" has an identity ``key`` (uint64, what is indexed and compared with the query)
  and a total order (what "min" means). Multiset: both are the uint64 value ``h(t, x)``.
  Weighted: the key identifies the ICWS sample ``(t, z)`` and the order is ``ln a``, then larger
  ``z``, then the token hash (ties beyond the first are practically impossible, but the order
  must be total and monotone within a token for the active-key argument to hold in floats).

Hash functions (index ``fn`` = 0, 1, ...; all randomness from ``hashing.mix64``):

* multiset, ``x``-th occurrence of token ``t`` with hash ``th``::

      h_fn(t, x) = mix64(mix64(th, 4 fn) ^ mix64(x, _X_SALT), 4 fn + 1)

* weighted: standard ICWS (Ioffe 2010; the paper's Algorithm 6). Per (token, fn) a seed
  ``s = mix64(th, 4 fn + 2)`` and five uniforms ``u_j = to_unit(mix64(s, j))``; then
  ``r = -ln(u0 u1) ~ Gamma(2,1)``, ``c = -ln(u2 u3) ~ Gamma(2,1)``, ``beta = u4 ~ U(0,1)`` and
  for a weight ``w > 0``::

      z = floor(ln w / r + beta),   ln y = r (z - beta),   ln a = ln c - ln y - r

  The sample is ``(t, y)`` (equivalently ``(t, z)``), ranked by ``a``; its key is
  ``mix64(s ^ mix64(z, _Z_SALT), 4 fn + 3)``. Because ``z`` is non-decreasing in ``w``, the
  value ``h(t, w(x))`` is non-increasing in the frequency ``x`` (the paper's Lemma 12) for any
  weight ``w(x) = tf(x) * idf(t)`` with ``tf`` non-decreasing; this is all MonoActive needs.

Paper notes: a hash value ``h(t, x)`` is *active* iff it is strictly SMALLER than
``h(t, 1..x-1)`` (Definition 12; §5's "greater" is a typo). Algorithm 4 line 10 must read
``a <- S[k].x + 1`` (its Example 10 does so). Keys are visited by hash value, then by
frequency descending (§5); with active keys only, one frequency per value per token remains,
so the tie rule never changes the output, but it is applied as specified.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.text.hashing import mix64, to_unit

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]

Mode = Literal["multiset", "weighted"]
TfMode = Literal["raw", "log", "binary", "sqrt", "squared"]
TfFn = Callable[[I64], F64]
IdfFn = Callable[[U64], F64]

_X_SALT = 0x5851F42D4C957F2D
_Z_SALT = 0x2545F4914F6CDD1D


# ---------------------------------------------------------------------------------------------
# weights


def tf_weights(tf: I64, mode: TfMode | TfFn) -> F64:
    """Term-frequency weight of counts ``tf >= 1``: raw tf, log 1 + ln tf, binary 1,
    sqrt, squared tf^2, or any vectorized callable that is positive and non-decreasing."""
    t = np.asarray(tf, dtype=np.int64)
    if callable(mode):
        return np.asarray(mode(t), dtype=np.float64)
    tf_f = t.astype(np.float64)
    if mode == "raw":
        return tf_f
    if mode == "log":
        return 1.0 + np.log(tf_f)
    if mode == "binary":
        return np.ones_like(tf_f)
    if mode == "sqrt":
        return np.sqrt(tf_f)
    if mode == "squared":
        return tf_f * tf_f
    raise ValueError(f"unknown tf mode {mode!r}")


def idf_lookup(table: Mapping[int, float], default: float = 1.0) -> IdfFn:
    """An idf function from a frozen table token-hash -> idf (missing tokens get ``default``)."""

    def idf(token_hashes: U64) -> F64:
        return np.fromiter(
            (table.get(int(h), default) for h in token_hashes),
            dtype=np.float64,
            count=len(token_hashes),
        )

    return idf


def idf_values(uniq: U64, idf: IdfFn | Mapping[int, float] | None) -> F64:
    """The idf of each token hash in ``uniq`` (1 for all when ``idf`` is None), checked."""
    if idf is None:
        return np.ones(len(uniq), dtype=np.float64)
    fn = idf_lookup(idf) if isinstance(idf, Mapping) else idf
    vals = np.asarray(fn(uniq), dtype=np.float64)
    if vals.shape != uniq.shape or not np.all(np.isfinite(vals)) or np.any(vals <= 0):
        raise ValueError("idf must give one finite positive value per token")
    return vals


# ---------------------------------------------------------------------------------------------
# hash values


def multiset_hash(token_hashes: U64, x: I64, fn: int) -> U64:
    """``h_fn(t, x)`` for the ``x``-th occurrence (x >= 1) of tokens with hash ``token_hashes``."""
    th = np.asarray(token_hashes, dtype=np.uint64)
    xs = np.asarray(x, dtype=np.int64).astype(np.uint64)
    return mix64(mix64(th, 4 * fn) ^ mix64(xs, _X_SALT), 4 * fn + 1)


def icws_params(token_hashes: U64, fn: int) -> tuple[F64, F64, F64, U64]:
    """ICWS randomness of each token for hash function ``fn``: ``(r, ln c, beta, seed)``."""
    s = mix64(np.asarray(token_hashes, dtype=np.uint64), 4 * fn + 2)
    u = [to_unit(mix64(s, j)) for j in range(5)]
    r = -np.log(u[0] * u[1])
    ln_c = np.log(-np.log(u[2] * u[3]))
    return r, ln_c, u[4], s


def icws_hash(token_hashes: U64, weights: F64, fn: int) -> tuple[F64, I64, U64]:
    """ICWS sample of each (token, weight > 0): ``(ln a, z, key)``; smaller ``ln a`` wins."""
    r, ln_c, beta, s = icws_params(token_hashes, fn)
    w = np.asarray(weights, dtype=np.float64)
    z = np.floor(np.log(w) / r + beta).astype(np.int64)
    ln_a = ln_c - r * (z - beta) - r
    key = mix64(s ^ mix64(z.view(np.uint64), _Z_SALT), 4 * fn + 3)
    return ln_a, z, key


# ---------------------------------------------------------------------------------------------
# token layout: positions grouped by token; "entries" are the (token, x) pairs, x = 1..f(t, T)


@dataclass(frozen=True)
class Layout:
    """Token occurrences of a text, grouped by token (ascending token hash).

    ``pos[off[t]:off[t+1]]`` are the 0-based positions of token ``t`` (hash ``uniq[t]``) in
    increasing order. The same range indexes the entries ``(t, x)`` with ``x = 1..f(t, T)``:
    entry ``e`` has token ``ent_tok[e]`` and frequency ``ent_x[e]``.
    """

    n: int
    uniq: U64
    pos: I64
    off: I64
    ent_tok: I64
    ent_x: I64


def layout(token_hashes: U64) -> Layout:
    """Group a text's token positions by token."""
    th = np.asarray(token_hashes, dtype=np.uint64)
    uniq, ids = np.unique(th, return_inverse=True)
    ids = ids.astype(np.int64).ravel()
    pos = np.argsort(ids, kind="stable").astype(np.int64)
    counts = np.bincount(ids, minlength=len(uniq)).astype(np.int64)
    off = np.zeros(len(uniq) + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    ent_tok = np.repeat(np.arange(len(uniq), dtype=np.int64), counts)
    ent_x = np.arange(len(th), dtype=np.int64) - off[ent_tok] + 1
    return Layout(len(th), uniq, pos, off, ent_tok, ent_x)


@dataclass(frozen=True)
class EntryHashes:
    """Hash values of every entry (t, x) of a layout under one hash function.

    ``visit`` lists the ACTIVE entries in visiting order (hash value ascending, then frequency
    descending); ``key[e]`` is entry e's identity key.
    """

    key: U64
    active: B
    visit: I64


@njit(cache=True, nogil=True)
def _active_prefix_min(values: U64, off: I64) -> B:
    """Entries whose value is strictly below every earlier value of the same token."""
    out = np.zeros(values.shape[0], dtype=np.bool_)
    for t in range(off.shape[0] - 1):
        best = np.uint64(0)
        for e in range(off[t], off[t + 1]):
            if e == off[t] or values[e] < best:
                best = values[e]
                out[e] = True
    return out


def entries_from_values(lay: Layout, values: U64) -> EntryHashes:
    """Entry hashes from explicit multiset values ``h(t, x)``, one per entry of ``lay``.

    This is the multiset path with a caller-given hash table (the paper's running example).
    """
    v = np.asarray(values, dtype=np.uint64)
    if v.shape != (lay.n,):
        raise ValueError("one value per (token, x) entry is required")
    active = _active_prefix_min(v, lay.off)
    idx = np.flatnonzero(active)
    visit = idx[np.lexsort((-lay.ent_x[idx], v[idx]))]
    return EntryHashes(v, active, visit.astype(np.int64))


def multiset_entries(lay: Layout, fn: int) -> EntryHashes:
    """Entry hashes for multiset Jaccard under hash function ``fn``."""
    return entries_from_values(lay, multiset_hash(lay.uniq[lay.ent_tok], lay.ent_x, fn))


def entry_weights(
    lay: Layout, tf: TfMode | TfFn = "raw", idf: IdfFn | Mapping[int, float] | None = None
) -> F64:
    """Weight ``tf(x) * idf(t)`` of every entry (t, x); checks positivity and monotonicity."""
    w = tf_weights(lay.ent_x, tf) * idf_values(lay.uniq, idf)[lay.ent_tok]
    if w.shape != (lay.n,) or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError("weights must be finite and positive")
    same = lay.ent_x[1:] > 1
    if np.any(w[1:][same] < w[:-1][same]):
        raise ValueError("the tf weight must be non-decreasing in the term frequency")
    return w


def weighted_entries(lay: Layout, weights: F64, fn: int) -> EntryHashes:
    """Entry hashes for weighted Jaccard (ICWS) under hash function ``fn``.

    Entry (t, x) gets the ICWS sample of token t at weight ``weights[e]`` (its weight in any
    subsequence where it occurs x times). It is active iff its ``z`` exceeds that of (t, x-1).
    """
    th = lay.uniq[lay.ent_tok]
    ln_a, z, key = icws_hash(th, weights, fn)
    active = np.ones(lay.n, dtype=np.bool_)
    active[1:] = (lay.ent_x[1:] == 1) | (z[1:] > z[:-1])
    idx = np.flatnonzero(active)
    visit = idx[np.lexsort((-lay.ent_x[idx], th[idx], -z[idx], ln_a[idx]))]
    return EntryHashes(key, active, visit.astype(np.int64))


# ---------------------------------------------------------------------------------------------
# active keys


def count_active_keys(lay: Layout, eh: EntryHashes) -> int:
    """|X(T)|: an active entry (t, x) yields f(t, T) - x + 1 keys."""
    e = eh.visit
    f = lay.off[lay.ent_tok[e] + 1] - lay.off[lay.ent_tok[e]]
    return int(np.sum(f - lay.ent_x[e] + 1))


@njit(cache=True, nogil=True)
def _emit_keys(pos: I64, off: I64, ent_tok: I64, ent_x: I64, visit: I64, total: int) -> I64:
    out = np.empty((total, 3), dtype=np.int64)
    m = 0
    for e in visit:
        t = ent_tok[e]
        x = ent_x[e]
        base = off[t]
        f = off[t + 1] - base
        for i in range(f - x + 1):
            out[m, 0] = pos[base + i]
            out[m, 1] = pos[base + i + x - 1]
            out[m, 2] = e
            m += 1
    return out


def active_keys(lay: Layout, eh: EntryHashes) -> tuple[I64, I64, I64]:
    """GenerateActiveKeys: active keys ``(p, q, entry)`` in visiting order.

    A key (p, q) (0-based inclusive, ``T[p] == T[q]``) spans exactly x occurrences of its token
    and has the hash value of entry (T[p], x); it is active iff that value is active.
    """
    out = _emit_keys(lay.pos, lay.off, lay.ent_tok, lay.ent_x, eh.visit, count_active_keys(lay, eh))
    return out[:, 0].copy(), out[:, 1].copy(), out[:, 2].copy()


# ---------------------------------------------------------------------------------------------
# monotonic partitioning


@njit(cache=True, nogil=True)
def _fen_add(tree: I64, i: int, delta: int) -> None:
    i += 1
    while i < tree.shape[0]:
        tree[i] += delta
        i += i & (-i)


@njit(cache=True, nogil=True)
def _fen_prefix(tree: I64, i: int) -> int:
    """Number of present coordinates in [0, i]."""
    s = 0
    i += 1
    while i > 0:
        s += tree[i]
        i -= i & (-i)
    return s


@njit(cache=True, nogil=True)
def _fen_kth(tree: I64, k: int, top: int) -> int:
    """Coordinate of the k-th (1-based) present coordinate."""
    p = 0
    step = top
    while step > 0:
        q = p + step
        if q < tree.shape[0] and tree[q] < k:
            p = q
            k -= tree[q]
        step >>= 1
    return p  # tree index p + 1 holds it, i.e. coordinate p


@njit(cache=True, nogil=True)
def partition_kernel(
    n: int, pos: I64, off: I64, ent_tok: I64, ent_x: I64, visit: I64, cap: int
) -> tuple[I64, int]:
    """Algorithm 4 over the active keys, with 1-based coordinates and guards 0 and n + 1.

    The skyline holds at most one key per x coordinate (a key dominates any key with the same
    x and a larger y), so it is kept as arrays indexed by x: ``yv[x]``, a doubly linked list
    ``prv``/``nxt`` in coordinate order, and a Fenwick tree of present x for successor search.
    Returns windows as rows (entry, a, b, c, d), 0-based inclusive, and their count.
    """
    m = n + 2
    tree = np.zeros(m + 1, dtype=np.int64)
    top = 1
    while top * 2 <= m:
        top *= 2
    yv = np.zeros(m, dtype=np.int64)
    prv = np.zeros(m, dtype=np.int64)
    nxt = np.zeros(m, dtype=np.int64)
    yv[0] = 0
    yv[n + 1] = n + 1
    nxt[0] = n + 1
    prv[n + 1] = 0
    _fen_add(tree, 0, 1)
    _fen_add(tree, n + 1, 1)
    out = np.empty((cap, 5), dtype=np.int64)
    w = 0
    for e in visit:
        t = ent_tok[e]
        x = ent_x[e]
        base = off[t]
        f = off[t + 1] - base
        for kk in range(f - x + 1):
            b = pos[base + kk] + 1
            c = pos[base + kk + x - 1] + 1
            # smallest skyline key with x >= b has the smallest y among those: (b, c) is
            # dominated iff that y <= c (Lemma 7 restated on the x axis)
            s = _fen_kth(tree, _fen_prefix(tree, b - 1) + 1, top)
            if yv[s] <= c:
                continue
            j = nxt[s] if s == b else s  # smallest x > b
            i = prv[j]
            while yv[i] >= c:  # keys with x <= b and y >= c are dominated by (b, c)
                i = prv[i]
            cp = c
            cur = i
            while cur != j:
                nx = nxt[cur]
                a = cur + 1
                d = yv[nx] - 1
                if a <= b and cp <= d:
                    out[w, 0] = e
                    out[w, 1] = a - 1
                    out[w, 2] = b - 1
                    out[w, 3] = cp - 1
                    out[w, 4] = d - 1
                    w += 1
                cp = yv[nx]
                cur = nx
            cur = nxt[i]
            while cur != j:
                _fen_add(tree, cur, -1)
                cur = nxt[cur]
            nxt[i] = b
            prv[b] = i
            nxt[b] = j
            prv[j] = b
            yv[b] = c
            _fen_add(tree, b, 1)
    return out, w


@dataclass(frozen=True)
class Windows:
    """Compact windows: window r is hash function ``fn[r]``, min-hash ``key[r]``, and the
    subsequences ``T[i..j]`` with ``i in [a[r], b[r]]``, ``j in [c[r], d[r]]`` (0-based,
    inclusive on both axes; ``b[r] <= c[r]``)."""

    fn: I32
    key: U64
    a: I32
    b: I32
    c: I32
    d: I32

    def __len__(self) -> int:
        return int(self.key.shape[0])

    def select(self, mask: B | I64) -> Windows:
        return Windows(
            self.fn[mask], self.key[mask], self.a[mask], self.b[mask], self.c[mask], self.d[mask]
        )

    @staticmethod
    def concat(parts: list[Windows]) -> Windows:
        if not parts:
            return Windows(
                np.empty(0, np.int32),
                np.empty(0, np.uint64),
                *(np.empty(0, np.int32) for _ in range(4)),
            )
        return Windows(
            np.concatenate([p.fn for p in parts]),
            np.concatenate([p.key for p in parts]),
            np.concatenate([p.a for p in parts]),
            np.concatenate([p.b for p in parts]),
            np.concatenate([p.c for p in parts]),
            np.concatenate([p.d for p in parts]),
        )


def monotonic_partition(lay: Layout, eh: EntryHashes, fn: int = 0) -> Windows:
    """MonoActive: the partition of all subsequences of one text under one hash function.

    Every subsequence ``T[i..j]`` (0 <= i <= j < n) lies in exactly one window, whose key is
    that subsequence's min-hash. At most 2 |X(T)| windows (Lemma 10).
    """
    cap = 2 * count_active_keys(lay, eh) + 1
    out, w = partition_kernel(lay.n, lay.pos, lay.off, lay.ent_tok, lay.ent_x, eh.visit, cap)
    rows = out[:w]
    return Windows(
        np.full(w, fn, dtype=np.int32),
        eh.key[rows[:, 0]],
        rows[:, 1].astype(np.int32),
        rows[:, 2].astype(np.int32),
        rows[:, 3].astype(np.int32),
        rows[:, 4].astype(np.int32),
    )


def _entries(lay: Layout, mode: Mode, fn: int, weights: F64 | None) -> EntryHashes:
    if mode == "multiset":
        return multiset_entries(lay, fn)
    if mode == "weighted":
        assert weights is not None
        return weighted_entries(lay, weights, fn)
    raise ValueError(f"unknown mode {mode!r}")


def compact_windows(
    token_hashes: U64,
    k: int,
    mode: Mode = "multiset",
    tf: TfMode | TfFn = "raw",
    idf: IdfFn | Mapping[int, float] | None = None,
) -> Windows:
    """The MonoActive partitions of a text for hash functions 0..k-1, concatenated.

    ``mode="multiset"``: multiset Jaccard with ``h(t, x)``; ``tf``/``idf`` are ignored.
    ``mode="weighted"``: weighted Jaccard with ICWS and weights ``tf(x) * idf(t)``.
    """
    lay = layout(token_hashes)
    if lay.n == 0:
        return Windows.concat([])
    weights = entry_weights(lay, tf, idf) if mode == "weighted" else None
    return Windows.concat(
        [monotonic_partition(lay, _entries(lay, mode, fn, weights), fn) for fn in range(k)]
    )
