"""A ``Router``'s rows (dupalign.stages.router: store ordinal -> fingerprint, None for a row
of another partition's id) kept in a stage partition's store as well as in memory, so that
whatever restores the store (a changelog: dupalign/service/changelog.py) restores them: one
record per row (8 bytes, big-endian, or empty for another partition's row). The rows a turn
changes are written by ``write``, in the batch that ends the turn. The same form keeps a
router's exact copies' fingerprints (``Router.kept``) under another log."""

from __future__ import annotations

import struct
from collections.abc import Iterator, MutableMapping

from dupalign.store import records
from dupalign.store.database import Batch, Store

_FP = struct.Struct(">Q")
_LOG = "router_rows"


class StoredRows(MutableMapping[int, int | None]):
    """The rows kept in ``store`` (none for a new store)."""

    def __init__(self, store: Store, log: str = _LOG) -> None:
        """``log``: the store's log of these rows (another for another map)."""
        self._log = log
        self._rows: dict[int, int | None] = {
            ordinal: _FP.unpack(raw)[0] if raw else None
            for ordinal, raw in records.log_items(store, log)}
        self._changed: dict[int, bytes | None] = {}  # ordinal -> record (None: gone)

    def __getitem__(self, ordinal: int) -> int | None:
        return self._rows[ordinal]

    def __setitem__(self, ordinal: int, fingerprint: int | None) -> None:
        self._rows[ordinal] = fingerprint
        self._changed[ordinal] = b"" if fingerprint is None else _FP.pack(fingerprint)

    def __delitem__(self, ordinal: int) -> None:
        del self._rows[ordinal]
        self._changed[ordinal] = None

    def __iter__(self) -> Iterator[int]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def write(self, batch: Batch) -> None:
        """The rows changed since the last call."""
        for ordinal, raw in self._changed.items():
            if raw is None:
                records.log_delete(batch, self._log, ordinal)
            else:
                records.log_put(batch, self._log, ordinal, raw)
        self._changed.clear()
