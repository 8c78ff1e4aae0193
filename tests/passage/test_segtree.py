"""Segment tree vs a plain array (dupalign.passage.segtree)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.passage.segtree import SegmentTree
from tests.oracles.oph import NaiveRangeArray


@st.composite
def programs(draw: st.DrawFn) -> tuple[int, list[tuple[str, int, int, int]]]:
    size = draw(st.integers(1, 70))
    pos = st.integers(-3, size + 3)  # out-of-range bounds are clipped
    ops = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["add", "add", "right", "max"]), pos, pos, st.integers(-5, 8)
            ),
            max_size=60,
        )
    )
    return size, ops


@settings(max_examples=300, deadline=None)
@given(programs())
def test_tree_matches_naive_array(prog: tuple[int, list[tuple[str, int, int, int]]]) -> None:
    size, ops = prog
    tree = SegmentTree(size)
    naive = NaiveRangeArray(size)
    for op, a, b, v in ops:
        lo, hi = min(a, b), max(a, b)
        if op == "add":
            tree.add(lo, hi, v)
            naive.add(lo, hi, v)
        elif op == "right":
            assert tree.rightmost_at_least(lo, hi, v) == naive.rightmost_at_least(lo, hi, v)
        elif max(lo, 0) <= min(hi, size - 1):
            assert tree.range_max(lo, hi) == naive.range_max(lo, hi)
    assert [tree.value_at(x) for x in range(size)] == naive.a.tolist()


def test_reversed_ranges_are_empty() -> None:
    tree = SegmentTree(8)
    tree.add(5, 2, 7)  # lo > hi: no-op
    assert tree.range_max(0, 7) == 0
    assert tree.rightmost_at_least(5, 2, -10) == -1


def test_rightmost_example() -> None:
    tree = SegmentTree(10)
    tree.add(2, 5, 3)
    tree.add(4, 9, 1)
    assert [tree.value_at(x) for x in range(10)] == [0, 0, 3, 3, 4, 4, 1, 1, 1, 1]
    assert tree.rightmost_at_least(0, 9, 4) == 5
    assert tree.rightmost_at_least(0, 9, 1) == 9
    assert tree.rightmost_at_least(0, 3, 1) == 3
    assert tree.rightmost_at_least(6, 9, 2) == -1
    tree.add(0, 9, -1)
    assert tree.rightmost_at_least(0, 9, 0) == 9
    assert tree.rightmost_at_least(0, 9, 3) == 5


def test_bad_size() -> None:
    with pytest.raises(ValueError):
        SegmentTree(0)
