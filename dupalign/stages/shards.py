"""Index shards by key, and the fan-in that combines their partial results.

The index stage's state splits in two (docs/topology.md, "Index shards by key"):

- the page directory, in the fan-in's store: per page its ``docs``/``ids``/``replay``/
  ``exact`` records, matches and offsets, its full forward record (align reads it) and the
  PSM fingerprint table with the volatility model and idf tables. These decide, before any
  shard applies ordinal n, what n adds to every shard (replay, revisit, delete,
  exact-before-near: an exact duplicate adds nothing) and the PSM probe order (the header
  width, the append buffer and the volatility model are properties of the whole table);
- S index shards, each over its own store: the verification sketches of the pages it owns
  (``page_owner``: ordinal mod S) and the inverted lists of the (bin, min-hash) keys it owns
  (``list_owner``: dupalign.stages.list_shard), with their stop-list flags, packed runs,
  and per page a forward record of its windows in those lists (what a removal must
  visit).

For ordinal n a shard computes alone, from its keys' state over ordinals < n, its
*partial*: the PSM candidates it owns that its sketches verify (``IndexShard.verify``),
and the heads of the page's lists it owns (``IndexShard.list_heads``: the single index's
``PassageIndex.list_heads`` on those lists, so a list is a stop list by the same rule,
found and marked in the shard that owns it, and the ``passage.max_list_read`` cut is
per list, local). The fan-in joins the heads and runs ``PassageIndex.find_tasks`` on them
as the single ``Indexer`` does (``ShardedPassages.list_heads``): bins are counted over
every list of a passage before the threshold (a page may reach it only with bins from
several shards), then the near duplicates and the earlier version are excluded, then
``passage.max_candidates`` ranks; stop lists become the empty list. Everything else is
``Indexer`` code too: ``ShardedIndexer`` is an ``Indexer`` whose near and passage indexes
fan out to the shards.

Writes: a page's shard entries are written (one batch per shard) before the page's batch
in the fan-in's store, which is the commit point. A crash between leaves entries of an
ordinal the fan-in never stored: they are removed when the shards open
(``IndexShard.roll_back``), or before that ordinal is staged again.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import numpy as np
import numpy.typing as npt

from dupalign.config import EngineConfig
from dupalign.errors import StoreMismatch
from dupalign.near.index import NearIndex, NearState
from dupalign.passage import forward
from dupalign.passage.index import PassageIndex, Removal
from dupalign.passage.sketch import PassageState
from dupalign.stages.index import Indexer
from dupalign.stages.list_shard import copy_heads, join_heads, list_owner, owned_part
from dupalign.stages.messages import IndexResult
from dupalign.stages.sketch import PageSketch
from dupalign.store import tables
from dupalign.store.database import Batch, Store

T = TypeVar("T")
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
REBUILD_BY_REPLAY = ("dupalign scan --store NEW_STORE --shards {n} INPUT... (the pages in "
                     "their original order; in the Kafka topology, the index roles replay "
                     "the retained topics into fresh stores: docs/topology.md)")


def page_owner(ordinal: int, n_shards: int) -> int:
    """The shard that keeps a page's verification sketch."""
    return ordinal % n_shards


def shard_dir(store_dir: str | Path, shard: int) -> Path:
    return Path(store_dir) / "shards" / str(shard)


def _busy(method: Callable[..., T]) -> Callable[..., T]:
    """Count the CPU seconds of this thread spent in an ``IndexShard`` method (``busy``:
    what the shard would cost as a process of its own; the rest of the index is the
    fan-in's)."""
    @functools.wraps(method)
    def timed(self: IndexShard, *args: Any, **kwargs: Any) -> T:
        t0 = time.thread_time()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.busy += time.thread_time() - t0
    return timed


class IndexShard:
    """One index shard: the keyed index state over its own store (module docstring)."""

    def __init__(self, store: Store, config: EngineConfig, shard: int, n_shards: int) -> None:
        self.store = store
        self.shard, self.n_shards = shard, n_shards
        self.near = NearIndex(store, config, 0)  # its verification sketches and filter
        self.passages = PassageIndex(store, config)  # its lists
        self.pending: Batch | None = None
        self.staged: int | None = None  # an ordinal written here, not yet committed
        # (ordinal, post removal, windows applied): staged by ``answer``, for ``settle``
        self.settling: tuple[int, Removal | None, PassageState | None] | None = None
        self.busy = 0.0  # CPU seconds in the shard's own work (``_busy``)

    def batch(self) -> Batch:
        if self.pending is None:
            self.pending = self.store.batch()
        return self.pending

    @_busy
    def flush(self) -> None:
        if self.pending is not None and len(self.pending):
            self.store.write(self.pending)
        self.pending = None

    # -- the partial result of a page --------------------------------------------------------
    @_busy
    def verify(self, state: NearState, candidates: list[tuple[int, int]]
               ) -> list[tuple[int, int, float]]:
        """The shard's near partial: those of the PSM candidates it owns that verify."""
        mine = [c for c in candidates if page_owner(c[0], self.n_shards) == self.shard]
        return self.near.verify(state, mine) if mine else []

    @_busy
    def list_heads(self, bins: I64, keys: U64, before: int, replaced: int | None
                   ) -> tuple[npt.NDArray[np.bool_], I64, I64, I64]:
        """The shard's part of a page's passage query: ``PassageIndex.list_heads`` of the
        page's lists it owns (a list lives wholly in one shard, so its stop-list decision
        and its ``max_list_read`` cut are local; the marks go into the shard's next
        batch)."""
        return self.passages.list_heads(bins, keys, before, replaced)

    # -- writes --------------------------------------------------------------------------
    @_busy
    def stage(self, ordinal: int, state: PassageState | None) -> PassageState | None:
        """Put the page's windows in the shard's lists into the pending batch (its sketch
        is there already, if the shard owns it); returns the part of ``state`` applied."""
        mine = None if state is None else self._owned(state)
        self.passages.stage(self.batch(), ordinal, mine)
        self.staged = ordinal
        return mine

    @_busy
    def commit(self, ordinal: int, mine: PassageState | None) -> None:
        self.passages.commit(ordinal, mine)
        self.staged = None

    def _owned(self, state: PassageState) -> PassageState | None:
        return owned_part(state, self.shard, self.n_shards)

    @_busy
    def stage_removal(self, ordinals: list[int]) -> Removal:
        batch = self.batch()
        tables.cws.remove(batch, ordinals)
        return self.passages.stage_removal(batch, ordinals)

    def roll_back(self, first: int) -> None:
        """Remove what the shard holds of ordinals >= ``first`` (written, then the fan-in's
        batch never was: a crash or a failed page)."""
        self.pending = None
        ords = {o for table in (tables.forward, tables.cws)
                for o in table.ordinals(self.store, first)}
        if not ords:
            return
        removal = self.stage_removal(sorted(ords))
        self.flush()
        self.passages.commit_removal(removal)
        self.passages.cache.clear()

    def needs_roll_back(self, first: int) -> bool:
        last = [table.last(self.store) for table in (tables.forward, tables.cws)]
        return any(o is not None and o >= first for o in last)


class ShardedNear(NearIndex):
    """The fan-in's near index: the PSM table here, verification sketches in the shards."""

    def __init__(self, store: Store, config: EngineConfig, next_ordinal: int,
                 shards: list[IndexShard], removal_only: bool = False) -> None:
        super().__init__(store, config, next_ordinal, removal_only)
        self.shards = shards

    def search(self, state: NearState, ordinal: int) -> list[tuple[int, int, float]]:
        candidates = self.candidates(state, ordinal)
        found = [f for shard in self.shards for f in shard.verify(state, candidates)]
        for shard in self.shards:  # the filter's totals, for metrics and IndexTimes
            self.counters.filter = _sum_filters(self.counters.filter, shard)
        return found

    def put_sketch(self, batch: Batch, ordinal: int, sketch: U64) -> None:
        shard = self.shards[page_owner(ordinal, len(self.shards))]
        shard.near.put_sketch(shard.batch(), ordinal, sketch)

    def sketch_of(self, ordinal: int) -> U64 | None:
        return self.shards[page_owner(ordinal, len(self.shards))].near.sketch_of(ordinal)



def _sum_filters(total: Any, shard: IndexShard) -> Any:
    """Move a shard's filter totals into ``total`` (the shard's start again from zero)."""
    f = shard.near.counters.filter
    total.pairs += f.pairs
    total.samples_used += f.samples_used
    total.samples_saved += f.samples_saved
    total.similar += f.similar
    for key, n in f.by.items():
        total.by[key] += n
    shard.near.counters.filter = type(f)()
    return total


class ShardedPassages(PassageIndex):
    """The fan-in's passage index: forward records here, inverted lists in the shards."""

    def __init__(self, store: Store, config: EngineConfig, shards: list[IndexShard]) -> None:
        super().__init__(store, config)
        self.shards = shards
        self._applied: list[PassageState | None] = []
        self._removals: list[Removal] = []

    def list_heads(self, bins: I64, keys: U64, before: int, replaced: int | None = None
                   ) -> tuple[npt.NDArray[np.bool_], I64, I64, I64]:
        """The heads of the page's lists, each from the shard that owns it, joined in one
        entries array: ``find_tasks`` then counts, thresholds, excludes and ranks the
        candidates as the single index does."""
        owner = list_owner(bins, keys, len(self.shards))
        parts = []
        for shard in self.shards:
            mine = np.flatnonzero(owner == shard.shard)
            if len(mine):
                long, start, n, ords = shard.list_heads(bins[mine], keys[mine], before,
                                                        replaced)
                # the heads copied out of the shard's cache (a process's reply, as a role)
                parts.append((mine, long, n, copy_heads(start, n, ords)))
        return join_heads(len(bins), parts)

    def stage(self, batch: Batch, ordinal: int, state: PassageState | None) -> None:
        """The page's full forward record here (every window: those in stop lists are
        never gathered, since a stop list stays one), its lists in the shards; then the
        shards' batches are written (before the fan-in's: see the module docstring)."""
        self.stage_forward(batch, ordinal, state)
        self._applied = [shard.stage(ordinal, state) for shard in self.shards]
        for shard in self.shards:
            shard.flush()

    @staticmethod
    def stage_forward(batch: Batch, ordinal: int, state: PassageState | None) -> None:
        """The page's full forward record and positions, in the fan-in's store."""
        if state is not None and state.rects is not None:
            r = state.rects
            tables.forward.put(batch, ordinal, forward.pack_windows(
                r.bin, r.key, np.stack((r.i_lo, r.i_hi, r.j_lo, r.j_hi), axis=1), r.empty))
            tables.positions.put(batch, ordinal, state.positions)

    def commit(self, ordinal: int, state: PassageState | None) -> None:
        for shard, mine in zip(self.shards, self._applied, strict=True):
            shard.commit(ordinal, mine)
        self._applied = []

    def stage_removal(self, batch: Batch, ordinals: list[int]) -> Removal:
        dead = self.stage_forward_removal(batch, ordinals)
        self._removals = [shard.stage_removal(dead.tolist()) for shard in self.shards]
        for shard in self.shards:
            shard.flush()
        return Removal(dead, np.zeros(0, np.int64), np.zeros(0, np.uint64))

    @staticmethod
    def stage_forward_removal(batch: Batch, ordinals: list[int]) -> I64:
        dead = np.unique(np.asarray(ordinals, dtype=np.int64))
        tables.forward.remove(batch, dead.tolist())
        tables.positions.remove(batch, dead.tolist())
        return dead

    def commit_removal(self, removal: Removal) -> None:
        for shard, mine in zip(self.shards, self._removals, strict=True):
            shard.passages.commit_removal(mine)
        self._removals = []

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        for shard in self.shards:
            for key, value in shard.passages.stats().items():
                out[key] += value
        return out


class ShardedIndexer(Indexer):
    """The index stage over a page directory (``store``) and S index shards: the
    ``Indexer``, with its near and passage indexes fanned out (module docstring)."""

    def __init__(self, store: Store, config: EngineConfig, shard_stores: list[Store],
                 read_only: bool = False, removal_only: bool = False) -> None:
        super().__init__(store, config, removal_only)
        n = len(shard_stores)
        self.shards = [IndexShard(s, config, i, n) for i, s in enumerate(shard_stores)]
        for shard in self.shards:
            if not read_only and shard.needs_roll_back(self.next_ordinal):
                shard.roll_back(self.next_ordinal)
        # (the plain indexes built by Indexer.__init__ are replaced: a second read of the
        # fingerprint table at open)
        self.near = ShardedNear(store, config, self.next_ordinal, self.shards, removal_only)
        self.passages = ShardedPassages(store, config, self.shards)

    def index(self, sk: PageSketch, source: tuple[str, int, int] | None = None,
              defer: bool = False) -> IndexResult:
        for shard in self.shards:  # what a page that failed after its shard writes left
            if shard.staged is not None and shard.staged >= self.next_ordinal:
                shard.roll_back(self.next_ordinal)
            shard.staged, shard.pending = None, None
        return super().index(sk, source, defer)

    def close(self) -> None:
        for shard in self.shards:
            shard.store.close()


def stored_shard_count(store: Store) -> int | None:
    """The shard count a store was built for (None: a new store; stores made before
    sharding are one shard)."""
    raw = tables.shard_count.get(store)
    if raw is not None:
        return int(msgpack.unpackb(raw))
    return None if tables.docs.last(store) is None else 1


RemoteIndexer = Callable[[Store, EngineConfig, int], Indexer]
"""Builds the index stage of a store whose S shards are processes of their own (the
service's fan-in, given the page directory's store, the config and S)."""


def open_indexer(store: Store, config: EngineConfig, read_only: bool = False,
                 shards: int | None = None, remote: RemoteIndexer | None = None,
                 removal_only: bool = False) -> Indexer:
    """The index stage over ``store``: one ``Indexer``, or a ``ShardedIndexer`` over the
    shard stores under ``<store>/shards/`` when the store was built for more than one
    shard. ``shards``: the count asked (None: the store's; 1 for a new one); ``remote``: the
    shards are processes that talk to this one by messages, and this builds the indexer
    that talks to them (the service's); ``removal_only``: ``Indexer``'s. The count is fixed
    per store: another one is refused with the rebuild-by-replay command."""
    has = stored_shard_count(store)
    n = shards if shards is not None else (has or 1)
    if n < 1:
        raise ValueError("the index shard count must be at least 1")
    if has is not None and has != n:
        raise StoreMismatch(
            f"store {store.path} was built for {has} index shard(s), asked for {n}: the "
            f"shard count is fixed per store (it decides where every key lives); rebuild "
            f"by replay into a new store: {REBUILD_BY_REPLAY.format(n=n)}")
    if has is None and not read_only and (n == 1 or remote is not None):
        tables.shard_count.put(store, msgpack.packb(n))
    if n == 1:
        indexer = Indexer(store, config, removal_only)
        # (index shards write their entries in their batches: a shard rolls a page back)
        indexer.passages.write_lists_behind(read_only)
        return indexer
    if remote is not None:  # the shards are processes of their own (the Kafka topology)
        if not read_only and tables.fan_in.get(store) is None:  # (also a store made
            tables.fan_in.put(store, msgpack.packb(True))  # before the mark existed)
        return remote(store, config, n)
    if has is not None:
        _check_local_shards(store, n, read_only)
    stores: list[Store] = []
    try:
        for i in range(n):
            s = Store(shard_dir(store.path, i), store.params, read_only=read_only)
            stores.append(s)
            check_shard(s, i, n, read_only)
        if has is None and not read_only:  # after its shards: a store that records a
            tables.shard_count.put(store, msgpack.packb(n))  # count has their stores
        return ShardedIndexer(store, config, stores, read_only, removal_only)
    except BaseException:
        for s in stores:
            s.close()
        raise


def _check_local_shards(store: Store, n: int, read_only: bool) -> None:
    """An existing store built for ``n`` shards opens them here only if they are here. The
    Kafka topology's fan-in (marked by the index role; before the mark, a store without
    its shard stores) has them in the shard roles: opened here, it would get new empty
    shards, and its pages waiting for their partials and align would be finished with
    what the directory alone knows (the role, taking it back, publishes those). A reader
    writes nothing: it may read shard roles' stores kept under the fan-in's directory."""
    role = (f"only the index role opens it (dupalign worker --roles index, "
            f"kafka.index_shards = {n})")
    if not read_only and tables.fan_in.get(store) is not None:
        raise StoreMismatch(f"store {store.path} is the index fan-in of a Kafka topology: "
                            f"its {n} index shards are the shard roles' stores; {role}")
    missing = next((d for d in (shard_dir(store.path, i) for i in range(n))
                    if not d.is_dir()), None)
    if missing is not None:
        raise StoreMismatch(f"store {store.path} was built for {n} index shards but {missing} "
                            "is missing: the index fan-in of a Kafka topology keeps its "
                            f"shards in the shard roles, {role}")


def check_shard(store: Store, shard: int, n: int, read_only: bool) -> None:
    raw = tables.shard_of.get(store)
    if raw is None:
        if read_only:
            raise StoreMismatch(f"{store.path} is not an index shard store")
        tables.shard_of.put(store, msgpack.packb([shard, n]))
        return
    if list(msgpack.unpackb(raw)) != [shard, n]:
        raise StoreMismatch(f"{store.path} is shard {list(msgpack.unpackb(raw))} (shard, "
                            f"count), expected {[shard, n]}")
