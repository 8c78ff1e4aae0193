"""The sequence record per batch (dupalign/service/sequence_batch.py): its wire form, and a
reader's ordinals: running counts over the batches read, kept from a cursor on."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dupalign.service.sequence_batch import (
    SequenceBatch,
    SequenceLog,
    page_header,
    record_page,
)


def batch(n: int, d: int = 3, at: int = 7) -> SequenceBatch:
    return SequenceBatch("pages", 1, tuple(range(10, 10 + n)), tuple(k % d for k in range(n)),
                         d, at)


def test_wire_form_and_page_header() -> None:
    b = batch(5)
    assert SequenceBatch.from_bytes(b.to_bytes()) == b
    rec = SimpleNamespace(headers=[("x", b""), page_header(2**40, 7)], topic="t", partition=0,
                          offset=3)
    assert record_page(rec) == (2**40, 7)
    with pytest.raises(ValueError, match="no dupalign-page"):
        record_page(SimpleNamespace(headers=[], topic="t", partition=0, offset=3))
    with pytest.raises(ValueError):
        SequenceBatch("p", 0, (1, 2), (0, 3), 3, 0)  # a partition past the count
    with pytest.raises(ValueError):
        SequenceBatch("p", 0, (), (), 3, 0)


@given(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 3)), min_size=1, max_size=20),
       st.data())
def test_ordinals_are_running_counts_from_any_cursor(
        sizes: list[tuple[int, int]], data: st.DataObject) -> None:
    """Batches at offsets with gaps (aborted transactions); a log resumed from the cursor
    noted after a trim gives the same pages."""
    log = SequenceLog(n_dirs=3)
    offset, pages = 0, []
    for n, gap in sizes:
        offset += gap
        log.add(offset, batch(n, at=offset))
        pages += [(offset, i, i % 3, offset) for i in range(n)]
        offset += 1
    assert log.end == len(pages) and log.page(len(pages)) is None
    for o, (b, i, d, at) in enumerate(pages):
        ref = log.page(o)
        assert ref is not None and (ref.batch, ref.index, ref.dir, ref.at_ms) == (b, i, d, at)
    below = data.draw(st.integers(0, len(pages)))
    log.trim(below)
    start, first = log.cursor()
    again = SequenceLog(start, first)
    for b, i, _, _ in pages:
        if b >= start and i == 0:
            again.add(b, batch(sum(1 for p in pages if p[0] == b), at=b))
    again.add(start - 1, batch(2))  # (read again below the cursor: ignored)
    for o in range(below, len(pages)):
        assert log.page(o) == again.page(o)
    assert first <= below
    if first:
        with pytest.raises(ValueError, match="below the sequence kept"):
            again.page(first - 1)


@given(st.lists(st.integers(1, 5), min_size=1, max_size=12), st.data())
def test_the_directory_partitions_of_a_stretch_are_each_page_s(sizes: list[int],
                                                                data: st.DataObject) -> None:
    """``dirs`` (a run of ordinals at once) against ``page`` one ordinal at a time."""
    log = SequenceLog(n_dirs=3)
    for offset, n in enumerate(sizes):
        log.add(offset, SequenceBatch("pages", 0, tuple(range(n)),
                                      tuple(data.draw(st.integers(0, 2)) for _ in range(n)), 3,
                                      offset))
    log.trim(below := data.draw(st.integers(0, log.end)))
    start = data.draw(st.integers(log.cursor()[1], log.end + 2))
    stop = data.draw(st.integers(start, log.end + 4))
    expected = []
    for o in range(start, stop):
        ref = log.page(o)
        if ref is None:
            break
        expected.append(ref.dir)
    assert log.dirs(start, stop) == expected
    assert below >= log.cursor()[1]
