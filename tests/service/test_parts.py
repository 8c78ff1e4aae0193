"""Values sent as parts (dupalign/service/parts.py) against a brute-force reader that keeps
every record it read and puts each ordinal's value together from all of them."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.service.parts import PartsByOrdinal, part_header, record_part, split


@dataclass
class Rec:
    offset: int
    value: bytes
    headers: list[tuple[str, bytes]]


Sent = tuple[int, bytes, list[tuple[str, bytes]]]  # ordinal, value, headers


def records_of(ordinal: int, value: bytes, limit: int) -> list[Sent]:
    slices = split(value, limit)
    return [(ordinal, s, [part_header(i, len(slices))] if len(slices) > 1 else [])
            for i, s in enumerate(slices)]


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Sent], dict[int, bytes]]:
    """Several writers' values, each split, their parts interleaved (each writer's in its
    own order), some parts read twice (an at-least-once resend), some values sent again."""
    limit = draw(st.integers(1, 8))
    values = draw(st.dictionaries(st.integers(0, 20), st.binary(max_size=40), max_size=6))
    queues = [records_of(o, v, limit) * draw(st.integers(1, 2)) for o, v in values.items()]
    out = []
    while any(queues):
        q = draw(st.sampled_from([q for q in queues if q]))
        rec = q.pop(0)
        out.append(rec)
        if draw(st.integers(0, 9)) == 0:
            out.append(rec)
    return out, values


@settings(max_examples=300, deadline=None)
@given(streams(), st.integers(0, 1000))
def test_values_come_whole_once_complete_and_the_commit_stops_before_the_incomplete(
        stream: tuple[list[Sent], dict[int, bytes]], cut: int) -> None:
    records, values = stream
    records = records[:cut % (len(records) + 1)]  # a reader that has read this far
    reader = PartsByOrdinal()
    got: dict[int, list[tuple[int, bytes]]] = {}
    for offset, (ordinal, value, headers) in enumerate(records):
        whole = reader.add(ordinal, Rec(offset, value, headers))
        if whole is not None:
            got.setdefault(ordinal, []).append(whole)
    # brute force: per ordinal, a value is whole each time the records since the last
    # whole one hold every part index; its offset is the first of those records
    expected: dict[int, list[tuple[int, bytes]]] = {}
    incomplete = []
    for ordinal in {o for o, _, _ in records}:
        mine = [(offset, record_part(Rec(offset, v, h)) or (0, 1))
                for offset, (o, v, h) in enumerate(records) if o == ordinal]
        start = 0
        for end in range(1, len(mine) + 1):
            group = mine[start:end]
            if len({index for _, (index, _) in group}) == group[0][1][1]:
                expected.setdefault(ordinal, []).append((group[0][0], values[ordinal]))
                start = end
        if start < len(mine):
            incomplete.append(mine[start][0])
    assert got == expected
    assert reader.lowest_offset(0) == min(incomplete, default=None)


def test_values_below_the_floor_no_longer_hold_the_commit_back() -> None:
    reader = PartsByOrdinal()
    assert reader.add(3, Rec(10, b"ab", [part_header(0, 2)])) is None
    assert reader.add(5, Rec(11, b"cd", [part_header(0, 2)])) is None
    assert reader.lowest_offset(0) == 10
    assert reader.lowest_offset(4) == 11  # ordinal 3 was applied from another copy
    assert reader.add(5, Rec(12, b"ef", [part_header(1, 2)])) == (11, b"cdef")
    assert reader.lowest_offset(4) is None
    assert reader.add(5, Rec(13, b"cd", [part_header(0, 2)])) is None  # sent again, cut short
    assert reader.lowest_offset(4) == 13
    assert reader.lowest_offset(6) is None


def test_a_whole_record_and_a_split_one_round_trip() -> None:
    assert split(b"abcdefg", 3) == [b"abc", b"def", b"g"]
    assert split(b"abc", 3) == [b"abc"]
    assert split(b"", 3) == [b""]
    assert record_part(Rec(0, b"", [part_header(2, 3)])) == (2, 3)
    assert record_part(Rec(0, b"", [])) is None


@pytest.mark.parametrize("raw", [b"\x00\x00\x00\x03\x00\x00\x00\x03", b"\x01\x02"])
def test_a_part_header_that_cannot_be_one_is_an_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        record_part(Rec(0, b"", [("dupalign-part", raw)]))
