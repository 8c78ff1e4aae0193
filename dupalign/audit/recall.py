"""Recall tallies of the audit and their intervals.

Per kind (``near``: the index's near matches against every stored page within the Hamming
bound that verifies; ``passage``: its matches against the pages of the reservoir that the
exact alignment finds), the sampled pages, the true pairs found (hits) and the true pairs
missed by cause. Passages are checked against a reservoir of R of the n pages before the
page, so each of its pairs stands for w = n / R pairs (1 for near: its search is
exhaustive): the recall estimate is the weighted share of hits (a ratio estimator,
Horvitz-Thompson weights). The pairs of one page are not independent (a text missed by one
page's query is missed for all the pages it was copied from), so the interval treats pages
as the sampled units: the ratio's variance from the spread of the pages' weighted hits
around it (the linearization, or cluster-robust, estimate), turned into an effective number
of pairs R(1-R)/var, and the Wilson score interval at that number (never above Kish's
(Σw)²/Σw² of the pairs; at a recall of 0 or 1 the variance says nothing, and the number of
pages stands in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgpack

KINDS = ("near", "passage")
# why a true pair was missed, where it can be told (dupalign.audit.auditor)
CAUSES = {
    "near": ("budget",),  # PSM's probes did not reach the page's bucket
    # a stop list held the collisions; a list was read only up to max_list_read; the page
    # was not among the passage's max_candidates; found as a task but not reported
    # (max_matches, max_repeats); none of those
    "passage": ("stop_list", "list_cut", "candidate_cut", "align_cap", "other"),
}
Z95 = 1.959963984540054


def wilson(hits: float, n: float, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``hits / n`` ((0, 1) when n is 0)."""
    if n <= 0:
        return 0.0, 1.0
    phat = hits / n
    denom = 1 + z * z / n
    centre = (phat + z * z / (2 * n)) / denom
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / denom
    # (at 0 or n hits the bound is exactly 0 or 1; the sum above can miss it by an ulp)
    low = 0.0 if hits <= 0 else max(0.0, centre - half)
    return low, 1.0 if hits >= n else min(1.0, centre + half)


@dataclass
class KindTally:
    pages: int = 0  # pages audited for this kind
    hits: int = 0  # true pairs the index found
    misses: dict[str, int] = field(default_factory=dict)  # true pairs missed, by cause
    w_hits: float = 0.0  # the same, each pair weighted by the pairs it stands for
    w_pairs: float = 0.0
    w2_pairs: float = 0.0  # sum of the squared weights (the effective count)
    # per page with true pairs, x its weighted pairs and y its weighted hits: their count and
    # the sums of x², y², xy (the ratio's variance)
    units: int = 0
    xx: float = 0.0
    yy: float = 0.0
    xy: float = 0.0

    @property
    def missed(self) -> int:
        return sum(self.misses.values())

    @property
    def pairs(self) -> int:
        return self.hits + self.missed

    def effective_pairs(self, recall: float) -> float:
        """The number of independent pairs the estimate is worth (module docstring)."""
        kish = self.w_pairs * self.w_pairs / self.w2_pairs
        m = self.units
        if m < 2:
            return min(kish, 1.0)
        mean_x = self.w_pairs / m
        s2 = max(0.0, (self.yy - 2 * recall * self.xy + recall * recall * self.xx) / (m - 1))
        var = s2 / (m * mean_x * mean_x)
        if var <= 0.0 or recall in (0.0, 1.0):
            return min(kish, float(m))
        return min(kish, recall * (1 - recall) / var)

    def estimate(self) -> dict[str, Any]:
        """Recall (None without a true pair yet), its 95 % interval and the counts."""
        if not self.w_pairs:
            return {"recall": None, "low": 0.0, "high": 1.0, "pages": self.pages,
                    "pairs": self.pairs, "hits": self.hits, "misses": dict(self.misses)}
        recall = self.w_hits / self.w_pairs
        low, high = wilson(recall * (n := self.effective_pairs(recall)), n)
        return {"recall": recall, "low": low,
                "high": high, "pages": self.pages, "pairs": self.pairs, "hits": self.hits,
                "misses": dict(self.misses)}


@dataclass
class Tally:
    """Both kinds' counts since the store was made (kept in the store: survives restarts)."""

    kinds: dict[str, KindTally] = field(default_factory=lambda: {k: KindTally() for k in KINDS})

    def add(self, kind: str, hits: int, misses: dict[str, int], weight: float = 1.0) -> None:
        """One audited page's true pairs, each standing for ``weight`` pairs."""
        t = self.kinds[kind]
        t.pages += 1
        t.hits += hits
        n = hits + sum(misses.values())
        t.w_hits += weight * hits
        t.w_pairs += weight * n
        t.w2_pairs += weight * weight * n
        if n:
            x, y = weight * n, weight * hits
            t.units += 1
            t.xx += x * x
            t.yy += y * y
            t.xy += x * y
        for cause, n in misses.items():
            if n:
                t.misses[cause] = t.misses.get(cause, 0) + n

    def estimates(self) -> dict[str, dict[str, Any]]:
        return {k: t.estimate() for k, t in self.kinds.items()}

    def to_bytes(self) -> bytes:
        return msgpack.packb({k: [t.pages, t.hits, t.misses, t.w_hits, t.w_pairs, t.w2_pairs,
                                  t.units, t.xx, t.yy, t.xy] for k, t in self.kinds.items()})

    @classmethod
    def from_bytes(cls, raw: bytes) -> Tally:
        out = cls()
        for k, (pages, hits, misses, *weighted) in msgpack.unpackb(raw).items():
            if k in out.kinds:
                out.kinds[k] = KindTally(pages, hits, dict(misses), *weighted)
        return out
