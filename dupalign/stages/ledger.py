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

from dupalign.stages.directory import NO_TIME, NONE, STORED, Decision, Decisions


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


@dataclass(frozen=True)
class Placements:
    """Consecutive decisions in store ordinals (``Placed`` as columns, NONE for None)."""

    ordinal: list[int]
    removed: list[int]
    replay_of: list[int]

    def placed(self, i: int) -> Placed:
        o, r, p = self.ordinal[i], self.removed[i], self.replay_of[i]
        return Placed(None if o == NONE else o, None if r == NONE else r,
                      None if p == NONE else p)


SHORT_RUN = 64  # decisions: a shorter run is applied one by one (its arrays cost more)


@dataclass(frozen=True)
class _Columns:
    """A run's columns ``Ledger._vectors`` reads as arrays."""

    removed: np.ndarray
    replay_of: np.ndarray
    fetched_at: np.ndarray


class Ledger:
    """``next_ordinal``: the store ordinal the next stored page gets; ``slots``: how many
    pages the first arrays hold.

    The pages stored, in slots in store ordinal order (sequence ordinals ascend with them,
    so both are found by binary search): sequence and store ordinal, ``fetched_at`` and
    whether the page is alive, 25 bytes a slot. The slots of removed pages are dropped
    once they are half the slots used, so memory follows the pages alive, not the pages
    ever stored. A cursor (``_first``) stays past the dead slots at the front, so a sweep
    reads the pages it takes, not every slot."""

    def __init__(self, next_ordinal: int = 0, slots: int = 1024) -> None:
        self.next_ordinal = next_ordinal
        self.next_seq = 0
        self._seq = np.zeros(slots, dtype=np.int64)
        self._ordinal = np.zeros(slots, dtype=np.int64)
        self._fetched = np.zeros(slots, dtype=np.int64)
        self._live = np.zeros(slots, dtype=np.bool_)
        self._used = 0  # slots used
        self._alive = 0
        self._first = 0  # every slot below it is dead

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
        ordinal, removed, replay_of = self._place(
            d.seq, d.kind == "stored", NONE if d.removed is None else d.removed.seq,
            NONE if d.replay_of is None else d.replay_of,
            NO_TIME if d.fetched_at is None else d.fetched_at)
        return Placements([ordinal], [removed], [replay_of]).placed(0)

    def _place(self, seq: int, stored: bool, removed: int, replay_of: int, fetched_at: int
               ) -> tuple[int, int, int]:
        """``apply``'s decision as its columns (``Decisions``): its placement's."""
        if seq < self.next_seq:
            raise ValueError(f"decision {seq} comes after decision {self.next_seq - 1}")
        ordinal = gone = repeats = NONE
        if removed != NONE:
            slot = self._known(removed, seq)
            gone = int(self._ordinal[slot])
            self._kill(slot)
        if replay_of != NONE:
            repeats = int(self._ordinal[self._known(replay_of, seq)])
        if stored:
            ordinal = self.next_ordinal
            self.next_ordinal += 1
            self._append(seq, ordinal, None if fetched_at == NO_TIME else fetched_at)
        self.next_seq = seq + 1
        return ordinal, gone, repeats

    def apply_run(self, run: Decisions) -> Placements:
        """The next decisions, placed as ``apply`` one by one places them, or its
        ValueError: a long run in a few array operations whatever its length
        (``_vectors``), a short one or one ``_vectors`` refuses one by one."""
        placed = self._vectors(run) if len(run) >= SHORT_RUN else None
        if placed is not None:
            return placed
        out = Placements([], [], [])
        for d in zip(run.seq, [k == STORED for k in run.kind], run.removed, run.replay_of,
                     run.fetched_at, strict=True):
            ordinal, removed, replay_of = self._place(*d)
            out.ordinal.append(ordinal)
            out.removed.append(removed)
            out.replay_of.append(replay_of)
        return out

    def _vectors(self, columns: Decisions) -> Placements | None:
        """``apply_run`` in array operations (None: a decision ``apply`` would refuse;
        nothing applied)."""
        seq, n = np.asarray(columns.seq, np.int64), len(columns)
        stored = np.asarray(columns.kind) == STORED
        if not n or seq[0] < self.next_seq or (np.diff(seq) <= 0).any():
            return None
        run = _Columns(np.asarray(columns.removed, np.int64),
                       np.asarray(columns.replay_of, np.int64),
                       np.asarray(columns.fetched_at, np.int64))
        new = seq[stored]
        has_removed, has_replay = run.removed != NONE, run.replay_of != NONE
        # every page a decision names is alive then: alive before the run or stored in it
        # before the decision, not removed by an earlier one (removals are of distinct pages)
        gone = run.removed[has_removed]
        if ((gone >= seq[has_removed]).any() or len(np.unique(gone)) < len(gone)
                or not (self._alive_before(gone) | np.isin(gone, new)).all()):
            return None
        repeats = run.replay_of[has_replay]
        at = np.flatnonzero(has_replay)
        if ((repeats >= seq[has_replay]).any()
                or not (self._alive_before(repeats) | np.isin(repeats, new)).all()):
            return None
        order = np.argsort(gone)
        k = np.minimum(np.searchsorted(gone[order], repeats), max(len(gone) - 1, 0))
        if len(gone):  # (removed by a decision at or before the replay's)
            removed_by = np.flatnonzero(has_removed)[order][k]
            if ((gone[order][k] == repeats) & (removed_by <= at)).any():
                return None
        # the new pages' slots, then the removals and replays found by sequence ordinal
        ordinal = np.full(n, NONE, np.int64)
        ordinal[stored] = self.next_ordinal + np.arange(len(new))
        self._reserve(len(new))
        used, end = self._used, self._used + len(new)
        self._seq[used:end], self._ordinal[used:end] = new, ordinal[stored]
        self._fetched[used:end], self._live[used:end] = run.fetched_at[stored], True
        self._used, self._alive = end, self._alive + len(new)
        removed = np.full(n, NONE, np.int64)
        slots = np.searchsorted(self._seq[:end], gone)
        removed[has_removed] = self._ordinal[slots]
        self._live[slots] = False
        self._alive -= len(gone)
        replay_of = np.full(n, NONE, np.int64)
        replay_of[has_replay] = self._ordinal[np.searchsorted(self._seq[:end], repeats)]
        self.next_ordinal += len(new)
        self.next_seq = int(seq[-1]) + 1
        return Placements(ordinal.tolist(), removed.tolist(), replay_of.tolist())

    def _alive_before(self, seqs: np.ndarray) -> np.ndarray:
        """Which of ``seqs`` are pages alive (``_slot``, at once)."""
        used = self._used
        slots = np.minimum(np.searchsorted(self._seq[:used], seqs), max(used - 1, 0))
        if not used:
            return np.zeros(len(seqs), np.bool_)
        return (self._seq[slots] == seqs) & self._live[slots]

    def _reserve(self, k: int) -> None:
        """Room for ``k`` more slots (``_append``'s, at once)."""
        if self._used + k > len(self._seq):
            self._compact()
        size = max(len(self._seq), 1)
        while self._used + k > size:
            size *= 2
        if size > len(self._seq):
            for name in ("_seq", "_ordinal", "_fetched", "_live"):
                a = getattr(self, name)
                grown = np.zeros(size, a.dtype)
                grown[:len(a)] = a
                setattr(self, name, grown)

    def _known(self, seq: int, by: int) -> int:
        slot = self._slot(seq)
        if slot is None:
            raise ValueError(f"decision {by} names page {seq}, which is not stored")
        return slot

    def _append(self, seq: int, ordinal: int, fetched_at: int | None) -> None:
        self._reserve(1)
        i = self._used
        self._seq[i], self._ordinal[i] = seq, ordinal
        self._fetched[i] = NO_TIME if fetched_at is None else fetched_at
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
        self._first = 0

    def expired(self, max_pages: int, max_age_s: int, now_ms: int, limit: int = 1000
                ) -> list[Expired]:
        """The oldest pages (lowest store ordinals) that must leave, at most ``limit``:
        while more than ``max_pages`` are alive, or while the oldest was fetched more than
        ``max_age_s`` before ``now_ms``; a page without ``fetched_at`` never expires by
        age and stops the age sweep (``Indexer.expired``)."""
        if not max_pages and not max_age_s:
            return []
        slots = self._oldest(limit)
        leaves = np.zeros(len(slots), dtype=np.bool_)
        if max_pages:  # the j-th oldest leaves if more than max_pages are left before it
            leaves |= self._alive - np.arange(len(slots)) > max_pages
        if max_age_s:
            fetched = self._fetched[slots]
            leaves |= (fetched != NO_TIME) & (fetched < now_ms - max_age_s * 1000)
        n = len(slots) if leaves.all() else int(np.argmin(leaves))  # up to the first to stay
        return [Expired(o, q) for o, q in zip(self._ordinal[slots[:n]].tolist(),
                                              self._seq[slots[:n]].tolist(), strict=True)]

    def _oldest(self, limit: int) -> np.ndarray:
        """The first ``limit`` live slots, read from the cursor in windows that double: the
        dead slots at the front are passed once (the cursor moves past them), and only as
        many slots are read as hold ``limit`` live ones (a scan of every slot cost a crawl
        that never stops O(pages alive) a sweep)."""
        used, start, step = self._used, self._first, 64
        while start < used:
            window = self._live[start:min(start + step, used)]
            if window.any():
                start += int(np.argmax(window))
                break
            start += len(window)
            step *= 2
        self._first = start
        found: list[np.ndarray] = []
        n, end, step = 0, start, max(limit, 64)
        while n < limit and end < used:
            found.append(np.flatnonzero(self._live[end:min(end + step, used)]) + end)
            n += len(found[-1])
            end, step = end + step, step * 2
        return np.concatenate(found)[:limit] if found else np.zeros(0, np.int64)

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
            if len(expired) < batch_pages:  # (the page after the last one stays: the
                break  # next batch would be empty)
        return out
