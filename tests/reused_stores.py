"""Stores reused between hypothesis examples: opening and closing a RocksDB store costs more
than an example's pages, so a role's store is emptied (one range delete per family) rather
than made anew, and replaced every ``reuse`` examples so that range tombstones do not pile
up. An engine on it is new each time, so no state in memory carries over."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack

from dupalign.config import EngineConfig
from dupalign.runtime.engine import Engine
from dupalign.store.database import Store


class Stores:
    def __init__(self, root: Path, reuse: int = 10) -> None:
        self.root, self.reuse = root, reuse
        self.stores: dict[str, tuple[Store, int]] = {}
        self.made = 0

    def store(self, role: str, params: dict[str, Any]) -> Store:
        """The role's store, empty, with the engine parameters ``params``."""
        store, uses = self.stores.get(role, (None, 0))
        if store is None or uses >= self.reuse:
            if store is not None:
                store.close()
            self.made += 1
            store, uses = Store(self.root / f"{role}{self.made}", params,
                                block_cache_bytes=8 << 20), 0
        else:
            batch = store.batch()
            for family in store._cfs:  # every key here is shorter than 32 bytes
                batch.delete_range(family, b"", b"\xff" * 32)
            store.write(batch)
            store.put("meta", b"params", msgpack.packb(params))  # as a new store has
            store.params = params
        self.stores[role] = (store, uses + 1)
        return store

    def engine(self, role: str, cfg: EngineConfig) -> Engine:
        return Engine(self.store(role, cfg.frozen_params()), cfg)

    def close(self) -> None:
        for store, _ in self.stores.values():
            store.close()
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def temporary_stores(prefix: str) -> Iterator[Stores]:
    """Stores under a new directory (in memory where /dev/shm is), removed when the block
    ends, failed or not (a generator iterated by ``for`` would leave them to the garbage
    collector when a test fails, which hypothesis delays: thousands were left in /dev/shm)."""
    shm = Path("/dev/shm")
    s = Stores(Path(tempfile.mkdtemp(prefix=prefix, dir=shm if shm.is_dir() else None)))
    try:
        yield s
    finally:
        s.close()
