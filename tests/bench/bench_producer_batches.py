"""A role's transaction of many records to a few partitions on a real broker: wall time and
this process's CPU per transaction, producer batch size against how the records are handed
over, side by side in one run (docs/performance/pipeline.md, "The producers' batches").

    python -m tests.bench.bench_producer_batches [--transactions 30] [--pages 32]
        [--bootstrap H:P]

A transaction is what the sketch role sends for a batch of ``--pages`` pages, in sizes only
(random bytes): per page a 14 KB sketch to one partition, 6.5 KB of windows to another and
a 200-byte entry to a third (docs/performance/pipeline.md: bytes per page between the roles).
aiokafka sends one batch per partition in a request and one request per broker at a time,
so a transaction whose records fill N batches of one partition waits N round trips; its
default batch is 16 KB. Rows: that default and ``topology.batch_bytes`` (1 MB), each with
a ``send`` per record (``send_all``) and with a batch per partition (``send_batched``).
Without --bootstrap a broker is started with deploy/kafka/broker.sh.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import uuid
from pathlib import Path

from aiokafka import AIOKafkaProducer
from aiokafka.admin import NewTopic

from dupalign.service.config import KafkaConfig
from dupalign.service.send_batches import send_batched
from dupalign.service.topology import Outgoing, batch_bytes, send_all
from tests.bench.bench_worker import run_with_broker
from tests.kafka_topics import create_topics

# (bytes, partition) of each page's records: sketch, windows, entry
PAGE = ((14_000, 0), (6_500, 1), (200, 2))


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _measure(kc: KafkaConfig, batch: int, batched: bool, transactions: int,
                   pages: int) -> tuple[float, float]:
    """Wall ms and CPU ms per transaction."""
    topic = f"bench-batches-{uuid.uuid4().hex[:8]}"
    await create_topics(kc.bootstrap_servers, [NewTopic(topic, 3, 1, topic_configs={
        "max.message.bytes": str(kc.max_request_size)})])
    producer = AIOKafkaProducer(**kc.client_kwargs(), enable_idempotence=True, acks="all",
                                linger_ms=kc.linger_ms, max_batch_size=batch,
                                transactional_id=topic)
    await producer.start()
    records = [Outgoing(topic, os.urandom(size), key=b"%d" % i, partition=p)
               for i in range(pages) for size, p in PAGE]
    try:
        wall, cpu = time.perf_counter(), _cpu_s()
        for _ in range(transactions):
            async with producer.transaction():
                if batched:
                    await send_batched(producer, records, alone=batch)
                else:
                    await send_all(producer, records)
        wall, cpu = time.perf_counter() - wall, _cpu_s() - cpu
    finally:
        await producer.stop()
    return 1000 * wall / transactions, 1000 * cpu / transactions


async def run(args: argparse.Namespace, bootstrap: str, tmp: Path) -> None:
    kc = KafkaConfig(bootstrap_servers=bootstrap)
    await _measure(kc, batch_bytes(kc), True, 3, args.pages)  # (connections, metadata)
    print(f"a transaction of {args.pages} pages ({len(PAGE) * args.pages} records, "
          f"{sum(s for s, _ in PAGE) * args.pages / 1e3:.0f} KB to 3 partitions), "
          f"{args.transactions} transactions a row")
    print("| producer batch | records handed over | wall ms a transaction | "
          "CPU ms a transaction |\n|---|---|---|---|")
    for batch in (16384, batch_bytes(kc)):
        for batched in (False, True):
            wall, cpu = await _measure(kc, batch, batched, args.transactions, args.pages)
            how = "a batch per partition (send_batched)" if batched else "send per record"
            print(f"| {batch // 1024} KB | {how} | {wall:.1f} | {cpu:.2f} |")
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--transactions", type=int, default=30)
    p.add_argument("--pages", type=int, default=32)
    p.add_argument("--bootstrap")
    args = p.parse_args()
    return run_with_broker(args.bootstrap, "bench-batches-",
                           lambda bootstrap, tmp: run(args, bootstrap, tmp))


if __name__ == "__main__":
    raise SystemExit(main())
