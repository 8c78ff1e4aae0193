"""What the align stage reads of the candidate pages: their forward records (windows and
positions) and ids, from the engine's store or an align partition's (``StoreForward``), or a
secondary instance of the engine's (the process pool's workers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import msgpack

from dupalign.store import tables
from dupalign.store.database import Store

# the families a ``StoreForward`` reads (meta: the parameters checked at open)
_FAMILIES = ("meta", tables.docs.family, tables.forward.family, tables.positions.family)


class ForwardReader(Protocol):
    def windows(self, ordinals: list[int]) -> list[bytes | None]:
        """The windows values of the pages' forward records (None: not here)."""
        ...

    def positions(self, ordinal: int) -> bytes | None:
        """The positions value of the page's forward record."""
        ...

    def doc_id(self, ordinal: int) -> str | None:
        ...

    def catch_up(self) -> bool:
        """Read what was written since (a secondary instance); False: nothing to read."""
        ...


class StoreForward:
    """The engine's store (or a secondary instance of it) as a ``ForwardReader``."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def windows(self, ordinals: list[int]) -> list[bytes | None]:
        return tables.forward.get_many(self.store, ordinals)

    def positions(self, ordinal: int) -> bytes | None:
        return tables.positions.get(self.store, ordinal)

    def doc_id(self, ordinal: int) -> str | None:
        raw = tables.docs.get(self.store, ordinal)
        return None if raw is None else str(msgpack.unpackb(raw)["id"])

    def catch_up(self) -> bool:
        return self.store.catch_up()


def open_secondary(path: str | Path, params: dict[str, Any], directory: str | Path,
                   block_cache_bytes: int) -> Store:
    """A secondary instance of the store at ``path`` (its own files in ``directory``) with
    only what a ``StoreForward`` reads: catching up replays only their part of the log,
    not the ~1,600 inverted-list entries a page adds, which would cost it as much as they
    cost the writer."""
    return Store(path, params, secondary=directory, block_cache_bytes=block_cache_bytes,
                 only=_FAMILIES)
