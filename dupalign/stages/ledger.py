"""The ledger of stored pages: what every consumer of the page directory's decisions (all
shards' of them, merged in sequence order: dupalign.stages.directory) computes alike, with
no coordinator. It gives each stored page its store ordinal (consecutive: the single
engine's ``Indexer.next_ordinal``), names the versions a decision removes or repeats by
store ordinal, keeps the set of pages alive, and computes retention sweeps
(``Indexer.expired``, from the pages alive and their ``fetched_at`` alone): since every
copy applies the same decisions in the same order, a sweep at the same sequence point and
``now_ms`` removes the same pages in every copy.

Its state is the pages alive: store ordinal, sequence ordinal and ``fetched_at`` of each,
in memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

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


class Ledger:
    """``next_ordinal``: the store ordinal the next stored page gets."""

    def __init__(self, next_ordinal: int = 0) -> None:
        self.next_ordinal = next_ordinal
        self.next_seq = 0
        self._ordinal_of: dict[int, int] = {}  # sequence -> store ordinal, of pages alive
        # store ordinal -> (sequence ordinal, fetched_at) of pages alive, in ordinal order
        # (a dict keeps insertion order, and ordinals are given ascending)
        self._alive: dict[int, tuple[int, int | None]] = {}

    @property
    def alive(self) -> int:
        """Pages stored (current versions)."""
        return len(self._alive)

    def ordinal_of(self, seq: int) -> int | None:
        """The store ordinal of the page alive that the ``seq``-th page stored (None: none)."""
        return self._ordinal_of.get(seq)

    def apply(self, d: Decision) -> Placed:
        """The next decision, in sequence order."""
        if d.seq < self.next_seq:
            raise ValueError(f"decision {d.seq} comes after decision {self.next_seq - 1}")
        removed = replay_of = ordinal = None
        if d.removed is not None:
            removed = self._known(d.removed.seq, d)
            del self._ordinal_of[d.removed.seq], self._alive[removed]
        if d.replay_of is not None:
            replay_of = self._known(d.replay_of, d)
        if d.kind == "stored":
            ordinal = self.next_ordinal
            self.next_ordinal += 1
            self._ordinal_of[d.seq] = ordinal
            self._alive[ordinal] = (d.seq, d.fetched_at)
        self.next_seq = d.seq + 1
        return Placed(ordinal, removed, replay_of)

    def _known(self, seq: int, d: Decision) -> int:
        ordinal = self._ordinal_of.get(seq)
        if ordinal is None:
            raise ValueError(f"decision {d.seq} names page {seq}, which is not stored")
        return ordinal

    def expired(self, max_pages: int, max_age_s: int, now_ms: int, limit: int = 1000
                ) -> list[Expired]:
        """The oldest pages (lowest store ordinals) that must leave, at most ``limit``:
        while more than ``max_pages`` are alive, or while the oldest was fetched more than
        ``max_age_s`` before ``now_ms``; a page without ``fetched_at`` never expires by
        age and stops the age sweep (``Indexer.expired``)."""
        if not max_pages and not max_age_s:
            return []
        cutoff = now_ms - max_age_s * 1000
        out: list[Expired] = []
        for ordinal, (seq, fetched) in self._alive.items():
            if len(out) >= limit:
                break
            too_many = max_pages and self.alive - len(out) > max_pages
            too_old = max_age_s and fetched is not None and fetched < cutoff
            if not (too_many or too_old):
                break
            out.append(Expired(ordinal, seq))
        return out

    def remove(self, expired: Iterable[Expired]) -> None:
        for e in expired:
            if self._alive.pop(e.ordinal, None) is not None:
                del self._ordinal_of[e.seq]

    def sweep(self, max_pages: int, max_age_s: int, now_ms: int, batch_pages: int = 1000
              ) -> list[Expired]:
        """A retention sweep: every page that leaves, removed from the ledger (as
        ``Engine.compact``, ``batch_pages`` at a time)."""
        out: list[Expired] = []
        while expired := self.expired(max_pages, max_age_s, now_ms, batch_pages):
            self.remove(expired)
            out += expired
        return out
