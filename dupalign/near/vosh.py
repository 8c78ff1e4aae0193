"""The Volatility Ordered Set Heap (VOSH): the bit sets of a fingerprint in non-increasing
probability of being the set of bits a rewrite flips, from the bits' volatilities
(dupalign.near.volatility).

Sood & Loguinov, "Probabilistic Near-Duplicate Detection Using Simhash" (CIKM'11), §5.2–§6.1.
Bit sets are sorted tuples of 0-based bit indices (bit j is ``(fp >> j) & 1``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit

F64 = npt.NDArray[np.float64]


def _children(s: tuple[int, ...], b: int) -> list[tuple[int, ...]]:
    """Algorithm 2 (ProduceChildren) on ranks 0..b-1, with the paper's two slips fixed.

    Line 9 must increment the right child S_R (not S_L), and the scan must stop at the first
    gap >= 2, as the text says ("until it finds the first gap"); otherwise (0, 2, 4) would
    yield (1, 2, 4), which is also the left child of (1, 2, 3).
    """
    out: list[tuple[int, ...]] = []
    h = len(s)
    if h == 0:
        return out
    if s[-1] <= b - 2:
        out.append((*s[:-1], s[-1] + 1))
    for j in range(h - 2, -1, -1):
        gap = s[j + 1] - s[j]
        if gap == 1:
            continue
        if gap == 2:
            out.append((*s[:j], s[j] + 1, *s[j + 1 :]))
        break
    return out


def vosh_sets(
    p: npt.ArrayLike, h: int, limit: int | None = None
) -> Iterator[tuple[float, tuple[int, ...]]]:
    """Bit sets S with |S| <= h in non-increasing p(u, S) = prod_S p_i * prod_notS (1 - p_j).

    Yields ``(p(u, S), S)`` with S a sorted tuple of indices into ``p``; every set exactly
    once; at most ``limit`` sets. Needs 0 <= p_j < 1. The empty set comes first whenever all
    p_j <= 1/2 (true for volatilities). Θ(k log k) for k sets: one VOSH tree per set size
    (§5.2) whose roots seed a max-heap M (§6.1); each pop pushes at most two children.
    Ties are broken by insertion order, so the sequence is deterministic.
    """
    pv = np.asarray(p, dtype=np.float64)
    b = int(pv.shape[0])
    if np.any(pv < 0) or np.any(pv >= 1):
        raise ValueError("volatilities must lie in [0, 1)")
    order = np.argsort(-pv, kind="stable")  # rank -> bit index, most volatile first
    ps = pv[order]
    ratio = ps / (1.0 - ps)
    base = float(np.prod(1.0 - ps))

    def key(s: tuple[int, ...]) -> float:
        k = base
        for r in s:
            k *= float(ratio[r])
        return k

    heap: list[tuple[float, int, tuple[int, ...]]] = []
    seq = 0
    for size in range(min(h, b) + 1):
        root = tuple(range(size))
        heap.append((-key(root), seq, root))
        seq += 1
    heapq.heapify(heap)
    emitted = 0
    while heap and (limit is None or emitted < limit):
        negk, _, s = heapq.heappop(heap)
        yield -negk, tuple(sorted(int(order[r]) for r in s))
        emitted += 1
        for c in _children(s, b):
            heapq.heappush(heap, (-key(c), seq, c))
            seq += 1


# -- numba twin used inside PSM: the same trees and frontier on packed sets -----------------
#
# A set of <= MAX_H ranks (each < MAX_RANKS) is one int64: element e in bits 8e..8e+7, the
# size in bits 56..58, and the unused element bytes hold SENTINEL. Keys and masks then read
# all seven bytes through tables whose SENTINEL entry is neutral (ratio 1.0, mask 0), with no
# loop whose trip count depends on the set: such loops mispredict on almost every probe.

MAX_H = 7
MAX_RANKS = 255
SENTINEL = 255
LINEAR_MAX_BUDGET = 64


@njit(cache=True)
def packed_size(s: int) -> int:
    return s >> 56


@njit(cache=True)
def packed_elem(s: int, e: int) -> int:
    return (s >> (8 * e)) & 255


@njit(cache=True)
def packed_root(size: int) -> int:
    s = size << 56
    for e in range(MAX_H):
        s |= (e if e < size else SENTINEL) << (8 * e)
    return s


@njit(cache=True)
def packed_key(base: float, ratio_ext: F64, s: int) -> float:
    """base * prod over the set of ratio_ext[rank]; ratio_ext[SENTINEL] must be 1.0.

    Multiplied in element order, like :func:`vosh_sets` (the sentinel factors are exact),
    so both give bit-identical keys and hence the same order, ties included.
    """
    k = base * ratio_ext[s & 255]
    k *= ratio_ext[(s >> 8) & 255]
    k *= ratio_ext[(s >> 16) & 255]
    k *= ratio_ext[(s >> 24) & 255]
    k *= ratio_ext[(s >> 32) & 255]
    k *= ratio_ext[(s >> 40) & 255]
    return k * ratio_ext[(s >> 48) & 255]


@njit(cache=True)
def packed_mask(bits_ext: npt.NDArray[np.uint64], s: int) -> np.uint64:
    """OR over the set of bits_ext[rank]; bits_ext[SENTINEL] must be 0."""
    m = bits_ext[s & 255] | bits_ext[(s >> 8) & 255] | bits_ext[(s >> 16) & 255]
    m |= bits_ext[(s >> 24) & 255] | bits_ext[(s >> 32) & 255] | bits_ext[(s >> 40) & 255]
    return m | bits_ext[(s >> 48) & 255]


@njit(cache=True)
def packed_children(s: int, b: int) -> tuple[int, int]:
    """Algorithm 2 (fixed, see :func:`_children`) on a packed set; -1 for a missing child.

    Left child: the last element + 1 (if < b). Right child: the scan from the end stops at
    the first gap >= 2, i.e. at the largest j <= size - 2 with e[j+1] - e[j] >= 2; there is
    a child (e[j] + 1) iff that gap is exactly 2. Computed over all six gaps with selects.
    """
    size = s >> 56
    sh = 8 * max(size - 1, 0)
    last = (s >> sh) & 255
    left = s + (1 << sh) if (size > 0) & (last <= b - 2) else -1
    jstar = -1
    gstar = 0
    for j in range(MAX_H - 1):
        g = ((s >> (8 * j + 8)) & 255) - ((s >> (8 * j)) & 255)
        c = (j <= size - 2) & (g >= 2)
        jstar = j if c else jstar
        gstar = g if c else gstar
    right = s + (1 << (8 * max(jstar, 0))) if (jstar >= 0) & (gstar == 2) else -1
    return left, right


@njit(cache=True)
def _before(keys: F64, seqs: npt.NDArray[np.int64], a: int, c: int) -> bool:
    # Larger key first, then earlier insertion (deterministic ties, as in vosh_sets).
    if keys[a] != keys[c]:
        return keys[a] > keys[c]
    return seqs[a] < seqs[c]


@njit(cache=True)
def heap_push(keys, seqs, sets, n, key, seq, s):
    """Push (key, seq, packed set) onto the heap of n nodes; returns n + 1."""
    i = n
    keys[i] = key
    seqs[i] = seq
    sets[i] = s
    while i > 0:
        par = (i - 1) >> 1
        if not _before(keys, seqs, i, par):
            break
        keys[i], keys[par] = keys[par], keys[i]
        seqs[i], seqs[par] = seqs[par], seqs[i]
        sets[i], sets[par] = sets[par], sets[i]
        i = par
    return n + 1


@njit(cache=True)
def heap_pop(keys, seqs, sets, n):
    """Remove the top node; returns (n - 1, its key, its packed set)."""
    key = keys[0]
    s = sets[0]
    n -= 1
    keys[0] = keys[n]
    seqs[0] = seqs[n]
    sets[0] = sets[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and _before(keys, seqs, c + 1, c):
            c += 1
        if not _before(keys, seqs, c, i):
            break
        keys[i], keys[c] = keys[c], keys[i]
        seqs[i], seqs[c] = seqs[c], seqs[i]
        sets[i], sets[c] = sets[c], sets[i]
        i = c
    return n, key, s


@njit(cache=True)
def list_pop(keys: F64, n_used: int) -> int:
    """Index of the first largest key of an insertion-ordered list.

    The same order as the heap (largest key, then earliest insertion). Live keys are >= 0
    and removed entries -2, so the result is negative-keyed when nothing live is left. The
    max is a select chain and the search for its first index exits once: a
    compare-and-branch argmax mispredicts on most pops.
    """
    mx = -3.0
    for i in range(n_used):
        mx = max(mx, keys[i])
    for i in range(n_used):
        if keys[i] == mx:
            return i
    return 0


@njit(cache=True)
def vosh_enumerate(base: float, ratio_ext: F64, b: int, h: int, limit: int, keys: F64,
                   seqs: npt.NDArray[np.int64], sets: npt.NDArray[np.int64],
                   out: npt.NDArray[np.int64], out_keys: F64) -> int:
    """The first ``limit`` VOSH sets, packed, into out[:k] (keys into out_keys); returns k.

    ``ratio_ext[r]`` = p/(1-p) of rank r (ranks by non-increasing p, r < b <= MAX_RANKS),
    ``ratio_ext[SENTINEL]`` = 1.0, ``base`` = prod_j (1 - p_j); keys are p(u, S).
    Frontier: for limit <= LINEAR_MAX_BUDGET an insertion-ordered list (children are
    appended without a branch: both slots are written, the count grows by the number that
    exist); a heap above. Same order either way: largest key,
    then earliest insertion. Scratch arrays need 2 * limit + h + 2 entries.
    """
    hh = min(h, b)
    linear = limit <= LINEAR_MAX_BUDGET
    n = 0  # live nodes (heap) / slots used (list)
    seq = 0
    for size in range(hh + 1):
        root = packed_root(size)
        key = packed_key(base, ratio_ext, root)
        if linear:
            keys[n] = key
            sets[n] = root
            n += 1
        else:
            n = heap_push(keys, seqs, sets, n, key, seq, root)
        seq += 1
    k = 0
    while k < limit:
        if linear:
            i = list_pop(keys, n)
            key = keys[i]
            if key < 0.0:
                break
            s = sets[i]
            keys[i] = -2.0
        else:
            if n == 0:
                break
            n, key, s = heap_pop(keys, seqs, sets, n)
        out[k] = s
        out_keys[k] = key
        k += 1
        if k == limit:
            break
        left, right = packed_children(s, b)
        if linear:
            keys[n] = packed_key(base, ratio_ext, left)
            sets[n] = left
            n += left >= 0
            keys[n] = packed_key(base, ratio_ext, right)
            sets[n] = right
            n += right >= 0
        else:
            for c in (left, right):
                if c >= 0:
                    n = heap_push(keys, seqs, sets, n, packed_key(base, ratio_ext, c), seq, c)
                    seq += 1
    return k


@njit(cache=True)
def rank_desc(p: F64, b: int, order: npt.NDArray[np.int64]) -> None:
    """order[:b] = indices of p[:b] by decreasing p, ties by index (counting rank)."""
    for i in range(b):
        v = p[i]
        r = 0
        for j in range(b):
            u = p[j]
            r += (u > v) | ((u == v) & (j < i))
        order[r] = i


@njit(cache=True)
def vosh_order_kernel(
    p: F64, h: int, limit: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], F64]:
    """The first ``limit`` VOSH sets: (indices (k, h) padded with -1, sizes (k,), keys (k,))."""
    b = p.shape[0]
    order = np.empty(b, dtype=np.int64)
    rank_desc(p, b, order)
    ratio_ext = np.ones(SENTINEL + 1)
    base = 1.0
    for r in range(b):
        pr = p[order[r]]
        ratio_ext[r] = pr / (1.0 - pr)
        base *= 1.0 - pr
    hh = min(h, b)
    cap = 2 * limit + hh + 2
    keys = np.empty(cap)
    seqs = np.empty(cap, dtype=np.int64)
    sets = np.empty(cap, dtype=np.int64)
    packed = np.empty(limit, dtype=np.int64)
    pkeys = np.empty(limit)
    k = vosh_enumerate(base, ratio_ext, b, h, limit, keys, seqs, sets, packed, pkeys)
    out_sets = np.full((k, max(hh, 1)), -1, dtype=np.int64)
    out_sizes = np.zeros(k, dtype=np.int64)
    out_keys = np.zeros(k)
    for i in range(k):
        s = packed[i]
        size = packed_size(s)
        for e in range(size):
            out_sets[i, e] = order[packed_elem(s, e)]
        out_sets[i, :size].sort()
        out_sizes[i] = size
        out_keys[i] = pkeys[i]
    return out_sets, out_sizes, out_keys


def vosh_array(
    p: npt.ArrayLike, h: int, limit: int | None = None
) -> list[tuple[float, tuple[int, ...]]]:
    """The numba kernel's sequence in :func:`vosh_sets` form (h <= 7, len(p) <= 255)."""
    pv = np.ascontiguousarray(p, dtype=np.float64)
    if np.any(pv < 0) or np.any(pv >= 1):
        raise ValueError("volatilities must lie in [0, 1)")
    b = pv.shape[0]
    if h > MAX_H or b > MAX_RANKS:
        raise ValueError(f"the packed kernel needs h <= {MAX_H} and at most {MAX_RANKS} bits")
    total = sum(math.comb(b, i) for i in range(min(h, b) + 1))
    lim = total if limit is None else min(limit, total)
    sets, sizes, keys = vosh_order_kernel(pv, h, lim)
    return [
        (float(keys[i]), tuple(int(x) for x in sets[i, : sizes[i]])) for i in range(len(keys))
    ]
