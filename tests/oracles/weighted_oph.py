"""Brute-force twins of dupalign.passage.weighted_oph: every subsequence's sketch computed
directly from the definition (counts, weights, M = floor(w + β) elements per token, the
smallest element value per bin), and exact weighted Jaccard."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from dupalign.passage.monoactive import tf_weights
from dupalign.passage.oph import oph_bins
from dupalign.passage.weighted_oph import BETA_SALT, ELEM_SALT, WOPHWindows
from dupalign.text.hashing import mix64, to_unit

# a bin of a subsequence: its smallest element value, None if it has no element there
Cell = int | None


def weight(count: int, tf: str) -> float:
    return float(tf_weights(np.array([count], dtype=np.int64), tf)[0])  # type: ignore[arg-type]


def n_elements(th: int, count: int, tf: str) -> int:
    """M = floor(w(count) + β_t)."""
    beta = float(to_unit(mix64(np.array([th], np.uint64), BETA_SALT))[0])
    return math.floor(weight(count, tf) + beta)


def element(th: int, m: int, k: int) -> tuple[int, int]:
    """(value, bin) of element (t, m), m >= 1."""
    u = mix64(mix64(np.array([th], np.uint64), ELEM_SALT) ^ np.uint64(m), ELEM_SALT + 1)
    return int(u[0]), int(oph_bins(u, k)[0])


def cells(units: Sequence[int], k: int, tf: str) -> list[Cell]:
    """Per bin of a whole sequence: its smallest element value (None: no element)."""
    best: list[int | None] = [None] * k
    for th, count in Counter(int(u) for u in units).items():
        for m in range(1, n_elements(th, count, tf) + 1):
            u, b = element(th, m, k)
            cur = best[b]
            if cur is None or u < cur:
                best[b] = u
    return best


def all_cells(units: Sequence[int], k: int, tf: str) -> dict[tuple[int, int, int], Cell]:
    """(i, j, bin) -> the cell of T[i..j] (inclusive), for every i <= j."""
    return {(i, j, b): c for i in range(len(units)) for j in range(i, len(units))
            for b, c in enumerate(cells(units[i : j + 1], k, tf))}


def window_cover(w: WOPHWindows, n: int) -> tuple[dict[tuple[int, int, int], int],
                                                  set[tuple[int, int, int]]]:
    """(i, j, bin) -> the key of the non-empty window covering it, and the (i, j, bin) the
    empty windows cover; fails if two windows of one kind cover one."""
    keys: dict[tuple[int, int, int], int] = {}
    empty: set[tuple[int, int, int]] = set()
    for x in range(len(w)):
        b = int(w.bin[x])
        for i in range(int(w.a[x]), int(w.b[x]) + 1):
            for j in range(max(i, int(w.c[x])), int(w.d[x]) + 1):
                assert 0 <= i <= j < n
                if w.empty[x]:
                    assert (i, j, b) not in empty, f"{(i, j, b)} in two empty windows"
                    empty.add((i, j, b))
                else:
                    assert (i, j, b) not in keys, f"{(i, j, b)} in two windows"
                    keys[i, j, b] = int(w.key[x])
    return keys, empty


def weighted_jaccard(a: Sequence[int], b: Sequence[int], tf: str) -> float:
    """Σ min(w_A, w_B) / Σ max(w_A, w_B) over tokens, w = tf(count) (0 if absent)."""
    ca, cb = Counter(int(u) for u in a), Counter(int(u) for u in b)
    lo = hi = 0.0
    for t in ca.keys() | cb.keys():
        wa = weight(ca[t], tf) if ca[t] else 0.0
        wb = weight(cb[t], tf) if cb[t] else 0.0
        lo += min(wa, wb)
        hi += max(wa, wb)
    return lo / hi if hi else float("nan")


def element_jaccard(a: Sequence[int], b: Sequence[int], tf: str) -> float:
    """Jaccard of the element sets: Σ min(M_A, M_B) / Σ max(M_A, M_B)."""
    ca, cb = Counter(int(u) for u in a), Counter(int(u) for u in b)
    lo = hi = 0
    for t in ca.keys() | cb.keys():
        ma = n_elements(t, ca[t], tf) if ca[t] else 0
        mb = n_elements(t, cb[t], tf) if cb[t] else 0
        lo += min(ma, mb)
        hi += max(ma, mb)
    return lo / hi if hi else float("nan")
