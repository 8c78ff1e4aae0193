"""A role of ``dupalign stage`` (the sketch role; the others through ``StageRole``,
stage_role.py): a consumer-group member of one input topic that turns each fetched batch
of one partition into records, produced in one transaction with the batch's offsets
(dupalign/service/loop.py: the loop and its ``Checkpoint``). Any number of copies run at
once: the group spreads the partitions (those of a role with a store per partition stay
with their owner as members come and go: ``keeps_state``), and a partition's
transactional id fences its previous owner.

A rebalance waits for the batch in hand (``busy``), then stops the producers of revoked
partitions; a batch fetched before the assignment changed is dropped (its partitions were
seeked to the committed offset on assignment, so it is fetched again). Assigned partitions
stay paused until the next turn has taken them (``_take_all``: outside aiokafka's
rebalance callback, which sends no heartbeat). A fenced producer steps the role down: it
lets every partition go and rejoins the group (``_step_down``), rather than exit.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.errors import KafkaError

from dupalign.service.config import Config
from dupalign.service.loop import (
    FENCED,
    Checkpoint,
    Listener,
    rebalance_timeout_ms,
    rejoin,
    ride_out,
    run_loop,
)
from dupalign.service.outage import stop_within, within
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.service.sticky import claim_path, leaving, sticky
from dupalign.service.topology import (
    Outgoing,
    committed_offsets,
    ensure_topics,
    new_consumer,
    new_producer,
    stop_quietly,
    transactional_id,
)

log = logging.getLogger("dupalign.roles")


class StatelessRole:
    """Subclasses name their input topic and implement ``prepare`` (CPU, in a thread) and
    ``produce`` (inside the partition's transaction); ``outgoing`` lists what ``produce``
    sends (counted once committed)."""

    name = "role"
    # a store per partition, which a move makes the next owner rebuild by replay: the group
    # keeps each partition with its owner (dupalign.service.sticky)
    keeps_state = False
    turn_wait_ms = 200  # the group's fetch waits this long for records

    def __init__(self, config: Config, metrics: RoleMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else RoleMetrics()
        self.metrics.add_role(self.name)
        self.started = False  # consuming (for /readyz)
        self.kc = config.kafka
        self.outage = self.metrics.outage(self.kc.max_outage_s, self.kc.outage_backoff_max_s)
        self.limit_s = self.kc.request_timeout_ms / 1000  # one Kafka step, at most
        self.group_id = f"{self.kc.group_id}-{self.name}"
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        self.consumer: AIOKafkaConsumer | None = None
        self.strategy: tuple[Any, ...] = ()  # the consumer's assignors
        self.producers: dict[TopicPartition, AIOKafkaProducer] = {}
        self.busy = asyncio.Lock()  # a batch in hand, or a rebalance
        self.generation = 0  # bumped by every assignment change
        self.stopping = asyncio.Event()
        self.batches = 0  # committed
        self.failure: BaseException | None = None  # raised in a rebalance listener
        self.pending: set[TopicPartition] = set()  # assigned, not taken yet (``_take_all``)

    @property
    def input_topic(self) -> str:
        raise NotImplementedError

    def prepare(self, tp: TopicPartition, records: list[Any]) -> Any:
        raise NotImplementedError

    async def produce(self, producer: AIOKafkaProducer, prepared: Any) -> None:
        raise NotImplementedError

    def outgoing(self, prepared: Any) -> list[Outgoing]:
        raise NotImplementedError

    def offsets(self, tp: TopicPartition, records: list[Any]) -> dict[TopicPartition, int]:
        """The offsets the batch's transaction commits (a role replaying below the
        committed offset commits none)."""
        return {tp: records[-1].offset + 1}

    async def take(self, tp: TopicPartition, committed: int | None) -> int | None:
        """A partition assigned (its producer started, so its previous owner is fenced):
        where to read it from (None: the beginning). Roles with state open it here."""
        return committed

    async def release(self, tps: Iterable[TopicPartition]) -> None:
        """Partitions revoked (their producers stopped)."""

    async def before(self, tp: TopicPartition, records: list[Any]) -> None:
        """Before a fetched batch of ``tp`` is prepared (roles with state catch up here). A
        wait here must end when the role stops: the batch is then dropped."""

    def state_dir(self) -> Path | None:
        """Where a role that ``keeps_state`` keeps it across restarts (None: nowhere, so
        nor does its assignor keep its claim)."""
        return None

    def stop(self) -> None:
        self.stopping.set()
        leaving(self.strategy)

    async def on_start(self) -> None:
        """Once the topics exist, before the role consumes."""

    def topics(self) -> dict[str, int | None]:
        """The topics the role checks (or makes) at start, with their partition counts."""
        raise NotImplementedError

    def topic_options(self) -> dict[str, Any]:
        """More of ``ensure_topics``' options for ``topics``."""
        return {}

    async def run(self) -> None:
        await ensure_topics(self.kc, self.topics(), self.config.worker.max_message_bytes,
                            **self.topic_options())
        await self.on_start()
        strategy = self.strategy = (sticky(claim_path(self.state_dir(), self.group_id))
                                    if self.keeps_state else (RoundRobinPartitionAssignor,))
        consumer = self.consumer = new_consumer(
            self.kc, self.group_id, self.config.worker.batch_size,
            rebalance_timeout_ms=rebalance_timeout_ms(self.kc),
            partition_assignment_strategy=strategy)
        consumer.subscribe([self.input_topic], listener=Listener(self))
        await consumer.start()
        self.started = True
        log.info("%s role started (group %s)", self.name, self.group_id)
        try:
            await run_loop(self, consumer, self.config.worker.batch_size, self._turn,
                           outage=self.outage, wait_ms=self.turn_wait_ms)
        finally:
            await self._close()

    async def _turn(self, batches: dict[TopicPartition, list[Any]]) -> None:
        """Partitions assigned are taken first (paused until then: nothing was fetched for
        them); a fenced producer steps down, and so does a failure while Kafka is away
        (``ride_out``: the turn is redone from the committed offsets)."""
        try:
            if self.pending:
                await self._take_all(self.pending)
            else:
                await self._work(batches)
        except KafkaError as exc:
            await ride_out(self.outage, exc, f"a turn of the {self.name} role", self._step_down)

    async def _work(self, batches: dict[TopicPartition, list[Any]]) -> None:
        loop = asyncio.get_running_loop()
        hops = []
        for tp, records in batches.items():
            if not records:
                continue
            self.metrics.consumed(self.name, tp.topic, records)
            await self.before(tp, records)
            if self.stopping.is_set():  # (a wait in ``before`` ended by the stop)
                break  # the rest of the batch is not committed: fetched again
            prepared = await loop.run_in_executor(self.executor, self.prepare, tp, records)
            # each partition has its own producer and transaction: they commit
            # concurrently, while the next partition's batch is prepared (an align
            # request's parts are on several partitions). At-least-once, the
            # consumer commits each partition's offsets in turn.
            hops.append(asyncio.ensure_future(self._hop(tp, records, prepared)))
            if not self.kc.transactions:
                await hops[-1]
        failed = [r for r in await asyncio.gather(*hops, return_exceptions=True)
                  if isinstance(r, BaseException)]
        if failed:  # (once every hop ended: a step-down stops their producers)
            raise failed[0]

    async def _hop(self, tp: TopicPartition, records: list[Any], prepared: Any) -> None:
        producer = self.producers[tp]  # made on assignment, before resume
        outgoing = self.outgoing(prepared)
        unit = Checkpoint(dict(self.offsets(tp, records)), outgoing,
                          send=lambda p: self.produce(p, prepared))
        async with self.metrics.transaction(self.name):
            await within(unit.commit(producer, self.group_id,
                                     None if self.kc.transactions else self.consumer),
                         self.limit_s)
        self.outage.succeeded()
        self.metrics.produced(self.name, outgoing)
        self.batches += 1

    async def _close(self) -> None:
        held = list(self.producers)
        await stop_quietly(self.consumer, *self.producers.values())
        self.producers.clear()
        await self.release(held)
        self.executor.shutdown(wait=True)

    async def on_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        async with self.busy:
            self.generation += 1
            self.pending = set()  # (assigned, never taken)
            await stop_quietly(*(self.producers.pop(tp, None) for tp in revoked))
            await self.release(revoked)
            self.metrics.assigned.labels(self.name).set(len(self.producers))

    async def on_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        """Only notes the partitions, paused: taking them (fencing their previous owners,
        opening stores, reading offsets) is the loop's next turn, with heartbeats flowing
        (aiokafka sends none while this callback runs)."""
        assert self.consumer is not None
        assigned = set(assigned)
        async with self.busy:
            self.generation += 1
            self.consumer.pause(*assigned)
            self.pending = assigned

    async def _take_all(self, assigned: set[TopicPartition]) -> None:
        assert self.consumer is not None
        t0 = time.perf_counter()
        for tp in sorted(assigned):
            if tp not in self.producers:
                # (no linger: a turn hands over all its records at once, in batches it
                # built, and waits for them; lingering only delays each of its requests)
                producer = new_producer(self.kc, transactional_id(self.kc, self.group_id, tp),
                                        linger_ms=0)
                self.producers[tp] = producer  # (stopped by a step-down if it fails)
                # fences the previous owner, aborts its open transaction
                await within(producer.start(), self.limit_s)
        committed = await within(committed_offsets(self.consumer, assigned),  # after fencing
                                 self.limit_s)
        for tp in sorted(assigned):
            start = await self.take(tp, committed.get(tp))
            if start is not None:
                self.consumer.seek(tp, start)
            else:
                await self.consumer.seek_to_beginning(tp)
        self.pending = set()
        self.consumer.resume(*assigned)
        self.outage.succeeded()
        self.metrics.assigned.labels(self.name).set(len(self.producers))
        log.info("%s role assigned %s (taken in %.2f s)", self.name,
                 sorted(f"{t.topic}:{t.partition}" for t in assigned), time.perf_counter() - t0)

    async def _step_down(self, exc: BaseException) -> None:
        """A producer fenced: another process has its partition (this one was expelled
        while stopped or starved), or the broker aborted a transaction open past
        ``kafka.transaction_timeout_ms``; or Kafka went away in a turn (``ride_out``).
        Every partition is let go and the group asked again (``rejoin``)."""
        assert self.consumer is not None
        if isinstance(exc, FENCED):
            log.warning("%s role stepping down: a producer was fenced (%r); rejoining the "
                        "group", self.name, exc)
        else:
            log.info("%s role stepping down while Kafka is away (%r); rejoining the group",
                     self.name, exc)
        self.generation += 1  # (the turn's fetched records are dropped)
        self.pending = set()
        held = list(self.producers)
        # (a producer's stop flushes: it waits for a broker that may be gone)
        await asyncio.gather(*(stop_within(p) for p in self.producers.values()))
        self.producers.clear()
        await self.release(held)
        self.metrics.assigned.labels(self.name).set(0)
        self.consumer.pause(*self.consumer.assignment())
        rejoin(self.consumer)
