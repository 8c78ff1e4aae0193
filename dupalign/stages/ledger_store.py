"""A ``Ledger`` (dupalign.stages.ledger) kept in a stage partition's store as well as in memory,
so that whatever restores the store (a changelog: dupalign/service/changelog.py) restores the
ledger: one row per page alive (sequence ordinal -> store ordinal and ``fetched_at``, 16
bytes), and its two counters. The rows a turn changes are written by ``write``, in the
batch that ends the turn."""

from __future__ import annotations

import struct

from dupalign.stages.directory import NO_TIME, NONE, Decision, Decisions
from dupalign.stages.ledger import Expired, Ledger, Placed, Placements
from dupalign.store import records
from dupalign.store.database import Batch, Store

_ROW = struct.Struct(">Qq")


class StoredLedger:
    """The ledger of ``store`` (empty for a new store)."""

    def __init__(self, store: Store) -> None:
        rows = []
        for seq, raw in records.log_items(store, "ledger"):
            ordinal, fetched = _ROW.unpack(raw)
            rows.append((seq, int(ordinal), None if fetched == NO_TIME else int(fetched)))
        self.ledger = Ledger.restored(rows, records.get_note(store, "ledger_next_ordinal") or 0,
                                      records.get_note(store, "ledger_next_seq") or 0)
        self._changed: dict[int, bytes | None] = {}  # sequence ordinal -> row (None: gone)

    @property
    def next_seq(self) -> int:
        """The sequence ordinal of the next decision it applies."""
        return self.ledger.next_seq

    def apply(self, d: Decision) -> Placed:
        placed = self.ledger.apply(d)
        if d.removed is not None:
            self._changed[d.removed.seq] = None
        if placed.ordinal is not None:
            fetched = NO_TIME if d.fetched_at is None else d.fetched_at
            self._changed[d.seq] = _ROW.pack(placed.ordinal, fetched)
        return placed

    def apply_run(self, run: Decisions) -> Placements:
        """The next decisions at once (``Ledger.apply_run``), their rows noted as ``apply``
        notes them, in the same order (a ValueError: the store is left for a restore)."""
        placed = self.ledger.apply_run(run)
        changed, row = self._changed, _ROW.pack
        for seq, ordinal, removed, fetched in zip(run.seq, placed.ordinal, run.removed,
                                                  run.fetched_at, strict=True):
            if removed != NONE:
                changed[removed] = None
            if ordinal != NONE:
                changed[seq] = row(ordinal, fetched)
        return placed

    def sweep(self, max_pages: int, max_age_s: int, now_ms: int) -> list[Expired]:
        swept = self.ledger.sweep(max_pages, max_age_s, now_ms)
        for e in swept:
            self._changed[e.seq] = None
        return swept

    def write(self, batch: Batch) -> None:
        """The rows changed since the last call, and the counters."""
        records.log_write(batch, (("ledger", seq, row) for seq, row in self._changed.items()))
        self._changed.clear()
        records.put_note(batch, "ledger_next_ordinal", self.ledger.next_ordinal)
        records.put_note(batch, "ledger_next_seq", self.ledger.next_seq)

