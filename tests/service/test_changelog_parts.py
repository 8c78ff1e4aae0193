"""Changelog values over the record limit, in parts (dupalign/service/changelog_parts.py),
without a broker: a store's writes through its ``Changelog`` with a tiny record limit, its
records restored at any turn, with or without the log cleaner's compaction, give the store
as it was; compacted, no part of a value that shrank or went stays; an owner that does not
know the parts counts leaves stale parts that the next restore names and deletes."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.service.changelog import Changelog, decode_key, encode_key
from dupalign.service.changelog_parts import (
    Rejoin,
    Rejoined,
    parse_part_key,
    part_count,
    slice_limit,
    value_records,
)
from dupalign.service.parts import record_part
from dupalign.service.topology import RECORD_OVERHEAD
from dupalign.store.database import Store

LIMIT = RECORD_OVERHEAD + 5 + 16  # slices of 16 bytes
FAMILIES = ("cws", "exact")
writes = st.lists(st.tuples(st.sampled_from(FAMILIES), st.binary(max_size=3),
                            st.none() | st.binary(max_size=80)), max_size=6)
turns = st.lists(writes, min_size=1, max_size=8)


def compacted(records: list[Any]) -> list[Any]:
    """What the log cleaner keeps: the last record per key, in offset order."""
    last = {r.key: i for i, r in enumerate(records)}
    return [r for i, r in enumerate(records) if last[r.key] == i]


def rejoined(records: list[Any]) -> tuple[dict[tuple[str, bytes], bytes], Rejoined]:
    """The store ``records`` restore (no deletions left), and what the restore reported."""
    rejoin = Rejoin()
    values: dict[tuple[str, bytes], bytes | None] = {}
    for i in range(0, len(records), 3):  # (in chunks, as a restore reads them)
        values.update((decode_key(k), v) for k, v in rejoin.add(records[i:i + 3]))
    done = rejoin.finish()
    values.update((decode_key(k), v) for k, v in done.changes)
    return {k: v for k, v in values.items() if v is not None}, done


def contents(store: Store) -> dict[tuple[str, bytes], bytes]:
    return {(f, k): v for f in FAMILIES for k, v in store.prefix(f, b"")}


def stale_parts(records: list[Any]) -> list[bytes]:
    """Part keys kept with a value that no value's first record asks for."""
    counts = {r.key: record_part(r)[1] for r in records
              if r.value is not None and record_part(r) is not None}
    return [r.key for r in records if r.value is not None and (p := parse_part_key(r.key))
            and p[0] >= counts.get(p[1], 1)]


def write(store: Store, turn: list[tuple[str, bytes, bytes | None]]) -> None:
    batch = store.batch()
    for family, key, value in turn:
        if value is None:
            batch.delete(family, key)
        else:
            batch.put(family, key, value)
    store.write(batch)


@settings(max_examples=60, deadline=None)
@given(turns=turns, restart=st.integers(0, 8))
def test_a_store_restored_from_its_parts_is_the_store(turns: list[Any], restart: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "db", {"p": 1})
        log = Changelog(store, "t.changelog", 0, LIMIT)
        records: list[Any] = []
        for n, turn in enumerate(turns):
            write(store, turn)
            out = log.outgoing()
            assert all(len(o.value or b"") <= slice_limit(LIMIT) for o in out)
            records += out
            want = contents(store)
            assert rejoined(records)[0] == want
            got, done = rejoined(compacted(records))
            assert got == want
            assert stale_parts(compacted(records)) == []
            if n == restart:  # a new owner: a store restored, its changelog goes on
                log.close()
                store.close()
                store = Store(Path(tmp) / f"db{n}", {"p": 1})
                write(store, [(f, k, v) for (f, k), v in got.items()])  # (unobserved)
                log = Changelog(store, "t.changelog", 0, LIMIT, done.counts, done.stale)
        log.close()
        store.close()


@settings(max_examples=30, deadline=None)
@given(first=st.binary(min_size=17, max_size=100), then=st.none() | st.binary(max_size=100))
def test_parts_left_by_an_owner_that_did_not_know_them_are_deleted_after_a_restore(
        first: bytes, then: bytes | None) -> None:
    key = encode_key("cws", b"k")
    records = value_records("t", 0, key, first, LIMIT)
    records += value_records("t", 0, key, then, LIMIT)  # (the last count unknown: kept)
    if part_count(then, LIMIT) < part_count(first, LIMIT):
        assert stale_parts(compacted(records))
    got, done = rejoined(compacted(records))
    assert got == ({} if then is None else {("cws", b"k"): then})
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "db", {"p": 1})
        log = Changelog(store, "t", 0, LIMIT, done.counts, done.stale)
        records += log.outgoing()
        log.close()
        store.close()
    assert stale_parts(compacted(records)) == []
    assert rejoined(compacted(records))[0] == got


def test_a_value_that_fits_is_one_record_and_a_big_one_has_its_count_first() -> None:
    key = encode_key("cws", b"k")
    (whole,) = value_records("t", 2, key, b"x" * 16, LIMIT)
    assert (whole.key, whole.value, whole.headers, whole.partition) == (key, b"x" * 16, [], 2)
    first, *rest = value_records("t", 2, key, b"y" * 40, LIMIT)
    assert (first.key, first.value, record_part(first)) == (key, b"y" * 16, (0, 3))
    assert [(parse_part_key(r.key), r.value) for r in rest] == [
        ((1, key), b"y" * 16), ((2, key), b"y" * 8)]
    assert decode_key(key) == ("cws", b"k")
