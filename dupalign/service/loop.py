"""The consume → process → produce → commit loop of the service, shared by the single worker
and every role, and its unit of progress, the ``Checkpoint``: the records a batch produces
and the input offsets it consumed, made visible together, then noted in the store.

* ``Checkpoint.commit``: with transactions, one Kafka transaction holds the records and the
  offsets (``send_offsets_to_transaction``): a crash before it commits leaves neither
  visible to read_committed readers. At-least-once (``kafka.transactions = false``): every
  record acknowledged, then the group commits the offsets; a crash in between sends them
  again (docs/topology.md, "At-least-once"). Then ``after``: the store's own note of the
  commit (the resume point should the group lose its offsets).
* ``turns``: the fetched batches of a consumer, each handed over only when no rebalance came
  since the fetch; ``Listener`` hands rebalances to the loop's owner.

The roles process a turn while they hold it (``turns``). The single worker fetches on while
its engine runs a batch (a batch can take longer than ``kafka.max_poll_interval_ms``), so it
queues what it fetched (dupalign/service/worker.py) and commits each batch with the same
``Checkpoint``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, InvalidProducerEpoch, ProducerFenced

from dupalign.service.config import KafkaConfig
from dupalign.service.topology import Outgoing, send_all

log = logging.getLogger("dupalign.loop")

# an offset to commit, or an offset with the commit's metadata
Offset = int | tuple[int, str]

# A transactional producer whose id another producer took (the partition's next owner), or
# whose transaction the broker's coordinator aborted for lasting past
# ``kafka.transaction_timeout_ms``: that abort bumps the id's epoch too, with no
# InitProducerId from anyone. A role steps down and rejoins on it (``rejoin``).
FENCED = (ProducerFenced, InvalidProducerEpoch)


@dataclass
class Checkpoint:
    """One unit of progress. ``send`` replaces the plain sending of ``outgoing`` when the
    records depend on one another's acknowledgements (it must await them all);
    ``outgoing`` still lists every record it sends. ``after`` runs once the commit is done
    (a note in the store: it may be lost in a crash, never ahead of the commit)."""

    offsets: dict[TopicPartition, Offset]
    outgoing: list[Outgoing] = field(default_factory=list)
    send: Callable[[AIOKafkaProducer], Awaitable[Any]] | None = None
    after: Callable[[], Awaitable[None]] | None = None
    publish_s: float = 0.0  # (set by ``commit``) sending and acknowledging the records
    commit_s: float = 0.0  # committing the offsets (the transaction's end)

    async def commit(self, producer: AIOKafkaProducer, group_id: str,
                     at_least_once: AIOKafkaConsumer | None = None, *,
                     lost_commit_ok: bool = True) -> None:
        """Produce, then commit (module docstring). ``at_least_once``: the consumer whose
        group commits the offsets (None: the producer's transaction does).
        ``lost_commit_ok``: at-least-once, a commit the group refused after a rebalance is
        a warning (the records' next owner reads them again), not an error."""
        t0 = time.perf_counter()
        t1 = t0
        if at_least_once is not None:
            await self._send(producer)
            t1 = time.perf_counter()
            if self.offsets:
                try:
                    await at_least_once.commit(self.offsets)
                except CommitFailedError:
                    if not lost_commit_ok:
                        raise
                    log.warning("offsets %s not committed: the group rebalanced; their next "
                                "owner reads them again", self.offsets)
        else:
            async with producer.transaction():
                await self._send(producer)
                t1 = time.perf_counter()
                if self.offsets:
                    await producer.send_offsets_to_transaction(self.offsets, group_id)
        self.publish_s, self.commit_s = t1 - t0, time.perf_counter() - t1
        if self.after is not None:
            await self.after()

    async def _send(self, producer: AIOKafkaProducer) -> None:
        if self.send is not None:
            await self.send(producer)
        else:
            await send_all(producer, self.outgoing)


class Consuming(Protocol):
    """What ``turns`` and ``Listener`` need of the loop's owner."""

    stopping: asyncio.Event
    failure: BaseException | None
    generation: int  # bumped by every assignment change, under ``busy``
    busy: asyncio.Lock  # a turn in hand, or a rebalance

    async def on_revoked(self, revoked: Any) -> None: ...

    async def on_assigned(self, assigned: Any) -> None: ...


async def turns(owner: Consuming, consumer: AIOKafkaConsumer, max_records: int,
                wanted: Callable[[], list[TopicPartition]] | None = None
                ) -> AsyncIterator[dict[TopicPartition, list[Any]]]:
    """The fetched batches, each handed over while holding ``owner.busy``, and only when
    no rebalance came since the fetch (those records are fetched again from the positions
    the assignment set). Raises what a rebalance listener failed with.

    getmany returns records that start at the partitions' positions as they are when it
    returns (aiokafka drops what a seek made stale), and nothing runs between its return
    and the next line: the generation read there is the one the records belong to. (Read
    before the call, it would make a rebalance that ran during the call drop records
    fetched after its seek, which are then never fetched again.)

    ``wanted``: the partitions to take records from in the next turn (default all). The
    others keep what was fetched for them: a paused partition drops it, to fetch it again
    once resumed."""
    while not owner.stopping.is_set():
        if owner.failure is not None:
            raise owner.failure
        batches = await consumer.getmany(*(wanted() if wanted is not None else ()),
                                         timeout_ms=200, max_records=max_records)
        generation = owner.generation
        async with owner.busy:
            if generation == owner.generation:
                yield batches


async def run_loop(owner: Consuming, consumer: AIOKafkaConsumer, max_records: int,
                   process: Callable[[dict[TopicPartition, list[Any]]], Awaitable[None]],
                   wanted: Callable[[], list[TopicPartition]] | None = None) -> None:
    """Consume until the owner stops: each turn's batches to ``process``, which produces
    and commits them (``Checkpoint``) before the next turn."""
    async for batches in turns(owner, consumer, max_records, wanted):
        await process(batches)


class Listener(ConsumerRebalanceListener):
    """Hands rebalances to the loop's owner (``on_revoked``, ``on_assigned``). aiokafka only
    logs what a listener raises: the error is kept in ``owner.failure`` and the owner's
    loop raises it."""

    def __init__(self, owner: Consuming) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: Any) -> None:
        try:
            await self.owner.on_revoked(revoked)
        except Exception as exc:
            self.owner.failure = exc

    async def on_partitions_assigned(self, assigned: Any) -> None:
        try:
            await self.owner.on_assigned(assigned)
        except Exception as exc:
            self.owner.failure = exc


def rebalance_timeout_ms(kc: KafkaConfig) -> int:
    """How long a rebalance waits for a member to rejoin: a role rejoins once the turn or
    takeover in hand is done (``busy``). The consumer's default, the session timeout,
    expelled a member whose turn outlasted it. Longer is capped by the request timeout:
    every member's JoinGroup waits for the slowest one, and aiokafka gives it
    ``kafka.request_timeout_ms`` before it calls the coordinator dead."""
    return max(kc.session_timeout_ms, kc.request_timeout_ms - 5_000)


def rejoin(consumer: AIOKafkaConsumer) -> None:
    """Ask the group for an assignment again, with the same member id: the listener's
    ``on_revoked``, then ``on_assigned`` with what the group gives now. aiokafka has no
    public call for it (tests/service/test_aiokafka_privates.py)."""
    coordinator = consumer._coordinator
    if coordinator is None:
        raise RuntimeError("rejoin: the consumer is not started")
    coordinator.request_rejoin()
