"""A copy of some pages' forward records outside the engine's store, read by the align
stage as it reads the engine's store.

The align role keeps one per process: the forward records of the pages whose ordinal falls
in its partitions, copied from the ``pages.forward`` topic (dupalign.service.align_store),
with the topic offset to go on from. It is a cache: a new directory is filled again from the
topic's beginning. Its keys: a one-byte prefix per family the align stage reads, then the
family's own key (the page's ordinal, a big-endian u64); the offsets, ``o`` then the
partition (u64). The layout is fixed: copies already written must open.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import cast

import msgpack
from rocksdict import Options, Rdict, WriteBatch

from dupalign.store.keys import read_u64, u64
from dupalign.wire.forward_record import ForwardRecord

# the families the align stage reads, each a key prefix here
_FAMILY_PREFIX = {"forward": b"f", "positions": b"p", "docs": b"d"}
_OFFSET = b"o"  # + partition (u64): the next forward-topic offset to apply


class ForwardCopy:
    """A ``ForwardReader`` (dupalign.store.forward_reader): an align stage opened on it reads
    a request's candidates exactly as it would read the engine's store."""

    def __init__(self, path: str | Path) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self.path = Path(path)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        self._db = Rdict(str(path), opts)

    # -- read by the align stage ------------------------------------------------------------
    def windows(self, ordinals: list[int]) -> list[bytes | None]:
        return self._many("forward", ordinals)

    def positions(self, ordinal: int) -> bytes | None:
        value: bytes | None = self._db.get(_FAMILY_PREFIX["positions"] + u64(ordinal))
        return value

    def doc_id(self, ordinal: int) -> str | None:
        raw = self._db.get(_FAMILY_PREFIX["docs"] + u64(ordinal))
        return None if raw is None else str(msgpack.unpackb(raw)["id"])

    def _many(self, family: str, ordinals: list[int]) -> list[bytes | None]:
        prefix = _FAMILY_PREFIX[family]
        return cast(list[bytes | None], self._db.get([prefix + u64(o) for o in ordinals]))

    def catch_up(self) -> bool:
        """(A secondary instance of the engine's store catches up; this copy is written in
        the same process, by ``apply``, before the requests that need it are aligned.)"""
        return False

    def has_all(self, ordinals: list[int]) -> bool:
        """Whether every page of ``ordinals`` has its forward record here."""
        return all(v is not None for v in self._many("forward", ordinals))

    # -- written from the forward topic -----------------------------------------------------
    def offset(self, partition: int) -> int | None:
        """The next offset of ``partition`` to apply (None: none applied yet)."""
        raw = self._db.get(_OFFSET + u64(partition))
        return None if raw is None else read_u64(raw)

    def apply(self, partition: int, changes: Iterable[tuple[int, ForwardRecord | None]],
              next_offset: int) -> None:
        """Forward records by page ordinal (None: the page left the engine's store) read
        from ``partition``, and the offset to go on from, in one write."""
        wb = WriteBatch(raw_mode=True)
        for ordinal, record in changes:
            key = u64(ordinal)
            if record is None:
                for prefix in _FAMILY_PREFIX.values():
                    wb.delete(prefix + key)
                continue
            wb.put(_FAMILY_PREFIX["forward"] + key, record.windows)
            wb.put(_FAMILY_PREFIX["positions"] + key, record.positions)
            # the one field of the engine's doc record that the align stage reads
            wb.put(_FAMILY_PREFIX["docs"] + key, msgpack.packb({"id": record.doc_id}))
        wb.put(_OFFSET + u64(partition), u64(next_offset))
        self._db.write(wb)

    def close(self) -> None:
        self._db.close()
