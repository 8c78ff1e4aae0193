"""The ledger of stored pages: what every consumer of the page directory's decisions (all
shards' of them, merged in sequence order: dupalign.stages.directory) computes alike, with
no coordinator. It gives each stored page its store ordinal (consecutive: the single
engine's ``Indexer.next_ordinal``), names the versions a decision removes or repeats by
store ordinal, keeps the set of pages alive, and computes retention sweeps
(``Indexer.expired``, from the pages alive and their ``fetched_at`` alone): since every
copy applies the same decisions in the same order, a sweep at the same sequence point and
``now_ms`` removes the same pages in every copy.

Its state is the pages alive: store ordinal, sequence ordinal and ``fetched_at`` of each,
in memory (``Ledger``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from dupalign.stages.directory import Decision


@dataclass(frozen=True)
class Placed:
    """A decision in store ordinals: ``ordinal`` the stored page's, ``removed`` the version
    it removes, ``replay_of`` the stored page a replay repeats (None: none)."""

    ordinal: int | None
    removed: int | None
    replay_of: int | None


@dataclass(frozen=True)
class Expired:
    """A page a retention sweep removes: its store and sequence ordinals."""

    ordinal: int
    seq: int


_NO_TIME = np.iinfo(np.int64).min  # a page without fetched_at


class Ledger:
    """``next_ordinal``: the store ordinal the next stored page gets; ``slots``: how many
    pages the first arrays hold.

    The pages stored, in slots in store ordinal order (sequence ordinals ascend with them,
    so both are found by binary search): sequence and store ordinal, ``fetched_at`` and
    whether the page is alive, 25 bytes a slot. The slots of removed pages are dropped
    once they are half the slots used, so memory follows the pages alive, not the pages
    ever stored."""

    def __init__(self, next_ordinal: int = 0, slots: int = 1024) -> None:
        self.next_ordinal = next_ordinal
        self.next_seq = 0
        self._seq = np.zeros(slots, dtype=np.int64)
        self._ordinal = np.zeros(slots, dtype=np.int64)
        self._fetched = np.zeros(slots, dtype=np.int64)
        self._live = np.zeros(slots, dtype=np.bool_)
        self._used = 0  # slots used
        self._alive = 0

    @classmethod
    def restored(cls, rows: Iterable[tuple[int, int, int | None]], next_ordinal: int,
                 next_seq: int) -> Ledger:
        """The ledger of the pages alive ``rows`` (sequence ordinal, store ordinal,
        ``fetched_at``; ascending), as kept by dupalign.stages.ledger_store."""
        ledger = cls(next_ordinal)
        for seq, ordinal, fetched_at in rows:
            ledger._append(seq, ordinal, fetched_at)
        ledger.next_seq = next_seq
        return ledger

    @property
    def alive(self) -> int:
        """Pages stored (current versions)."""
        return self._alive

    def ordinal_of(self, seq: int) -> int | None:
        """The store ordinal of the page alive that the ``seq``-th page stored (None: none)."""
        slot = self._slot(seq)
        return None if slot is None else int(self._ordinal[slot])

    def _slot(self, seq: int) -> int | None:
        """The live slot of the page of sequence ordinal ``seq``."""
        slot = int(np.searchsorted(self._seq[:self._used], seq))
        if slot < self._used and self._seq[slot] == seq and self._live[slot]:
            return slot
        return None

    def apply(self, d: Decision) -> Placed:
        """The next decision, in sequence order."""
        if d.seq < self.next_seq:
            raise ValueError(f"decision {d.seq} comes after decision {self.next_seq - 1}")
        removed = replay_of = ordinal = None
        if d.removed is not None:
            slot = self._known(d.removed.seq, d)
            removed = int(self._ordinal[slot])
            self._kill(slot)
        if d.replay_of is not None:
            replay_of = int(self._ordinal[self._known(d.replay_of, d)])
        if d.kind == "stored":
            ordinal = self.next_ordinal
            self.next_ordinal += 1
            self._append(d.seq, ordinal, d.fetched_at)
        self.next_seq = d.seq + 1
        return Placed(ordinal, removed, replay_of)

    def _known(self, seq: int, d: Decision) -> int:
        slot = self._slot(seq)
        if slot is None:
            raise ValueError(f"decision {d.seq} names page {seq}, which is not stored")
        return slot

    def _append(self, seq: int, ordinal: int, fetched_at: int | None) -> None:
        if self._used == len(self._seq):
            self._compact()
        if self._used == len(self._seq):
            for name in ("_seq", "_ordinal", "_fetched", "_live"):
                a = getattr(self, name)
                setattr(self, name, np.concatenate([a, np.zeros_like(a)]))
        i = self._used
        self._seq[i], self._ordinal[i] = seq, ordinal
        self._fetched[i] = _NO_TIME if fetched_at is None else fetched_at
        self._live[i] = True
        self._used += 1
        self._alive += 1

    def _kill(self, slot: int) -> None:
        self._live[slot] = False
        self._alive -= 1

    def _compact(self) -> None:
        """Drop the slots of removed pages when they are half the slots or more."""
        if 2 * self._alive > self._used:
            return
        keep = np.flatnonzero(self._live[:self._used])
        for name in ("_seq", "_ordinal", "_fetched", "_live"):
            a = getattr(self, name)
            a[:len(keep)] = a[keep]
        self._live[len(keep):] = False
        self._used = len(keep)

    def expired(self, max_pages: int, max_age_s: int, now_ms: int, limit: int = 1000
                ) -> list[Expired]:
        """The oldest pages (lowest store ordinals) that must leave, at most ``limit``:
        while more than ``max_pages`` are alive, or while the oldest was fetched more than
        ``max_age_s`` before ``now_ms``; a page without ``fetched_at`` never expires by
        age and stops the age sweep (``Indexer.expired``)."""
        if not max_pages and not max_age_s:
            return []
        slots = np.flatnonzero(self._live[:self._used])[:limit]
        leaves = np.zeros(len(slots), dtype=np.bool_)
        if max_pages:  # the j-th oldest leaves if more than max_pages are left before it
            leaves |= self._alive - np.arange(len(slots)) > max_pages
        if max_age_s:
            fetched = self._fetched[slots]
            leaves |= (fetched != _NO_TIME) & (fetched < now_ms - max_age_s * 1000)
        n = len(slots) if leaves.all() else int(np.argmin(leaves))  # up to the first to stay
        return [Expired(o, q) for o, q in zip(self._ordinal[slots[:n]].tolist(),
                                              self._seq[slots[:n]].tolist(), strict=True)]

    def remove(self, expired: Iterable[Expired]) -> None:
        ordinals = np.array([e.ordinal for e in expired], dtype=np.int64)
        used = self._used
        slots = np.minimum(np.searchsorted(self._ordinal[:used], ordinals), max(used - 1, 0))
        if used:
            found = slots[(self._ordinal[slots] == ordinals) & self._live[slots]]
            self._live[found] = False
            self._alive -= len(np.unique(found))
        self._compact()

    def sweep(self, max_pages: int, max_age_s: int, now_ms: int, batch_pages: int = 1000
              ) -> list[Expired]:
        """A retention sweep: every page that leaves, removed from the ledger (as
        ``Engine.compact``, ``batch_pages`` at a time)."""
        out: list[Expired] = []
        while expired := self.expired(max_pages, max_age_s, now_ms, batch_pages):
            self.remove(expired)
            out += expired
        return out
