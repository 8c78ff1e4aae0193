"""A stage turn's records sent a batch per partition (dupalign/service/send_batches.py) on a real
broker: in one transaction, every record arrives once, with its key, value (tombstones too)
and headers, in the order sent within each partition named; records with no partition and
records too large for a batch go by ``send`` among them."""

from __future__ import annotations

import random
import uuid
from collections import defaultdict

import pytest
from aiokafka.admin import NewTopic

from dupalign.service.config import KafkaConfig
from dupalign.service.send_batches import ALONE_BYTES, send_batched
from dupalign.service.topology import Outgoing, batch_bytes, new_producer
from tests.kafka_topics import create_topics
from tests.role_processes import read_topic

pytestmark = [pytest.mark.kafka]


def _records(topics: dict[str, int], rng: random.Random, n: int) -> list[Outgoing]:
    out = []
    for i in range(n):
        topic = rng.choice(sorted(topics))
        partition = None if rng.random() < 0.05 else rng.randrange(topics[topic])
        r = rng.random()
        value = (None if r < 0.05 else b"" if r < 0.1
                 else rng.randbytes(ALONE_BYTES + 10) if r < 0.13
                 else rng.randbytes(rng.randrange(1, 400)))
        headers = [("i", str(i).encode())] if rng.random() < 0.7 else []
        out.append(Outgoing(topic, value, key=f"k{i}".encode(), partition=partition,
                            headers=headers))
    return out


@pytest.mark.parametrize("big_batches", [False, True])
async def test_batched_records_arrive_once_in_order_per_partition(kafka_bootstrap: str,
                                                                  big_batches: bool) -> None:
    """``big_batches``: the records of ``ALONE_BYTES`` and more in batches too (the
    producer's ``batch_bytes``, as the roles send), many records a batch."""
    kc = KafkaConfig(bootstrap_servers=kafka_bootstrap)
    alone = batch_bytes(kc) if big_batches else ALONE_BYTES
    name = uuid.uuid4().hex[:8]
    topics = {f"batched-{name}-a": 3, f"batched-{name}-b": 2}
    await create_topics(kafka_bootstrap, [NewTopic(t, n, 1) for t, n in topics.items()])
    rng = random.Random(5)
    sent = _records(topics, rng, 3000)
    producer = new_producer(kc, f"batched-{name}")
    await producer.start()
    try:
        for turn in (sent[:2000], sent[2000:]):  # (two transactions, as two turns)
            async with producer.transaction():
                await send_batched(producer, turn, alone=alone)
    finally:
        await producer.stop()
    got = {t: await read_topic(kafka_bootstrap, t, n) for t, n in topics.items()}
    by_key = {r.key: (t, r) for t, recs in got.items() for r in recs}
    assert len(by_key) == sum(map(len, got.values())) == len(sent)  # (each once)
    for o in sent:
        topic, r = by_key[o.key]
        assert topic == o.topic and r.value == o.value
        assert list(r.headers) == o.headers
        assert o.partition is None or r.partition == o.partition
    order: dict[tuple[str, int], list[bytes]] = defaultdict(list)
    for o in sent:
        if o.partition is not None:
            order[(o.topic, o.partition)].append(o.key or b"")
    for (topic, partition), keys in order.items():
        named = set(keys)
        read = [r.key for r in got[topic] if r.partition == partition and r.key in named]
        assert read == keys, (topic, partition)
