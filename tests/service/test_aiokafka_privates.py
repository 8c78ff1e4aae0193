"""The private aiokafka APIs the service uses: the group coordinator's fetch of committed
offsets with their metadata (dupalign.service.topology.fetch_committed) and its request to
rejoin the group (dupalign.service.loop.rejoin, a role stepping down). Fails when aiokafka
changes them, so an upgrade is caught here rather than at a worker's takeover."""

from __future__ import annotations

import asyncio
import inspect

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.consumer.group_coordinator import GroupCoordinator

from dupalign.service.loop import rejoin
from dupalign.service.topology import fetch_committed


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
