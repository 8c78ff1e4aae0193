"""Brute-force twins for dupalign.passage.monoactive and dupalign.passage.monoactive_query:
min-hashes of every
subsequence computed from the definitions (Equations 1 and 4 of the MonoActive paper), all
keys (Algorithm 3), active keys by Definition 12, vanilla Monotonic Partitioning over all keys
with a plain sorted-list skyline (Algorithm 4), and alignment by enumerating every subsequence.

A "value function" ``value(t, x) -> (order, key)`` gives the hash value of the x-th occurrence
of token t (multiset) or of token t at its weight for frequency x (weighted): ``order`` is a
comparable tuple (smaller wins), ``key`` the identity compared with the query.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from fractions import Fraction
from functools import cache
from typing import Any

import numpy as np

from dupalign.passage.monoactive import icws_hash, multiset_hash

Order = tuple[float | int, ...]
ValueFn = Callable[[Hashable, int], tuple[Order, int]]
Window = tuple[int, int, int, int, int]  # (key, a, b, c, d), 0-based inclusive

TF: dict[str, Callable[[int], float]] = {
    "raw": lambda x: float(x),
    "log": lambda x: 1.0 + math.log(x),
    "binary": lambda x: 1.0,
    "sqrt": lambda x: math.sqrt(x),
    "squared": lambda x: float(x * x),
}


def multiset_value(fn: int) -> ValueFn:
    """h_fn(t, x) of dupalign.passage.monoactive, one scalar at a time."""

    @cache
    def value(t: Hashable, x: int) -> tuple[Order, int]:
        v = int(multiset_hash(np.array([t], dtype=np.uint64), np.array([x]), fn)[0])
        return (v,), v

    return value


def weighted_value(fn: int, tf: str = "raw", idf: Mapping[int, float] | None = None) -> ValueFn:
    """ICWS sample of token t at weight tf(x) * idf(t) under hash function fn."""

    @cache
    def value(t: Hashable, x: int) -> tuple[Order, int]:
        w = TF[tf](x) * (idf.get(int(t), 1.0) if idf else 1.0)  # type: ignore[call-overload]
        ln_a, z, key = icws_hash(np.array([t], dtype=np.uint64), np.array([w]), fn)
        return (float(ln_a[0]), -int(z[0]), int(t)), int(key[0])  # type: ignore[call-overload]

    return value


def table_value(table: Mapping[tuple[Any, int], int]) -> ValueFn:
    """A value function from an explicit table h(t, x) (the paper's running example)."""
    return lambda t, x: ((table[(t, x)],), table[(t, x)])


# --- min-hashes straight from the definitions ---------------------------------------------------


def minhash_multiset(seq: Sequence[Hashable], value: ValueFn) -> int:
    """Equation 1: min over tokens t and 1 <= x <= f(t, seq) of h(t, x)."""
    f = Counter(seq)
    return min((value(t, x) for t in f for x in range(1, f[t] + 1)), key=lambda v: v[0])[1]


def minhash_weighted(seq: Sequence[Hashable], value: ValueFn) -> int:
    """Equation 4: min over distinct tokens t of h(t, w(t, seq))."""
    f = Counter(seq)
    return min((value(t, f[t]) for t in f), key=lambda v: v[0])[1]


def all_minhashes(
    seq: Sequence[Hashable], value: ValueFn, weighted: bool = False
) -> dict[tuple[int, int], int]:
    """Min-hash key of every subsequence seq[i..j] (0-based inclusive)."""
    mh = minhash_weighted if weighted else minhash_multiset
    n = len(seq)
    return {(i, j): mh(seq[i : j + 1], value) for i in range(n) for j in range(i, n)}


# --- keys -------------------------------------------------------------------------------------


def all_keys(seq: Sequence[Hashable], value: ValueFn) -> list[tuple[int, int, int]]:
    """Algorithm 3: every (p, q, x) with seq[p] == seq[q], x = occurrences in seq[p..q]."""
    out = []
    for p in range(len(seq)):
        x = 0
        for q in range(p, len(seq)):
            if seq[q] == seq[p]:
                x += 1
                out.append((p, q, x))
    return out


def active_keys(seq: Sequence[Hashable], value: ValueFn) -> set[tuple[int, int]]:
    """Definition 13: keys whose value is strictly smaller than h(t, x') for every x' < x."""
    out = set()
    for p, q, x in all_keys(seq, value):
        v = value(seq[p], x)[0]
        if all(v < value(seq[p], x2)[0] for x2 in range(1, x)):
            out.add((p, q))
    return out


# --- vanilla monotonic partitioning ------------------------------------------------------------


def mono_all(seq: Sequence[Hashable], value: ValueFn) -> list[Window]:
    """Algorithm 4 over ALL keys (visited by value, then frequency descending), with the
    skyline as a plain coordinate-ordered Python list (guards (-1, -1) and (n, n))."""
    n = len(seq)
    keys = all_keys(seq, value)
    keys.sort(key=lambda k: (value(seq[k[0]], k[2])[0], -k[2]))
    sky: list[tuple[int, int]] = [(-1, -1), (n, n)]
    out: list[Window] = []
    for b, c, x in keys:
        v = value(seq[b], x)[1]
        ys = [s[1] for s in sky]
        jp = bisect.bisect_right(ys, c) - 1  # largest index with y <= c
        if sky[jp][0] >= b:  # dominates (b, c): [x, y] strictly inside [b, c]
            continue
        i = bisect.bisect_left(ys, c) - 1  # largest index with y < c
        xs = [s[0] for s in sky]
        j = bisect.bisect_right(xs, b)  # smallest index with x > b
        cp = c
        for k in range(i, j):
            a, d = sky[k][0] + 1, sky[k + 1][1] - 1
            if a <= b and cp <= d:
                out.append((v, a, b, cp, d))
            cp = sky[k + 1][1]
        sky[i + 1 : j] = [(b, c)]
    return out


def partition_problems(
    windows: Sequence[Window], n: int, minhash: dict[tuple[int, int], int]
) -> list[str]:
    """Why ``windows`` is not a partition of the subsequences carrying their min-hashes."""
    seen: dict[tuple[int, int], int] = {}
    bad = []
    for w, (key, a, b, c, d) in enumerate(windows):
        if not (0 <= a <= b <= c <= d < n):
            bad.append(f"window {w} {(a, b, c, d)} out of shape")
            continue
        for i in range(a, b + 1):
            for j in range(c, d + 1):
                if (i, j) in seen:
                    bad.append(f"cell {(i, j)} in windows {seen[(i, j)]} and {w}")
                seen[(i, j)] = w
                if minhash[(i, j)] != key:
                    bad.append(f"cell {(i, j)} has min-hash {minhash[(i, j)]}, window {key}")
    missing = set(minhash) - set(seen)
    if missing:
        bad.append(f"cells not covered: {sorted(missing)[:5]}")
    return bad


# --- alignment --------------------------------------------------------------------------------


def longest_only(cells: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """Half-open ranges of the inclusive cells (i, j) not strictly inside another cell."""
    keep = [
        (i, j)
        for i, j in cells
        if not any(i2 <= i and j <= j2 and (i2, j2) != (i, j) for i2, j2 in cells)
    ]
    return sorted((i, j + 1) for i, j in keep)


def brute_align(
    query: Sequence[Hashable],
    text: Sequence[Hashable],
    values: Sequence[ValueFn],
    theta: tuple[int, int],
    weighted: bool = False,
    min_len: int = 1,
) -> list[tuple[int, int]]:
    """Every text subsequence with (matching min-hashes) / k >= theta, longest only."""
    mh = minhash_weighted if weighted else minhash_multiset
    qk = [mh(query, v) for v in values]
    th = Fraction(*theta)
    cells = set()
    for i in range(len(text)):
        for j in range(i + min_len - 1, len(text)):
            sub = text[i : j + 1]
            m = sum(mh(sub, v) == q for v, q in zip(values, qk, strict=True))
            if Fraction(m, len(values)) >= th:
                cells.add((i, j))
    return longest_only(cells)


def brute_scan(
    rects: Sequence[tuple[int, int, int, int]], threshold: int, min_len: int = 1
) -> list[tuple[int, int]]:
    """Plane sweep by counting: cells (i <= j) covered by >= threshold rectangles."""
    count: Counter[tuple[int, int]] = Counter()
    for a, b, c, d in rects:
        for i in range(a, b + 1):
            for j in range(max(c, i), d + 1):
                count[(i, j)] += 1
    return longest_only(
        {cell for cell, m in count.items() if m >= threshold and cell[1] - cell[0] + 1 >= min_len}
    )


# --- exact similarities (the paper's Examples 1 and 3) -------------------------------------------


def multiset_jaccard(s: Sequence[Hashable], t: Sequence[Hashable]) -> Fraction:
    fs, ft = Counter(s), Counter(t)
    keys = set(fs) | set(ft)
    return Fraction(sum(min(fs[k], ft[k]) for k in keys), sum(max(fs[k], ft[k]) for k in keys))


def weighted_jaccard(ws: Mapping[Any, float], wt: Mapping[Any, float]) -> float:
    keys = set(ws) | set(wt)
    num = sum(min(ws.get(k, 0.0), wt.get(k, 0.0)) for k in keys)
    return num / sum(max(ws.get(k, 0.0), wt.get(k, 0.0)) for k in keys)
