"""An align process's store: the forward records of the pages its ``pages.align`` partitions
own (align shards keyed by earlier page: partition ``ordinal % A``), copied from the same
partitions of the compacted ``pages.forward`` topic, which the index fills in the
transaction that stores each page and empties (tombstones) when a page leaves its store.
``dupalign.stages.align.Aligner`` reads the candidates of a request's part from it, as the single
worker's pool reads the index's store. Rebuilt by replay: a fresh directory reads its
partitions of the forward topic from the beginning; a kept one goes on from the offsets
noted with the records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import msgpack
from rocksdict import Options, Rdict, WriteBatch

from dupalign.runtime.owned_dir import OwnedTempDir
from dupalign.store.database import read_u64, u64
from dupalign.wire.versions import FORWARD_RECORD

# the families ``Aligner`` reads, each a key prefix here
_PREFIX = {"forward": b"f", "positions": b"p", "docs": b"d"}
_OFFSET = b"o"  # + partition (u64): the next forward-topic offset to apply
TEMPORARY_PREFIX = "dupalign-align-store-"


def encode_forward(doc_id: str, windows: bytes, positions: bytes) -> bytes:
    """A ``pages.forward`` record's value (its key: the page's ordinal, ``u64``)."""
    return bytes(msgpack.packb({"v": FORWARD_RECORD.writes, "id": doc_id, "forward": windows,
                                "positions": positions}, use_bin_type=True))


class AlignStore:
    """Keyed like the index's store (``u64(ordinal)`` per family), so an ``Aligner`` opened
    on it reads a part's candidates exactly as it would read the index's store."""

    def __init__(self, path: str | Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self.path = Path(path)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self._db = Rdict(str(path), opts)

    # -- read by the Aligner --------------------------------------------------------------
    def get(self, family: str, key: bytes) -> bytes | None:
        value: bytes | None = self._db.get(_PREFIX[family] + key)
        return value

    def multi_get(self, family: str, keys: list[bytes]) -> list[bytes | None]:
        prefix = _PREFIX[family]
        return cast(list[bytes | None], self._db.get([prefix + k for k in keys]))

    def catch_up(self) -> bool:
        """(A secondary instance of the index's store catches up; this store is written in
        the same process, by ``apply``, before the requests that need it are aligned.)"""
        return False

    def has_all(self, ordinals: list[int]) -> bool:
        return all(v is not None for v in self.multi_get("forward", [u64(o) for o in ordinals]))

    # -- written from the forward topic ---------------------------------------------------
    def offset(self, partition: int) -> int | None:
        raw = self._db.get(_OFFSET + u64(partition))
        return None if raw is None else read_u64(raw)

    def apply(self, partition: int, records: list[Any], next_offset: int) -> None:
        """The forward records read from ``partition`` (a null value: the page left the
        index's store), and the offset to go on from, in one write."""
        wb = WriteBatch(raw_mode=True)
        for rec in records:
            key = bytes(rec.key)
            if rec.value is None:
                for prefix in _PREFIX.values():
                    wb.delete(prefix + key)
                continue
            d = msgpack.unpackb(rec.value, raw=False)
            FORWARD_RECORD.check(d.get("v"))
            wb.put(_PREFIX["forward"] + key, d["forward"])
            wb.put(_PREFIX["positions"] + key, d["positions"])
            wb.put(_PREFIX["docs"] + key, msgpack.packb({"id": d["id"]}))
        wb.put(_OFFSET + u64(partition), u64(next_offset))
        self._db.write(wb)

    def close(self) -> None:
        self._db.close()


class TemporaryStoreDir(OwnedTempDir):
    """The store directory of an align process run without one: a temporary directory that
    holds a copy of its partitions' forward records (gigabytes on a large crawl), removed
    by the next one made if its process is killed (dupalign.runtime.owned_dir)."""

    def __init__(self, parent: str | Path | None = None) -> None:
        super().__init__(TEMPORARY_PREFIX, parent)
        self.store = self.path / "store"
