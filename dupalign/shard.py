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
  (``list_owner``), with their stop-list flags, packed runs, and per page a forward record
  of its windows in those lists (what a removal must visit).

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
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

import msgpack
import numpy as np
import numpy.typing as npt

from dupalign import forward
from dupalign.config import EngineConfig
from dupalign.errors import StoreMismatch
from dupalign.hashing import mix64
from dupalign.index import Indexer, IndexResult, Query, StoredVersion
from dupalign.match import Match
from dupalign.near import NearIndex, NearState
from dupalign.passage_sketch import PassageState, Rects, query_lists
from dupalign.passages import PassageIndex, Removal
from dupalign.sketch import PageSketch
from dupalign.store import (
    Batch,
    Store,
    delete_ordinals,
    offsets_key,
    ordinal_ranges,
    read_u64,
    u64,
)

T = TypeVar("T")
I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
SHARDS_KEY = b"index_shards"  # meta of the fan-in's store: the shard count, msgpack int
SHARD_KEY = b"index_shard"  # meta of a shard's store: [shard, count]
FAN_IN_KEY = b"index_fan_in"  # meta of the Kafka topology's fan-in store: its shards are roles
OUTBOX_PREFIX = b"outbox/"  # meta of the fan-in's store: seq -> its shard messages
_LIST_SALT = 0x5348415244  # "SHARD"
REBUILD_BY_REPLAY = ("dupalign scan --store NEW_STORE --shards {n} INPUT... (the pages in "
                     "their original order; in the Kafka topology, the index roles replay "
                     "the retained topics into fresh stores: docs/topology.md)")


def list_owner(bins: I64, keys: U64, n_shards: int) -> I64:
    """The shard of each inverted list (bin, min-hash)."""
    mixed = mix64(np.asarray(keys, dtype=np.uint64) ^ np.asarray(bins).astype(np.uint64),
                  _LIST_SALT)
    return (mixed % np.uint64(n_shards)).astype(np.int64)


def owned_part(state: PassageState, shard: int, n_shards: int) -> PassageState | None:
    """The page's non-empty windows in the lists of ``shard`` (None: there are none)."""
    r = state.rects
    if r is None:
        return None
    idx = np.flatnonzero(~r.empty)
    return _windows(state, idx[list_owner(r.bin[idx], r.key[idx], n_shards) == shard])


def owned_parts(state: PassageState | None, n_shards: int) -> list[PassageState | None]:
    """``owned_part`` for every shard, the owners computed once (the fan-in splits each
    page S ways: per shard, that was S passes over all the page's windows)."""
    if state is None or state.rects is None:
        return [None] * n_shards
    r = state.rects
    idx = np.flatnonzero(~r.empty)
    owner = list_owner(r.bin[idx], r.key[idx], n_shards)
    return [_windows(state, idx[owner == shard]) for shard in range(n_shards)]


def _windows(state: PassageState, idx: I64) -> PassageState | None:
    """The windows ``idx`` of ``state`` (None: there are none); no positions: the fan-in
    keeps them."""
    if not len(idx):
        return None
    assert state.rects is not None
    return PassageState(Rects(*(getattr(state.rects, f.name)[idx] for f in fields(Rects))),
                        state.n_units)


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
        for lo, hi in ordinal_ranges(ordinals):
            delete_ordinals(batch, ("cws",), lo, hi)
        return self.passages.stage_removal(batch, ordinals)

    def roll_back(self, first: int) -> None:
        """Remove what the shard holds of ordinals >= ``first`` (written, then the fan-in's
        batch never was: a crash or a failed page)."""
        self.pending = None
        ords = {read_u64(key) for family in ("forward", "cws")
                for key, _ in self.store.items(family) if read_u64(key) >= first}
        if not ords:
            return
        removal = self.stage_removal(sorted(ords))
        self.flush()
        self.passages.commit_removal(removal)
        self.passages.cache.clear()

    def needs_roll_back(self, first: int) -> bool:
        last = [self.store.last_key(f) for f in ("forward", "cws")]
        return any(k is not None and read_u64(k) >= first for k in last)


class ShardedNear(NearIndex):
    """The fan-in's near index: the PSM table here, verification sketches in the shards."""

    def __init__(self, store: Store, config: EngineConfig, next_ordinal: int,
                 shards: list[IndexShard]) -> None:
        super().__init__(store, config, next_ordinal)
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
        long = np.zeros(len(bins), dtype=np.bool_)
        start = np.zeros(len(bins), dtype=np.int64)
        n_head = np.zeros(len(bins), dtype=np.int64)
        parts: list[I64] = []
        at = 0
        owner = list_owner(bins, keys, len(self.shards))
        for shard in self.shards:
            mine = np.flatnonzero(owner == shard.shard)
            if not len(mine):
                continue
            s_long, s_start, s_n, s_ords = shard.list_heads(bins[mine], keys[mine], before,
                                                            replaced)
            # the heads copied out of the shard's cache (a process's reply, as a role)
            idx = np.repeat(s_start - np.cumsum(s_n) + s_n, s_n) + np.arange(int(s_n.sum()))
            parts.append(s_ords[idx])
            long[mine], n_head[mine] = s_long, s_n
            start[mine] = at + np.cumsum(s_n) - s_n
            at += int(s_n.sum())
        ords = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return long, start, n_head, ords

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
            batch.put("forward", u64(ordinal), forward.pack_windows(
                r.bin, r.key, np.stack((r.i_lo, r.i_hi, r.j_lo, r.j_hi), axis=1), r.empty))
            batch.put("positions", u64(ordinal), state.positions)

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
        for lo, hi in ordinal_ranges(dead):
            delete_ordinals(batch, ("forward", "positions"), lo, hi)
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
                 read_only: bool = False) -> None:
        super().__init__(store, config)
        n = len(shard_stores)
        self.shards = [IndexShard(s, config, i, n) for i, s in enumerate(shard_stores)]
        for shard in self.shards:
            if not read_only and shard.needs_roll_back(self.next_ordinal):
                shard.roll_back(self.next_ordinal)
        # (the plain indexes built by Indexer.__init__ are replaced: a second read of the
        # fingerprint table at open)
        self.near = ShardedNear(store, config, self.next_ordinal, self.shards)
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
    raw = store.get("meta", SHARDS_KEY)
    if raw is not None:
        return int(msgpack.unpackb(raw))
    return None if store.last_key("docs") is None else 1


def open_indexer(store: Store, config: EngineConfig, read_only: bool = False,
                 shards: int | None = None, remote: bool = False) -> Indexer:
    """The index stage over ``store``: one ``Indexer``, or a ``ShardedIndexer`` over the
    shard stores under ``<store>/shards/`` when the store was built for more than one
    shard. ``shards``: the count asked (None: the store's; 1 for a new one); ``remote``: the
    shards are processes that talk to this one by messages (``FanInIndexer``). The count is
    fixed per store: another one is refused with the rebuild-by-replay command."""
    has = stored_shard_count(store)
    n = shards if shards is not None else (has or 1)
    if n < 1:
        raise ValueError("the index shard count must be at least 1")
    if has is not None and has != n:
        raise StoreMismatch(
            f"store {store.path} was built for {has} index shard(s), asked for {n}: the "
            f"shard count is fixed per store (it decides where every key lives); rebuild "
            f"by replay into a new store: {REBUILD_BY_REPLAY.format(n=n)}")
    if has is None and not read_only and (n == 1 or remote):
        store.put("meta", SHARDS_KEY, msgpack.packb(n))
    if n == 1:
        indexer = Indexer(store, config)
        # (index shards write their entries in their batches: a shard rolls a page back)
        indexer.passages.write_lists_behind(read_only)
        return indexer
    if remote:  # the shards are processes of their own (the Kafka topology)
        if not read_only and store.get("meta", FAN_IN_KEY) is None:  # (also a store made
            store.put("meta", FAN_IN_KEY, msgpack.packb(True))  # before the mark existed)
        return FanInIndexer(store, config, n)
    if has is not None:
        _check_local_shards(store, n, read_only)
    stores: list[Store] = []
    try:
        for i in range(n):
            s = Store(shard_dir(store.path, i), store.params, read_only=read_only)
            stores.append(s)
            _check_shard(s, i, n, read_only)
        if has is None and not read_only:  # after its shards: a store that records a
            store.put("meta", SHARDS_KEY, msgpack.packb(n))  # count has their stores
        return ShardedIndexer(store, config, stores, read_only)
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
    if not read_only and store.get("meta", FAN_IN_KEY) is not None:
        raise StoreMismatch(f"store {store.path} is the index fan-in of a Kafka topology: "
                            f"its {n} index shards are the shard roles' stores; {role}")
    missing = next((d for d in (shard_dir(store.path, i) for i in range(n))
                    if not d.is_dir()), None)
    if missing is not None:
        raise StoreMismatch(f"store {store.path} was built for {n} index shards but {missing} "
                            "is missing: the index fan-in of a Kafka topology keeps its "
                            f"shards in the shard roles, {role}")


def _check_shard(store: Store, shard: int, n: int, read_only: bool) -> None:
    raw = store.get("meta", SHARD_KEY)
    if raw is None:
        if read_only:
            raise StoreMismatch(f"{store.path} is not an index shard store")
        store.put("meta", SHARD_KEY, msgpack.packb([shard, n]))
        return
    if list(msgpack.unpackb(raw)) != [shard, n]:
        raise StoreMismatch(f"{store.path} is shard {list(msgpack.unpackb(raw))} (shard, "
                            f"count), expected {[shard, n]}")


# -- the shards as processes: the keys and partials messages ----------------------------------
# The Kafka topology (worker/role_index.py, worker/role_shard.py, docs/topology.md) runs the
# split above across processes. The index role is the fan-in (``FanInIndexer``): for each
# record of the sequence (``seq``, its offset there) it does what ``ShardedIndexer`` does
# to the page directory, and sends each shard s a *keys message* (``ShardMessage``) with
# what ``ShardedIndexer`` would have asked of and written to shard s for that record; the
# shard process applies it (``IndexShard.answer``, ``IndexShard.settle``) and answers with
# its *partial* (``Partial``) for a page that got an ordinal; the fan-in decides the page
# from the S partials (``FanInIndexer.decide``), with ``Indexer._decide``: the same code
# as one process.

# version 2 carries a window as its list only (bin <u2, min-hash <u8: 10 bytes, against
# 49 for version 1's whole rectangle): a shard keeps lists, and its forward record only
# names them (the fan-in keeps the rectangles and aligns from them). Version 1 messages
# (retained in the keys topic, or in a fan-in's outbox from before an upgrade) are read
# too.
KEYS_WIRE = 2
_KEYS_READ = (1, 2)
# partials: version 2 sends the list heads' counts and ordinals as <u4 when they fit (they
# do below 4.3e9 ordinals), half of version 1's <i8, which is still read (the retained
# partials topic, and the partials a shard keeps to answer a repeated message). A shard
# answers a version 1 keys message, from a fan-in that predates both, with a version 1
# partial: so a rolling upgrade works shards first, then the index processes.
PARTIAL_WIRE = 2
_PARTIAL_READ = (1, 2)
_RECT_DTYPES = {"bin": "<i8", "key": "<u8", "i_lo": "<i8", "i_hi": "<i8", "j_lo": "<i8",
                "j_hi": "<i8", "empty": "?"}  # version 1


@dataclass
class ShardQuery:
    """What the fan-in asks shard s about the page at ``ordinal`` (its partial's inputs)."""

    sketch: U64 | None = None  # the page's verification sketch (verify; kept by its owner)
    candidates: list[tuple[int, int]] = field(default_factory=list)  # PSM's, owned here
    bins: I64 | None = None  # the page's lists owned here (None: no passage query)
    keys: U64 | None = None
    replaced: int | None = None  # the version the page replaces
    prev: int | None = None  # its verification sketch is asked (a changed revisit)


@dataclass
class ShardMessage:
    """Everything shard s does for one sequence record, in the order ``ShardedIndexer``
    does it: ``pre`` removals (a retention sweep before the page, a delete), then, for a
    page that got ``ordinal``, its ``query`` (the partial, from the state before the page),
    then in the page's batch the ``post`` removal (the version it replaces), its
    verification sketch (``put_sketch``: this shard owns the ordinal) and its ``windows``
    in this shard's lists."""

    seq: int
    ordinal: int | None = None
    pre: list[int] = field(default_factory=list)
    query: ShardQuery | None = None
    post: list[int] = field(default_factory=list)
    put_sketch: bool = False
    windows: PassageState | None = None
    wire: int = KEYS_WIRE  # the version it was read in (not sent: ``to_bytes`` writes its own)

    @property
    def empty(self) -> bool:
        return self.ordinal is None and not self.pre

    @property
    def partial_wire(self) -> int:
        """The partial version its sender reads: one that sends version 1 keys messages
        predates version 2 partials."""
        return 1 if self.wire == 1 else PARTIAL_WIRE

    def to_bytes(self) -> bytes:
        q = self.query
        w = None
        if self.windows is not None and self.windows.rects is not None:
            r = self.windows.rects
            if r.empty.any():  # (``owned_part`` keeps only windows that are in a list)
                raise ValueError("a keys message carries no empty window")
            w = {"n_units": self.windows.n_units, "bin": _b(r.bin, "<u2"),
                 "key": _b(r.key, "<u8")}
        return bytes(msgpack.packb({
            "v": KEYS_WIRE, "seq": self.seq, "ordinal": self.ordinal, "pre": self.pre,
            "post": self.post, "put_sketch": self.put_sketch, "windows": w,
            "query": None if q is None else {
                "sketch": None if q.sketch is None else _b(q.sketch, "<u8"),
                "candidates": [list(c) for c in q.candidates],
                "bins": None if q.bins is None else _b(q.bins, "<u2"),
                "keys": None if q.keys is None else _b(q.keys, "<u8"),
                "replaced": q.replaced, "prev": q.prev}}, use_bin_type=True))

    @classmethod
    def from_bytes(cls, raw: bytes) -> ShardMessage:
        d = msgpack.unpackb(raw, raw=False)
        v = d.get("v")
        if v not in _KEYS_READ:
            raise ValueError(f"keys message version {v!r}, expected one of {_KEYS_READ}")
        q, w = d["query"], d["windows"]
        bin_dtype = "<i8" if v == 1 else "<u2"
        query = None if q is None else ShardQuery(
            None if q["sketch"] is None else np.frombuffer(q["sketch"], "<u8").copy(),
            [(int(o), int(h)) for o, h in q["candidates"]],
            None if q["bins"] is None else np.frombuffer(q["bins"], bin_dtype).astype(np.int64),
            None if q["keys"] is None else np.frombuffer(q["keys"], "<u8").copy(),
            q["replaced"], q["prev"])
        windows = None
        if w is not None and v == 1:
            windows = PassageState(Rects(**{f: np.frombuffer(w[f], d).copy()
                                            for f, d in _RECT_DTYPES.items()}), w["n_units"])
        elif w is not None:
            bins = np.frombuffer(w["bin"], "<u2").astype(np.int64)
            n = len(bins)  # rectangles (zeros): not a shard's business
            i_lo, i_hi, j_lo, j_hi = np.zeros((4, n), dtype=np.int64)
            windows = PassageState(Rects(bins, np.frombuffer(w["key"], "<u8").copy(), i_lo,
                                         i_hi, j_lo, j_hi, np.zeros(n, dtype=bool)),
                                   w["n_units"])
        return cls(d["seq"], d["ordinal"], list(d["pre"]), query, list(d["post"]),
                   bool(d["put_sketch"]), windows, v)


@dataclass
class Partial:
    """Shard s's answer for the page at sequence record ``seq``: the PSM candidates it owns
    that its sketches verify, the heads of the page's lists it owns (``IndexShard
    .list_heads``, copied out: ``ords[sum(n[:i]):][:n[i]]`` for list i), and the
    verification sketch of the version the page replaces, if asked and owned here."""

    seq: int
    shard: int
    near: list[tuple[int, int, float]] = field(default_factory=list)
    long: npt.NDArray[np.bool_] | None = None
    n: I64 | None = None
    ords: I64 | None = None
    prev_sketch: U64 | None = None

    def to_bytes(self, version: int = PARTIAL_WIRE) -> bytes:
        if version not in _PARTIAL_READ:
            raise ValueError(f"partial version {version!r}, not one of {_PARTIAL_READ}")
        def counts(a: I64) -> Any:
            return _narrow(a) if version == 2 else _b(a, "<i8")

        return bytes(msgpack.packb({
            "v": version, "seq": self.seq, "shard": self.shard,
            "near": [list(x) for x in self.near],
            "long": None if self.long is None else _b(self.long, "?"),
            "n": None if self.n is None else counts(self.n),
            "ords": None if self.ords is None else counts(self.ords),
            "prev_sketch": None if self.prev_sketch is None else _b(self.prev_sketch, "<u8"),
        }, use_bin_type=True))

    @classmethod
    def from_bytes(cls, raw: bytes) -> Partial:
        d = msgpack.unpackb(raw, raw=False)
        v = d.get("v")
        if v not in _PARTIAL_READ:
            raise ValueError(f"partial version {v!r}, expected one of {_PARTIAL_READ}")

        def arr(key: str, dtype: str) -> Any:
            return None if d[key] is None else np.frombuffer(d[key], dtype).copy()

        def counts(key: str) -> Any:
            if v == 1 or d[key] is None:
                return arr(key, "<i8")
            raw, width = d[key]
            return np.frombuffer(raw, "<u4" if width == 4 else "<i8").astype(np.int64)

        return cls(d["seq"], d["shard"], [(int(o), int(h), float(e)) for o, h, e in d["near"]],
                   arr("long", "?"), counts("n"), counts("ords"), arr("prev_sketch", "<u8"))


def _b(a: npt.NDArray[Any], dtype: str) -> bytes:
    return np.ascontiguousarray(a, dtype=dtype).tobytes()


def _narrow(a: I64) -> tuple[bytes, int]:
    """Non-negative integers as <u4 when they all fit, else <i8; with the width."""
    if not len(a) or (int(a.min()) >= 0 and int(a.max()) < 1 << 32):
        return _b(a, "<u4"), 4
    return _b(a, "<i8"), 8


def answer(shard: IndexShard, msg: ShardMessage) -> Partial | None:
    """Shard s's part of a sequence record (``msg``), as ``ShardedIndexer`` runs it in one
    process: the removals before the page (written at once), the partial, then the page's
    batch staged in ``shard.batch()`` (the caller adds its own records to it, writes it with
    ``shard.flush()``, then calls ``settle``)."""
    if msg.pre:
        removal = shard.stage_removal(msg.pre)
        shard.flush()
        shard.passages.commit_removal(removal)
    shard.settling = None
    if msg.ordinal is None:
        return None
    ordinal, q = msg.ordinal, msg.query
    assert q is not None
    out = Partial(msg.seq, shard.shard)
    if q.prev is not None:
        out.prev_sketch = shard.near.sketch_of(q.prev)
    if q.candidates:
        assert q.sketch is not None
        out.near = shard.verify(NearState(indexed=True, sketch=q.sketch), q.candidates)
    if q.bins is not None and len(q.bins):
        assert q.keys is not None
        long, start, n, ords = shard.list_heads(q.bins, q.keys, ordinal, q.replaced)
        idx = np.repeat(start, n) + (np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n))
        out.long, out.n, out.ords = long.copy(), n.copy(), ords[idx]
    post = shard.stage_removal(msg.post) if msg.post else None
    if msg.put_sketch:
        assert q.sketch is not None
        shard.near.put_sketch(shard.batch(), ordinal, q.sketch)
    mine = shard.stage(ordinal, msg.windows)
    shard.settling = (ordinal, post, mine)
    return out


def settle(shard: IndexShard) -> None:
    """After the batch ``answer`` staged is written: the shard's memory follows."""
    if shard.settling is None:
        return
    ordinal, post, mine = shard.settling
    shard.settling = None
    if post is not None:
        shard.passages.commit_removal(post)
    shard.commit(ordinal, mine)


class RemoteShard:
    """The fan-in's view of shard s: answers the calls ``ShardedNear`` and
    ``ShardedPassages`` make to a shard from the partial the shard process sent."""

    def __init__(self, shard: int, n_shards: int) -> None:
        self.shard, self.n_shards = shard, n_shards
        self.partial: Partial | None = None

    def verify(self, state: NearState, candidates: list[tuple[int, int]]
               ) -> list[tuple[int, int, float]]:
        assert self.partial is not None
        return list(self.partial.near)

    def list_heads(self, bins: I64, keys: U64, before: int, replaced: int | None
                   ) -> tuple[npt.NDArray[np.bool_], I64, I64, I64]:
        p = self.partial
        assert p is not None and p.long is not None and p.n is not None and p.ords is not None
        if len(p.n) != len(bins):
            raise ValueError(f"shard {self.shard}'s partial for sequence record {p.seq} has "
                             f"{len(p.n)} lists, the page names {len(bins)} there")
        return p.long, np.cumsum(p.n) - p.n, p.n, p.ords


class Outbox:
    """The keys messages of one sequence record, one per shard, as the fan-in makes them."""

    def __init__(self, n_shards: int) -> None:
        self.n_shards = n_shards
        self.closing = False  # what is written now is the record's last batch
        self.begin(-1)

    def begin(self, seq: int, messages: list[ShardMessage] | None = None) -> None:
        self.seq = seq
        self.messages = messages or [ShardMessage(seq) for _ in range(self.n_shards)]
        self.queried = False
        self.page: dict[str, Any] | None = None  # what deciding the page needs again
        self.complete = False  # the store holds the messages marked complete

    @property
    def empty(self) -> bool:
        return all(m.empty for m in self.messages)

    def remove(self, ordinals: list[int]) -> None:
        for m in self.messages:
            (m.post if self.queried else m.pre).extend(int(o) for o in ordinals)

    def persist(self, batch: Batch) -> None:
        """The record's messages (and what deciding its page needs) into the batch that
        writes what they tell the shards: after a crash they are sent again
        (``FanInIndexer.recover``), whether the transaction that sent them committed or
        not; a shard answers a message it applied from its stored partial. ``complete``:
        the record ends with this batch (``FanInIndexer.recover`` must not guess it from
        the sequence offset, which a record after an unfinished page does not store)."""
        batch.put("meta", OUTBOX_PREFIX + u64(self.seq), msgpack.packb({
            "messages": [[s, m.to_bytes()] for s, m in enumerate(self.messages)
                         if not m.empty],
            "page": self.page, "complete": self.closing}, use_bin_type=True))
        self.complete = self.closing


class RemoteNear(ShardedNear):
    """The fan-in's near index: the PSM table and the volatility model here; a page's
    candidates go to the shards that own them in the keys messages, their verification
    comes back in the partials."""

    def __init__(self, store: Store, config: EngineConfig, next_ordinal: int,
                 shards: list[RemoteShard], outbox: Outbox) -> None:
        super().__init__(store, config, next_ordinal, shards)  # type: ignore[arg-type]
        self.outbox = outbox
        self.answering = False

    def search(self, state: NearState, ordinal: int) -> list[tuple[int, int, float]]:
        assert self.answering
        return [f for shard in self.shards for f in shard.verify(state, [])]

    def refresh(self, state: NearState) -> None:
        if not self.answering:  # (the idf table may have changed since the page's turn)
            super().refresh(state)

    def put_sketch(self, batch: Batch, ordinal: int, sketch: U64) -> None:
        self.outbox.messages[page_owner(ordinal, len(self.shards))].put_sketch = True

    def sketch_of(self, ordinal: int) -> U64 | None:
        assert self.answering
        shard = self.shards[page_owner(ordinal, len(self.shards))]
        assert isinstance(shard, RemoteShard) and shard.partial is not None
        return shard.partial.prev_sketch


class RemotePassages(ShardedPassages):
    """The fan-in's passage index: the pages' full forward records here (align reads them),
    their windows sent to the shards that own the lists, the heads read from the
    partials (``ShardedPassages.list_heads`` over ``RemoteShard``)."""

    def __init__(self, store: Store, config: EngineConfig, shards: list[RemoteShard],
                 outbox: Outbox) -> None:
        super().__init__(store, config, shards)  # type: ignore[arg-type]
        self.outbox = outbox

    def stage(self, batch: Batch, ordinal: int, state: PassageState | None) -> None:
        self.stage_forward(batch, ordinal, state)
        for m, part in zip(self.outbox.messages, owned_parts(state, len(self.shards)),
                           strict=True):
            m.windows = part
        self.outbox.persist(batch)  # the page's batch: its last write

    def commit(self, ordinal: int, state: PassageState | None) -> None:
        pass

    def stage_removal(self, batch: Batch, ordinals: list[int]) -> Removal:
        dead = self.stage_forward_removal(batch, ordinals)
        self.outbox.remove(dead.tolist())
        self.outbox.persist(batch)
        return Removal(dead, np.zeros(0, np.int64), np.zeros(0, np.uint64))

    def commit_removal(self, removal: Removal) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return PassageIndex.stats(self)


class FanInIndexer(Indexer):
    """The index role's ``Indexer`` when the index is split over S shard processes: the
    page directory (``ShardedIndexer``'s fan-in) in ``store``; for each sequence record
    (``begin``), ``index`` decides what it can from the directory (replay, delete, revisit,
    exact) and writes the page, and ``take`` hands over the keys messages; once the S
    partials of a page are in, ``decide`` finds its matches and tasks with
    ``Indexer._decide``; ``finish`` then stores them as for any page."""

    def __init__(self, store: Store, config: EngineConfig, n_shards: int) -> None:
        super().__init__(store, config)
        self.n_shards = n_shards
        self.remote = [RemoteShard(i, n_shards) for i in range(n_shards)]
        self.outbox = Outbox(n_shards)
        self.near = RemoteNear(store, config, self.next_ordinal, self.remote, self.outbox)
        self.passages = RemotePassages(store, config, self.remote, self.outbox)
        self.queries: dict[int, Query] = {}  # seq -> a page whose partials are awaited
        # seq -> a page not finished before a crash, to decide again (``recover``)
        self.resumable: dict[int, tuple[IndexResult, dict[str, Any]]] = {}
        # a record cut short by a crash (``recover``): its seq, its messages so far
        self.carried: tuple[int, list[ShardMessage]] | None = None

    def begin(self, seq: int) -> None:
        """What follows (a retention sweep, ``index``) is sequence record ``seq``."""
        carried = self.carried
        if carried is not None and carried[0] == seq:  # read again: goes on where it was
            self.carried = None
            self.outbox.begin(seq, carried[1])
        else:
            self.outbox.begin(seq)

    def index(self, sk: PageSketch, source: tuple[str, int, int] | None = None,
              defer: bool = False) -> IndexResult:
        """``Indexer.index``, the record's last step: what it writes (the page's batch, a
        delete's removal) marks the record's messages complete in the same batch. When it
        writes nothing (a replay, an unchanged revisit, a delete of a page not stored)
        after a sweep wrote messages, one more batch marks them: without the mark, a crash
        would leave the record to be taken for one cut short (``recover``)."""
        self.outbox.closing = True
        try:
            result = super().index(sk, source, defer)
            if not self.outbox.complete and not self.outbox.empty:
                batch = self.store.batch()
                self.outbox.persist(batch)
                self.store.write(batch)
        finally:
            self.outbox.closing = False
        return result

    def take(self) -> list[tuple[int, ShardMessage]]:
        """The keys messages of the current sequence record, by shard (none: nothing for
        the shards, e.g. a replay or an unchanged revisit)."""
        out = [(s, m) for s, m in enumerate(self.outbox.messages) if not m.empty]
        self.outbox.begin(self.outbox.seq)
        return out

    def awaits(self, seq: int) -> bool:
        return seq in self.queries

    def _decide(self, q: Query) -> bool:
        """Record the page's query for the shards; decided later (``decide``)."""
        sk, prev, ordinal, n = q.sk, q.prev, q.ordinal, self.n_shards
        near_state, passage_state = q.near_state, q.passage_state
        queries = [ShardQuery() for _ in range(n)]
        if prev is not None:
            if sk.near is not None:  # as ``_changed`` does (the table in force now)
                self.near.refresh(sk.near)
            queries[page_owner(prev.ordinal, n)].prev = prev.ordinal
            for sq in queries:
                sq.replaced = prev.ordinal
        if near_state is not None:
            candidates = self.near.candidates(near_state, ordinal)
            for c in candidates:
                queries[page_owner(c[0], n)].candidates.append(c)
            if near_state.sketch is not None:
                for s, sq in enumerate(queries):
                    if sq.candidates or s == page_owner(ordinal, n):
                        sq.sketch = near_state.sketch
        if passage_state is not None and passage_state.rects is not None:
            _, _, l_bins, l_keys, _ = query_lists(passage_state)
            owner = list_owner(l_bins, l_keys, n)
            for s, sq in enumerate(queries):
                mine = np.flatnonzero(owner == s)
                sq.bins, sq.keys = l_bins[mine], l_keys[mine]
        for m, sq in zip(self.outbox.messages, queries, strict=True):
            m.ordinal, m.query = ordinal, sq
        self.outbox.queried = True
        self.outbox.page = {"prev": None if prev is None else [
            prev.ordinal, prev.doc_id, prev.content_hash, prev.simhash, prev.url,
            prev.fetched_at, prev.replay_key], "original": q.original,
            # under the idf table in force now (a later page may freeze another)
            "fingerprint": None if sk.near is None else sk.near.fingerprint}
        self.queries[self.outbox.seq] = q
        return False

    def _put_matches(self, batch: Any, ordinal: int, matches: list[Match],
                     source: tuple[str, int, int] | None) -> None:
        """A page's matches are stored in sequence order: the messages of the records up
        to it are in the shards (its partials came), so they are not kept any more."""
        super()._put_matches(batch, ordinal, matches, source)
        if source is not None:
            batch.delete_range("meta", OUTBOX_PREFIX, OUTBOX_PREFIX + u64(source[2] + 1))

    def recover(self, stored: int | None, published: int
                ) -> tuple[int | None, list[tuple[int, int, ShardMessage]]]:
        """On taking the store over, whose sequence offset is ``stored``: the offset below
        which every sequence record's changes are in the store (its unfinished pages too),
        and the messages of the records from ``published`` on to send again (seq, shard,
        message), in order. The pages not finished are decided again once read again
        (``resume``), those below ``published`` too (another fan-in published past them
        since this store was last used: the shards have their messages, their partials
        are in the retained topic; ``first_resumable``). A record cut short by a crash (a
        retention sweep written, not the page after it: its messages were never sent) is
        not sent, nor counted in the offset: read again, it goes on from its messages so
        far (``begin``), its sweep is due there again (the schedule goes on from the last
        record before it) and finishes, and it is sent once, whole. Only the last entry
        can be one, and only if it is not marked complete (``index``) nor covered by the
        offset: a delete after an unfinished page stores no offset, and taken for cut
        short it was applied again after the records before it, which then saw it."""
        unfinished = {}
        for _, raw in self.store.items("unfinished"):
            result = IndexResult.from_bytes(raw)
            assert result.source is not None
            unfinished[result.source[2]] = result
        entries = [(read_u64(key, len(OUTBOX_PREFIX)), msgpack.unpackb(raw, raw=False))
                   for key, raw in self.store.prefix("meta", OUTBOX_PREFIX)]
        self.carried = None
        # (an entry written before the mark existed: complete if its page is unfinished)
        if entries and (stored or 0) <= entries[-1][0] and not entries[-1][1].get(
                "complete", entries[-1][0] in unfinished):
            seq, d = entries.pop()
            messages = [ShardMessage(seq) for _ in range(self.n_shards)]
            for s, m in d["messages"]:
                messages[s] = ShardMessage.from_bytes(m)
            self.carried = (seq, messages)
        out: list[tuple[int, int, ShardMessage]] = []
        self.resumable = {}
        for seq, d in entries:
            if seq >= published:
                out += [(seq, s, ShardMessage.from_bytes(m)) for s, m in d["messages"]]
            if seq in unfinished:
                self.resumable[seq] = (unfinished.pop(seq), d["page"])
        if unfinished:
            raise StoreMismatch(f"pages {sorted(unfinished)[:5]} of the index fan-in's store "
                                "are not finished and their shard messages are not kept")
        if entries:
            stored = max(stored or 0, entries[-1][0] + 1)
        return stored, out

    def first_resumable(self) -> int | None:
        """The first page ``recover`` found not finished (None: every page is)."""
        return min(self.resumable, default=None)

    def will_resume(self, seq: int) -> bool:
        return seq in self.resumable

    def resume(self, seq: int, sk: PageSketch) -> IndexResult | None:
        """A page of the store not finished before the crash, read again: it waits for its
        partials (sent again by ``recover``) to be decided as it would have been."""
        got = self.resumable.pop(seq, None)
        if got is None:
            return None
        result, page = got
        p = page["prev"]
        prev = None if p is None else StoredVersion(p[0], p[1], bytes(p[2]), p[3], p[4], p[5],
                                                    None if p[6] is None else bytes(p[6]))
        assert result.ordinal is not None
        if sk.near is not None and page["fingerprint"] is not None:
            sk.near.fingerprint = page["fingerprint"]  # as when it was indexed
        self.queries[seq] = Query(result, sk, prev, page["original"], result.ordinal)
        return result

    def decide(self, seq: int, partials: list[Partial]) -> IndexResult:
        """The page's matches and tasks from its shards' partials (one per shard)."""
        q = self.queries.pop(seq)
        for shard, p in zip(self.remote, sorted(partials, key=lambda p: p.shard), strict=True):
            shard.partial = p
        self.near.answering = True  # type: ignore[attr-defined]
        try:
            Indexer._decide(self, q)
        finally:
            self.near.answering = False  # type: ignore[attr-defined]
            for shard in self.remote:
                shard.partial = None
        return q.result

    def unfinished_results(self) -> list[IndexResult]:
        """The fan-in finishes its pages itself (worker/role_index.py)."""
        if "unfinished" not in self.store._cfs:
            return []
        self.unfinished = sum(1 for _ in self.store.items("unfinished"))
        return []


PARTIAL_PREFIX = b"partial/"  # meta of a shard's store: seq -> the partial it answered
APPLIED_KEY = b"applied_seq"  # meta of a shard's store: the last sequence record applied


class ShardStore:
    """One index shard as a process of its own keeps it (worker/role_shard.py): its
    ``IndexShard`` over ``<store_dir>/shards/<shard>``, the last sequence record it applied,
    and the partials of its last ``kept`` pages, written in the batch of each page with the
    input offset: a keys message read again (the store ran ahead of the committed input
    before a crash, or the fan-in sent it again) is answered with the same partial."""

    def __init__(self, store_dir: str | Path, config: EngineConfig, shard: int, n_shards: int,
                 kept: int) -> None:
        from dupalign.config import IMPLIED_PARAMS, PARAM_UPGRADES

        config = config.validate()
        self.store = Store(shard_dir(store_dir, shard), config.frozen_params(),
                           implied=IMPLIED_PARAMS, upgrades=PARAM_UPGRADES,
                           block_cache_bytes=config.cache.blocks_mb << 20)
        try:
            _check_shard(self.store, shard, n_shards, False)
        except BaseException:
            self.store.close()
            raise
        self.shard = IndexShard(self.store, config, shard, n_shards)
        raw = self.store.get("meta", APPLIED_KEY)
        self.applied = -1 if raw is None else read_u64(raw)
        self.kept_max = kept
        self.kept = deque(read_u64(k, len(PARTIAL_PREFIX))
                          for k, _ in self.store.prefix("meta", PARTIAL_PREFIX))

    def offset(self, topic: str, partition: int) -> int | None:
        """The next input offset after the last record applied (None: a new store)."""
        raw = self.store.get("offsets", offsets_key(topic, partition))
        return None if raw is None else read_u64(raw)

    def apply(self, msg: ShardMessage, source: tuple[str, int, int]) -> Partial | None:
        """Apply the keys message read at ``source`` (its partial, if it is a page's); one
        read before (``seq`` at or below the last applied) is answered from the store."""
        if msg.seq <= self.applied:
            if msg.ordinal is None:
                return None
            raw = self.store.get("meta", PARTIAL_PREFIX + u64(msg.seq))
            if raw is None:
                raise StoreMismatch(
                    f"shard {self.shard.shard}: the keys message of sequence record {msg.seq} "
                    f"came again, but its partial is not kept any more (the last "
                    f"{self.kept_max}: kafka.shard_partials_kept)")
            return Partial.from_bytes(raw)
        out = answer(self.shard, msg)
        batch = self.shard.batch()
        batch.put("meta", APPLIED_KEY, u64(msg.seq))
        batch.put("offsets", offsets_key(source[0], source[1]), u64(source[2] + 1))
        if out is not None:
            batch.put("meta", PARTIAL_PREFIX + u64(msg.seq), out.to_bytes())
            self.kept.append(msg.seq)
            while len(self.kept) > self.kept_max:
                batch.delete("meta", PARTIAL_PREFIX + u64(self.kept.popleft()))
        self.shard.flush()
        settle(self.shard)
        self.applied = msg.seq
        return out

    def close(self) -> None:
        self.store.close()
