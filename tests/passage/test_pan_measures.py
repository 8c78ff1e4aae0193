"""The PAN text-alignment measures of the benchmark, on an example computed by hand."""

from __future__ import annotations

import math

import pytest

from tests.bench.pan import Alignment, pan_scores


def test_hand_computed_example() -> None:
    # pair (a, b): one case of 100 + 100 characters, found in two overlapping pieces;
    # pair (c, d): one case of 50 + 50, and a detection that overlaps it in the suspicious
    # document only (so it detects nothing)
    s1 = Alignment("a", "b", (0, 100), (0, 100))
    s2 = Alignment("c", "d", (0, 50), (0, 50))
    r1 = Alignment("a", "b", (0, 50), (0, 50))  # all inside s1: 100 / 100
    r2 = Alignment("a", "b", (40, 120), (50, 130))  # (60 + 50) / (80 + 80) = 0.6875
    r3 = Alignment("c", "d", (10, 20), (300, 310))  # 0 / 20
    got = pan_scores([s1, s2], [r1, r2, r3])
    precision = (1 + 0.6875 + 0) / 3  # 0.5625
    recall = (200 / 200 + 0) / 2  # s1: r1 ∪ r2 cover [0, 100) on both sides; s2: nothing
    granularity = 2  # s1 is detected by r1 and r2; s2 is not detected
    f1 = 2 * precision * recall / (precision + recall)  # 0.5294...
    assert got.precision == pytest.approx(0.5625)
    assert got.recall == pytest.approx(0.5)
    assert got.granularity == granularity
    assert got.plagdet == pytest.approx(f1 / math.log2(3))
    assert got.plagdet == pytest.approx(0.334021, abs=1e-6)


def test_perfect_and_empty() -> None:
    s = Alignment("a", "b", (5, 10), (20, 40))
    perfect = pan_scores([s], [s])
    assert (perfect.precision, perfect.recall, perfect.granularity, perfect.plagdet) == (
        1, 1, 1, 1)
    none = pan_scores([s], [])
    assert (none.precision, none.recall, none.granularity, none.plagdet) == (0, 0, 1, 0)
