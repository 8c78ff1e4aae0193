"""Brute-force twins for dupalign.near.cws: ICWS with one Python loop per (sample, feature) using
hashing.mix64 / to_unit and math.log; exact weighted Jaccard from dicts; binomial tails as
sums of Fractions; the filter's bounds by scanning every m; and the exact probabilities of
the filter's sequential decisions by dynamic programming over the match count.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from dupalign.text.hashing import mix64, to_unit

_MASK64 = (1 << 64) - 1


def _mix(x: int, salt: int) -> int:
    return int(mix64(np.array([x], dtype=np.uint64), salt)[0])


def _unit(x: int) -> float:
    return float(to_unit(np.array([x], dtype=np.uint64))[0])


def icws_twin(weighted: dict[int, float], K: int, seed: int) -> list[tuple[int, int]]:
    """Ioffe's ICWS as written: per sample k, argmin over features of a = c / (y e^r).

    Returns (hash of x*, t*) per sample; ties go to the smaller hash. Uses the same salts as
    dupalign.near.cws (seed << 4 | stream), since consistency across runs is the point.
    """

    def salt(stream: int) -> int:
        return ((seed << 4) | stream) & _MASK64

    out: list[tuple[int, int]] = []
    for k in range(K):
        sample_key = _mix(k, salt(1))
        best: tuple[float, int, int] | None = None
        for h in sorted(weighted):
            s = weighted[h]
            if s <= 0:
                continue
            x = _mix(h, salt(0)) ^ sample_key
            r = -math.log(_unit(_mix(x, salt(2))) * _unit(_mix(x, salt(3))))
            c = -math.log(_unit(_mix(x, salt(4))) * _unit(_mix(x, salt(5))))
            beta = _unit(_mix(x, salt(6)))
            t = math.floor(math.log(s) / r + beta)
            y = math.exp(r * (t - beta))
            assert y <= s * (1 + 1e-12) and s < y * math.exp(r) * (1 + 1e-12)  # y ≤ S < y e^r
            ln_a = math.log(c) - r * (t - beta + 1.0)
            if best is None or ln_a < best[0]:
                best = (ln_a, h, t)
        out.append((0, 0) if best is None else (best[1], best[2]))
    return out


def weighted_jaccard_twin(a: dict[int, float], b: dict[int, float]) -> float:
    keys = set(a) | set(b)
    num = sum(min(a.get(x, 0.0), b.get(x, 0.0)) for x in keys)
    den = sum(max(a.get(x, 0.0), b.get(x, 0.0)) for x in keys)
    return num / den if den else 0.0


def binom_cdf_twin(k: int, p: Fraction, m: int) -> Fraction:
    """P(X ≤ m), X ~ B(k, p), as a sum of exact terms."""
    return sum(
        (Fraction(math.comb(k, i)) * p**i * (1 - p) ** (k - i) for i in range(0, min(m, k) + 1)),
        Fraction(0),
    )


def bounds_twin(k: int, t: Fraction, e: Fraction) -> tuple[int, int]:
    """(m_lower, m_upper) by scanning every m: largest m with P(X ≤ m) ≤ e (else −1) and
    smallest m with P(X > m) ≤ e."""
    lows = [m for m in range(k + 1) if binom_cdf_twin(k, t, m) <= e]
    ups = [m for m in range(k + 1) if 1 - binom_cdf_twin(k, t, m) <= e]
    return (max(lows) if lows else -1), min(ups)


def decision_probabilities(
    points: list[int], m_lower: list[int], m_upper: list[int], R: float
) -> dict[str, float]:
    """Exact P(decided "upper" / "lower" / left to the estimate) of the sequential filter
    when every sample matches independently with probability R (DP over the match count
    among pairs still undecided)."""
    alive = {0: 1.0}  # matches so far -> probability, among pairs not yet decided
    prev = 0
    out = {"upper": 0.0, "lower": 0.0, "estimate": 0.0}
    for k, lo, up in zip(points, m_lower, m_upper, strict=True):
        n = k - prev
        step = [math.comb(n, j) * R**j * (1 - R) ** (n - j) for j in range(n + 1)]
        nxt: dict[int, float] = {}
        for x, px in alive.items():
            for j, pj in enumerate(step):
                nxt[x + j] = nxt.get(x + j, 0.0) + px * pj
        alive = {}
        for x, px in nxt.items():
            if x > up:
                out["upper"] += px
            elif x <= lo:
                out["lower"] += px
            else:
                alive[x] = px
        prev = k
    out["estimate"] = sum(alive.values())
    return out
