"""A store kept in a compacted changelog (dupalign/service/changelog.py) on a real broker: a
store written in transactions, one of them aborted, restores into a fresh directory with the
same contents and input offsets, before and after the log cleaner compacted the topic."""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import NewTopic

from dupalign.service.changelog import Changelog, changelog_topic, ensure_changelog, restore
from dupalign.service.config import KafkaConfig
from dupalign.service.loop import Checkpoint
from dupalign.service.topology import TopologyError, new_producer, send_all
from dupalign.store import records
from dupalign.store.database import Store
from dupalign.store.keys import FAMILIES, u64
from tests.kafka_topics import create_topics
from tests.service.test_loop_kafka import partition_values

pytestmark = [pytest.mark.kafka]

PARAMS = {"p": 1}
PARTITION = 1  # of 2: the records go to the store's own partition


def _contents(store: Store) -> dict[str, list[tuple[bytes, bytes]]]:
    return {f: [(bytes(k), bytes(v)) for k, v in store.items(f)] for f in FAMILIES}


def _turn(store: Store, rng: random.Random, offset: int) -> None:
    """Pages of a stage's turn: puts (empty values too), deletes and a range delete over few
    keys, so that later turns overwrite earlier ones; the input offset noted with them."""
    for _ in range(rng.randrange(1, 6)):
        batch = store.batch()
        for _ in range(rng.randrange(1, 20)):
            k = u64(rng.randrange(200))
            r = rng.random()
            if r < 0.5:
                batch.put("cws", k, rng.randbytes(rng.randrange(0, 64)))
            elif r < 0.8:
                batch.put("simhash", k, b"")
            else:
                batch.delete(rng.choice(("cws", "simhash")), k)
        if rng.random() < 0.2:
            lo = rng.randrange(200)
            batch.delete_range("cws", u64(lo), u64(lo + rng.randrange(1, 30)))
        records.put_offset(batch, "in", 0, offset)
        store.write(batch)


async def _commit_turns(kc: KafkaConfig, store: Store, log: Changelog, name: str,
                        turns: range, rng: random.Random) -> None:
    producer = new_producer(kc, f"changelog-{name}")
    await producer.start()
    try:
        for t in turns:
            _turn(store, rng, t + 1)
            await Checkpoint({}, log.outgoing()).commit(producer, f"changelog-{name}")
    finally:
        await producer.stop()


async def _aborted_turn(kc: KafkaConfig, scratch: Store, topic: str, name: str,
                        rng: random.Random) -> int:
    """A turn whose transaction aborts: its records reach the log, marked aborted."""
    log = Changelog(scratch, topic, PARTITION)
    for k in range(0, 200, 3):  # deletes of live keys, new values, a later offset
        batch = scratch.batch()
        batch.delete("simhash", u64(k))
        batch.put("cws", u64(k), b"aborted")
        records.put_offset(batch, "in", 0, 10_000)
        scratch.write(batch)
    out = log.outgoing()
    producer = new_producer(kc, f"changelog-aborting-{name}")
    await producer.start()
    try:
        with pytest.raises(RuntimeError, match="abort"):
            async with producer.transaction():
                await send_all(producer, out)
                raise RuntimeError("abort the turn")
    finally:
        await producer.stop()
    return len(out)


async def _log_records(kc: KafkaConfig, topic: str) -> int:
    """The records the partition holds now, aborted ones included."""
    return len(await partition_values(kc, TopicPartition(topic, PARTITION), "read_uncommitted"))


async def test_a_restored_store_equals_the_written_one_aborted_turns_left_out(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    kc = KafkaConfig(bootstrap_servers=kafka_bootstrap)
    name = uuid.uuid4().hex[:8]
    topic = changelog_topic(kc, f"test-{name}")
    await ensure_changelog(kc, topic, 2)
    await ensure_changelog(kc, topic, 2)  # (present: checked, not made again)
    rng = random.Random(7)
    store = Store(tmp_path / "a", PARAMS)
    log = Changelog(store, topic, PARTITION)
    await _commit_turns(kc, store, log, name, range(0, 10), rng)
    scratch = Store(tmp_path / "scratch", PARAMS)
    assert await _aborted_turn(kc, scratch, topic, name, rng) > 0
    await _commit_turns(kc, store, log, name, range(10, 20), rng)
    expected = _contents(store)
    assert expected["simhash"] and expected["cws"]
    assert any(v == b"" for _, v in expected["simhash"])  # empty values are not tombstones

    fresh = Store(tmp_path / "b", PARAMS)
    done = await restore(kc, fresh, topic, PARTITION)
    assert _contents(fresh) == expected
    assert records.get_offset(fresh, "in", 0) == 20  # where the stage resumes its input
    assert done.records > 0
    with pytest.raises(ValueError, match="not fresh"):
        await restore(kc, fresh, topic, PARTITION)
    for s in (store, scratch, fresh):
        s.close()


async def test_a_compacted_changelog_restores_the_same_store(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """The log cleaner drops overwritten values and, after delete.retention.ms, tombstones:
    the restore still gives the store (the topic's cleaner settings made eager here)."""
    kc = KafkaConfig(bootstrap_servers=kafka_bootstrap)
    name = uuid.uuid4().hex[:8]
    topic = changelog_topic(kc, f"test-{name}")
    await create_topics(kafka_bootstrap, [NewTopic(topic, 2, 1, topic_configs={
        "cleanup.policy": "compact", "segment.ms": "200", "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "0", "min.compaction.lag.ms": "0"}),
                                          NewTopic(f"{topic}-deleting", 1, 1)])
    with pytest.raises(TopologyError, match="must be 'compact'"):
        await ensure_changelog(kc, f"{topic}-deleting", 1)
    await ensure_changelog(kc, topic, 2)
    rng = random.Random(11)
    store = Store(tmp_path / "a", PARAMS)
    log = Changelog(store, topic, PARTITION)
    await _commit_turns(kc, store, log, name, range(0, 30), rng)
    scratch = Store(tmp_path / "scratch", PARAMS)
    await _aborted_turn(kc, scratch, topic, name, rng)
    await _commit_turns(kc, store, log, name, range(30, 40), rng)
    written = await _log_records(kc, topic)
    await asyncio.sleep(0.5)
    await _commit_turns(kc, store, log, name, range(40, 41), rng)  # rolls the segment
    deadline = time.monotonic() + 120  # the cleaner looks every 15 s (log.cleaner.backoff.ms)
    while (held := await _log_records(kc, topic)) >= written:
        assert time.monotonic() < deadline, f"not compacted: {held} records, {written} written"
        await asyncio.sleep(2)
    expected = _contents(store)
    fresh = Store(tmp_path / "b", PARAMS)
    await restore(kc, fresh, topic, PARTITION)
    assert _contents(fresh) == expected
    assert records.get_offset(fresh, "in", 0) == 41
    for s in (store, scratch, fresh):
        s.close()
