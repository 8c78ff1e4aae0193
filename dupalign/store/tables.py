"""The store's families by what they hold, so that the engine says what it reads or writes
and never names a family or packs a key (the layout: ``dupalign.store.keys``).

Each table is a module-level object whose methods take the ``Store`` (reads) or a ``Batch``
(writes) first: ``docs.get(store, ordinal)``, ``ids.put(batch, doc_id, ordinal)``,
``exact.first(store, content_hash)``. Reads and writes of many rows take them whole
(``get_many``, ``remove``, ``simhash.load``) so that a hot path pays no call per row. The
inverted lists of the passage index have their own module (``dupalign.store.lists``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import numpy.typing as npt

from dupalign.store import lists
from dupalign.store.database import Batch, Store
from dupalign.store.keys import read_u64, u64

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]


class ByOrdinal:
    """A family keyed by page ordinal (a big-endian u64: key order is ordinal order)."""

    def __init__(self, family: str) -> None:
        self.family = family

    def get(self, store: Store, ordinal: int) -> bytes | None:
        return store.get(self.family, u64(ordinal))

    def get_many(self, store: Store, ordinals: Iterable[int]) -> list[bytes | None]:
        return store.multi_get(self.family, [u64(o) for o in ordinals])

    def put(self, target: Store | Batch, ordinal: int, value: bytes) -> None:
        target.put(self.family, u64(ordinal), value)

    def delete(self, batch: Batch, ordinal: int) -> None:
        batch.delete(self.family, u64(ordinal))

    def remove(self, batch: Batch, ordinals: Iterable[int]) -> None:
        """Delete the pages ``ordinals`` by runs of consecutive ones (``_delete_ordinals``)."""
        for first, last in _ordinal_ranges(ordinals):
            _delete_ordinals(batch, self.family, first, last)

    def delete_through(self, batch: Batch, last: int) -> None:
        """Delete every page up to ordinal ``last`` (one range delete)."""
        batch.delete_range(self.family, u64(0), u64(last + 1))

    def items(self, store: Store, start: int = 0) -> Iterator[tuple[int, bytes]]:
        """(ordinal, value) from ordinal ``start`` on, ascending."""
        for key, value in store.items_from(self.family, u64(start) if start else None):
            yield read_u64(key), value

    def ordinals(self, store: Store, start: int = 0) -> Iterator[int]:
        for key, _ in store.items_from(self.family, u64(start) if start else None):
            yield read_u64(key)

    def last(self, store: Store) -> int | None:
        """The highest ordinal stored (None: the family is empty)."""
        key = store.last_key(self.family)
        return None if key is None else read_u64(key)

    def in_store(self, store: Store) -> bool:
        """Whether the store has the family (a store opened read-only that was made
        before the family existed has not)."""
        return store.has_family(self.family)


def _ordinal_ranges(ordinals: Iterable[int]) -> list[tuple[int, int]]:
    """Ascending distinct ordinals as maximal runs ``(first, last)`` of consecutive ones."""
    out: list[tuple[int, int]] = []
    for o in sorted(set(int(x) for x in ordinals)):
        if out and out[-1][1] + 1 == o:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out


def _delete_ordinals(batch: Batch, family: str, first: int, last: int) -> None:
    """Delete the keys ordinal ``first``..``last`` of an ordinal-keyed family: one point
    delete per key for a short run, one range delete (cheap to write, compacted away) for a
    longer one: many small range tombstones would slow reads."""
    if last - first < 8:
        for o in range(first, last + 1):
            batch.delete(family, u64(o))
    else:
        batch.delete_range(family, u64(first), u64(last + 1))


docs = ByOrdinal("docs")  # the page's doc record (msgpack)
matches = ByOrdinal("matches")  # the matches the page produced (msgpack), for replays
unfinished = ByOrdinal("unfinished")  # the page's index result until its matches are stored
cws = ByOrdinal("cws")  # the page's verification sketch (K <u8 min-hashes)
forward = ByOrdinal("forward")  # the windows of the page's forward record
positions = ByOrdinal("positions")  # the positions of the page's forward record
units = ByOrdinal("units")  # the high halves of the page's unit hashes (a forward stage's)
idf_pending = ByOrdinal("idf_pending")  # the page's distinct token hashes (<u8)

# the ordinal-keyed families a removal empties, compacted after a retention sweep
_PAGE_FAMILIES = (docs, matches, unfinished, cws, forward, positions)


def compact_pages(store: Store, first: int, last: int) -> None:
    """Compact what the pages ``first``..``last`` held (after their removal)."""
    store.compact_ordinals([t.family for t in _PAGE_FAMILIES], first, last)


class _Ids:
    """Doc id -> the ordinal of its stored version."""

    family = "ids"

    def get(self, store: Store, doc_id: str) -> int | None:
        raw = store.get(self.family, doc_id.encode("utf-8"))
        return None if raw is None else read_u64(raw)

    def get_many(self, store: Store, doc_ids: list[str]) -> list[int | None]:
        """``get`` of each id, in one read of the store."""
        found = store.multi_get(self.family, [d.encode("utf-8") for d in doc_ids])
        return [None if raw is None else read_u64(raw) for raw in found]

    def put(self, batch: Batch, doc_id: str, ordinal: int) -> None:
        batch.put(self.family, doc_id.encode("utf-8"), u64(ordinal))

    def delete(self, batch: Batch, doc_id: str) -> None:
        batch.delete(self.family, doc_id.encode("utf-8"))

    def count(self, store: Store) -> int:
        return sum(1 for _ in store.keys(self.family))


class _Replay:
    """A page's replay key (a hash of its id and body) -> its ordinal and how its body was
    read into text (None in stores written before that was kept)."""

    family = "replay"

    def get(self, store: Store, key: bytes) -> tuple[int, str | None] | None:
        return self._read(store.get(self.family, key))

    def get_many(self, store: Store, keys: list[bytes]) -> list[tuple[int, str | None] | None]:
        """``get`` of each key, in one read of the store."""
        return [self._read(raw) for raw in store.multi_get(self.family, keys)]

    @staticmethod
    def _read(raw: bytes | None) -> tuple[int, str | None] | None:
        if raw is None:
            return None
        return read_u64(raw), (raw[8:].decode("utf-8") if len(raw) > 8 else None)

    def put(self, batch: Batch, key: bytes, ordinal: int, read_as: str) -> None:
        batch.put(self.family, key, u64(ordinal) + read_as.encode("utf-8"))

    def delete(self, batch: Batch, key: bytes) -> None:
        batch.delete(self.family, key)


class _Exact:
    """Content hash ‖ ordinal: the pages with the same text."""

    family = "exact"

    def first(self, store: Store, content_hash: bytes) -> int | None:
        """The lowest ordinal stored with ``content_hash`` (None: none)."""
        key = store.first_key(self.family, content_hash)
        return None if key is None else read_u64(key, len(content_hash))

    def first_many(self, store: Store, content_hashes: list[bytes]) -> list[int | None]:
        """``first`` of each content hash, through one iterator (``first`` makes one a
        lookup, which cost more than its seek: issue #44)."""
        reader = store.prefix_reader(self.family)
        out: list[int | None] = []
        for content_hash in content_hashes:
            keys, _ = reader.items(content_hash, 1)
            out.append(read_u64(keys[0], len(content_hash)) if keys else None)
        return out

    def put(self, batch: Batch, content_hash: bytes, ordinal: int) -> None:
        batch.put(self.family, content_hash + u64(ordinal), b"")

    def delete(self, batch: Batch, content_hash: bytes, ordinal: int) -> None:
        batch.delete(self.family, content_hash + u64(ordinal))


class _Simhash:
    """Fingerprint ‖ ordinal of every near-indexed page (the PSM table, rebuilt at open)."""

    family = "simhash"

    def put(self, batch: Batch, fingerprint: int, ordinal: int) -> None:
        batch.put(self.family, u64(fingerprint) + u64(ordinal), b"")

    def delete(self, batch: Batch, fingerprint: int, ordinal: int) -> None:
        batch.delete(self.family, u64(fingerprint) + u64(ordinal))

    def load(self, store: Store, chunk: int = 1 << 16) -> tuple[U64, I64]:
        """Every (fingerprint, ordinal) as two arrays in key order, read a chunk of keys at
        a time: a Python int per fingerprint and ordinal would take ~13 GB at 10^8 pages
        (tests/bench/bench_open.py)."""
        fps: list[U64] = []
        ords: list[I64] = []
        keys: list[bytes] = []

        def convert() -> None:
            rows = np.frombuffer(b"".join(keys), dtype=">u8").reshape(-1, 2)
            fps.append(rows[:, 0].astype(np.uint64))
            ords.append(rows[:, 1].astype(np.int64))
            keys.clear()

        for key in store.keys(self.family):
            keys.append(key)
            if len(keys) == chunk:
                convert()
        if keys:
            convert()
        if not fps:
            return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
        return np.concatenate(fps), np.concatenate(ords)


ids = _Ids()
replay = _Replay()
exact = _Exact()
simhash = _Simhash()


class MetaValue:
    """One named value in ``meta``."""

    family = "meta"

    def __init__(self, key: bytes) -> None:
        self.key = key

    def get(self, store: Store) -> bytes | None:
        return store.get(self.family, self.key)

    def put(self, target: Store | Batch, value: bytes) -> None:
        target.put(self.family, self.key, value)

    def delete(self, batch: Batch) -> None:
        batch.delete(self.family, self.key)


class MetaCount(MetaValue):
    """One named count in ``meta`` (a u64)."""

    def count(self, store: Store) -> int | None:
        raw = self.get(store)
        return None if raw is None else read_u64(raw)

    def put_count(self, target: Store | Batch, value: int) -> None:
        self.put(target, u64(value))


# the ordinal after the last one ever given (dupalign.stages.index)
next_ordinal = MetaCount(b"next_ordinal")
# every page below has its inverted-list entries in the lists (dupalign.passage.lists.files)
lists_through = MetaCount(b"lists_through")
# the lists' entries and runs are in the store: a list shard's changelog leaves them out
# (``lists.derived``), and a store restored from it, without this key, rebuilds them from its
# forward records at open (dupalign.passage.lists.files ``rebuild_entries``)
lists_entries = MetaValue(lists.ENTRIES_KEY)
# a forward stage's ``forward`` records are in the store: its changelog leaves them out, and a
# store restored from it, without this key, rebuilds them from ``positions`` and ``units`` at
# open (dupalign.passage.forward_units ``rebuild_forward``)
forward_windows = MetaValue(b"forward_windows")
volatility = MetaValue(b"volatility")  # the near index's bit flip model, at its last checkpoint
# the model in force for probes: as learned up to the latest idf freeze (docs/pipeline.md, rule 3)
volatility_frozen = MetaValue(b"volatility_frozen")


class _VolatilityLog:
    """The pages' updates of the volatility model since its checkpoint (``volatility``):
    ordinal -> the page's normalized weights (<f8), in ``meta`` under b"volatility/"."""

    family = "meta"
    _prefix = b"volatility/"

    def put(self, batch: Batch, ordinal: int, value: bytes) -> None:
        batch.put(self.family, self._prefix + u64(ordinal), value)

    def values(self, store: Store) -> Iterator[bytes]:
        """The updates in ordinal order."""
        for _, value in store.prefix(self.family, self._prefix):
            yield value

    def clear(self, batch: Batch) -> None:
        batch.delete_range(self.family, self._prefix, self._prefix[:-1] + b"0")  # ("/" + 1)


volatility_log = _VolatilityLog()
# a store built for index shards (removed after 4e63f5c): its shard count (msgpack); the
# engine refuses a store of more than one
shard_count = MetaValue(b"index_shards")


class _IdfTables:
    """The frozen idf tables by version (version 0, uniform, is never stored)."""

    family = "meta"

    def get(self, store: Store, version: int) -> bytes | None:
        return store.get(self.family, b"idf/" + u64(version))

    def put(self, batch: Batch, version: int, value: bytes) -> None:
        batch.put(self.family, b"idf/" + u64(version), value)


idf_tables = _IdfTables()
