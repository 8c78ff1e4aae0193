"""The align role: align shards keyed by earlier page. Partition p of ``pages.align`` owns
the pages whose ordinal is p modulo its partition count: the index sends each stored page's
forward record to partition p of the compacted ``pages.forward`` topic, and each request
split by its candidates' owners (``AlignRequest.split``), the part for p to partition p
of ``pages.align``. A process copies its partitions' forward records into its store
(``dupalign.service.align_store``) as they come; a fetched batch of requests whose candidates are
not
all there yet waits until the forward partition is read up to the end of what was written
to it now, committed or not: a request's candidates were written with it or before it, and
the commit marker of their transaction may reach the forward partition after the request's
(the coordinator writes a transaction's markers partition by partition). Its answer
is each part's best pages with their rank keys (``Aligner.align_ranked``); the index
merges a page's parts (``align.merge_ranked``).
A pure function of the request and the forward records, so which copy aligns a part, or
how often after a crash, does not change it; the index takes the first answer per part.

A request that carries its candidates' forward records (an index from before align
shards) is aligned from them and answered as before (a whole request).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from dupalign.service.align_store import TemporaryStoreDir, forward_changes
from dupalign.service.config import Config
from dupalign.service.roles.base import StatelessRole
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.service.topology import (
    Outgoing,
    encode_aligned,
    encode_aligned_part,
    ordinal_header,
    record_ordinal,
    record_reply,
    send_all,
    stop_quietly,
)
from dupalign.stages.align import Aligner
from dupalign.stages.messages import AlignRequest
from dupalign.store.forward_copy import ForwardCopy
from dupalign.wire import messages

log = logging.getLogger("dupalign.roles.align")


class AlignRole(StatelessRole):
    name = "align"
    keeps_state = True

    def __init__(self, config: Config, metrics: RoleMetrics | None = None,
                 store_dir: str | Path | None = None) -> None:
        super().__init__(config, metrics)
        # without a store directory: a temporary one (made at start), filled from the
        # forward topic at every start (a deployment keeps one per process to start fast)
        self.store_dir = None if store_dir is None else Path(store_dir) / "align"
        self.temporary: TemporaryStoreDir | None = None
        self.store: ForwardCopy | None = None
        self.aligner = Aligner(config.engine)
        self.forward: AIOKafkaConsumer | None = None  # this process's forward partitions
        self.written: AIOKafkaConsumer | None = None  # asks for their ends, committed or not
        self.held: set[int] = set()
        self.follower: asyncio.Future[None] | None = None
        self.applied = asyncio.Event()  # set (and replaced) after each apply
        self.decoded: dict[int, AlignRequest | Exception] = {}  # the batch's, by offset
        self.requests = 0

    async def on_start(self) -> None:
        if self.store_dir is None:
            self.temporary = TemporaryStoreDir()
            self.store_dir = self.temporary.store
        self.store = ForwardCopy(self.store_dir)
        self.aligner = Aligner(self.config.engine, store=self.store)
        kc = self.kc
        self.forward = AIOKafkaConsumer(
            **kc.client_kwargs(), group_id=None, enable_auto_commit=False,
            isolation_level="read_committed", auto_offset_reset="earliest",
            fetch_max_bytes=kc.fetch_max_bytes,
            max_partition_fetch_bytes=kc.max_partition_fetch_bytes)
        await self.forward.start()
        self.written = AIOKafkaConsumer(**kc.client_kwargs(), group_id=None,
                                        enable_auto_commit=False,
                                        isolation_level="read_uncommitted")
        await self.written.start()
        self.follower = asyncio.ensure_future(self._follow())
        log.info("align store %s", self.store_dir)

    def state_dir(self) -> Path | None:
        return None if self.temporary is not None else self.store_dir

    async def take(self, tp: TopicPartition, committed: int | None) -> int | None:
        self.held.add(tp.partition)
        self._assign_forward()
        return committed

    async def release(self, tps: Iterable[TopicPartition]) -> None:
        self.held -= {tp.partition for tp in tps}
        if self.forward is not None and not self.stopping.is_set():
            self._assign_forward()

    def _assign_forward(self) -> None:
        """The forward partitions of the align partitions held, each from where the store
        is (every apply notes it; a new store: the beginning)."""
        assert self.forward is not None and self.store is not None
        tps = [TopicPartition(self.kc.forward_topic, p) for p in sorted(self.held)]
        self.forward.assign(tps)
        for ftp in tps:
            offset = self.store.offset(ftp.partition)
            if offset is not None:
                self.forward.seek(ftp, offset)

    async def _follow(self) -> None:
        """Copies the held forward partitions into the store as their records come, so a
        request's candidates are usually there before it is read."""
        assert self.forward is not None and self.store is not None
        while not self.stopping.is_set():
            if not self.held:
                await asyncio.sleep(0.05)
                continue
            try:
                got = await self.forward.getmany(timeout_ms=200, max_records=2000)
            except Exception as exc:  # the role stops with it (``before`` raises it)
                self.failure = exc
                self.applied.set()
                return
            for ftp, records in got.items():  # (no await before they are applied)
                if records and ftp.partition in self.held:
                    self.store.apply(ftp.partition, forward_changes(records),
                                     records[-1].offset + 1)
            self.applied.set()
            self.applied = asyncio.Event()

    async def before(self, tp: TopicPartition, records: list[Any]) -> None:
        """The forward records of the batch's candidates in the store: the follower has
        usually copied them already; otherwise wait until it has read the forward
        partition up to the end of what was written to it now. The candidates were written
        before the requests were committed, but their transaction's commit marker may not
        be on the forward partition yet (markers are written partition by partition); the
        follower passes that end once every transaction open in it now has ended, which is
        bounded by the transaction timeout. A candidate still missing then (a forward
        record too big to send, a page that left the index) is answered "not aligned
        here" by ``prepare``. A stop while it waits ends the wait (the follower has
        stopped: the partition would never be read further) and the role drops the batch,
        uncommitted, for the partition's next owner."""
        assert self.forward is not None and self.written is not None
        assert self.store is not None
        # decoded once, here: ``prepare`` takes them (and answers what could not be read)
        self.decoded = {rec.offset: _decode(rec) for rec in records}
        needed: set[int] = set()
        for request in self.decoded.values():
            if isinstance(request, AlignRequest) and not request.has_forward:
                needed.update(request.others.tolist())
        if self.store.has_all(sorted(needed)):
            return
        ftp = TopicPartition(self.kc.forward_topic, tp.partition)
        end = (await self.written.end_offsets([ftp]))[ftp]
        while not self.store.has_all(sorted(needed)) and (
                await self.forward.position(ftp)) < end:
            if self.failure is not None:
                raise self.failure
            if self.stopping.is_set():
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.applied.wait(), 0.5)

    async def _close(self) -> None:
        self.stopping.set()
        await super()._close()
        if self.follower is not None:
            self.follower.cancel()
            with contextlib.suppress(BaseException):
                await self.follower
        await stop_quietly(self.forward)
        await stop_quietly(self.written)
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.temporary is not None:
            self.temporary.remove()

    @property
    def input_topic(self) -> str:
        return self.kc.align_topic

    def prepare(self, tp: TopicPartition, records: list[Any]) -> list[Outgoing]:
        out = []
        for rec in records:
            try:
                ordinal = record_ordinal(rec)
            except ValueError as exc:  # no index waits for it: only dead-lettered
                out.append(self._dead_letter(tp, rec, exc))
                continue
            try:
                request = self.decoded.pop(rec.offset, None) or _decode(rec)
                if isinstance(request, Exception):
                    raise request
                if request.has_forward:  # (an index from before align shards)
                    answer = encode_aligned(ordinal, self.aligner.align(request))
                elif self.store is None or not self.store.has_all(request.others.tolist()):
                    # not here (a page whose forward record was too big to send; a stale
                    # request read again after its candidates left): the index aligns it
                    log.warning("align request %s:%d:%d: a candidate's forward record is not "
                                "in this store; the index aligns page %d", tp.topic,
                                tp.partition, rec.offset, ordinal)
                    answer = encode_aligned_part(ordinal, tp.partition, None)
                else:
                    answer = encode_aligned_part(ordinal, tp.partition,
                                                 self.aligner.align_ranked(request))
            except Exception as exc:  # unreadable (another wire version), or a defect it
                # triggers: recurs on every replay. Dead-lettered, and answered "not
                # aligned here", so the index aligns the page itself and goes on
                log.exception("align request %s:%d:%d failed (sent to DLQ)",
                              tp.topic, tp.partition, rec.offset)
                out.append(self._dead_letter(tp, rec, exc))
                answer = encode_aligned_part(ordinal, tp.partition, None)
            # back to who asked: the partition its request names (a combine partition), else
            # the index (one shard: partition 0)
            topic, partition = record_reply(rec) or (self.kc.aligned_topic, 0)
            out.append(Outgoing(topic, answer, partition=partition,
                                headers=[ordinal_header(ordinal)]))
        return out

    def _dead_letter(self, tp: TopicPartition, rec: Any, exc: Exception) -> Outgoing:
        dl = messages.dead_letter_to_wire(
            error="internal_error", detail=f"align request: {type(exc).__name__}: {exc}",
            topic=tp.topic, partition=tp.partition, offset=rec.offset,
            raw=rec.value or b"", key=rec.key, failed_at_ms=int(time.time() * 1000),
            doc_id=None, raw_max_bytes=self.config.worker.dlq_raw_max_bytes)
        return Outgoing(self.kc.dlq_topic, messages.pack(dl), messages.dead_letter_key(rec.key))

    async def produce(self, producer: AIOKafkaProducer, prepared: list[Outgoing]) -> None:
        await send_all(producer, prepared)
        self.requests += len(prepared)

    def outgoing(self, prepared: list[Outgoing]) -> list[Outgoing]:
        return prepared


def _decode(rec: Any) -> AlignRequest | Exception:
    try:
        return AlignRequest.from_bytes(rec.value or b"")
    except Exception as exc:  # answered by ``prepare``
        return exc
