"""The index role: the one stage with state. It applies the pages' sketches in ordinal order
to its store (dupalign.stages.index.Indexer), sends alignment requests, takes back their results
and publishes each page's matches, finished in ordinal order as ``Engine.process`` does.

Inputs (one consumer, co-partitioned sticky assignment, dupalign/service/sticky.py: partition
0 of the three topics goes to one group member, the shard's owner, and stays with it while
it is a member; other index processes are standbys):

* ``sequence``: the order. Its read_committed records are the ordinals to apply, in order;
  an aborted ordinal is never seen, so never waited for.
* ``sketches``: ``PageSketch`` per ordinal, in any order (several sketch processes write
  concurrently); buffered until the sequence reaches them.
* ``aligned``: align results per ordinal; the first one for a page still waiting is taken.

Checkpoint (one transaction per loop turn, transactional id of the sequence partition):
the align requests and matches produced, and the offsets: ``sequence`` at the first page
whose matches are not published yet (E), ``sketches`` at the lowest offset of a sketch of a
page at or after E, ``aligned`` at its position. The store may run ahead of E (it is written
first): after a crash, pages from E on are read again and the ones in the store are
answered from it (the engine's replay check; ``Engine.open`` first finishes, aligning
locally, any page whose align result never came), so their matches are published exactly
once. So aligned results are never needed twice.

Recovery of a shard (a standby taking over, a fresh store directory, a store restored from
a backup): when the store's sequence offset S is below E, the role replays ``sequence`` from
S and ``sketches`` from the beginning (both retained), indexing and aligning locally and
publishing nothing below E, then goes on as usual. No other state exists: the store is a
cache of the retained input.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from dupalign.config import EngineConfig
from dupalign.errors import PageRejected
from dupalign.runtime.engine import Engine, Source
from dupalign.service.config import Config
from dupalign.service.loop import Checkpoint, Listener, rebalance_timeout_ms, ride_out, run_loop
from dupalign.service.outage import within
from dupalign.service.parts import PartsByOrdinal, in_parts
from dupalign.service.roles.fan_in import FanInIndexer
from dupalign.service.roles.index_align import AlignExchange, Waiting
from dupalign.service.roles.index_lifecycle import Lifecycle
from dupalign.service.roles.index_takeover import Takeover
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.service.roles.shard_protocol import Partial
from dupalign.service.sticky import claim_path, leaving, sticky
from dupalign.service.topics import topology_topics
from dupalign.service.topology import (
    Outgoing,
    decode_aligned,
    decode_sequence,
    ensure_topics,
    new_consumer,
    ordinal_header,
    published,
    record_limit,
    record_ordinal,
    stop_quietly,
)
from dupalign.stages.sketch import PageSketch
from dupalign.store.database import Store
from dupalign.wire.forward_record import forward_key

log = logging.getLogger("dupalign.roles.index")

class IndexRole(AlignExchange, Lifecycle, Takeover):
    name = "index"

    def __init__(self, config: Config, store_dir: str | Path,
                 metrics: RoleMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else RoleMetrics()
        self.metrics.add_role(self.name)
        self.started = False  # consuming (for /readyz; a standby is ready too)
        self.kc = kc = config.kafka
        self.outage = self.metrics.outage(kc.max_outage_s, kc.outage_backoff_max_s)
        self.limit_s = kc.request_timeout_ms / 1000
        self.align_limit = kc.max_request_size  # the largest align request (see run)
        self.forward_limit = kc.max_request_size  # the largest forward record
        self.keys_limit = kc.max_request_size  # the largest keys record (index shards)
        self.align_parts = kc.align_partitions  # the align topic's partitions (see run)
        self.tombstones: list[int] = []  # pages removed from the store this turn
        self.sent_below = 0  # the store's next ordinal when the turn's records were made
        self.store_dir = Path(store_dir)
        self.group_id = f"{kc.group_id}-index"
        self.seq_tp = TopicPartition(kc.sequence_topic, 0)
        self.sketch_tp = TopicPartition(kc.sketch_topic, 0)
        self.aligned_tp = TopicPartition(kc.aligned_topic, 0)
        self.tps = {self.seq_tp, self.sketch_tp, self.aligned_tp}
        # index shards (kafka.index_shards > 1): this role is their fan-in
        self.n_shards = kc.index_shards
        self.partials_tp = TopicPartition(kc.partials_topic, 0)
        if self.n_shards > 1:
            self.tps.add(self.partials_tp)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="index")
        self.engine: Engine | None = None
        self.producer: AIOKafkaProducer | None = None
        self.consumer: Any = None
        self.strategy: tuple[Any, ...] = ()  # the consumer's assignors
        self.busy = asyncio.Lock()
        self.generation = 0
        self.stopping = asyncio.Event()
        self.failure: BaseException | None = None
        self.taking = False  # the shard assigned, not taken over yet (``Takeover``)
        self.max_waiting = 4 * max(1, config.worker.batch_size) * 8
        # a turn takes batch_size pages' worth of records: each page brings its sequence
        # record, its sketch, its align answer and a partial per shard (one transaction a
        # turn, so batch_size records a turn held the fan-in to ~batch_size / 6 pages)
        self.turn_records = max(1, config.worker.batch_size) * (
            3 + (self.n_shards if self.n_shards > 1 else 0))
        self.published = 0  # pages whose matches were committed, this process
        self.fan_in: FanInIndexer | None = None  # the engine's index stage with shards
        self._reset(0, 0)

    def _reset(self, start: int, silent_below: int) -> None:
        self.expected: deque[tuple[int, Source]] = deque()  # sequence read, not applied
        # per source (pages topic, partition, offset) in ``expected``: its last ordinal
        self.latest_of_source: dict[Source, int] = {}
        self.last_sketch = -1  # the highest ordinal whose sketch was read
        self.sketches: dict[int, tuple[int, bytes]] = {}  # ordinal -> (offset, sketch)
        self.sketch_parts = PartsByOrdinal()  # sketches sent as parts, not all read yet
        self.waiting: deque[Waiting] = deque()
        self.by_ordinal: dict[int, Waiting] = {}
        self.partials: dict[int, dict[int, Partial]] = {}  # ordinal -> shard -> partial
        self.resend: list[Outgoing] = []  # index shards: messages sent again on a takeover
        self.floor = start  # sketches of lower ordinals are not needed
        self.silent_below = silent_below  # rebuilding: publish nothing below this ordinal
        self.applying = start  # the sequence record being applied (its removals' owner)
        self.rebuilt = False
        self.seq_read = start  # the sequence consumer's position (next offset it returns)
        self.read_ahead = 0  # the most sequence records read and not applied yet
        self.owner = False
        self.last_offsets: dict[TopicPartition, int] = {}
        self._resume_lifecycle(None)

    def stop(self) -> None:
        self.stopping.set()
        leaving(self.strategy)

    # -- life cycle -----------------------------------------------------------------------
    async def run(self) -> None:
        counts = await ensure_topics(self.kc, topology_topics(self.kc),
                                     self.config.worker.max_message_bytes)
        self.align_parts = counts[self.kc.align_topic]
        self.align_limit = await record_limit(self.kc, self.kc.align_topic)
        self.forward_limit = await record_limit(self.kc, self.kc.forward_topic)
        if self.n_shards > 1:
            self.keys_limit = await record_limit(self.kc, self.kc.keys_topic)
        self.strategy = sticky(claim_path(self.store_dir, self.group_id))
        consumer = self.consumer = new_consumer(
            self.kc, self.group_id, self.turn_records,
            rebalance_timeout_ms=rebalance_timeout_ms(self.kc),
            # co-partitioned (partition i of every input topic to the same member) and
            # sticky: a standby that joins does not take the shard (it would rebuild it)
            partition_assignment_strategy=self.strategy)
        consumer.subscribe(sorted(t.topic for t in self.tps), listener=Listener(self))
        await consumer.start()
        self.started = True
        log.info("index role started (group %s, store %s)", self.group_id, self.store_dir)
        try:
            await run_loop(self, consumer, self.turn_records, self._turn, self._wanted,
                           outage=self.outage)
        finally:
            await self._close()

    async def _turn(self, batches: dict[TopicPartition, list[Any]]) -> None:
        """The shard taken over once assigned (its partitions were paused: nothing was
        fetched for it), then worked on; a fenced producer steps down (``Takeover``), and
        so does a failure while Kafka is away (``ride_out``: taken over afresh after it)."""
        try:
            if self.taking:
                await self._take_over()
                self.outage.succeeded()
            elif self.owner:
                await self._work(batches)
        except KafkaError as exc:
            await ride_out(self.outage, exc, "a turn of the index role", self._step_down)

    async def _work(self, batches: dict[TopicPartition, list[Any]]) -> None:
        """Route the turn's records, advance the index, then one checkpoint: the records
        made and the offsets (``_offsets``), when either changed."""
        loop = asyncio.get_running_loop()
        for tp, records in batches.items():
            self.metrics.consumed(self.name, tp.topic, records)
            self._route(tp, records)
        out = await loop.run_in_executor(self.executor, self._advance)
        self.seq_read = await self.consumer.position(self.seq_tp)
        self._gauges()
        if self._rebuilding():
            assert not out, "a turn still rebuilding produced records"
            return  # nothing to publish, nothing to commit
        if self.silent_below and not self.rebuilt:
            self.rebuilt = True
            log.info("index store rebuilt up to ordinal %d (the sequence read at most "
                     "%d records ahead)", self.silent_below, self.read_ahead)
        offsets = await self._offsets()
        if not out and offsets == self.last_offsets:
            return
        assert self.producer is not None
        sent_below = self.sent_below

        async def noted() -> None:
            if self.engine is not None:  # every page below has its forward record out
                await loop.run_in_executor(self.executor, self._note_forward_sent, sent_below)
            if offsets[self.seq_tp] != self.published and self.engine is not None:
                # the resume point should the group lose its offsets
                await loop.run_in_executor(self.executor, self.engine.set_checkpoint,
                                           self.seq_tp.topic, 0, offsets[self.seq_tp])

        unit = Checkpoint(dict(offsets), out, after=noted)
        async with self.metrics.transaction(self.name):
            await within(unit.commit(self.producer, self.group_id,
                                     None if self.kc.transactions else self.consumer),
                         self.limit_s)
        self.outage.succeeded()
        self.metrics.produced(self.name, out)
        self.last_offsets = offsets
        self.published = offsets[self.seq_tp]
        await self._audit()

    async def _audit(self) -> None:
        """The recall audit of the pages sampled (``engine.audit.sample``), once their
        matches are committed, as the single worker does after a batch. The index role
        holds what it reads: the fingerprint table, the lists, every forward record. With
        index shards the lists are the shards': not audited (``audit_default`` 0 there)."""
        engine = self.engine
        if engine is None or engine.audit is None or self.n_shards > 1:
            return
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self.executor, engine.run_audits)
        if results:
            tally = await loop.run_in_executor(self.executor, engine.audit_tally)
            self.metrics.audit.audited(results, tally.estimates())

    async def _close(self) -> None:
        await stop_quietly(self.consumer)
        await self._release()
        self.executor.shutdown(wait=True)

    # -- the work -------------------------------------------------------------------------
    def _route(self, tp: TopicPartition, records: list[Any]) -> None:
        for rec in records:
            if tp == self.seq_tp:
                _, source = decode_sequence(rec.value)
                self.expected.append((rec.offset, source))
                self.latest_of_source[source] = rec.offset
                self.read_ahead = max(self.read_ahead, len(self.expected))
                self.sequenced_at[rec.offset] = rec.timestamp  # retention's clock
                continue
            if tp == self.partials_tp:
                partial = Partial.from_bytes(rec.value)
                waiting = self.by_ordinal.get(partial.seq)
                fan_in = None if self.engine is None else self.fan_in
                # a page it waits for, or one to resume after a takeover, whose partial
                # can come before the page is read again, or (rebuilding) a page the
                # replay has not reached; the first one wins
                if (waiting is not None and waiting.undecided) or (
                        fan_in is not None and fan_in.will_resume(partial.seq)
                ) or self.floor <= partial.seq < self.silent_below:
                    self.partials.setdefault(partial.seq, {}).setdefault(partial.shard, partial)
                continue
            ordinal = record_ordinal(rec)
            if tp == self.sketch_tp:
                if ordinal >= self.floor and (whole := self.sketch_parts.add(ordinal, rec)):
                    self.last_sketch = max(self.last_sketch, ordinal)
                    self.sketches[ordinal] = whole
            else:
                waiting = self.by_ordinal.get(ordinal)
                if waiting is not None and waiting.passages is None:
                    try:
                        self._answer(waiting, decode_aligned(rec.value))
                    except Exception:  # another wire version (an upgrade), a broken
                        # record: it would stop the role at every start; aligned here
                        log.exception("aligned record %s:%d:%d unreadable: page %d is "
                                      "aligned by the index", tp.topic, tp.partition,
                                      rec.offset, ordinal)
                        waiting.align_here = True

    def _advance(self) -> list[Outgoing]:
        """Runs in the index thread: apply the sketches the sequence has reached, in order,
        then publish the matches of the waiting pages that are ready, in order."""
        engine = self.engine
        assert engine is not None
        fan_in = self.fan_in
        out: list[Outgoing] = []
        if not self._rebuilding():  # (a rebuilding turn commits nothing: sent after it)
            out, self.resend = self.resend, []
        while self.expected:
            ordinal, source = self.expected[0]
            if ordinal not in self.sketches:
                if not self._superseded(ordinal, source):
                    break  # its sketch is on its way
                self._pop_expected()
                self.sequenced_at.pop(ordinal, None)
                self.floor = ordinal + 1
                log.warning("ordinal %d is skipped: its page (%s) was sequenced again at "
                            "ordinal %d, whose sketch came first; its own never will (an "
                            "at-least-once sketch process stopped between its sends)",
                            ordinal, ":".join(map(str, source)),
                            self.latest_of_source[source])
                continue
            if ordinal >= self.silent_below and self._rebuilding():
                # (the fan-in: pages below E wait for partials) pages from E on send
                # messages, which a rebuilding turn does not: they wait until it is over
                break
            sk = PageSketch.from_bytes(self.sketches[ordinal][1])
            if self._must_wait(ordinal, sk):
                break  # until the pages it waits for are published (a later turn)
            self._pop_expected()
            sketch_offset, _ = self.sketches.pop(ordinal)
            self.floor = ordinal + 1
            if fan_in is not None:
                fan_in.begin(ordinal)  # the shards' messages of this sequence record
            self.applying = ordinal  # (removals from here on are this page's)
            if self._lifecycle(ordinal, sk):
                self._to_shards(out, ordinal)
                continue
            if fan_in is not None and (resumed := fan_in.resume(ordinal, sk)) is not None:
                # indexed before a crash, not finished: decided from its partials again
                waiting = Waiting(ordinal, source, sketch_offset, resumed, undecided=True)
                self.waiting.append(waiting)
                self.by_ordinal[ordinal] = waiting
                continue
            at = (self.seq_tp.topic, 0, ordinal)
            if ordinal < self.silent_below and fan_in is None:
                # rebuilding what was published (the fan-in: below, from the partials)
                result = engine.index(sk, at, defer=True)
                with contextlib.suppress(PageRejected):
                    engine.finish(result, engine.align(result))
                continue
            result = engine.index(sk, at)
            if result.ordinal is not None and ordinal >= self.silent_below:
                self._forward(out, result.ordinal, sk.id)
            waiting = Waiting(ordinal, source, sketch_offset, result)
            if self._to_shards(out, ordinal):
                waiting.undecided = True  # decided once its shards' partials are in
            else:
                self._request(waiting, out)
            self.waiting.append(waiting)
            self.by_ordinal[ordinal] = waiting
        if fan_in is not None:
            for waiting in self.waiting:  # the pages whose partials are all in
                got = self.partials.get(waiting.ordinal, {})
                if waiting.undecided and len(got) == self.n_shards:
                    fan_in.decide(waiting.ordinal, list(got.values()))
                    del self.partials[waiting.ordinal]
                    waiting.undecided = False
                    if waiting.ordinal < self.silent_below:  # rebuilding: aligned here
                        if waiting.result.align is not None:
                            waiting.passages = engine.align(waiting.result)
                    else:
                        self._request(waiting, out)
        for waiting in self.waiting:
            if waiting.align_here and waiting.passages is None:
                waiting.passages = engine.align(waiting.result)
        out.extend(Outgoing(self.kc.forward_topic, None, key=forward_key(o),
                            partition=o % self.align_parts) for o in self.tombstones)
        self.tombstones = []
        self.sent_below = engine.next_ordinal
        now = int(time.time() * 1000)
        while self.waiting and self.waiting[0].ready:
            waiting = self.waiting.popleft()
            del self.by_ordinal[waiting.ordinal]
            try:
                matches = engine.finish(waiting.result, waiting.passages or [])
            except PageRejected:  # the sketch role dead-letters these: never sequenced
                matches = []
            if waiting.ordinal < self.silent_below:
                continue  # rebuilt: published before
            self._count_revisits(matches)
            out.extend(published(self.kc, waiting.result.doc_id, matches, waiting.source, now))
        return out

    def _head_may_be_superseded(self) -> bool:
        """At-least-once: the first sequence record not applied has no sketch though later
        ones have theirs, so it may never get one; only a later record of its source,
        maybe further than the read-ahead bound, can tell (``_superseded``): the sequence
        is read on. (Memory grows only while such a record holds the head.)"""
        return (not self.kc.transactions and bool(self.expected)
                and self.expected[0][0] not in self.sketches
                and self.last_sketch > self.expected[0][0])

    def _pop_expected(self) -> None:
        ordinal, source = self.expected.popleft()
        if self.latest_of_source.get(source) == ordinal:
            del self.latest_of_source[source]

    def _superseded(self, ordinal: int, source: Source) -> bool:
        """Whether the sequence record ``ordinal``, whose sketch has not come, never gets
        one. With transactions a sequence record and its sketch are committed together;
        at-least-once, a sketch process that stops between sending a batch's sequence
        records and their sketches leaves ordinals without one, and the next process
        sequences those pages again (from its group's offset). Once a later ordinal of
        the same source has its sketch, the earlier one's is not coming: both would be on
        the one sketches partition, in the order they were sent, and the first process was
        gone before the second read the page. Decided from the topics' order, so a replay
        skips the same ordinals (unless the first process was not gone but stalled past
        its session and sent that sketch after all, late: ignored here, a replay that
        reads both sketches before deciding applies the first; docs/topology.md)."""
        later = self.latest_of_source.get(source, ordinal)
        return later > ordinal and later in self.sketches

    def _to_shards(self, out: list[Outgoing], ordinal: int) -> bool:
        """The keys messages of the sequence record ``ordinal`` (index shards); whether the
        page awaits its shards' partials. Rebuilding, the messages are not sent again
        (the shards applied them before the matches below ``silent_below`` were
        published): the page is decided from the partials they answered then, read from
        the retained partials topic."""
        fan_in = self.fan_in
        if fan_in is None:
            return False
        taken = fan_in.take()
        if ordinal >= self.silent_below:
            out.extend(part for shard, message in taken
                       for part in self._keys(ordinal, shard, message))
        if fan_in.awaits(ordinal):
            return True
        self.partials.pop(ordinal, None)
        return False

    def _keys(self, ordinal: int, shard: int, message: Any) -> list[Outgoing]:
        """A keys message, as parts if it is over the keys topic's record limit (the
        windows of a big page)."""
        return in_parts(Outgoing(self.kc.keys_topic, message.to_bytes(), partition=shard,
                                 headers=[ordinal_header(ordinal)]), self.keys_limit)

    def _open_fan_in(self, store: Store, config: EngineConfig, n_shards: int) -> FanInIndexer:
        """The engine's index stage when the index is split over shard processes, kept
        here to drive it (``Engine.open``'s ``remote_shards``)."""
        self.fan_in = FanInIndexer(store, config, n_shards)
        return self.fan_in

    async def _offsets(self) -> dict[TopicPartition, int]:
        consumer = self.consumer
        if self.waiting:
            seq = self.waiting[0].ordinal
        elif self.expected:
            seq = self.expected[0][0]
        else:
            seq = await consumer.position(self.seq_tp)
        sketch_offsets = [w.sketch_offset for w in self.waiting]
        sketch_offsets += [offset for offset, _ in self.sketches.values()]
        if (incomplete := self.sketch_parts.lowest_offset(self.floor)) is not None:
            sketch_offsets.append(incomplete)
        sketch = min(sketch_offsets, default=await consumer.position(self.sketch_tp))
        offsets = {self.seq_tp: seq, self.sketch_tp: sketch,
                   self.aligned_tp: await consumer.position(self.aligned_tp)}
        if self.n_shards > 1:
            offsets[self.partials_tp] = await consumer.position(self.partials_tp)
        return offsets

    def _gauges(self) -> None:
        m = self.metrics
        applied = self.floor - 1
        seen = self.expected[-1][0] if self.expected else applied
        m.ordinal_seen.set(seen)
        m.ordinal_applied.set(applied)
        m.ordinal_lag.set(seen - applied)
        m.align_in_flight.set(sum(1 for w in self.waiting
                                  if w.result.align is not None and w.passages is None))
        rebuilding = self._rebuilding()
        m.rebuild_target.set(self.silent_below if rebuilding else 0)
        m.rebuild_ordinal.set(self.floor if rebuilding else 0)

    def _rebuilding(self) -> bool:
        """Replaying pages whose matches were published (a store behind E): until the last
        of them is finished, nothing is published or committed. (The sequence read past
        E - 1 tells the replay is over: the offsets before E may end with transaction
        markers, which are no pages.)"""
        pending = self.expected[0][0] if self.expected else self.seq_read
        return pending < self.silent_below or bool(
            self.waiting and self.waiting[0].ordinal < self.silent_below)

    def _wanted(self) -> list[TopicPartition]:
        """The partitions the next turn takes records from (backpressure; the others keep
        what was fetched for them, where a paused partition would drop it and fetch it
        again). No new pages while too many wait for align (their results still flow in:
        the aligned partition is always read). No more of the sequence while many of its
        records wait for their sketches: its records are tiny, so one fetch holds
        thousands (a replay read all of it at once); unless the first of them may never
        get one (``_head_may_be_superseded``). A fan-in rebuilding reads the
        partials topic from its beginning: no more of it while it holds many partials of
        pages not replayed yet, unless a replayed page still waits for one (shards that
        ran far apart put a page's partials far apart in the topic)."""
        if not self.owner:
            return []  # (a standby: nothing assigned)
        held = set()
        if len(self.waiting) >= self.max_waiting:
            held |= {self.seq_tp, self.sketch_tp}
        if len(self.expected) >= self.max_waiting and not self._head_may_be_superseded():
            held.add(self.seq_tp)
        if (self.n_shards > 1 and self._rebuilding() and len(self.partials) >= self.max_waiting
                and not any(w.undecided for w in self.waiting)):
            held.add(self.partials_tp)
        return sorted(self.tps - held)
