"""The consume → process → produce → commit loop of the service, shared by the single worker
and every role, and its unit of progress, the ``Checkpoint``: the records a batch produces
and the input offsets it consumed, made visible together, then noted in the store.

* ``Checkpoint.commit``: with transactions, one Kafka transaction holds the records and the
  offsets (``send_offsets_to_transaction``): a crash before it commits leaves neither
  visible to read_committed readers. At-least-once (``kafka.transactions = false``): every
  record acknowledged, then the group commits the offsets; a crash in between sends them
  again (docs/delivery.md). Then ``after``: the store's own note of the
  commit (the resume point should the group lose its offsets).
* ``turns``: the fetched batches of a consumer, each handed over only when no rebalance came
  since the fetch; ``Listener`` hands rebalances to the loop's owner.

The roles process a turn while they hold it (``turns``). The single worker's engine batch
can take longer than ``kafka.max_poll_interval_ms``: it runs the loop in fetch-ahead mode
(``Ahead``), which fetches on while a batch is processed and queues what it fetched, with
per-partition epochs in place of the generation.

A role whose producer is fenced (``FENCED``) steps down and asks the group to assign it
again (``rejoin``); ``rebalance_timeout_ms`` gives a member time to finish the turn or
takeover in hand before the group moves on without it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import (
    CommitFailedError,
    IllegalOperation,
    InvalidProducerEpoch,
    KafkaConnectionError,
    KafkaError,
    ProducerFenced,
)

from dupalign.service.config import KafkaConfig
from dupalign.service.outage import KafkaOutage
from dupalign.service.topology import Outgoing, background_failure, mark_retrieved, send_all

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
            try:
                async with producer.transaction():
                    # the offsets' two requests (AddOffsetsToTxn, TxnOffsetCommit) go while
                    # the records are sent, not after: two round trips fewer a turn
                    offsets = (asyncio.ensure_future(producer.send_offsets_to_transaction(
                        self.offsets, group_id)) if self.offsets else None)
                    try:
                        await self._send(producer)
                    except BaseException:
                        if offsets is not None:
                            offsets.add_done_callback(mark_retrieved)
                            offsets.cancel()
                        raise
                    t1 = time.perf_counter()
                    if offsets is not None:
                        await offsets
            except (IllegalOperation, AssertionError) as exc:
                # a producer fenced in the background: its cause, so that a role steps down
                # (FENCED) instead of stopping on an unexpected error
                cause = background_failure(producer)
                if cause is None:
                    raise
                raise cause from exc
        self.publish_s, self.commit_s = t1 - t0, time.perf_counter() - t1
        if self.after is not None:
            await self.after()

    async def _send(self, producer: AIOKafkaProducer) -> None:
        if self.send is not None:
            await self.send(producer)
        else:
            await send_all(producer, self.outgoing)


class Rebalanced(Protocol):
    """What ``Listener`` needs of the loop's owner."""

    failure: BaseException | None

    async def on_revoked(self, revoked: Any) -> None: ...

    async def on_assigned(self, assigned: Any) -> None: ...


class Running(Rebalanced, Protocol):
    """What the loop in fetch-ahead mode (``Ahead``) needs of its owner."""

    stopping: asyncio.Event


@runtime_checkable
class Consuming(Running, Protocol):
    """What ``turns`` needs of the loop's owner."""

    generation: int  # bumped by every assignment change, under ``busy``
    busy: asyncio.Lock  # a turn in hand, or a rebalance


async def turns(owner: Consuming, consumer: AIOKafkaConsumer, max_records: int,
                wanted: Callable[[], list[TopicPartition]] | None = None,
                outage: KafkaOutage | None = None, wait_ms: int = 200
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
    once resumed.

    ``outage``: a fetch that fails while Kafka is away is retried, and a consumer cut off
    from its group coordinator is in an outage too (``CoordinatorWatch``).

    ``wait_ms``: how long a fetch waits for records (a turn comes at least that often)."""
    watch = None if outage is None else CoordinatorWatch(outage)
    while not owner.stopping.is_set():
        if owner.failure is not None:
            raise owner.failure
        try:
            batches = await consumer.getmany(*(wanted() if wanted is not None else ()),
                                             timeout_ms=wait_ms, max_records=max_records)
        except KafkaError as exc:
            if outage is None:
                raise
            await asyncio.sleep(outage.failed(exc, "fetching"))
            continue
        generation = owner.generation
        if watch is not None:
            await watch.check(consumer)
        async with owner.busy:
            if generation == owner.generation:
                yield batches


async def run_loop(owner: Running, consumer: AIOKafkaConsumer, max_records: int,
                   process: Callable[[dict[TopicPartition, list[Any]]], Awaitable[None]],
                   wanted: Callable[[], list[TopicPartition]] | None = None,
                   ahead: Ahead | None = None, outage: KafkaOutage | None = None,
                   wait_ms: int = 200) -> None:
    """Consume until the owner stops: each turn's batches to ``process``, which produces
    and commits them (``Checkpoint``) before the next turn. ``ahead``: fetch while a batch
    is processed (``Ahead``: one partition's batch per turn); otherwise the owner holds
    ``busy`` over each turn (``turns``)."""
    if ahead is not None:
        await ahead.run(owner, consumer, max_records, process)
        return
    if not isinstance(owner, Consuming):
        raise TypeError(f"{type(owner).__name__} has no generation and busy lock: it "
                        "consumes in turns only with ``ahead``")
    async for batches in turns(owner, consumer, max_records, wanted, outage, wait_ms):
        await process(batches)


# a consumer without a group coordinator for this long is cut off from Kafka (finding a
# moved coordinator takes well under a second)
CUT_OFF_S = 3.0


def coordinator_known(consumer: AIOKafkaConsumer) -> bool:
    """Whether the consumer's group has a coordinator it reaches. aiokafka has no public
    call for it (tests/service/test_aiokafka_privates.py)."""
    coordinator = consumer._coordinator
    return coordinator is not None and coordinator.coordinator_id is not None


class CoordinatorWatch:
    """A consumer's fetches return nothing while Kafka is away, and fail nowhere: a process
    that has nothing to commit (idle, or busy in its engine) would never see the outage.
    One whose consumer lost its group coordinator for ``CUT_OFF_S`` is in an outage too:
    it says so, shows it in the outage gauge, and gives up after ``kafka.max_outage_s``."""

    def __init__(self, outage: KafkaOutage) -> None:
        self.outage = outage
        self.lost: float | None = None  # since when the coordinator is unknown

    async def check(self, consumer: AIOKafkaConsumer) -> None:
        """After each fetch (whose records are still handed over): cut off, it waits the
        outage's backoff; raises once the outage has lasted ``kafka.max_outage_s``."""
        if coordinator_known(consumer):
            if self.lost is not None:
                self.outage.succeeded()  # (an idle process's only sign that Kafka is back)
            self.lost = None
        elif self.lost is None:
            self.lost = time.monotonic()
        elif time.monotonic() - self.lost >= CUT_OFF_S:
            await asyncio.sleep(self.outage.failed(
                KafkaConnectionError("no group coordinator"), "finding the group coordinator"))


async def ride_out(outage: KafkaOutage, exc: KafkaError, what: str,
                   step_down: Callable[[BaseException], Awaitable[None]]) -> None:
    """A role's turn failed with ``exc``. A fenced producer steps the role down (``rejoin``);
    so does a retriable failure while Kafka is away, then waits the outage's backoff: the
    step-down drops the producers and the turn's records, the next assignment starts new
    producers with the partitions' transactional ids (which abort what the outage cut)
    and reads from the committed offsets, so the turn is redone once, whole. Raises what
    is neither, or an outage that lasted ``kafka.max_outage_s``."""
    if isinstance(exc, FENCED) and outage.since is None:
        await step_down(exc)
        return
    delay = outage.failed(exc, what)
    await step_down(exc)
    await asyncio.sleep(delay)

class Listener(ConsumerRebalanceListener):
    """Hands rebalances to the loop's owner (``on_revoked``, ``on_assigned``). aiokafka only
    logs what a listener raises: the error is kept in ``owner.failure`` and the owner's
    loop raises it."""

    def __init__(self, owner: Rebalanced) -> None:
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


@dataclass
class Fetched:
    """One partition's records, fetched in its epoch ``epoch``."""

    tp: TopicPartition
    epoch: int
    records: list[Any]


class Ahead:
    """The loop's fetch-ahead mode, for an owner whose batch can take longer than
    ``kafka.max_poll_interval_ms`` (the single worker's engine): a fetcher keeps calling
    getmany while a batch is processed, so the group never sees the member as stuck, and
    queues what it fetched, one partition at a time; every partition pauses while
    ``max_batches`` wait, and resumes below.

    Each held partition has an epoch, given once its producer and position are ready
    (``admit``) and taken on revocation (``revoke``): a queued batch whose partition
    changed epoch since its fetch is dropped (it is fetched again from the position the
    assignment set), and records fetched for a partition without an epoch are put back."""

    def __init__(self, max_batches: int,
                 gauges: Callable[[int, int], None] | None = None,
                 outage: KafkaOutage | None = None) -> None:
        self.max_batches = max_batches
        self.gauges = gauges  # (queued batches, paused partitions), after every change
        self.outage = outage  # a fetch that fails while Kafka is away is retried
        self.queue: asyncio.Queue[Fetched] = asyncio.Queue()
        self.epochs: dict[TopicPartition, int] = {}
        self.revoking: set[TopicPartition] = set()
        self.paused: set[TopicPartition] = set()
        self.inflight: TopicPartition | None = None
        self.idle = asyncio.Event()  # no batch in hand
        self.idle.set()
        self._counter = 0

    def held(self, tp: TopicPartition, epoch: int | None = None) -> bool:
        """``tp`` is ours and not being revoked (and still in ``epoch``, if given)."""
        return (tp in self.epochs and tp not in self.revoking
                and (epoch is None or self.epochs[tp] == epoch))

    def admit(self, tps: Iterable[TopicPartition]) -> None:
        """From now on, what is fetched for ``tps`` is processed."""
        for tp in tps:
            self._counter += 1
            self.epochs[tp] = self._counter

    async def revoke(self, tps: set[TopicPartition], timeout_s: float) -> None:
        """Their queued batches are abandoned (never committed: the next owner reads them
        from the committed offset); a batch of theirs in hand is finished first, for at
        most ``timeout_s`` (bounded: one micro-batch)."""
        self.revoking |= tps
        if self.inflight in tps:
            try:
                await asyncio.wait_for(self.idle.wait(), timeout_s)
            except TimeoutError:
                log.error("batch of %s still running at revocation; abandoning it",
                          self.inflight)
        for tp in tps:
            self.epochs.pop(tp, None)
        self.paused -= tps
        self.revoking -= tps

    async def run(self, owner: Running, consumer: AIOKafkaConsumer, max_records: int,
                  process: Callable[[dict[TopicPartition, list[Any]]], Awaitable[None]]
                  ) -> None:
        """Fetch (a task of its own) and process until the owner stops; raises what the
        fetcher or a rebalance listener failed with. A stop lets the batch in hand end."""
        fetching = asyncio.create_task(self._fetch(owner, consumer, max_records),
                                       name="fetch")
        try:
            while not owner.stopping.is_set():
                item = await self._next(fetching)
                if owner.stopping.is_set():
                    break  # not started: left uncommitted, consumed again after a restart
                if not self.held(item.tp, item.epoch):
                    continue  # revoked since it was fetched
                self.inflight = item.tp
                self.idle.clear()
                try:
                    await process({item.tp: item.records})
                finally:
                    self.inflight = None
                    self.idle.set()
        finally:
            fetching.cancel()
            await asyncio.gather(fetching, return_exceptions=True)

    async def _next(self, fetching: asyncio.Task[None]) -> Fetched:
        getting = asyncio.ensure_future(self.queue.get())
        try:
            await asyncio.wait({getting, fetching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getting.done():
                getting.cancel()
        if getting.done() and not getting.cancelled():
            self._gauge()
            return getting.result()
        fetching.result()  # raises the fetcher's failure
        raise RuntimeError("the fetcher ended")

    async def _fetch(self, owner: Running, consumer: AIOKafkaConsumer, max_records: int
                     ) -> None:
        failing = False  # (a fetch while Kafka is away returns nothing, or fails)
        watch = None if self.outage is None else CoordinatorWatch(self.outage)
        while not owner.stopping.is_set():
            if owner.failure is not None:
                raise owner.failure
            self._backpressure(consumer)
            # getmany goes on while paused: the group never sees us as stuck
            try:
                batches = await consumer.getmany(timeout_ms=200, max_records=max_records)
            except KafkaError as exc:
                if self.outage is None:
                    raise
                await asyncio.sleep(self.outage.failed(exc, "fetching"))
                failing = True
                continue
            if failing and self.outage is not None:
                self.outage.succeeded()
                failing = False
            for tp, records in batches.items():
                if not records:
                    continue
                epoch = self.epochs.get(tp)
                if epoch is None:
                    # fetched while its assignment was being set up: put the position back
                    # rather than skip the records
                    if tp in consumer.assignment():
                        consumer.seek(tp, records[0].offset)
                    continue
                self.queue.put_nowait(Fetched(tp, epoch, records))
            self._gauge()
            if watch is not None:
                await watch.check(consumer)

    def _backpressure(self, consumer: AIOKafkaConsumer) -> None:
        assignment = consumer.assignment()
        if self.queue.qsize() >= self.max_batches:
            to_pause = set(assignment) - self.paused
            if to_pause:
                consumer.pause(*to_pause)
                self.paused |= to_pause
        elif self.paused:
            to_resume = self.paused & set(assignment)
            if to_resume:
                consumer.resume(*to_resume)
            self.paused.clear()
        self._gauge()

    def _gauge(self) -> None:
        if self.gauges is not None:
            self.gauges(self.queue.qsize(), len(self.paused))


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
