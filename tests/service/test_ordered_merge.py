"""The ordered merge of partitioned inputs (dupalign/service/ordered_merge.py): whatever order
the partitions are read in, and wherever a reader stops and resumes from the noted
low-water offsets and last key taken, every record is handed over once, in key order."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.service.ordered_merge import OrderedMerge


def run(owner: list[int], layouts: list[list[int]], rng: random.Random, crashes: set[int]
        ) -> list[int]:
    """Keys 0..n-1, key k in partition ``owner[k]``, each partition's records in the order
    ``layouts[p]``; partitions read one record at a time in an order ``rng`` picks; at the
    steps in ``crashes`` the merge is dropped and a new one resumes from its notes. The keys
    taken, in order."""
    n_parts = len(layouts)
    merge: OrderedMerge[int] = OrderedMerge(dict.fromkeys(range(n_parts), 0))
    read = dict.fromkeys(range(n_parts), 0)  # each reader's position
    out: list[int] = []
    step = 0
    while len(out) < len(owner):
        p = rng.randrange(n_parts)
        if read[p] < len(layouts[p]):
            merge.add(p, read[p], layouts[p][read[p]], b"%d" % layouts[p][read[p]])
            read[p] += 1
        nxt = 0 if merge.taken is None else merge.taken + 1
        while nxt < len(owner) and (v := merge.take(owner[nxt], nxt)) is not None:
            assert v == b"%d" % nxt
            out.append(nxt)
            nxt += 1
        step += 1
        if step in crashes:
            read = merge.low_water()
            merge = OrderedMerge(read, merge.taken)
        assert step < 20_000, f"stuck after {out}"  # (a record lost: never handed over)
    assert len(merge) == 0 and not merge.stale()
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.tuples(
    st.lists(st.integers(0, 3), min_size=n, max_size=n), st.integers(0, 2**32),
    st.sets(st.integers(1, 200), max_size=6), st.booleans())))
def test_any_interleaving_and_restart_hands_every_record_over_once_in_order(
        case: tuple[list[int], int, set[int], bool]) -> None:
    # (a plain Random: hypothesis's would call a stuck run an overrun, not a failure)
    owner, seed, crashes, ordered = case
    rng = random.Random(seed)
    layouts: list[list[int]] = [[k for k in range(len(owner)) if owner[k] == p]
                                for p in range(4)]
    if not ordered:  # a partition of many writers: records in any order
        for layout in layouts:
            rng.shuffle(layout)
    assert run(owner, layouts, rng, crashes) == list(range(len(owner)))


def test_a_record_twice_and_a_key_taken_out_of_order_are_errors() -> None:
    merge: OrderedMerge[tuple[int, int]] = OrderedMerge({0: 0, 1: 5})
    merge.add(1, 5, (3, 0), b"a")
    merge.add(1, 4, (3, 0), b"a")  # below the position: read again, ignored
    with pytest.raises(ValueError, match="twice"):
        merge.add(1, 6, (3, 0), b"a")
    with pytest.raises(ValueError, match="not an input"):
        merge.add(2, 0, (1, 0), b"")
    assert merge.take(0, (2, 0)) is None
    assert merge.take(1, (3, 0)) == b"a"
    with pytest.raises(ValueError, match="taken after"):
        merge.take(0, (2, 5))
    merge.add(0, 0, (1, 1), b"old")  # at or below the last key taken: applied before
    assert len(merge) == 0 and merge.low_water() == {0: 1, 1: 7}


def test_a_record_the_sequence_passed_is_stale() -> None:
    merge: OrderedMerge[int] = OrderedMerge({0: 0, 1: 0})
    merge.add(0, 0, 4, b"x")
    merge.add(1, 0, 2, b"y")
    assert merge.take(1, 2) == b"y" and merge.stale() == []
    merge.add(1, 1, 6, b"z")
    assert merge.take(1, 6) == b"z"
    assert merge.stale() == [(0, 4)]
    assert merge.low_water() == {0: 0, 1: 2}
