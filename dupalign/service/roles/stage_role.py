"""A stage of the partitioned pipeline as a role on Kafka (docs/pipeline.md, "Roles on Kafka"):
the turn of one stage partition on loop.py's ``Checkpoint``, with a ``Changelog`` of its
store and a restore on a fresh store when the partition is taken.

Ownership: the copies of a stage role form a consumer group over the stage's changelog
topic, whose partitions they keep paused: the group says who owns partition p, p's
transactional id fences its previous owner. Taking p: its producer starts (aborting what the
last owner left open), a fresh store directory is restored from p's changelog up to its
read_committed end, and a reader of p's own (no group, read_committed) is placed at the
input offsets noted in that store. A turn of p: what the reader fetched goes to the
partition (``StagePartition.turn``, in the role's thread), which applies every record whose
turn has come, in ordinal order, writes its store and notes its place (``cursor``); then one
transaction holds the outputs and the changelog records of what the store changed (its
place in its inputs among them). No group offsets: the inputs' positions travel in the
changelog. A store is never used again after its owner lets it go or a turn fails
(``release``): the next owner restores a fresh one.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgpack
from aiokafka import AIOKafkaConsumer, TopicPartition

from dupalign.service.changelog import Changelog, ensure_changelog, restore
from dupalign.service.config import Config
from dupalign.service.loop import Checkpoint
from dupalign.service.ordered_merge import OrderedMerge
from dupalign.service.outage import within
from dupalign.service.roles.base import StatelessRole
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.service.sequence_batch import SequenceBatch, SequenceLog
from dupalign.service.stage_topics import StageTopics, require_frozen_idf
from dupalign.service.topology import Outgoing, TopologyError, stop_quietly
from dupalign.stages.partitioned import Shape
from dupalign.store import records
from dupalign.store.database import Store

log = logging.getLogger("dupalign.roles.stage")
# records a partition's turn takes at most. A turn comes every 200 ms at least (the group's
# poll of its paused partitions, dupalign/service/loop.py ``turns``), so this bounds both a
# transaction's size and a partition's rate (not yet: a turn as soon as a reader has records)
TURN_RECORDS = 10_000


def _key(raw: Any) -> Any:
    """A merge key read back from msgpack (a (b, i) pair comes back as a list)."""
    return tuple(raw) if isinstance(raw, list) else raw


class StagePartition:
    """Partition ``partition`` of a stage over ``store`` (restored). Subclasses read the
    sequence (``self.seq``) and the ``merges`` they add (``merge``: a topic's partitions
    merged by key), and implement ``advance``."""

    def __init__(self, topics: StageTopics, partition: int, store: Store) -> None:
        self.topics, self.partition, self.store = topics, partition, store
        raw = records.get_blob(store, "stage_cursor")
        self.noted: dict[str, Any] = {} if raw is None else msgpack.unpackb(raw)
        offset, first = self.noted.get("seq", (0, 0))
        self.seq = SequenceLog(offset, first, topics.shape.directory)
        self.merges: dict[str, OrderedMerge[Any]] = {}  # topic -> its merge

    def merge(self, topic: str, partitions: Iterable[int]) -> OrderedMerge[Any]:
        """The merge of ``partitions`` of ``topic``, from the place noted in the store."""
        noted = self.noted.get("merges", {}).get(topic, {})
        low = {int(p): o for p, o in noted.get("low", {}).items()}
        merge: OrderedMerge[Any] = OrderedMerge({p: low.get(p, 0) for p in partitions},
                                                _key(noted.get("taken")))
        self.merges[topic] = merge
        return merge

    def positions(self) -> dict[TopicPartition, int]:
        """Where the reader starts: the sequence's cursor and each merge's low-water marks."""
        out = {TopicPartition(self.topics.batches, 0): self.seq.cursor()[0]}
        for topic, merge in self.merges.items():
            out.update((TopicPartition(topic, p), o) for p, o in merge.low_water().items())
        return out

    def turn(self, fetched: dict[TopicPartition, list[Any]]) -> list[Outgoing]:
        """The records fetched, then every step whose turn has come (``advance``); the
        store written with the place reached. The outputs, in order."""
        for tp, recs in fetched.items():
            if tp.topic == self.topics.batches:
                for r in recs:
                    self.seq.add(r.offset, SequenceBatch.from_bytes(r.value))
            else:
                merge = self.merges[tp.topic]
                for r in recs:
                    merge.add(tp.partition, r.offset, self.key_of(tp.topic, r), r.value)
        out = self.advance()
        for topic, merge in self.merges.items():
            stale = merge.stale()
            if stale:
                raise RuntimeError(f"{topic}: records {stale[:5]} were never asked for by "
                                   "the sequence (sent to the wrong partition?)")
        batch = self.store.batch()
        self.note(batch)
        records.put_blob(batch, "stage_cursor", msgpack.packb(self.cursor()))
        self.store.write(batch)
        return out

    def cursor(self) -> dict[str, Any]:
        self.seq.trim(self.needed())
        return {"seq": list(self.seq.cursor()), "merges": {
            t: {"low": {str(p): o for p, o in m.low_water().items()}, "taken": m.taken}
            for t, m in self.merges.items()}, **self.extra()}

    # -- what a stage adds ------------------------------------------------------------------
    def key_of(self, topic: str, record: Any) -> Any:
        """The merge key of a record of ``topic``."""
        raise NotImplementedError

    def advance(self) -> list[Outgoing]:
        """Apply every step whose inputs are in, in ordinal order."""
        raise NotImplementedError

    def needed(self) -> int:
        """The lowest ordinal still to be applied (the sequence below it can go)."""
        raise NotImplementedError

    def note(self, batch: Any) -> None:
        """Write what the turn changed beside the store's own writes (a ledger's rows)."""

    def extra(self) -> dict[str, Any]:
        """More of the stage's place, noted with the cursor (``self.noted`` reads it)."""
        return {}


class StageRole(StatelessRole):
    """The copies of stage ``stage``: subclasses name it and make its partitions
    (``open_partition``)."""

    stage = "stage"
    keeps_state = True

    def __init__(self, config: Config, shape: Shape, store_dir: str | Path,
                 metrics: RoleMetrics | None = None) -> None:
        super().__init__(config, metrics)
        if not self.kc.transactions:
            raise TopologyError("the stage roles need kafka.transactions = true (their "
                                "stores' changelogs go in the turns' transactions)")
        require_frozen_idf(config.engine)
        self.shape = shape
        self.topics_ = StageTopics(self.kc, shape)
        self.store_dir = Path(store_dir) / self.stage
        self.parts: dict[TopicPartition, StagePartition] = {}
        self.readers: dict[TopicPartition, AIOKafkaConsumer] = {}
        self.changelogs: dict[TopicPartition, Changelog] = {}

    @property
    def input_topic(self) -> str:
        return self.topics_.changelog(self.stage)

    def topics(self) -> dict[str, int | None]:
        return self.topics_.wanted()

    def state_dir(self) -> Path | None:
        return self.store_dir

    async def on_start(self) -> None:
        await ensure_changelog(self.kc, self.input_topic, self.topics_.partitions(self.stage))

    def open_partition(self, partition: int, store: Store) -> StagePartition:
        raise NotImplementedError

    async def take(self, tp: TopicPartition, committed: int | None) -> int | None:
        """A fresh store restored from the changelog (its producer started: the last
        owner's open transaction aborted), and a reader from the place noted in it."""
        loop = asyncio.get_running_loop()
        path = self.store_dir / str(tp.partition)
        params = self.config.engine.frozen_params()

        def fresh() -> Store:
            shutil.rmtree(path, ignore_errors=True)
            return Store(path, params)

        store = await loop.run_in_executor(self.executor, fresh)
        done = await restore(self.kc, store, tp.topic, tp.partition)
        part = await loop.run_in_executor(self.executor, self.open_partition, tp.partition,
                                          store)
        self.parts[tp] = part
        self.changelogs[tp] = Changelog(store, tp.topic, tp.partition)
        # (an offset noted that the topic no longer holds is an error, never a silent skip)
        reader = AIOKafkaConsumer(
            **self.kc.client_kwargs(), group_id=None, enable_auto_commit=False,
            isolation_level="read_committed", auto_offset_reset="none",
            max_partition_fetch_bytes=self.kc.max_partition_fetch_bytes,
            fetch_max_bytes=self.kc.fetch_max_bytes)
        self.readers[tp] = reader  # (stopped by ``release`` if what follows fails)
        await reader.start()
        positions = part.positions()
        reader.assign(list(positions))
        for itp, offset in positions.items():
            reader.seek(itp, offset)
        log.info("%s partition %d taken: %d changelog records restored, inputs from %s",
                 self.stage, tp.partition, done.records,
                 {f"{t.topic}:{t.partition}": o for t, o in positions.items()})
        return committed

    async def _take_all(self, assigned: set[TopicPartition]) -> None:
        await super()._take_all(assigned)
        assert self.consumer is not None
        self.consumer.pause(*assigned)  # (the group only says who owns them)

    async def release(self, tps: Iterable[TopicPartition]) -> None:
        loop = asyncio.get_running_loop()
        for tp in tps:
            await stop_quietly(self.readers.pop(tp, None))
            changelog = self.changelogs.pop(tp, None)
            if changelog is not None:
                changelog.close()
            part = self.parts.pop(tp, None)
            if part is not None:
                await loop.run_in_executor(self.executor, part.store.close)

    async def _work(self, batches: dict[TopicPartition, list[Any]]) -> None:
        loop = asyncio.get_running_loop()
        for tp, part in list(self.parts.items()):
            fetched = await self.readers[tp].getmany(timeout_ms=0, max_records=TURN_RECORDS)
            if not any(fetched.values()):
                continue  # (nothing new: nothing can have come due)
            for itp, recs in fetched.items():
                self.metrics.consumed(self.name, itp.topic, recs)
            outputs = await loop.run_in_executor(self.executor, part.turn, fetched)
            changes = self.changelogs[tp].outgoing()
            unit = Checkpoint({}, [*outputs, *changes])
            async with self.metrics.transaction(self.name):
                await within(unit.commit(self.producers[tp], self.group_id), self.limit_s)
            self.outage.succeeded()
            self.metrics.produced(self.name, outputs)
            self.batches += 1
