"""The typed tables and inverted lists write the exact bytes of the store's layout
(dupalign.store.keys): stores written before they existed must still open and read the
same. Each expected key and value is built here by hand from the documented layout."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from dupalign.store import lists, records, tables
from dupalign.store.database import Store


def _q(n: int) -> bytes:
    return struct.pack(">Q", n)


def _raw(store: Store, family: str) -> list[tuple[bytes, bytes]]:
    return [(bytes(k), bytes(v)) for k, v in store.items(family)]


def test_tables_write_the_documented_keys_and_values(tmp_path: Path) -> None:
    store = Store(tmp_path / "db", {"p": 1})
    chash = bytes(range(16))
    batch = store.batch()
    tables.docs.put(batch, 7, b"doc")
    tables.ids.put(batch, "pé", 7)
    tables.replay.put(batch, b"r" * 16, 7, "text/html; utf-8")
    tables.exact.put(batch, chash, 7)
    tables.simhash.put(batch, 2**64 - 1, 7)
    tables.cws.put(batch, 300, b"sketch")
    tables.next_ordinal.put_count(batch, 8)
    tables.idf_tables.put(batch, 2, b"idf")
    records.put_offset(batch, "pages", 3, 41)
    records.put_note(batch, "ledger_next_seq", 5)
    store.write(batch)
    records.put_checkpoint(store, "pages", 3, 40)
    assert _raw(store, "docs") == [(_q(7), b"doc")]
    assert _raw(store, "ids") == [("pé".encode(), _q(7))]
    assert _raw(store, "replay") == [(b"r" * 16, _q(7) + b"text/html; utf-8")]
    assert _raw(store, "exact") == [(chash + _q(7), b"")]
    assert _raw(store, "simhash") == [(b"\xff" * 8 + _q(7), b"")]
    assert _raw(store, "cws") == [(_q(300), b"sketch")]
    assert _raw(store, "offsets") == [(b"pages\x00" + struct.pack(">I", 3), _q(41))]
    assert {k: v for k, v in _raw(store, "meta") if k != b"params"} == {
        b"next_ordinal": _q(8), b"idf/" + _q(2): b"idf", b"ledger_next_seq": _q(5),
        b"published/pages\x00" + struct.pack(">I", 3): _q(40)}
    # and read back through the tables
    assert tables.ids.get(store, "pé") == 7 and tables.ids.get(store, "x") is None
    assert tables.replay.get(store, b"r" * 16) == (7, "text/html; utf-8")
    assert tables.exact.first(store, chash) == 7
    assert records.stored_offsets(store) == {("pages", 3): 41}
    assert records.checkpoints(store) == {("pages", 3): 40}
    assert records.get_note(store, "ledger_next_seq") == 5
    fps, ords = tables.simhash.load(store, chunk=1)
    assert fps.tolist() == [2**64 - 1] and ords.tolist() == [7]
    store.close()


def test_a_replay_value_without_how_the_page_was_read_answers_any(tmp_path: Path) -> None:
    """Stores that did not keep how a page was read hold the ordinal alone."""
    store = Store(tmp_path / "db", {"p": 1})
    store.put("replay", b"k", _q(9))
    assert tables.replay.get(store, b"k") == (9, None)
    store.close()


def test_removal_by_ordinal_ranges_deletes_exactly_those_pages(tmp_path: Path) -> None:
    store = Store(tmp_path / "db", {"p": 1})
    batch = store.batch()
    for o in range(40):
        tables.forward.put(batch, o, b"w")
    store.write(batch)
    batch = store.batch()
    tables.forward.remove(batch, [3, 1, 2, *range(10, 30)])  # a short run and a long one
    store.write(batch)
    left = list(tables.forward.ordinals(store))
    assert left == [0, *range(4, 10), *range(30, 40)]
    assert list(tables.forward.ordinals(store, 5)) == [o for o in left if o >= 5]
    assert tables.forward.last(store) == 39
    store.close()


def test_lists_write_entries_marks_and_runs_in_the_documented_layout(tmp_path: Path) -> None:
    store = Store(tmp_path / "db", {"p": 1})
    a, b = struct.pack(">H", 3) + _q(2**63 + 5), struct.pack(">H", 4) + _q(5)
    assert lists.prefix(3, 2**63 + 5) == a
    assert lists.prefixes(np.array([3, 4]), np.array([2**63 + 5, 5], dtype=np.uint64)) == [a, b]
    batch = store.batch()
    lists.put_run(batch, lists.packed(a, np.array([1, 1, 200], dtype=np.int64), []))
    lists.put_entries(batch, lists.entries(np.array([3]), np.array([2**63 + 5], np.uint64), 300),
                      np.array([3]))
    lists.put_marks(batch, {b: 9})
    store.write(batch)
    # the run: keyed by its last ordinal then 0xFFFFFFFF; varint deltas 1, 0, 199
    run_key = a + _q(200) + b"\xff" * 4
    assert _raw(store, "oph") == [(run_key, bytes([1, 0, 199 & 0x7F | 0x80, 199 >> 7])),
                                  (a + _q(300), struct.pack("<I", 3)), (b, _q(9))]
    reader = lists.reader(store)
    stored = lists.read(reader, a, 10)
    assert stored is not None and not stored.marked and stored.keys_read() == 2
    assert stored.run.tolist() == [1, 1, 200] and stored.keys == [a + _q(300)]
    assert stored.windows() == 3 and stored.windows_of(1) == 2 and stored.windows_of(300) == 3
    assert stored.stored_keys() == [run_key, a + _q(300)]
    assert lists.entry_ordinals(stored.keys, stored.values).tolist() == [300] * 3
    marked = lists.read(reader, b, 10)
    assert marked is not None and marked.marked and marked.keys_read() == 1
    assert lists.read(reader, struct.pack(">H", 5) + _q(5), 10) is None
    assert [x.tolist() for x in lists.names([a, b])] == [[3, 4], [2**63 + 5, 5]]
    # removing pages 200 and 300: the run rewritten without 200, page 300's entry deleted
    batch = store.batch()
    lists.remove_pages(batch, lists.reader(store), a, 200, 300, np.array([200, 300]),
                       {200, 300})
    store.write(batch)
    assert _raw(store, "oph") == [(a + _q(1) + b"\xff" * 4, bytes([1, 0])), (b, _q(9))]
    store.close()
