"""The store side of a stage partition's restore, for tests/bench/bench_retained.py
``--restore``: the partition's store written into a fresh one with ``Store.apply`` in chunks of
10,000 (as ``restore`` does), in the layout before (every key a changelog kept then) and as
now (the keys the changelog keeps, then the stage opened on it, which rebuilds the rest),
timed, no broker; the two stores' contents are checked equal.

- A list partition: before, every key; now without the lists' entries and runs
  (``lists.derived``), rebuilt from its forward records by ``ListShard``.
- The forward partition: before, every key but ``units`` (which the layout before did not
  have); now without the ``forward`` records (``forward_units.derived``), rebuilt from the
  positions and units by ``ForwardStage``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dupalign.config import EngineConfig
from dupalign.stages.forward_stage import DERIVED, ForwardStage
from dupalign.stages.list_shard import ListShard
from dupalign.stages.partitioned import Shape
from dupalign.store import lists, tables
from dupalign.store.database import Change, Store
from dupalign.store.keys import FAMILIES

CHUNK = 10_000  # (``restore``'s chunks)


@dataclass
class Restore:
    """A partition's store written into a fresh one, as a restore from its compacted
    changelog would: in the layout before, and as now (the kept keys, then the stage
    opened on it: what it derives rebuilt)."""

    name: str
    pages: int  # the pages whose derived keys are rebuilt (forward records)
    records_before: int
    seconds_before: float
    records: int
    seconds_apply: float
    seconds_rebuild: float


def _every(store: Store) -> list[Change]:
    return [(f, k, v) for f in FAMILIES if store.has_family(f)
            for k, v in store.items(f) if (f, k) != ("meta", b"params")]


def _applied(store: Store, changes: list[Change]) -> float:
    t0 = time.perf_counter()
    for at in range(0, len(changes), CHUNK):
        store.apply(changes[at:at + CHUNK])
    return time.perf_counter() - t0


def time_restore(name: str, store: Store, config: EngineConfig, shape: Shape, tmp: Path
                 ) -> Restore:
    """``Restore`` of list partition ``name`` (its store ``store``), each way into a new
    store under ``tmp``; the two stores' lists are checked equal."""
    params = config.frozen_params()
    every = _every(store)
    kept = [c for c in every if not lists.derived(c[0], c[1])]
    before = Store(tmp / f"{name}-before", params)
    seconds_before = _applied(before, every)
    after = Store(tmp / f"{name}-after", params)
    seconds_apply = _applied(after, kept)
    t0 = time.perf_counter()
    shard = ListShard(after, config, int(name[len("lists"):]), shape.lists)
    seconds_rebuild = time.perf_counter() - t0
    assert lists_multiset(after) == lists_multiset(before)
    before.close()
    after.close()
    return Restore(name, shard.rebuilt, len(every), seconds_before, len(kept), seconds_apply,
                   seconds_rebuild)


def time_forward_restore(name: str, store: Store, config: EngineConfig, tmp: Path) -> Restore:
    """``Restore`` of the forward partition ``name``; the forward records rebuilt are
    checked equal, byte for byte, to the ones written (and every other key to the store's)."""
    params = config.frozen_params()
    every = _every(store)
    before_keys = [c for c in every if c[0] != tables.units.family]
    kept = [c for c in every if not DERIVED(c[0], c[1])]
    before = Store(tmp / f"{name}-before", params)
    seconds_before = _applied(before, before_keys)
    after = Store(tmp / f"{name}-after", params)
    seconds_apply = _applied(after, kept)
    t0 = time.perf_counter()
    stage = ForwardStage(after, config)
    seconds_rebuild = time.perf_counter() - t0
    assert _every(after) == every
    before.close()
    after.close()
    return Restore(name, stage.rebuilt, len(before_keys), seconds_before, len(kept),
                   seconds_apply, seconds_rebuild)


def lists_multiset(store: Store) -> dict[bytes, tuple[bytes | None, list[int]]]:
    """Every list: its long mark's value, its entries' ordinals (a page once per window)."""
    out: dict[bytes, tuple[bytes | None, list[int]]] = {}
    for key, value in store.items(lists.FAMILY):
        mark, ords = out.get(key[:10], (None, []))
        if len(key) == 10:
            mark = value
        elif key.endswith(lists.RUN_SEQ):
            ords = ords + lists.decode_run(np.frombuffer(value, dtype=np.uint8)).tolist()
        else:
            ords = ords + [int.from_bytes(key[10:], "big")] * (
                1 if not value else lists.COUNT.unpack(value)[0])
        out[key[:10]] = (mark, ords)
    return {k: (m, sorted(o)) for k, (m, o) in out.items()}
