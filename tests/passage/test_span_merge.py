"""Merging passage hits into maximal spans, against a brute-force component merge."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.stages.align import HitBox, merge_hits

Box = tuple[int, int, int, int]


def overlap(a: Box, b: Box) -> bool:
    return a[0] <= b[1] and b[0] <= a[1] and a[2] <= b[3] and b[2] <= a[3]


def brute_merge(boxes: list[Box]) -> list[Box]:
    """Merge any two boxes that overlap (or touch) on both axes, until none do."""
    out = list(boxes)
    merged = True
    while merged:
        merged = False
        for i in range(len(out)):
            for j in range(i + 1, len(out)):
                if overlap(out[i], out[j]):
                    a, b = out[i], out.pop(j)
                    out[i] = (min(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), max(a[3], b[3]))
                    merged = True
                    break
            if merged:
                break
    return sorted(out)


box = st.tuples(st.integers(0, 40), st.integers(1, 8), st.integers(0, 40), st.integers(1, 8))


@given(st.lists(box, max_size=14))
@settings(max_examples=500, deadline=None)
def test_merge_equals_brute_force(raw: list[tuple[int, int, int, int]]) -> None:
    hits = [HitBox(q, q + ql, t, t + tl, 0.5) for q, ql, t, tl in raw]
    got = sorted((h.q_start, h.q_end, h.t_start, h.t_end) for h in merge_hits(hits))
    assert got == brute_merge([(q, q + ql, t, t + tl) for q, ql, t, tl in raw])


def test_interleaved_hits_become_one_span() -> None:
    # the greedy "compare with the last span only" merge left the inner hit on its own
    hits = [HitBox(0, 73, 0, 170, 0.3), HitBox(100, 140, 50, 90, 0.3), HitBox(24, 73, 6, 48, 0.4)]
    merged = merge_hits(hits)
    assert [(h.q_start, h.q_end, h.t_start, h.t_end, h.est) for h in merged] == [
        (0, 73, 0, 170, 0.4), (100, 140, 50, 90, 0.3)]
