"""The pages passages are audited against: a bounded, uniform reservoir of stored pages.

At most ``size`` pages, each with all its compact windows (including those in stop lists,
which its forward record leaves out), kept in the store's ``meta`` family by slot, so the
reservoir survives a restart as it was. Reservoir sampling (Vitter's algorithm R) with the
choice drawn from a hash of the seed and the page's ordinal instead of a random stream, so
the same pages in the same order give the same reservoir: page n (its ordinal, a count of
the pages before it) takes a free slot if there is one, else slot ``j = hash(n) mod (n + 1)``
when j < size. A page that leaves the store (delete, new version, retention) frees its slot
at once; the next pages fill it, which favours them slightly over a strict uniform sample
until the store has turned over.
"""

from __future__ import annotations

import msgpack

from dupalign.store import records
from dupalign.store.database import Store
from dupalign.text.hashing import mix64

_SALT = 0xA0D17
_MASK = (1 << 64) - 1


def draw(seed: int, ordinal: int, salt: int) -> int:
    """A uniform 64-bit value for (seed, ordinal): the audit's only source of chance."""
    return int(mix64((ordinal ^ (seed << 32)) & _MASK, salt + _SALT))


class Reservoir:
    def __init__(self, store: Store, size: int, seed: int, read_only: bool = False) -> None:
        self.store = store
        self.size = size
        self.seed = seed
        self.read_only = read_only
        self.slots: dict[int, tuple[int, bytes]] = {}  # slot -> (ordinal, windows value)
        for slot, raw in records.log_items(store, "audit_reservoir"):
            if slot < size:  # (a smaller size now: the slots above it are dropped)
                ordinal, windows = msgpack.unpackb(raw)
                self.slots[slot] = (ordinal, windows)
        self._by_ordinal = {o: s for s, (o, _) in self.slots.items()}

    def __len__(self) -> int:
        return len(self.slots)

    def slot_for(self, ordinal: int) -> int | None:
        """The slot page ``ordinal`` would take (None: it is not kept)."""
        if len(self.slots) < self.size:
            return min(set(range(self.size)) - set(self.slots))
        j = draw(self.seed, ordinal, 1) % (ordinal + 1)
        return j if j < self.size else None

    def offer(self, ordinal: int, windows: bytes) -> None:
        """Page ``ordinal`` was stored with the windows value ``windows``."""
        slot = self.slot_for(ordinal)
        if slot is None or self.read_only:
            return
        old = self.slots.get(slot)
        if old is not None:
            self._by_ordinal.pop(old[0], None)
        self.slots[slot] = (ordinal, windows)
        self._by_ordinal[ordinal] = slot
        batch = self.store.batch()
        records.log_put(batch, "audit_reservoir", slot, msgpack.packb([ordinal, windows]))
        self.store.write(batch)

    def removed(self, ordinals: list[int]) -> None:
        """Pages that left the store: their slots are freed."""
        gone = [self._by_ordinal.pop(o) for o in ordinals if o in self._by_ordinal]
        if not gone or self.read_only:
            return
        batch = self.store.batch()
        for slot in gone:
            del self.slots[slot]
            records.log_delete(batch, "audit_reservoir", slot)
        self.store.write(batch)

    def pages(self, before: int) -> list[tuple[int, bytes]]:
        """(ordinal, windows) of the pages kept with an ordinal below ``before``."""
        return sorted(v for v in self.slots.values() if v[0] < before)
