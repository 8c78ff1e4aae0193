"""The index role's fan-in over S shard processes (the Kafka topology): its view of the
shards (``RemoteShard``: what their partials say), the keys messages of one sequence record
as it makes them (``Outbox``, persisted with the page's batch so a crash sends them again),
and ``FanInIndexer``, the ``Indexer`` that sends a page's query to the shards and decides
the page once their partials are in (dupalign/service/roles/shard_protocol.py has the messages).
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import numpy.typing as npt

from dupalign.config import EngineConfig
from dupalign.errors import StoreMismatch
from dupalign.match import Match
from dupalign.near.index import NearState
from dupalign.passage.index import PassageIndex, Removal
from dupalign.passage.sketch import PassageState, query_lists
from dupalign.service.roles.shard_protocol import Partial, ShardMessage, ShardQuery
from dupalign.stages.index import Indexer
from dupalign.stages.list_shard import list_owner, owned_parts
from dupalign.stages.messages import IndexResult, Query, StoredVersion
from dupalign.stages.shards import (
    I64,
    U64,
    ShardedNear,
    ShardedPassages,
    page_owner,
)
from dupalign.stages.sketch import PageSketch
from dupalign.store.database import Batch, Store
from dupalign.store.records import log_delete_below, log_items, log_put, unfinished_records


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
        log_put(batch, "outbox", self.seq, msgpack.packb({
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
        elif sk.near is not None and sk.near.indexed:  # an exact copy keeps its sketch
            queries[page_owner(ordinal, n)].sketch = sk.near.sketch  # (``NearIndex.keep``)
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
            log_delete_below(batch, "outbox", source[2] + 1)

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
        for raw in unfinished_records(self.store):
            result = IndexResult.from_bytes(raw)
            assert result.source is not None
            unfinished[result.source[2]] = result
        entries = [(seq, msgpack.unpackb(raw, raw=False))
                   for seq, raw in log_items(self.store, "outbox")]
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
        """The fan-in finishes its pages itself (dupalign/service/roles/index.py)."""
        self.unfinished = sum(1 for _ in unfinished_records(self.store))
        return []

