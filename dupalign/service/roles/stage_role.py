"""A stage of the partitioned pipeline as a role on Kafka (docs/pipeline.md, "Roles on Kafka"):
the turn of one stage partition on loop.py's ``Checkpoint``, with a ``Changelog`` of its
store and a restore on a fresh store when the partition is taken.

Ownership: the copies of a stage role form a consumer group over the stage's changelog
topic, whose partitions they keep paused: the group says who owns partition p, p's
transactional id fences its previous owner. Taking p: its producer starts (aborting what the
last owner left open), a fresh store directory is restored from p's changelog up to its
read_committed end, and p's inputs are read from the offsets noted in that store. One
reader per process (no group, read_committed) reads the inputs of every partition it holds,
each input partition from the lowest offset any of them needs (a partition drops what it
read before: ``OrderedMerge.add``, ``SequenceLog.add``): the sequence and the decisions,
which every partition of a stage reads, are fetched and parsed once per process, not once
per partition. A turn of p: what the reader fetched of p's inputs goes to the partition
(``StagePartition.turn``, in the role's thread), which applies every record whose turn has
come, in ordinal order, writes its store and notes its place (``cursor``); records the
reader fetched meanwhile get turns too, before any commit (no wait: only what is there, up
to ``TURN_RECORDS``); then one transaction per partition, all at once, holds the outputs and
the changelog records of what the store changed (its place in its inputs among them). A
partition whose turns applied nothing has no transaction, even if its place moved (the place
noted before reads the same records again): the new place goes with its next one. No group
offsets: the inputs' positions travel in the changelog. A store is used again only by the
same process directory, when its last turn committed and the changelog has not moved since
it was let go (``release``, ``_kept``; it may note a later place than the changelog's, for
the same state): a clean restart does not restore; after a failed turn, a crash or another
owner, the next owner restores a fresh store.

A record of a merged input too large for one Kafka record comes in parts
(dupalign/service/parts.py, one producer's transaction each): the partition puts them
together by (partition, key) before its merge holds the value, and reads a partition again
from the first part of a value still incomplete or held.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
from aiokafka import AIOKafkaConsumer, TopicPartition

from dupalign.service.changelog import Changelog, LeaveOut, ensure_changelog, restore
from dupalign.service.config import Config
from dupalign.service.loop import Checkpoint
from dupalign.service.ordered_merge import OrderedMerge
from dupalign.service.outage import within
from dupalign.service.parts import PART_HEADER, in_parts_from, record_part
from dupalign.service.roles.base import StatelessRole
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.service.send_batches import send_batched
from dupalign.service.sequence_batch import SequenceBatch, SequenceLog
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import Outgoing, TopologyError, batch_bytes, stop_quietly
from dupalign.stages.partitioned import Shape
from dupalign.store import records
from dupalign.store.database import Store

log = logging.getLogger("dupalign.roles.stage")
# records a partition's turn takes at most: it bounds a transaction's size
TURN_RECORDS = 10_000
# how long a turn waits for the first record of any partition's reader (then the group's
# fetch runs again: it keeps the membership and hands over assignments)
READ_WAIT_S = 0.2
# how long a partition's turns that sent nothing downstream may keep their store changes out
# of a transaction (they go with its next one; or when no record came for READ_WAIT_S)
DEFER_S = 1.0
CURSOR = ("meta", records.BLOBS["stage_cursor"])  # the store key of a partition's place


@dataclass
class Whole:
    """A value sent in parts, put together: as its first part's record, with the whole value."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


def _key(raw: Any) -> Any:
    """A merge key read back from msgpack (a (b, i) pair comes back as a list)."""
    return tuple(raw) if isinstance(raw, list) else raw


def parted_outputs(outputs: list[Outgoing], parted: frozenset[str], sender: str, limit: int
                   ) -> list[Outgoing]:
    """``outputs``, those of the ``parted`` topics over ``limit`` bytes in parts."""
    return [part for o in outputs
            for part in (in_parts_from(o, sender, limit) if o.topic in parted else [o])]


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
        # (topic, partition, headers) -> (first offset, count, the parts read)
        # of a value sent in parts, not all read yet
        self.incomplete: dict[tuple[str, int, Any], tuple[int, int, dict[int, bytes]]] = {}
        self._cursor = raw  # the cursor as last written (the same again: not rewritten)

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
        for topic in self.merges:
            out.update((TopicPartition(topic, p), o) for p, o in self.low_water(topic).items())
        return out

    def low_water(self, topic: str) -> dict[int, int]:
        """Where to read ``topic``'s partitions again from: its merge's low-water marks,
        or the first part of a value still incomplete below them."""
        low = self.merges[topic].low_water()
        for (t, p, _), (first, _, _) in self.incomplete.items():
            if t == topic:
                low[p] = min(low[p], first)
        return low

    def _add(self, topic: str, record: Any) -> None:
        """A record of a merged topic into its merge (a part: once its value is whole, its
        merge key read from the whole value). The parts of a value are told from other
        values' by their headers (``in_parts``: the same on every part; the page's or the
        ordinal's, with the sender's when several send for one: ``StageRole.parted``)."""
        merge, p, part = self.merges[topic], record.partition, record_part(record)
        if part is None:
            merge.add(p, record.offset, self.key_of(topic, record), record.value)
            return
        if record.offset < merge.next.get(p, 0):
            return  # (read again)
        index, count = part
        headers = tuple((k, bytes(v)) for k, v in record.headers or () if k != PART_HEADER)
        group = (topic, p, headers)
        first, _, got = self.incomplete.setdefault(group, (record.offset, count, {}))
        got[index] = bytes(record.value)
        if len(got) == count:
            del self.incomplete[group]
            whole = Whole(record.topic, p, record.offset, record.key,
                          b"".join(got[i] for i in range(count)), list(headers))
            merge.add(p, record.offset, self.key_of(topic, whole), whole.value, first)

    def turn(self, fetched: dict[TopicPartition, list[Any]]) -> list[Outgoing]:
        """The records fetched, then every step whose turn has come (``advance``); the
        store written with the place reached. The outputs, in order."""
        for tp, recs in fetched.items():
            if tp.topic == self.topics.batches:
                for r in recs:
                    self.seq.add(r.offset, SequenceBatch.from_bytes(r.value))
            else:
                for r in recs:
                    self._add(tp.topic, r)
        out = self.advance()
        for topic, merge in self.merges.items():
            stale = merge.stale()
            if stale:
                raise RuntimeError(f"{topic}: records {stale[:5]} were never asked for by "
                                   "the sequence (sent to the wrong partition?)")
        batch = self.store.batch()
        self.note(batch)
        cursor = msgpack.packb(self.cursor())
        if cursor != self._cursor:  # (unchanged, with nothing else written: no changelog
            records.put_blob(batch, "stage_cursor", cursor)  # records, no transaction)
            self._cursor = cursor
        self.store.write(batch)
        return out

    def cursor(self) -> dict[str, Any]:
        self.seq.trim(self.needed())
        return {"seq": list(self.seq.cursor()), "merges": {
            t: {"low": {str(p): o for p, o in self.low_water(t).items()}, "taken": m.taken}
            for t, m in self.merges.items()}, **self.extra()}

    def applied(self) -> bytes:
        """What the cursor notes of what the partition applied (each merge's last key
        taken, the stage's ``extra``), not where it reads: a cursor that changed and kept
        this only moved the partition's place."""
        return msgpack.packb([{t: m.taken for t, m in self.merges.items()}, self.extra()])

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

    def sequenced(self) -> int:
        """The ordinal after the last page this partition knows to exist (its metrics)."""
        return self.seq.end

    def note(self, batch: Any) -> None:
        """Write what the turn changed beside the store's own writes (a ledger's rows)."""

    def extra(self) -> dict[str, Any]:
        """More of the stage's place, noted with the cursor (``self.noted`` reads it)."""
        return {}

    def leave_out(self) -> LeaveOut | None:
        """The store keys the changelog leaves out (None: none): derived from the others,
        they are rebuilt when the partition opens a restored store."""
        return None


class StageRole(StatelessRole):
    """The copies of stage ``stage``: subclasses name it and make its partitions
    (``open_partition``)."""

    stage = "stage"
    keeps_state = True
    turn_wait_ms = 0  # (the turn waits on the partitions' readers instead: ``_fetched``)

    def __init__(self, config: Config, shape: Shape, store_dir: str | Path,
                 metrics: RoleMetrics | None = None) -> None:
        super().__init__(config, metrics)
        if not self.kc.transactions:
            raise TopologyError("the stage roles need kafka.transactions = true (their "
                                "stores' changelogs go in the turns' transactions)")
        self.shape = shape
        self.topics_ = StageTopics(self.kc, shape)
        self.store_dir = Path(store_dir) / self.stage
        self.parts: dict[TopicPartition, StagePartition] = {}
        self.reader: AIOKafkaConsumer | None = None  # every partition's inputs (``_assign``)
        self.inputs: dict[TopicPartition, frozenset[TopicPartition]] = {}  # what each reads
        self.changelogs: dict[TopicPartition, Changelog] = {}
        self.dirty: set[TopicPartition] = set()  # a turn begun, not committed
        # partitions whose turns changed the store and sent nothing, not committed yet:
        # since when (``_commit``)
        self.deferred: dict[TopicPartition, float] = {}
        self.committed: dict[TopicPartition, bytes] = {}  # ``applied`` as last committed

    @property
    def input_topic(self) -> str:
        return self.topics_.changelog(self.stage)

    def topics(self) -> dict[str, int | None]:
        return self.topics_.wanted()

    def topic_options(self) -> dict[str, Any]:
        return self.topics_.options()

    def state_dir(self) -> Path | None:
        return self.store_dir

    async def on_start(self) -> None:
        await ensure_changelog(self.kc, self.input_topic, self.topics_.partitions(self.stage),
                               self.topics_.options()["counts_from"])

    def open_partition(self, partition: int, store: Store) -> StagePartition:
        raise NotImplementedError

    async def take(self, tp: TopicPartition, committed: int | None) -> int | None:
        """The store this process kept for ``tp`` if nothing was written to the changelog
        since (``_kept``), else a fresh store restored from the changelog (the producer
        started: the last owner's open transaction aborted); its inputs read from the place
        noted in it."""
        loop = asyncio.get_running_loop()
        reader = await self._reader()
        kept = await self._kept(tp, reader)
        how = "kept (the changelog unchanged since)"
        if kept is not None:
            store, counts, stale = kept[0], kept[1], []
        else:
            store = await loop.run_in_executor(self.executor, self._fresh, tp)
            done = await restore(self.kc, store, tp.topic, tp.partition)
            counts, stale = done.counts, done.stale
            how = f"{done.records} changelog records restored"
        part = await loop.run_in_executor(self.executor, self.open_partition, tp.partition,
                                          store)
        self.parts[tp] = part
        self.committed[tp] = part.applied()
        self.changelogs[tp] = Changelog(store, tp.topic, tp.partition, self.kc.max_request_size,
                                        counts, stale, part.leave_out())
        positions = part.positions()
        self.inputs[tp] = frozenset(positions)
        self._assign()
        self.metrics.stage_progress(self.name, tp.partition, part.sequenced(), part.needed())
        log.info("%s partition %d taken: store %s, inputs from %s", self.stage, tp.partition,
                 how, {f"{t.topic}:{t.partition}": o for t, o in positions.items()})
        return committed

    async def _reader(self) -> AIOKafkaConsumer:
        """The process's reader of its partitions' inputs, started (stopped by ``release``
        when no partition is held)."""
        if self.reader is None:
            # (an offset noted that the topic no longer holds is an error, never a silent
            # skip)
            self.reader = AIOKafkaConsumer(
                **self.kc.client_kwargs(), group_id=None, enable_auto_commit=False,
                isolation_level="read_committed", auto_offset_reset="none",
                max_partition_fetch_bytes=self.kc.max_partition_fetch_bytes,
                fetch_max_bytes=self.kc.fetch_max_bytes)
            await self.reader.start()
        return self.reader

    def _assign(self) -> None:
        """The reader on every input of the partitions held, each from the lowest offset a
        partition reading it needs (``positions``: what each has read is in its merges;
        a record read again is dropped by those that had it). Records fetched and not yet
        handed over are fetched again."""
        assert self.reader is not None
        wanted: dict[TopicPartition, int] = {}
        for part in self.parts.values():
            for itp, offset in part.positions().items():
                wanted[itp] = min(offset, wanted.get(itp, offset))
        self.reader.assign(list(wanted))
        for itp, offset in wanted.items():
            self.reader.seek(itp, offset)

    def _path(self, tp: TopicPartition) -> Path:
        return self.store_dir / str(tp.partition)

    def _marker(self, tp: TopicPartition) -> Path:
        """Written when a partition is let go with its store as committed: the changelog's
        end then."""
        return self.store_dir / f"{tp.partition}.committed"

    def _fresh(self, tp: TopicPartition) -> Store:
        shutil.rmtree(self._path(tp), ignore_errors=True)
        return Store(self._path(tp), self.config.engine.frozen_params())

    async def _kept(self, tp: TopicPartition, reader: AIOKafkaConsumer
                    ) -> tuple[Store, dict[bytes, int]] | None:
        """The store left by this process's last owner of ``tp`` when its last turn
        committed and the changelog's read_committed end has not moved since (no other
        owner wrote, no transaction was aborted): it then holds what a restore would give;
        with its changelog's ``counts`` then. The marker goes first, so a store written by
        a later turn is never taken as kept."""
        marker = self._marker(tp)
        try:
            noted, counts = msgpack.unpackb(marker.read_bytes())
            noted, counts = int(noted), {bytes(k): int(n) for k, n in counts.items()}
        except (OSError, ValueError, TypeError, msgpack.UnpackException):
            return None
        marker.unlink()
        end = (await within(reader.end_offsets([tp]), self.limit_s))[tp]
        if end != noted:
            return None
        loop = asyncio.get_running_loop()
        store = await loop.run_in_executor(
            self.executor, Store, self._path(tp), self.config.engine.frozen_params())
        return store, counts

    async def _take_all(self, assigned: set[TopicPartition]) -> None:
        await super()._take_all(assigned)
        assert self.consumer is not None
        self.consumer.pause(*assigned)  # (the group only says who owns them)

    async def release(self, tps: Iterable[TopicPartition]) -> None:
        """Lets partitions go; a store whose last turn committed is kept for the next
        ``take`` here, with the changelog's end (read now) in its marker."""
        loop = asyncio.get_running_loop()
        reader = self.reader
        for tp in tps:
            end = None
            if reader is not None and tp not in self.dirty and tp in self.parts:
                try:
                    end = (await within(reader.end_offsets([tp]), self.limit_s))[tp]
                except Exception as exc:  # (Kafka away: the next take restores)
                    log.info("%s partition %d: store not kept (%r)", self.stage,
                             tp.partition, exc)
            self.dirty.discard(tp)
            self.deferred.pop(tp, None)
            self.inputs.pop(tp, None)
            self.committed.pop(tp, None)
            changelog = self.changelogs.pop(tp, None)
            counts: dict[bytes, int] = {}
            if changelog is not None:
                changelog.close()
                counts = changelog.counts
            part = self.parts.pop(tp, None)
            self.metrics.stage_released(self.name, tp.partition)
            if part is not None:
                await loop.run_in_executor(self.executor, part.store.close)
                if end is not None:
                    self._marker(tp).write_bytes(msgpack.packb([end, counts]))
        if reader is not None and self.parts:
            self._assign()  # (the inputs of the partitions still held)
        elif reader is not None:
            self.reader = None
            await stop_quietly(reader)

    async def _work(self, batches: dict[TopicPartition, list[Any]]) -> None:
        """The partitions' turns on what the reader has fetched, and on what it fetched
        while they ran, until nothing more is there (no wait) or ``TURN_RECORDS`` records
        were taken; then each partition's transaction, all at once. Nothing fetched: the
        deferred partitions' transactions (``_commit``)."""
        loop = asyncio.get_running_loop()
        outputs: dict[TopicPartition, list[Outgoing]] = {}
        fetched, room = await self._fetched(TURN_RECORDS, wait=True)
        idle = not fetched  # (for READ_WAIT_S: what was deferred is committed now)
        while fetched:
            for tp, mine in fetched.items():
                part = self.parts[tp]
                for itp, recs in mine.items():
                    self.metrics.consumed(self.name, itp.topic, recs)
                self.dirty.add(tp)  # (until its transaction commits: the store is ahead)
                outputs.setdefault(tp, []).extend(
                    await loop.run_in_executor(self.executor, part.turn, mine))
                self.metrics.stage_progress(self.name, tp.partition, part.sequenced(),
                                            part.needed())
            # records that came while the turns ran go in the same transactions: a commit
            # per partition and turn is most of a turn's cost when turns are small
            fetched, room = (await self._fetched(room, wait=False)) if room > 0 else ({}, 0)
        for tp in self.deferred:  # (idle, or one that got no records while others did)
            outputs.setdefault(tp, [])
        failed = [r for r in await asyncio.gather(
            *(self._commit(tp, outs, idle) for tp, outs in outputs.items()),
            return_exceptions=True) if isinstance(r, BaseException)]
        if failed:  # (once every transaction ended: a step-down stops their producers)
            raise failed[0]

    async def _commit(self, tp: TopicPartition, outputs: list[Outgoing], idle: bool = False
                      ) -> None:
        """Partition ``tp``'s transaction: its outputs and the changelog records of what
        its turns changed (none when they changed nothing: the store is as committed).
        The partitions of a process commit at once: a downstream partition, which reads
        them all, then finds their records together, in fewer turns. Turns that sent
        nothing have no transaction of their own (``deferred``) unless the reader is
        ``idle`` or they have waited ``DEFER_S``."""
        changelog, applied = self.changelogs[tp], self.parts[tp].applied()
        if not outputs and changelog.holds_only(CURSOR) and applied == self.committed[tp]:
            # its turns took records and applied none: only where it reads moved, and the
            # place noted before is as good (the same records are read again, none was
            # applied). So no transaction: the cursor goes with the partition's next one.
            if tp not in self.deferred:
                self.dirty.discard(tp)
            return
        if not outputs and not idle:
            # no stage waits for a transaction that sends nothing downstream (no stage
            # reads another's changelog): its store changes go with the next one, and the
            # partition is free for the records that will send something (a transaction
            # costs a turn tens of ms). The store stays ahead of the changelog (``dirty``:
            # a crash or a move restores it, and its inputs are read again).
            since = self.deferred.setdefault(tp, time.monotonic())
            if time.monotonic() - since < DEFER_S:
                return
        self.deferred.pop(tp, None)
        records = [*self.parted(tp.partition, outputs), *changelog.outgoing()]
        self.committed[tp] = applied
        if records:
            unit = Checkpoint({}, records, send=functools.partial(
                send_batched, records=records, alone=batch_bytes(self.kc)))
            async with self.metrics.transaction(self.name):
                await within(unit.commit(self.producers[tp], self.group_id), self.limit_s)
            self.outage.succeeded()
            self.metrics.produced(self.name, outputs)
            self.batches += 1
        self.dirty.discard(tp)

    def parted(self, partition: int, outputs: list[Outgoing]) -> list[Outgoing]:
        """``outputs``, those over ``kafka.max_request_size`` in parts (a big page's list
        partials, near answers, align answers: ``StageTopics.parted``), sent as from
        stage:partition (``in_parts_from``)."""
        return parted_outputs(outputs, self.topics_.parted(), f"{self.stage}:{partition}",
                              self.kc.max_request_size)

    async def _fetched(self, most: int, wait: bool
                       ) -> tuple[dict[TopicPartition, dict[TopicPartition, list[Any]]], int]:
        """What the reader has fetched, at most ``most`` records, by partition held: each
        gets the records of its own inputs (only those with records: with none, nothing can
        have come due); and what is left of ``most``. With ``wait``, waits up to
        ``READ_WAIT_S`` for a first record: a turn comes as soon as the reader has records,
        not at the group's next poll (the group's fetch does not wait: ``turn_wait_ms``)."""
        reader = self.reader
        if reader is None or not self.parts:
            if wait:
                await asyncio.sleep(READ_WAIT_S)
            return {}, most
        fetched = await reader.getmany(timeout_ms=0, max_records=most)
        if wait and not any(fetched.values()):
            fetched = await reader.getmany(timeout_ms=int(READ_WAIT_S * 1000),
                                           max_records=most)
        got = {}
        for tp in self.parts:
            mine = {itp: recs for itp, recs in fetched.items()
                    if recs and itp in self.inputs[tp]}
            if mine:
                got[tp] = mine
        return got, most - sum(map(len, fetched.values()))
