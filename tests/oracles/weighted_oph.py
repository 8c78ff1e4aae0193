"""Brute-force twins of dupalign.passage.weighted_oph: every subsequence's sample per bin
computed directly from the definition (counts, weights, ICWS per token, min per bin), and
exact weighted Jaccard."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from dupalign.passage.monoactive import icws_hash, tf_weights
from dupalign.passage.oph import oph_bins
from dupalign.passage.weighted_oph import BIN_SALT, FN, WOPHWindows
from dupalign.text.hashing import mix64

Sample = int | None  # a bin's key, None when the bin is empty


def weight(count: int, tf: str) -> float:
    return float(tf_weights(np.array([count], dtype=np.int64), tf)[0])  # type: ignore[arg-type]


def token_sample(th: int, count: int, tf: str) -> tuple[float, int, int]:
    """ICWS of one token at its weight: ``(ln a, z, key)``."""
    ln_a, z, key = icws_hash(np.array([th], np.uint64), np.array([weight(count, tf)]), FN)
    return float(ln_a[0]), int(z[0]), int(key[0])


def token_bin(th: int, k: int) -> int:
    return int(oph_bins(mix64(np.array([th], np.uint64), BIN_SALT), k)[0])


def sample(units: Sequence[int], k: int, tf: str) -> list[Sample]:
    """The sketch of a whole sequence, from the definition."""
    best: list[tuple[float, int, int, int] | None] = [None] * k
    for th, count in Counter(int(u) for u in units).items():
        ln_a, z, key = token_sample(th, count, tf)
        b = token_bin(th, k)
        cand = (ln_a, -z, th, key)
        cur = best[b]
        if cur is None or cand[:3] < cur[:3]:
            best[b] = cand
    return [None if c is None else c[3] for c in best]


def all_samples(units: Sequence[int], k: int, tf: str) -> dict[tuple[int, int, int], Sample]:
    """(i, j, bin) -> the sample of T[i..j] (inclusive) in that bin, for every i <= j."""
    out = {}
    for i in range(len(units)):
        for j in range(i, len(units)):
            for b, s in enumerate(sample(units[i : j + 1], k, tf)):
                out[i, j, b] = s
    return out


def window_cover(w: WOPHWindows, n: int) -> dict[tuple[int, int, int], Sample]:
    """(i, j, bin) -> the key of the window covering it; fails if two windows cover it."""
    out: dict[tuple[int, int, int], Sample] = {}
    for x in range(len(w)):
        b = int(w.bin[x])
        for i in range(int(w.a[x]), int(w.b[x]) + 1):
            for j in range(max(i, int(w.c[x])), int(w.d[x]) + 1):
                assert 0 <= i <= j < n
                assert (i, j, b) not in out, f"(i, j, bin) = {(i, j, b)} covered twice"
                out[i, j, b] = None if w.empty[x] else int(w.key[x])
    return out


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
