"""Records of several partitions handed over in the order the sequence names them
(docs/pipeline.md, "Roles on Kafka").

A stage partition reads its inputs with a consumer of its own, as fast as they come; the
sequence (dupalign/service/sequence_batch.py) says which record is next and in which
partition it is. ``OrderedMerge`` holds what was read ahead, by (partition, key), and
``take`` hands a record over when its turn has come. A partition need not be in key order
(``<in>.entries`` is written by every sketch copy: a later batch's entries may commit
first); what the merge needs of it is that every record is read once from the resume
point on.

Resuming: the offset to read partition p again from is its low-water mark (``low_water``):
the lowest offset of a record of p still held, else the offset after the last one read.
The records read again from there whose key is at or below the last key taken
(``taken``, noted with the offsets) were applied before: ``add`` drops them. Keys taken
ascend (the sequence's order), so nothing below the last one taken is still wanted.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import Any, Generic, Protocol, TypeVar


class _Ordered(Hashable, Protocol):
    def __lt__(self, other: Any, /) -> bool: ...
    def __le__(self, other: Any, /) -> bool: ...


K = TypeVar("K", bound=_Ordered)


class OrderedMerge(Generic[K]):
    """``positions``: partition -> the offset its reader starts from; ``taken``: the last
    key taken before (None: none)."""

    def __init__(self, positions: Mapping[int, int], taken: K | None = None) -> None:
        self.next = dict(positions)  # partition -> the offset after the last one read
        self.taken = taken
        self._held: dict[tuple[int, K], tuple[int, bytes]] = {}  # -> (offset, value)

    def add(self, partition: int, offset: int, key: K, value: bytes,
            first: int | None = None) -> None:
        """A record read from ``partition`` at ``offset`` (offsets ascend per partition);
        ``first``: a value sent in parts, the offset of its first part (where a restart
        must read from while it is held)."""
        if partition not in self.next:
            raise ValueError(f"partition {partition} is not an input of this merge")
        if offset < self.next[partition]:
            return  # (read again: a reader's seek back)
        self.next[partition] = offset + 1
        if self.taken is not None and key <= self.taken:
            return  # applied before the resume point
        if (partition, key) in self._held:
            raise ValueError(f"partition {partition} holds key {key!r} twice")
        self._held[(partition, key)] = (offset if first is None else first, value)

    def take(self, partition: int, key: K) -> bytes | None:
        """The record ``key`` of ``partition`` if it was read (None: not yet). Keys are
        taken in ascending order."""
        if self.taken is not None and key <= self.taken:
            raise ValueError(f"key {key!r} taken after {self.taken!r}")
        held = self._held.pop((partition, key), None)
        if held is None:
            return None
        self.taken = key
        return held[1]

    def peek(self, partition: int, key: K) -> bytes | None:
        """The record ``take`` would hand over, left held (None: not read yet): a step
        that needs several records takes none until all are in."""
        held = self._held.get((partition, key))
        return None if held is None else held[1]

    def stale(self) -> list[tuple[int, K]]:
        """(partition, key) of records held whose key is passed: a record the sequence
        never asked for (a mis-routed record), which would stay held forever."""
        t = self.taken
        return [] if t is None else sorted(pk for pk in self._held if pk[1] <= t)

    def low_water(self) -> dict[int, int]:
        """Per partition, the offset to read it again from after a restart."""
        low = dict(self.next)
        for (partition, _), (offset, _) in self._held.items():
            low[partition] = min(low[partition], offset)
        return low

    def __len__(self) -> int:
        return len(self._held)
