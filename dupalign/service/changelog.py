"""A stage's store partition kept in a compacted changelog topic, as Kafka Streams keeps its
state stores (docs/pipeline.md, "State and what Kafka keeps").

Partition p of the changelog holds the store of the stage's input partition p: one record per
changed key (key: the column family's name, length-prefixed, then the store key; value: the
value, or a tombstone for a deletion). ``Changelog`` observes the store (``Store.observe``)
and hands what changed since the last turn, the last value per key, as records for the
stage's transaction, the one that also carries the stage's outputs and its input offsets.
So what read_committed readers see of the changelog is the store as of a committed input
offset, and the store notes that offset itself (``records.put_offset``, in its batches).
A stage may leave out keys its store derives from the others (``leave_out``: a list shard's
entries, from its forward records), which the stage rebuilds when it opens a restored store.

``restore``: a fresh store directory reads its partition from the beginning to the end a
read_committed consumer sees (aborted transactions skipped), then the stage resumes its input
from the offsets noted in the restored store. The log cleaner keeps the last record per key
and drops tombstones after ``delete.retention.ms``: what Kafka keeps is bounded by the store,
not by the history of writes.

A store written in a turn whose transaction then aborts holds changes the changelog has not:
it must not be used again as it is; the stage restores a fresh directory instead (Kafka
Streams wipes its stores after an unclean stop under exactly-once for the same reason).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from dupalign.service.changelog_parts import Rejoin, slice_limit, value_records
from dupalign.service.config import KafkaConfig
from dupalign.service.topology import Outgoing, TopologyError, ensure_topics
from dupalign.store.database import Change, Store
from dupalign.store.keys import FAMILIES

log = logging.getLogger("dupalign.changelog")


def changelog_topic(kc: KafkaConfig, stage: str) -> str:
    """The changelog of ``stage``'s stores: one partition per input partition of the stage."""
    return f"{kc.input_topic}.{stage}.changelog"


def encode_key(family: str, key: bytes) -> bytes:
    name = family.encode("ascii")
    return bytes([len(name)]) + name + key


def decode_key(raw: bytes) -> tuple[str, bytes]:
    n = raw[0]
    return raw[1:1 + n].decode("ascii"), raw[1 + n:]


# (family, key) -> whether the changelog leaves the key out: the stage's store derives it
# from what the changelog keeps, again at open after a restore (a list shard's entries)
LeaveOut = Callable[[str, bytes], bool]


class Changelog:
    """The changes of ``store`` since the last ``outgoing``, for partition ``partition`` of
    ``topic``: the last value per key (what the log cleaner would keep of them), but for
    the keys ``leave_out`` names; a value over ``limit`` bytes in parts (changelog_parts.py).
    ``counts``: the parts of the values last sent in more than one (a restore's); ``stale``:
    part keys to delete (a restore's)."""

    def __init__(self, store: Store, topic: str, partition: int, limit: int = 1 << 20,
                 counts: dict[bytes, int] | None = None, stale: Iterable[bytes] = (),
                 leave_out: LeaveOut | None = None) -> None:
        self.store, self.topic, self.partition = store, topic, partition
        self.limit, self.counts = limit, dict(counts or {})
        self.leave_out = leave_out
        self.pending: dict[tuple[str, bytes], bytes | None] = {}
        self.stale = list(stale)
        store.observe(self._note)

    def _note(self, changes: list[Change]) -> None:
        out = self.leave_out
        if out is None:
            self.pending.update(((f, k), v) for f, k, v in changes)
        else:
            self.pending.update(((f, k), v) for f, k, v in changes if not out(f, k))

    def outgoing(self) -> list[Outgoing]:
        """The records of the changes since the last call, for the turn's transaction."""
        pending, self.pending = self.pending, {}
        topic, partition, limit, counts = self.topic, self.partition, self.limit, self.counts
        out = [Outgoing(topic, None, key=k, partition=partition) for k in self.stale]
        self.stale = []
        one = slice_limit(limit)  # (a value up to this is one record)
        for (f, k), value in pending.items():
            key = encode_key(f, k)
            if (value is None or len(value) <= one) and key not in counts:
                out.append(Outgoing(topic, value, key=key, partition=partition))
                continue  # (``value_records`` of a value in one record, none before)
            records = value_records(topic, partition, key, value, limit, counts.pop(key, 1))
            if len(records) > 1 and records[0].headers:
                counts[key] = sum(r.value is not None for r in records)
            out += records
        return out

    def holds_only(self, key: tuple[str, bytes]) -> bool:
        """Whether the changes since the last ``outgoing`` are of store key ``key``
        (family, key) alone."""
        return not self.stale and set(self.pending) <= {key}

    def close(self) -> None:
        self.store.observe(None)


async def ensure_changelog(kc: KafkaConfig, topic: str, partitions: int,
                           counts_from: str = "") -> None:
    """Check (with ``kafka.create_topics``, create) the compacted changelog ``topic`` with
    ``partitions`` partitions (the stage's input's). A changelog that is not compacted
    expires records that a restore needs: refused. ``counts_from``: as ``ensure_topics``'."""
    await ensure_topics(kc, {topic: partitions}, compacted={topic}, counts_from=counts_from)
    admin = AIOKafkaAdminClient(**kc.client_kwargs())
    await admin.start()
    try:
        resource = ConfigResource(ConfigResourceType.TOPIC, topic,
                                  configs={"cleanup.policy": None})
        for response in await admin.describe_configs([resource]):
            for _, _, _, _, entries in response.resources:
                policy = {e[0]: e[1] for e in entries}.get("cleanup.policy")
                if policy != "compact":
                    raise TopologyError(
                        f"changelog topic {topic!r} has cleanup.policy = {policy!r}: it must "
                        "be 'compact' (with 'delete', records a restore needs expire)")
    finally:
        await admin.close()


@dataclass
class Restored:
    """What ``restore`` read: records (tombstones included), up to offset ``end``; the parts
    of its values in more than one (``counts``), the part keys no value uses (``stale``):
    for the store's ``Changelog``."""

    records: int
    end: int
    seconds: float
    counts: dict[bytes, int] = field(default_factory=dict)
    stale: list[bytes] = field(default_factory=list)


def _is_fresh(store: Store) -> bool:
    """Nothing but the parameters written at open."""
    if any(k != b"params" for k in store.keys("meta")):
        return False
    return all(next(store.keys(f), None) is None for f in FAMILIES if f != "meta")


async def restore(kc: KafkaConfig, store: Store, topic: str, partition: int,
                  chunk: int = 10_000) -> Restored:
    """Rebuild ``store`` (fresh: nothing written but its parameters) from partition
    ``partition`` of the changelog ``topic``, up to the end that read_committed sees now.
    Call it after the stage's transactional producer started: starting, it aborted what
    the partition's previous owner left open, which would otherwise hold that end back."""
    if not _is_fresh(store):
        raise ValueError(f"store {store.path} is not fresh: a changelog restores a new "
                         "store directory (keys the log cleaner dropped would stay)")
    t0 = time.perf_counter()
    tp = TopicPartition(topic, partition)
    consumer = AIOKafkaConsumer(
        **kc.client_kwargs(), group_id=None, enable_auto_commit=False,
        isolation_level="read_committed", max_partition_fetch_bytes=kc.max_partition_fetch_bytes,
        fetch_max_bytes=kc.fetch_max_bytes)
    await consumer.start()
    loop = asyncio.get_running_loop()
    n = 0
    rejoin = Rejoin()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]  # read_committed: the last stable offset
        while await consumer.position(tp) < end:
            for records in (await consumer.getmany(tp, timeout_ms=1000,
                                                   max_records=chunk)).values():
                mine = [r for r in records if r.offset < end]
                changes: list[Change] = [(*decode_key(k), v) for k, v in rejoin.add(mine)]
                # (off the event loop: a role's group heartbeats on it meanwhile)
                await loop.run_in_executor(None, store.apply, changes)
                n += len(mine)
        rejoined = rejoin.finish()  # (the values in parts: after all others, as the latest)
        await loop.run_in_executor(None, store.apply,
                                   [(*decode_key(k), v) for k, v in rejoined.changes])
    finally:
        await consumer.stop()
    seconds = time.perf_counter() - t0
    log.info("store %s restored from %s[%d]: %d records up to offset %d in %.1f s",
             store.path, topic, partition, n, end, seconds)
    return Restored(n, end, seconds, rejoined.counts, rejoined.stale)
