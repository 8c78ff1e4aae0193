"""The private aiokafka APIs the service uses: the group coordinator's fetch of committed
offsets with their metadata (dupalign.service.topology.fetch_committed), its request to rejoin
the group (dupalign.service.loop.rejoin, a role stepping down), its coordinator's node id
(dupalign.service.loop.coordinator_known: an idle role noticing an outage) and
``internal_waiters`` (a failed producer's futures that nothing awaits, also once a producer
given up on fails: dupalign.service.outage.stop_within) and the transaction manager's
partitions to add (dupalign.service.topology.add_to_transaction). Fails when aiokafka
changes them, so an upgrade is caught here rather than at a worker's takeover."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.consumer.group_coordinator import GroupCoordinator

from dupalign.service.loop import coordinator_known, rejoin
from dupalign.service.topology import (
    add_to_transaction,
    background_failure,
    fetch_committed,
    internal_waiters,
)


def test_the_consumer_keeps_its_group_coordinator_where_fetch_committed_reads_it() -> None:
    async def check() -> None:
        consumer = AIOKafkaConsumer(group_id="g", bootstrap_servers="127.0.0.1:9")
        try:
            assert consumer._coordinator is None  # before start: none
            # start() makes it, for a consumer with a group, in this attribute
            assert "self._coordinator = GroupCoordinator(" in inspect.getsource(
                AIOKafkaConsumer.start)
            with pytest.raises(RuntimeError, match="not started"):
                await fetch_committed(consumer, [TopicPartition("t", 0)])
        finally:
            await consumer.stop()
    asyncio.run(check())


def test_the_coordinator_fetches_committed_offsets_of_a_list_of_partitions() -> None:
    fetch = GroupCoordinator.fetch_committed_offsets
    assert inspect.iscoroutinefunction(fetch)
    assert list(inspect.signature(fetch).parameters) == ["self", "partitions"]


def test_the_coordinator_rejoins_when_asked_with_the_same_member_id() -> None:
    request = GroupCoordinator.request_rejoin
    assert not inspect.iscoroutinefunction(request)
    assert list(inspect.signature(request).parameters) == ["self"]
    # it completes the future the coordination routine waits on, which then rejoins
    assert "self._rejoin_needed_fut.set_result(None)" in inspect.getsource(request)
    assert "futures.append(self._rejoin_needed_fut)" in inspect.getsource(
        GroupCoordinator._GroupCoordinator__coordination_routine)  # type: ignore[attr-defined]

    async def unstarted() -> None:
        consumer = AIOKafkaConsumer(group_id="g", bootstrap_servers="127.0.0.1:9")
        try:
            with pytest.raises(RuntimeError, match="not started"):
                rejoin(consumer)
        finally:
            await consumer.stop()
    asyncio.run(unstarted())


def test_the_coordinator_forgets_a_coordinator_it_lost_where_coordinator_known_reads_it(
        ) -> None:
    # a connection or heartbeat failure marks the coordinator dead: its node id is dropped
    # until a lookup finds one again
    assert "self.coordinator_id = None" in inspect.getsource(GroupCoordinator.coordinator_dead)
    assert "self.coordinator_id = coordinator_id" in inspect.getsource(
        GroupCoordinator.ensure_coordinator_known)

    async def unstarted() -> None:
        consumer = AIOKafkaConsumer(group_id="g", bootstrap_servers="127.0.0.1:9")
        try:
            assert not coordinator_known(consumer)
        finally:
            await consumer.stop()
    asyncio.run(unstarted())


def test_a_failed_producer_keeps_its_unawaited_waiters_where_send_all_finds_them() -> None:
    """``send_all`` marks retrieved the futures a failed producer fails and nothing awaits
    (``internal_waiters``): the batches' drain waiters and the transaction's waiter."""
    async def check() -> None:
        producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9", transactional_id="t")
        try:
            producer._txn_manager.set_pid_and_epoch(1, 0)  # (what start() gets from the broker)
            producer._txn_manager.begin_transaction()
            waiter = producer._txn_manager._transaction_waiter
            assert isinstance(waiter, asyncio.Future)
            batches = producer._message_accumulator._batches
            assert isinstance(batches, dict)
            batch = producer._message_accumulator._append_batch(
                producer._message_accumulator.create_builder(), TopicPartition("t", 0))
            assert isinstance(batch._drain_waiter, asyncio.Future)
            assert list(batches) == [TopicPartition("t", 0)]
            assert internal_waiters(producer) == [batch._drain_waiter, waiter]
        finally:
            await producer.stop()
    asyncio.run(check())


def test_a_failed_sender_task_is_where_background_failure_finds_the_fencing() -> None:
    from aiokafka.producer.sender import Sender

    assert isinstance(Sender.sender_task, property)
    assert "self._sender = Sender(" in inspect.getsource(AIOKafkaProducer.__init__)
    # the task's exception is what makes the transaction fatal
    assert "self._txn_manager.fatal_error(task_exception)" in inspect.getsource(Sender._fail_all)
    # made a callback of the task when it starts: one that stop_within adds later runs after
    # it, and finds the waiters the fatal error failed (dupalign.service.outage)
    assert "self._sender_task.add_done_callback(self._fail_all)" in inspect.getsource(
        Sender.start)

    async def unstarted() -> None:
        assert background_failure(AIOKafkaProducer(bootstrap_servers="127.0.0.1:9")) is None
    asyncio.run(unstarted())


def test_partitions_added_ahead_go_in_the_senders_next_add_partitions_request() -> None:
    """``add_to_transaction`` puts partitions where a batch's hand-over puts them (the
    transaction manager's pending partitions), which the sender adds in one request before
    its offsets' requests and mutes until added; a producer with no transactions: none."""
    from aiokafka.producer.message_accumulator import MessageAccumulator
    from aiokafka.producer.sender import Sender

    assert "self._txn_manager.maybe_add_partition_to_txn(tp)" in inspect.getsource(
        MessageAccumulator._append_batch)
    request = inspect.getsource(Sender._maybe_do_transactional_request)
    assert request.index("partitions_to_add()") < request.index("consumer_group_to_add()")
    assert "txn_manager.partitions_to_add()" in inspect.getsource(Sender._sender_routine)

    async def check() -> None:
        producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9", transactional_id="t")
        plain = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9")
        try:
            producer._txn_manager.set_pid_and_epoch(1, 0)  # (what start() gets from the broker)
            producer._txn_manager.begin_transaction()
            tps = {TopicPartition("a", 0), TopicPartition("b", 3)}
            add_to_transaction(producer, tps)
            assert producer._txn_manager.partitions_to_add() == tps
            add_to_transaction(plain, tps)  # (no transaction manager: nothing to add)
        finally:
            await producer.stop()
            await plain.stop()
    asyncio.run(check())
