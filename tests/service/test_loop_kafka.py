"""The service's checkpoint unit (dupalign/service/loop.py ``Checkpoint``) on a real broker:
the records and the consumed offsets become visible together or not at all, and the store's
note (``after``) runs only once they did."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from dupalign.service.config import KafkaConfig
from dupalign.service.loop import Checkpoint
from dupalign.service.topology import (
    Outgoing,
    committed_offsets,
    fetch_committed,
    new_producer,
    send_all,
)

pytestmark = [pytest.mark.kafka]


async def _committed_values(kc: KafkaConfig, tp: TopicPartition) -> list[bytes | None]:
    consumer = AIOKafkaConsumer(**kc.client_kwargs(), isolation_level="read_committed",
                                enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        values: list[bytes | None] = []
        while await consumer.position(tp) < end:
            for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                values += [r.value for r in records]
        return values
    finally:
        await consumer.stop()


async def test_a_checkpoint_commits_its_records_and_offsets_together_then_notes_them(
        kafka_bootstrap: str) -> None:
    kc = KafkaConfig(bootstrap_servers=kafka_bootstrap)
    name = uuid.uuid4().hex[:8]
    pages, out, group = f"loop-in-{name}", f"loop-out-{name}", f"loop-{name}"
    admin = AIOKafkaAdminClient(**kc.client_kwargs())
    await admin.start()
    producer = new_producer(kc, f"loop-{name}")
    # the group's member that reads its commits (with their metadata), subscribed to nothing
    group_reader = AIOKafkaConsumer(**kc.client_kwargs(), group_id=group,
                                    enable_auto_commit=False)
    try:
        await admin.create_topics([NewTopic(pages, 1, 1), NewTopic(out, 1, 1)])
        await producer.start()
        await group_reader.start()
        notes: list[str] = []

        async def note() -> None:
            notes.append("noted")

        async def broken(p: AIOKafkaProducer) -> None:
            await send_all(p, [Outgoing(out, b"lost")])  # acknowledged, then the batch fails
            raise RuntimeError("the batch failed after its first record")

        tp_in = TopicPartition(pages, 0)
        with pytest.raises(RuntimeError, match="first record"):
            await Checkpoint({tp_in: 5}, send=broken, after=note).commit(producer, group)
        assert notes == []  # never noted: nothing was committed
        assert await committed_offsets(group_reader, [tp_in]) == {}

        unit = Checkpoint({tp_in: (7, "dupalign:published")}, [Outgoing(out, b"kept")],
                          after=note)
        await unit.commit(producer, group)
        assert notes == ["noted"]
        assert unit.publish_s > 0 and unit.commit_s > 0
        committed = await asyncio.wait_for(_committed(group_reader, tp_in), 30)
        assert (committed.offset, committed.metadata) == (7, "dupalign:published")
        values = await asyncio.wait_for(_committed_values(kc, TopicPartition(out, 0)), 30)
        assert values == [b"kept"]  # the aborted record is invisible to read_committed
    finally:
        await group_reader.stop()
        await producer.stop()
        await admin.close()


async def _committed(reader: AIOKafkaConsumer, tp: TopicPartition) -> Any:
    """The group's committed offset of ``tp`` once the coordinator shows it: an offset sent
    in a transaction stays pending, and is not returned, until the commit markers are written
    (a test on a loaded machine read it too early)."""
    while True:
        found = await fetch_committed(reader, [tp])
        if tp in found:
            return found[tp]
        await asyncio.sleep(0.2)
