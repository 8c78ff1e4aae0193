"""The PAN text-alignment measures (Potthast et al., "An Evaluation Framework for Plagiarism
Detection", COLING 2010; the PAN 2013-2015 text alignment task's perfmeasures).

A plagiarism case and a detection are both an alignment: a pair of documents and a
character range in each, [start, end). As sets of characters they hold the characters of
both ranges, so every measure below counts the two documents together.

* r detects s when both name the same document pair and overlap in both documents.
* precision = mean over detections r of |r ∩ ⋃ {s : r detects s}| / |r| (0 if no detection),
* recall = mean over cases s of |s ∩ ⋃ {r : r detects s}| / |s|,
* granularity = mean over detected cases of the number of detections detecting them (1 if
  none is detected): one copy reported in three pieces has granularity 3,
* plagdet = F1(precision, recall) / log2(1 + granularity).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class Alignment:
    """A case or a detection: ``susp``/``src`` document names, a character range in each."""

    susp: str
    src: str
    susp_chars: tuple[int, int]
    src_chars: tuple[int, int]

    def size(self) -> int:
        return (self.susp_chars[1] - self.susp_chars[0]) + (self.src_chars[1] - self.src_chars[0])


@dataclass(frozen=True)
class PanScores:
    precision: float
    recall: float
    granularity: float
    plagdet: float
    cases: int
    detections: int


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def detects(r: Alignment, s: Alignment) -> bool:
    return (r.susp, r.src) == (s.susp, s.src) and _overlaps(r.susp_chars, s.susp_chars) \
        and _overlaps(r.src_chars, s.src_chars)


def _covered(target: tuple[int, int], ranges: list[tuple[int, int]]) -> int:
    """Characters of ``target`` inside the union of ``ranges``."""
    lo, hi = target
    total, at = 0, lo
    for a, b in sorted(ranges):
        a, b = max(a, at), min(b, hi)
        if b > a:
            total += b - a
            at = b
    return total


def _shared(x: Alignment, others: list[Alignment]) -> int:
    return (_covered(x.susp_chars, [o.susp_chars for o in others])
            + _covered(x.src_chars, [o.src_chars for o in others]))


def pan_scores(cases: list[Alignment], detections: list[Alignment]) -> PanScores:
    by_pair: dict[tuple[str, str], list[Alignment]] = defaultdict(list)
    for s in cases:
        by_pair[(s.susp, s.src)].append(s)
    precision = 0.0
    detected_by: dict[int, int] = defaultdict(int)  # case index -> detections detecting it
    case_index = {id(s): n for n, s in enumerate(cases)}
    for r in detections:
        hit = [s for s in by_pair.get((r.susp, r.src), []) if detects(r, s)]
        precision += _shared(r, hit) / r.size() if r.size() else 0.0
        for s in hit:
            detected_by[case_index[id(s)]] += 1
    precision = precision / len(detections) if detections else 0.0
    recall = 0.0
    for s in cases:
        hit = [r for r in detections if detects(r, s)]
        recall += _shared(s, hit) / s.size() if s.size() else 0.0
    recall = recall / len(cases) if cases else 0.0
    granularity = (sum(detected_by.values()) / len(detected_by)) if detected_by else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return PanScores(precision, recall, granularity, f1 / math.log2(1 + granularity),
                     len(cases), len(detections))
