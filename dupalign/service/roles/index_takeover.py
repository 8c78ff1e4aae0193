"""How the index role takes its shard over, lets it go, and steps down when fenced.

aiokafka sends no heartbeat while a rebalance callback runs, and a takeover (fencing the
previous owner, opening the store, which finishes pages whose align answer never came,
sending forward records again, reading the committed offsets) takes seconds, more than a
session under load: a member doing it in the callback was expelled mid-takeover and the
shard went round the group. So ``on_assigned`` only pauses the partitions and notes the
shard; the loop's next turn takes it over (``_take_over``), heartbeats flowing, and
resumes them. A rebalance that comes meanwhile waits for it (``busy``), within the
consumer's rebalance timeout (dupalign/service/loop.py ``rebalance_timeout_ms``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition

from dupalign.config import WORKER_AUDIT_SAMPLE, EngineConfig
from dupalign.runtime.engine import Engine
from dupalign.service.config import Config, KafkaConfig
from dupalign.service.loop import FENCED, rejoin
from dupalign.service.outage import stop_within, within
from dupalign.service.roles.fan_in import FanInIndexer
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.service.topology import (
    Outgoing,
    TopologyError,
    committed_offsets,
    new_producer,
    require_retained,
    transactional_id,
)
from dupalign.store.database import Store

log = logging.getLogger("dupalign.roles.index")


class Takeover:
    """The ownership half of ``IndexRole`` (dupalign/service/roles/index.py)."""

    name: str
    config: Config
    kc: KafkaConfig
    metrics: RoleMetrics
    consumer: Any
    producer: AIOKafkaProducer | None
    engine: Engine | None
    fan_in: FanInIndexer | None
    executor: ThreadPoolExecutor
    busy: asyncio.Lock
    generation: int
    owner: bool
    taking: bool  # assigned, not taken over yet
    store_dir: Path
    group_id: str
    seq_tp: TopicPartition
    sketch_tp: TopicPartition
    aligned_tp: TopicPartition
    partials_tp: TopicPartition
    tps: set[TopicPartition]
    n_shards: int
    align_parts: int
    resend: list[Outgoing]
    limit_s: float  # one Kafka step, at most (``within``)

    # (the other halves of ``IndexRole``)
    def _reset(self, start: int, silent_below: int) -> None:
        raise NotImplementedError

    def _resume_lifecycle(self, stored: int | None) -> None:
        raise NotImplementedError

    def _keys(self, ordinal: int, shard: int, message: Any) -> list[Outgoing]:
        raise NotImplementedError

    def _open_fan_in(self, store: Store, config: EngineConfig, n_shards: int) -> FanInIndexer:
        raise NotImplementedError

    def _keyed_by(self, parts: int) -> None:
        raise NotImplementedError

    def _removed(self, ordinals: list[int]) -> None:
        raise NotImplementedError

    async def _send_forward_again(self, producer: AIOKafkaProducer, consumer: Any) -> None:
        raise NotImplementedError

    async def on_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        async with self.busy:
            self.generation += 1
            self.taking = False
            self.metrics.assigned.labels(self.name).set(0)
            if self.owner or self.producer is not None or self.engine is not None:
                await self._release()
                log.info("index shard released")

    async def on_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        """Only notes the assignment: aiokafka sends no heartbeat while this callback runs,
        and taking the shard over (fencing, opening the store, sending forward records
        again) takes seconds, longer than a session under load: the member was expelled
        mid-takeover. The loop's next turn takes it over (``_take_over``), heartbeats
        flowing; its partitions stay paused until then."""
        assigned = set(assigned)
        async with self.busy:
            self.generation += 1
            if not assigned:
                log.info("index role: a standby (another member holds the shard)")
                return
            if assigned != self.tps:
                raise TopologyError(f"index role assigned {sorted(map(str, assigned))}, not "
                                    "the whole shard: do the input topics have one partition "
                                    "per shard?")
            self.consumer.pause(*assigned)
            self.taking = True

    async def _take_over(self) -> None:
        """The shard assigned: fence its previous owner, open the store, send the forward
        records the last owner may not have committed, read the offsets and seek; then
        resume the partitions (in a turn: ``busy`` held)."""
        t0 = time.perf_counter()
        consumer, assigned = self.consumer, self.tps
        producer = new_producer(self.kc, transactional_id(self.kc, self.group_id,
                                                          self.seq_tp))
        self.producer = producer  # (stopped by a step-down if it fails)
        # fences a previous owner: its open transaction aborts
        await within(producer.start(), self.limit_s)
        loop = asyncio.get_running_loop()
        # opening finishes (aligning here) pages whose align answer never came
        self.engine = await loop.run_in_executor(
            self.executor, functools.partial(
                Engine.open, self.store_dir, self.config.engine, shards=self.n_shards,
                remote_shards=self._open_fan_in if self.n_shards > 1 else None,
                audit_default=WORKER_AUDIT_SAMPLE if self.n_shards == 1 else 0.0))
        self._keyed_by(self.align_parts)
        self.engine.on_removed(self._removed)
        # the forward records of pages stored after the last commit (their transaction
        # may have aborted) and, the first time, of every stored page
        await self._send_forward_again(producer, consumer)
        stored = (await loop.run_in_executor(self.executor, self.engine.stored_offsets)
                  ).get((self.seq_tp.topic, 0))
        fan_in = self.fan_in
        committed = await within(committed_offsets(consumer, assigned), self.limit_s)
        # a group without offsets (expired after offsets.retention.minutes, deleted, a
        # new group id) resumes where this store noted every page's matches published
        # (none noted: from the start, publishing again what the store holds)
        noted = (await loop.run_in_executor(self.executor, self.engine.checkpoints)
                 ).get((self.seq_tp.topic, 0), 0)
        published = committed.get(self.seq_tp, noted)
        again: list[tuple[int, int, Any]] = []
        first = None  # a fan-in's first page not finished
        if fan_in is not None:
            # its pages not finished are stored too; the shard messages of the records
            # from E on, whether their transaction committed or not (a shard answers
            # what it applied from its store)
            stored, again = await loop.run_in_executor(
                self.executor, fan_in.recover, stored, published)
            first = fan_in.first_resumable()
        applied_below = stored  # every sequence record below it is in the store
        if first is not None and first < published:
            # another fan-in published past pages this store left unfinished (it took
            # over from this one, then stopped): the replay starts there and finishes
            # them from their partials (the pages stored after them answer from it)
            log.warning("index fan-in store: pages from ordinal %d not finished, published "
                        "since up to %d: finishing them by replay", first, published)
            stored = first
        if stored is not None and stored >= published:
            self._reset(published, 0)
            starts = {self.seq_tp: published, self.sketch_tp: committed.get(self.sketch_tp),
                      self.partials_tp: committed.get(self.partials_tp)}
        else:
            start = stored or 0
            if start < published:
                log.warning("index store behind the published matches (%d < %d): "
                            "rebuilding it from the retained sequence and sketches",
                            start, published)
            self._reset(start, published)
            # the sketches (and the shards' partials) of the pages from S on: their
            # partitions from the beginning (they come in about ordinal order)
            starts = {self.seq_tp: start, self.sketch_tp: None, self.partials_tp: None}
        starts[self.aligned_tp] = committed.get(self.aligned_tp)
        for tp in sorted(self.tps):
            if tp != self.aligned_tp:  # (align answers are never needed twice)
                await require_retained(consumer, tp, starts[tp] or 0, "the index role")
            await self._seek(tp, starts[tp])
        self._resume_lifecycle(applied_below)
        self.resend = [part for seq, shard, m in again for part in self._keys(seq, shard, m)]
        if again:
            log.info("index fan-in: %d shard messages from ordinal %d sent again",
                     len(again), again[0][0])
        self.owner, self.taking = True, False
        self.metrics.assigned.labels(self.name).set(len(assigned))
        consumer.resume(*assigned)
        took = time.perf_counter() - t0
        log.info("index shard owned: published up to ordinal %d, store at %s (taken "
                 "over in %.2f s)", published, stored, took)

    async def _step_down(self, exc: BaseException) -> None:
        """Its producer fenced: another process took the shard (this one was expelled
        while stopped or starved), or the transaction coordinator aborted a transaction
        open past ``kafka.transaction_timeout_ms`` (which fences it too). What this process
        holds of the shard may be behind what was committed: it lets it go and asks the
        group again (``rejoin``); if the shard comes back, it is taken over afresh."""
        if isinstance(exc, FENCED):
            log.warning("index role stepping down: its producer was fenced (%r); rejoining "
                        "the group", exc)
        else:  # (``ride_out``: Kafka went away in a turn)
            log.info("index role stepping down while Kafka is away (%r); rejoining the "
                     "group", exc)
        self.generation += 1  # (the turn's fetched records are dropped)
        self.taking = False
        self.metrics.assigned.labels(self.name).set(0)
        await self._release()
        self.consumer.pause(*self.consumer.assignment())
        rejoin(self.consumer)

    async def _seek(self, tp: TopicPartition, offset: int | None) -> None:
        if offset is None:
            await self.consumer.seek_to_beginning(tp)
        else:
            self.consumer.seek(tp, offset)

    async def _release(self) -> None:
        self.owner = False
        if self.producer is not None:  # (its stop flushes: it waits for a broker that may be gone)
            await stop_within(self.producer)
        self.producer = None
        if self.engine is not None:
            engine, self.engine, self.fan_in = self.engine, None, None
            await asyncio.get_running_loop().run_in_executor(self.executor, engine.close)

