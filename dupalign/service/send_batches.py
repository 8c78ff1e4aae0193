"""Records sent a batch per partition, not one ``send`` each (docs/performance/pipeline.md,
"The stage roles on Kafka"): a stage turn's transaction holds its outputs and the
changelog records of what its store changed, ~230 records a page for a list partition
(a key per list entry). ``AIOKafkaProducer.send`` costs per record (metadata wait,
partitioner, accumulator, a future and its callbacks); a ``BatchBuilder`` filled with a
partition's records and handed over whole (``send_batch``, which adds the partition to
the transaction as ``send`` does) costs per batch.

The same records in the same order per partition as ``send_all``: each partition's
records go, in order, into batches sent one after the other. A record with no partition
named, or larger than a batch holds, goes through ``send`` as before (its partitioner, its
size check), after the batches of its partition (with no partition named: of its topic)
filled so far.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaProducer

from dupalign.service.topology import Outgoing, internal_waiters, mark_retrieved

# a record at least this large goes through ``send`` by default (aiokafka's default batch
# size: a batch's first record may exceed it, but ``send`` checks it against
# max_request_size)
ALONE_BYTES = 16384


def _size(o: Outgoing) -> int:
    return (len(o.value or b"") + len(o.key or b"")
            + sum(len(k) + len(v) for k, v in o.headers))


async def send_batched(producer: AIOKafkaProducer, records: list[Outgoing],
                       alone: int = ALONE_BYTES) -> None:
    """Send ``records`` and wait for every acknowledgement (``send_all``'s failures: the
    first raised once). ``alone``: records at least this large go through ``send`` (the
    producer's batch size, ``topology.batch_bytes``: a larger one would get a batch of
    its own unchecked)."""
    futures: list[asyncio.Future[Any]] = []
    open_: dict[tuple[str, int], Any] = {}  # (topic, partition) -> its batch being filled

    async def flush(tp: tuple[str, int]) -> None:
        batch = open_.pop(tp, None)
        if batch is not None:
            futures.append(await producer.send_batch(batch, tp[0], partition=tp[1]))

    try:
        for o in records:
            if o.partition is None or _size(o) >= alone:
                # (its partition, or any of its topic's if the partitioner picks it: the
                # records before it go first)
                for tp in [tp for tp in open_ if tp[0] == o.topic
                           and o.partition in (None, tp[1])]:
                    await flush(tp)
                futures.append(await producer.send(o.topic, o.value, key=o.key,
                                                   partition=o.partition, headers=o.headers))
                continue
            tp = (o.topic, o.partition)
            headers = o.headers
            batch = open_.get(tp)
            if batch is None or batch.append(timestamp=None, key=o.key, value=o.value,
                                             headers=headers) is None:
                await flush(tp)
                batch = open_[tp] = producer.create_batch()
                if batch.append(timestamp=None, key=o.key, value=o.value,
                                headers=headers) is None:
                    raise AssertionError("a batch's first record did not fit")
        for tp in list(open_):
            await flush(tp)
    except BaseException:
        for future in [*futures, *internal_waiters(producer)]:
            future.add_done_callback(mark_retrieved)
        raise
    await asyncio.gather(*futures)
