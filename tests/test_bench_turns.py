"""bench_stage_roles' pages per turn (tests/bench/stage_turns.py) against brute force: a
changelog of transactions written as a stage partition writes them (records at consecutive
offsets, a commit marker after each, aborted ones between) gives back the pages of each."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from tests.bench.stage_turns import BUCKETS, bucket_name, histogram, turn_pages


@dataclass
class Rec:
    partition: int
    offset: int
    progress: int | None  # the ordinal the record notes, None: another store key


def written(turns: list[tuple[int, int, bool]], partition: int) -> list[Rec]:
    """The committed records of ``turns`` (pages applied, other records, aborted?) as a
    changelog partition holds them: a turn that applied pages notes its progress."""
    out, offset, at = [], 0, 0
    for pages, others, aborted in turns:
        recs = [Rec(partition, offset + i, None) for i in range(others)]
        if pages:
            recs.append(Rec(partition, offset + others, at + pages))
        if not recs:  # (a turn that changed nothing has no transaction)
            continue
        offset += len(recs) + 1  # (its marker)
        if not aborted:
            out += recs
            at += pages
    return out


turn = st.tuples(st.integers(0, 40), st.integers(0, 3), st.booleans())


@given(st.lists(st.lists(turn, max_size=12), min_size=1, max_size=3), st.integers(0, 60))
def test_turn_pages_gives_back_each_committed_turn(parts: list[list[tuple[int, int, bool]]],
                                                   since: int) -> None:
    records = [r for p, turns in enumerate(parts) for r in written(turns, p)]
    expected = []
    for turns in parts:
        at = 0
        for pages, others, aborted in turns:
            if aborted or not (pages or others):
                continue
            if at >= since:
                expected.append(pages)
            at += pages
    got = turn_pages(reversed(records), lambda r: r.progress, since)
    assert sorted(got) == sorted(expected)


@given(st.lists(st.integers(0, 600)))
def test_histogram_puts_each_turn_in_its_bucket(pages: list[int]) -> None:
    counts = histogram(pages)
    assert sum(counts) == len(pages)
    for i, c in enumerate(counts):
        lo = 0 if i == 0 else BUCKETS[i - 1] + 1
        hi = BUCKETS[i] if i < len(BUCKETS) else 10**9
        assert c == sum(lo <= n <= hi for n in pages)
    assert [bucket_name(i) for i in (0, 1, 2, len(BUCKETS))] == ["0", "1", "2-3", "256+"]
