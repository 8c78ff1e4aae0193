"""A stage store kept in a compacted changelog (dupalign/service/changelog.py) on a real broker:
the time to rebuild a near shard of ``--pages`` pages on a fresh store from its changelog, and
what the changelog keeps per page once the log cleaner compacted it.

    python -m tests.bench.bench_changelog [--pages 100000] [--removed 25000] [--turn 256]
        [--bootstrap H:P]

The shard: ``NearShard`` (dupalign/stages/near_shard.py), shard 1 of 2 by fingerprint prefix,
over its own store, each page a random fingerprint of the shard's prefix and a verification
sketch of ``near.cws_samples`` (128) random 64-bit min-hashes (what the store holds per page:
a ``simhash`` key and a 1 KB ``cws`` value). ``--pages + --removed`` pages are added, in
transactions of ``--turn`` pages with the turn's input offset noted in the store, and the
first ``--removed`` of them removed again (retention, new versions: tombstones), so that
``--pages`` are alive at the end. The changelog topic is made with ``ensure_changelog`` and
then given an eager cleaner (segment.bytes 8 MB, min.cleanable.dirty.ratio 0.01,
delete.retention.ms 0: tombstones go at the next cleaning instead of after a day) so that
compaction happens within the run.

Measured: the CPU of ``NearShard.add`` per page, unobserved and observed (side by side, on
the first 20,000 pages), and of making the turn's records; the rebuild on a fresh directory
before compaction (every record written) and after (restore: reading the partition to its
end and writing the store; open: ``NearShard`` loading its table from the store), with the
contents checked equal to the written store; records, payload bytes (keys + values) and the
broker's log segment bytes on disk (only with the broker this benchmark starts) per alive
page. Without --bootstrap a broker is started with deploy/kafka/broker.sh.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from pathlib import Path

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from dupalign.config import EngineConfig
from dupalign.service.changelog import (
    Changelog,
    Restored,
    changelog_topic,
    encode_key,
    ensure_changelog,
    restore,
)
from dupalign.service.config import KafkaConfig
from dupalign.service.loop import Checkpoint
from dupalign.service.topology import COMPACTED, new_producer
from dupalign.stages.near_shard import NearShard
from dupalign.store import records
from dupalign.store.database import Store
from tests.bench.bench_worker import run_with_broker

SHARD, BITS, PARTITION = 1, 1, 0
EAGER = {"segment.bytes": str(8 << 20), "min.cleanable.dirty.ratio": "0.01",
         "delete.retention.ms": "0", "min.compaction.lag.ms": "0"}


def _pages(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    fps = rng.integers(0, 1 << 63, n, dtype=np.uint64) | np.uint64(1 << 63)  # shard 1's prefix
    return fps, rng.integers(0, np.iinfo(np.uint64).max, (n, k), dtype=np.uint64,
                             endpoint=True)


def _add_cpu(store: Store, config: EngineConfig, fps: np.ndarray, sketches: np.ndarray) -> float:
    shard = NearShard(store, config, SHARD, BITS)
    t0 = time.process_time()
    for o in range(len(fps)):
        shard.add(o, int(fps[o]), sketches[o])
    return (time.process_time() - t0) / len(fps)


async def log_stats(kc: KafkaConfig, topic: str) -> tuple[int, int]:
    """Records and key + value bytes the partition holds now."""
    tp = TopicPartition(topic, PARTITION)
    consumer = AIOKafkaConsumer(**kc.client_kwargs(), isolation_level="read_uncommitted",
                                enable_auto_commit=False, fetch_max_bytes=50 << 20,
                                max_partition_fetch_bytes=16 << 20)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        n = size = 0
        while await consumer.position(tp) < end:
            for recs in (await consumer.getmany(tp, timeout_ms=1000)).values():
                n += len(recs)
                size += sum(len(r.key) + len(r.value or b"") for r in recs)
        return n, size
    finally:
        await consumer.stop()


def disk_bytes(data: Path, topic: str) -> float:
    return float(sum(f.stat().st_size for f in (data / f"{topic}-{PARTITION}").glob("*.log")))


def _contents(store: Store) -> dict[str, list[tuple[bytes, bytes]]]:
    return {f: list(store.items(f)) for f in ("simhash", "cws", "offsets")}


async def _rebuild(kc: KafkaConfig, config: EngineConfig, path: Path, topic: str
                   ) -> tuple[Restored, float, Store, int]:
    store = Store(path, config.frozen_params())
    done = await restore(kc, store, topic, PARTITION)
    t0 = time.perf_counter()
    shard = NearShard(store, config, SHARD, BITS)
    return done, time.perf_counter() - t0, store, len(shard)


async def run(args: argparse.Namespace, bootstrap: str, tmp: Path) -> None:
    kc = KafkaConfig(bootstrap_servers=bootstrap)
    config = EngineConfig()
    name = uuid.uuid4().hex[:8]
    topic = changelog_topic(kc, f"near-bench-{name}")
    await ensure_changelog(kc, topic, 1)  # (the cleaner made eager only before compaction)
    total = args.pages + args.removed
    fps, sketches = _pages(total, config.near.cws_samples, 1)

    probe = min(20_000, total)
    plain_store = Store(tmp / "plain", config.frozen_params())
    plain = _add_cpu(plain_store, config, fps[:probe], sketches[:probe])
    noted = Store(tmp / "noted", config.frozen_params())
    Changelog(noted, topic + "-unused", PARTITION)  # observed, its records never sent
    observed = _add_cpu(noted, config, fps[:probe], sketches[:probe])
    plain_store.close()
    noted.close()

    store = Store(tmp / "a", config.frozen_params())
    log = Changelog(store, topic, PARTITION)
    shard = NearShard(store, config, SHARD, BITS)
    producer = new_producer(kc, f"bench-changelog-{name}")
    await producer.start()
    encode_cpu = 0.0
    t0 = time.perf_counter()
    try:
        offset = 0

        async def commit() -> None:
            nonlocal encode_cpu
            c0 = time.process_time()
            out = log.outgoing()
            encode_cpu += time.process_time() - c0
            await Checkpoint({}, out).commit(producer, f"bench-changelog-{name}")

        for start in range(0, total, args.turn):
            for o in range(start, min(total, start + args.turn)):
                shard.add(o, int(fps[o]), sketches[o])
            offset = min(total, start + args.turn)
            batch = store.batch()
            records.put_offset(batch, "pages.near", SHARD, offset)
            store.write(batch)
            await commit()
        for start in range(0, args.removed, args.turn):
            stop = min(args.removed, start + args.turn)
            shard.remove([(o, int(fps[o])) for o in range(start, stop)])
            offset += 1
            batch = store.batch()
            records.put_offset(batch, "pages.near", SHARD, offset)
            store.write(batch)
            await commit()
        write_s = time.perf_counter() - t0
        expected = _contents(store)
        assert len(shard) == args.pages

        written, written_bytes = await log_stats(kc, topic)
        data = tmp / "broker" / "data"
        disk_before = disk_bytes(data, topic) if data.exists() else float("nan")
        before = await _rebuild(kc, config, tmp / "b", topic)
        assert _contents(before[2]) == expected and before[3] == args.pages
        before[2].close()

        # compaction: the active segment is never cleaned; a last turn rolls it
        await admin_roll(kc, topic)
        batch = store.batch()
        records.put_offset(batch, "pages.near", SHARD, offset + 1)
        store.write(batch)
        await commit()
        expected = _contents(store)
        live = sum(len(v) for v in expected.values())
        # compacted: the last record per key, the removed pages' tombstones (kept for
        # delete.retention.ms after a first cleaning: they go at a later one) and the active
        # segment's one record (its key's older record stays until that segment is cleaned)
        compacted = live + 2 * args.removed + 1
        deadline = time.monotonic() + args.wait
        while (held := await log_stats(kc, topic))[0] > compacted:
            if time.monotonic() > deadline:
                print(f"not compacted after {args.wait} s: {held[0]} records, {compacted} "
                      "expected")
                break
            await asyncio.sleep(5)
        live_bytes = sum(len(encode_key(f, k)) + len(v) for f, kv in expected.items()
                         for k, v in kv)
        disk_after = disk_bytes(data, topic) if data.exists() else float("nan")
        after = await _rebuild(kc, config, tmp / "c", topic)
        assert _contents(after[2]) == expected and after[3] == args.pages
        after[2].close()
    finally:
        await producer.stop()
    store.close()

    n = args.pages
    print(f"\nnear shard {SHARD} of 2, {n:,} pages alive ({total:,} added, {args.removed:,} "
          f"removed), {config.near.cws_samples} min-hashes a sketch, turns of {args.turn} pages")
    print(f"NearShard.add CPU per page ({probe:,} pages): unobserved {plain * 1e6:.0f} us, "
          f"observed {observed * 1e6:.0f} us; making the records {encode_cpu / total * 1e6:.0f} "
          f"us per page; writing the {total:,} pages through the changelog {write_s:.1f} s")
    print(f"\n{'changelog':<22}{'records':>10}{'rec/page':>10}{'payload B/page':>16}"
          f"{'disk B/page':>13}{'restore s':>11}{'open s':>8}{'rebuild s':>11}")
    for label, stats, disk, rebuilt in (("as written", (written, written_bytes), disk_before,
                                         before),
                                        ("compacted", held, disk_after, after)):
        done, open_s = rebuilt[0], rebuilt[1]
        print(f"{label:<22}{stats[0]:>10,}{stats[0] / n:>10.2f}{stats[1] / n:>16.0f}"
              f"{disk / n:>13.0f}{done.seconds:>11.1f}{open_s:>8.1f}"
              f"{done.seconds + open_s:>11.1f}")
    print(f"the live keys' records alone (no tombstones): {live:,} records, "
          f"{live_bytes / n:.0f} payload bytes per page")


async def admin_roll(kc: KafkaConfig, topic: str) -> None:
    """An eager cleaner (``EAGER``), and the active segment rolled at its next record
    (segment.ms 1 s, then 2 s of waiting). AlterConfigs replaces the topic's whole config:
    what ``ensure_changelog`` set is given again, and checked after."""
    configs = {**COMPACTED, "compression.type": kc.retained_compression,
               "max.message.bytes": str(kc.max_request_size), **EAGER, "segment.ms": "1000"}
    admin = AIOKafkaAdminClient(**kc.client_kwargs())
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                                  configs=configs)])
    finally:
        await admin.close()
    await ensure_changelog(kc, topic, 1)
    await asyncio.sleep(2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=100_000, help="pages alive at the end")
    parser.add_argument("--removed", type=int, default=25_000, help="pages added and removed")
    parser.add_argument("--turn", type=int, default=256, help="pages per transaction")
    parser.add_argument("--wait", type=float, default=300, help="seconds to wait for the cleaner")
    parser.add_argument("--bootstrap", help="use a running broker (no disk bytes then)")
    args = parser.parse_args()
    return run_with_broker(args.bootstrap, "bench-changelog-",
                           lambda b, tmp: run(args, b, tmp))


if __name__ == "__main__":
    raise SystemExit(main())
