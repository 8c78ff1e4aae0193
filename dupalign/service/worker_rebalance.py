"""The single worker's rebalances: where each assigned partition resumes, decided from the
group's committed offset (and whether it says the range was published), the store's own
stored offset and its note of what it published; what a revocation abandons. The delivery
guarantee behind these decisions: docs/delivery.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from dupalign.runtime.engine import Engine
from dupalign.service.config import KafkaConfig, WorkerConfig
from dupalign.service.log_repeats import STARTUP
from dupalign.service.loop import Ahead
from dupalign.service.metrics import WorkerMetrics
from dupalign.service.outage import KafkaOutage, stop_within, within
from dupalign.service.topology import fetch_committed, new_producer

log = logging.getLogger("dupalign.worker")

# Metadata of every offset commit: the batch's output was published (docs/delivery.md).
PUBLISHED = "dupalign:published"

T = TypeVar("T")


class Rebalancing:
    """The rebalance half of ``Worker`` (dupalign/service/worker.py)."""

    consumer: AIOKafkaConsumer | None
    engine: Engine | None
    executor: ThreadPoolExecutor
    metrics: WorkerMetrics
    kc: KafkaConfig
    wc: WorkerConfig
    txn_producers: dict[TopicPartition, AIOKafkaProducer]
    ahead: Ahead
    outage: KafkaOutage
    suppress_below: dict[TopicPartition, int]
    unsettled: dict[TopicPartition, int]
    committed: dict[TopicPartition, int]

    def transactional_id(self, tp: TopicPartition) -> str:
        return f"{self.kc.transactional_id_prefix}-{self.kc.group_id}-{tp.topic}-{tp.partition}"

    async def on_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        revoked = set(revoked)
        self.metrics.rebalances.labels("revoked").inc()
        # the batch in hand is finished and committed, the queued ones are abandoned
        await self.ahead.revoke(revoked, self.wc.shutdown_timeout_s)
        for tp in revoked:
            self.suppress_below.pop(tp, None)
            # (``unsettled`` stays: the store still holds the partition's pages past the
            # group's commit, whoever reads it now; a commit that reaches them settles it,
            # ours or another member's, which ``_lag_loop`` looks for)
            self.committed.pop(tp, None)
            with contextlib.suppress(KeyError):
                self.metrics.consumer_lag.remove(tp.topic, str(tp.partition))
            producer = self.txn_producers.pop(tp, None)
            if producer is not None:
                await stop_within(producer)  # (it flushes: Kafka may be away)
        self.metrics.assigned_partitions.set(len(self.ahead.epochs))
        log.info("partitions revoked", extra={"partitions": _names(revoked)})

    async def on_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        assert self.consumer is not None and self.engine is not None
        assigned = set(assigned)
        if assigned:
            STARTUP.end()
        self.metrics.rebalances.labels("assigned").inc()
        # aiokafka starts fetching as soon as the assignment is set, before this listener
        # returns: hold the partitions until their positions and producers are ready.
        self.consumer.pause(*assigned)
        loop = asyncio.get_running_loop()
        stored = await loop.run_in_executor(self.executor, self.engine.stored_offsets)
        noted = await loop.run_in_executor(self.executor, self.engine.checkpoints)
        for tp in sorted(assigned):
            if self.kc.transactions and tp not in self.txn_producers:
                # InitProducerId fences a previous owner of this id
                self.txn_producers[tp] = await self._kafka(
                    f"starting the producer of {tp.topic}:{tp.partition}",
                    functools.partial(self._started, tp))
        # after the fencing: no pending commit
        group = await self._kafka("reading the group's offsets",
                                  lambda: self._group_offsets(assigned))
        # the first offset each partition still holds: pages stored past the commit whose
        # records the topic's retention deleted are never read again, so they cannot hold
        # back the retention sweeps (``unsettled``) until a commit reaches them
        consumer = self.consumer
        begins = await self._kafka("reading where the partitions begin",
                                   lambda: consumer.beginning_offsets(list(assigned)))
        # the store's other partitions of the input topic (another member of the group
        # holds them, or no one yet): their pages stored past the group's commit are read
        # again, by us if they come back, and must still be in the store then
        exists = self.consumer.partitions_for_topic(self.kc.input_topic) or set()
        elsewhere = {TopicPartition(t, p) for t, p in stored
                     if t == self.kc.input_topic and p in exists} - assigned
        await self._kafka("reading the offsets of the store's other partitions",
                          lambda: self._settle(elsewhere, stored, noted))
        self._warn_if_shared(assigned)
        for tp in sorted(assigned):
            self.unsettled.pop(tp, None)  # decided again below
            committed, published = group.get(tp, (None, False))
            in_store = stored.get((tp.topic, tp.partition))
            noted_published = noted.get((tp.topic, tp.partition))
            if committed is not None:
                self.committed[tp] = committed
            elif noted_published is not None:
                log.warning("%s: the group has no committed offset (expired, deleted or a new "
                            "group id); resuming after the pages it records as published, "
                            "at offset %d", tp, noted_published)
                committed, published = noted_published, True
            elif in_store is not None:
                # stored before the partition's first commit (a crash came between): their
                # matches were never published; read again, they are replays, published now
                log.warning("%s: the group has no committed offset and the store records "
                            "no publication of its pages (next offset %d); reading the "
                            "partition from its beginning", tp, in_store)
                await self.consumer.seek_to_beginning(tp)
                self._unsettle(tp, 0, in_store, begins[tp])
                continue
            if committed is None:
                continue  # new partition: auto_offset_reset applies
            if in_store is not None and in_store < committed:
                if published:
                    log.warning("%s: store is behind the group (%d < %d), whose commit says "
                                "that range was published; re-indexing it without publishing",
                                tp, in_store, committed)
                    self.suppress_below[tp] = committed
                else:
                    log.warning("%s: store is behind the group (%d < %d), whose commit does "
                                "not say that range was published; re-indexing and publishing "
                                "it", tp, in_store, committed)
                self.consumer.seek(tp, in_store)
            else:
                if in_store is None:
                    log.warning("%s: the store has no pages of this partition before offset "
                                "%d; they cannot be matched", tp, committed)
                elif in_store > committed:
                    self._unsettle(tp, committed, in_store, begins[tp])
                self.consumer.seek(tp, max(committed, begins[tp]))
        # Only now (producers ready, positions set) do fetched batches of these count.
        self.ahead.admit(assigned)
        self.consumer.resume(*assigned)
        self.metrics.assigned_partitions.set(len(self.ahead.epochs))
        log.info("partitions assigned", extra={"partitions": _names(assigned)})

    async def _kafka(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        """``operation`` retried while Kafka is away (dupalign/service/outage.py)."""
        return await self.outage.until_ok(what, operation)

    async def _started(self, tp: TopicPartition) -> AIOKafkaProducer:
        producer = new_producer(self.kc, self.transactional_id(tp))
        try:
            await within(producer.start(), self.kc.request_timeout_ms / 1000)
        except BaseException:
            await stop_within(producer)
            raise
        return producer

    def _unsettle(self, tp: TopicPartition, committed: int, in_store: int, begin: int
                  ) -> None:
        """The store holds pages of ``tp`` up to ``in_store`` past the commit: no sweep until
        a commit reaches them, unless the topic no longer holds their records."""
        if begin < in_store:
            self.unsettled[tp] = in_store
        else:
            log.warning("%s: offsets %d to %d were stored but their matches not committed, "
                        "and the topic no longer holds them (its log starts at %d): they "
                        "cannot be published again", tp, committed, in_store - 1, begin)

    async def _settle(self, tps: Iterable[TopicPartition], stored: dict[tuple[str, int], int],
                      noted: dict[tuple[str, int], int]) -> None:
        """``unsettled`` of partitions this worker does not hold: the store's next offset
        while the group's commit (without one, the store's note of what it published) is
        below it and the topic still holds those records; dropped once a commit reaches it."""
        tps = sorted(tps)
        if not tps:
            return
        assert self.consumer is not None
        group = await self._group_offsets(tps)
        begins = await self.consumer.beginning_offsets(tps)
        held = self.consumer.assignment()  # (assigned meanwhile: on_assigned decided)
        for tp in tps:
            if tp in held:
                continue
            self.unsettled.pop(tp, None)
            in_store = stored.get((tp.topic, tp.partition))
            committed = group.get(tp, (noted.get((tp.topic, tp.partition)), False))[0]
            if in_store is not None and (committed is None or committed < in_store):
                self._unsettle(tp, committed or 0, in_store, begins[tp])

    def _warn_if_shared(self, assigned: set[TopicPartition]) -> None:
        """The single worker compares a page with the pages of its own store only: another
        member of its group (a second instance) splits the index between them."""
        assert self.consumer is not None
        every = self.consumer.partitions_for_topic(self.kc.input_topic) or set()
        held = {tp.partition for tp in assigned if tp.topic == self.kc.input_topic}
        if every and held != every:
            log.warning("this worker holds partitions %s of %s; another member of group %s "
                        "holds the others: each single worker matches pages against its own "
                        "store only. Run one per group (replicas: 1), or the stage roles "
                        "(docs/topology.md) to scale out", sorted(held), self.kc.input_topic,
                        self.kc.group_id)

    async def _group_offsets(self, tps: Iterable[TopicPartition]
                             ) -> dict[TopicPartition, tuple[int, bool]]:
        """The group's committed offset per partition, and whether it carries PUBLISHED.
        ``AIOKafkaConsumer.committed`` drops the metadata; the group coordinator's fetch,
        which it calls, keeps it (and retries retriable errors the same way)."""
        assert self.consumer is not None
        found = await fetch_committed(self.consumer, tps)
        return {tp: (om.offset, om.metadata == PUBLISHED) for tp, om in found.items()
                if om.offset >= 0}


def _names(tps: Iterable[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}:{tp.partition}" for tp in tps)
