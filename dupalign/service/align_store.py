"""An align process's store: the forward records of the pages its ``pages.align`` partitions
own (align shards keyed by earlier page: partition ``ordinal % A``), copied from the same
partitions of the compacted ``pages.forward`` topic, which the index fills in the
transaction that stores each page and empties (tombstones) when a page leaves its store.
``dupalign.stages.align.Aligner`` reads the candidates of a request's part from it
(``dupalign.store.forward_copy.ForwardCopy``), as the single worker's pool reads the index's
store. Rebuilt by replay: a fresh directory reads its partitions of the forward topic from
the beginning; a kept one goes on from the offsets noted with the records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dupalign.runtime.owned_dir import OwnedTempDir
from dupalign.wire.forward_record import ForwardRecord, decode_forward, read_forward_key

TEMPORARY_PREFIX = "dupalign-align-store-"


def forward_changes(records: list[Any]) -> list[tuple[int, ForwardRecord | None]]:
    """The ``pages.forward`` records read (Kafka records: key, value) as a
    ``ForwardCopy.apply`` takes them: per page ordinal, its forward record or None (a
    tombstone: the page left the index's store)."""
    return [(read_forward_key(bytes(rec.key)),
             None if rec.value is None else decode_forward(rec.value)) for rec in records]


class TemporaryStoreDir(OwnedTempDir):
    """The store directory of an align process run without one: a temporary directory that
    holds a copy of its partitions' forward records (gigabytes on a large crawl), removed
    by the next one made if its process is killed (dupalign.runtime.owned_dir)."""

    def __init__(self, parent: str | Path | None = None) -> None:
        super().__init__(TEMPORARY_PREFIX, parent)
        self.store = self.path / "store"
