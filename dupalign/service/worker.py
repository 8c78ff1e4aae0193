"""The Kafka worker: pages in, matches and dead letters out, one page at a time through the
engine, offsets committed only after the page's output is durable.

The delivery guarantee (write, produce, commit), what stops the worker and how it resumes from
the group's committed offset and the store's own: docs/delivery.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, TopicAlreadyExistsError

from dupalign.errors import ConfigError, PageRejected, StoreError
from dupalign.match import Match
from dupalign.page import Page
from dupalign.runtime.engine import Engine, PageReport
from dupalign.runtime.pipeline import default_jobs
from dupalign.service.config import Config, load_config
from dupalign.service.http import HttpServer
from dupalign.service.kafka_args import add_worker_arguments
from dupalign.service.log_repeats import STARTUP, RepeatFolder
from dupalign.service.metrics import WorkerMetrics
from dupalign.service.topology import Outgoing, fetch_committed, new_producer
from dupalign.wire import messages
from dupalign.wire.messages import MessageRejected

log = logging.getLogger("dupalign.worker")

SOURCE_HEADER = "dupalign-source"
ENGINE_STAGES = ("text", "exact", "near", "passage", "store")
# Metadata of every offset commit: the batch's output was published (see the docstring).
PUBLISHED = "dupalign:published"


# per input offset: (page, its matches or the exception it raised, its report), or why the
# record never became a page
EngineOut = dict[int, "tuple[Page, list[Match] | BaseException, PageReport] | MessageRejected"]


@dataclass
class BatchResult:
    """What the engine thread made of one partition's micro-batch."""

    tp: TopicPartition
    next_offset: int
    outgoing: list[Outgoing] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    matches: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    suppressed: int = 0
    timestamps_ms: list[int] = field(default_factory=list)


@dataclass
class WorkItem:
    tp: TopicPartition
    epoch: int
    records: list[Any]


class FatalError(RuntimeError):
    """Stop the worker without committing more (e.g. the store cannot be written)."""


# Failures of the machine, never of one page: they stop the worker (see the docstring).
SYSTEM_FAILURES = (StoreError, OSError, MemoryError, FatalError)


class Worker:
    """One worker process: a consumer-group member with its own engine and store."""

    def __init__(self, config: Config, store_dir: str | Path) -> None:
        self.config = config
        self.store_dir = Path(store_dir)
        self.kc = config.kafka
        self.wc = config.worker
        self.metrics = WorkerMetrics()
        self.engine: Engine | None = None
        # The engine is not thread-safe: exactly one thread ever touches it.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None  # non-transactional mode
        self.txn_producers: dict[TopicPartition, AIOKafkaProducer] = {}
        self.queue: asyncio.Queue[WorkItem] = asyncio.Queue()
        self.epochs: dict[TopicPartition, int] = {}
        self._epoch_counter = 0
        self.suppress_below: dict[TopicPartition, int] = {}
        # per assigned partition whose store is ahead of the group's commit: the store's
        # offset S; until a commit reaches S, pages in the store await their replay, so no
        # retention sweep may remove them
        self.unsettled: dict[TopicPartition, int] = {}
        self._last_sweep = time.monotonic()  # retention: the first sweep after one period
        # the group's committed offset per assigned partition, for the failure log line
        self.committed: dict[TopicPartition, int] = {}
        self.inflight: TopicPartition | None = None
        self.revoking: set[TopicPartition] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self.stopping = asyncio.Event()
        self.started = False
        self.failure: BaseException | None = None
        self.http: HttpServer | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self._paused: set[TopicPartition] = set()
        self.hostname = socket.gethostname()

    # -- life cycle -----------------------------------------------------------------------
    async def run(self) -> int:
        """Run until stop() or a fatal error; returns the process exit code."""
        loop = asyncio.get_running_loop()
        messages.compile_all()
        if self.config.metrics.enabled:
            self.http = HttpServer(self.metrics.registry, self._healthy, self._ready)
            port = await self.http.start(self.config.metrics.host, self.config.metrics.port)
            log.info("http listening", extra={"host": self.config.metrics.host, "port": port})
        try:
            self._check_free_space()
            self.engine = await loop.run_in_executor(
                self.executor, Engine.open, self.store_dir, self.config.engine
            )
            if self.kc.create_topics:
                await self._create_topics()
            if not self.kc.transactions:
                self.producer = new_producer(self.kc, None)
                await self.producer.start()
            self.consumer = AIOKafkaConsumer(
                **self.kc.client_kwargs(),
                group_id=self.kc.group_id,
                enable_auto_commit=False,
                auto_offset_reset=self.kc.auto_offset_reset,
                isolation_level="read_committed",
                max_poll_records=self.wc.batch_size,
                session_timeout_ms=self.kc.session_timeout_ms,
                heartbeat_interval_ms=self.kc.heartbeat_interval_ms,
                max_poll_interval_ms=self.kc.max_poll_interval_ms,
                max_partition_fetch_bytes=self.kc.max_partition_fetch_bytes,
                fetch_max_bytes=self.kc.fetch_max_bytes,
            )
            STARTUP.begin()
            self.consumer.subscribe([self.kc.input_topic], listener=_Listener(self))
            await self.consumer.start()
            self.started = True
            log.info("worker started", extra={"config": self.config.redacted()})
            self.tasks = [
                asyncio.create_task(self._guard(self._fetch_loop), name="fetch"),
                asyncio.create_task(self._guard(self._process_loop), name="process"),
                asyncio.create_task(self._guard(self._lag_loop), name="lag"),
                asyncio.create_task(self._guard(self._store_size_loop), name="store-size"),
            ]
            await self.stopping.wait()
        except BaseException as exc:  # start-up failure: report and clean up
            if self.failure is None:
                self.failure = exc
        finally:
            await self._shutdown()
        if self.failure is not None and not isinstance(self.failure, asyncio.CancelledError):
            self._log_failure(self.failure)
            return 1
        return 0

    def _log_failure(self, exc: BaseException) -> None:
        """One line: the cause, and where the group's offsets stand (the next start resumes
        there). A traceback only for what is not a known failure of the store or Kafka."""
        if self.committed:
            tail = "nothing committed past " + ", ".join(
                f"offset {offset} of {tp.topic}:{tp.partition}"
                for tp, offset in sorted(self.committed.items()))
        else:
            tail = "nothing committed"
        if isinstance(exc, StoreError | FatalError):
            cause = str(exc)
        elif isinstance(exc, KafkaError):
            cause = f"Kafka failed: {exc!r}"
        else:
            cause = f"unexpected {type(exc).__name__}: {exc}"
        known = isinstance(exc, StoreError | FatalError | KafkaError)
        log.error("worker stopped: %s; %s", cause, tail, exc_info=None if known else exc)

    def _check_free_space(self) -> None:
        free, total = filesystem_space(self.store_dir)
        self.metrics.store_free_bytes.set(free)
        self.metrics.store_filesystem_bytes.set(total)
        if free < self.wc.min_free_mb << 20:
            raise FatalError(
                f"refusing to start: {free / (1 << 20):.1f} MB free on the filesystem of the "
                f"store {self.store_dir}, below worker.min_free_mb ({self.wc.min_free_mb})")

    def stop(self) -> None:
        """Graceful stop (SIGTERM): finish the current batch, publish, commit, close."""
        self.stopping.set()

    async def _guard(self, loop_fn: Callable[[], Awaitable[None]]) -> None:
        # Takes the function, not a coroutine: a task cancelled before its first step never
        # runs this body, and a coroutine made in advance would be left never awaited.
        try:
            await loop_fn()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if self.failure is None:
                self.failure = exc
            self.stopping.set()

    async def _shutdown(self) -> None:
        self.stopping.set()
        fetch = [t for t in self.tasks if t.get_name() in ("fetch", "lag", "store-size")]
        for t in fetch:
            t.cancel()
        # The processor finishes (publishes and commits) the batch it holds, then stops.
        process = [t for t in self.tasks if t.get_name() == "process"]
        if process:
            try:
                await asyncio.wait_for(self._idle.wait(), self.wc.shutdown_timeout_s)
            except TimeoutError:
                log.error("in-flight batch did not finish in %.0fs; its offsets stay "
                          "uncommitted and it will be reprocessed", self.wc.shutdown_timeout_s)
            process[0].cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.consumer is not None:
            with contextlib.suppress(Exception):
                await self.consumer.stop()
        for producer in list(self.txn_producers.values()):
            with contextlib.suppress(Exception):
                await producer.stop()
        self.txn_producers.clear()
        if self.producer is not None:
            with contextlib.suppress(Exception):
                await self.producer.stop()  # flushes pending sends
        if self.engine is not None:
            engine, self.engine = self.engine, None
            try:
                await asyncio.get_running_loop().run_in_executor(self.executor, engine.close)
            except StoreError as exc:  # after a store failure, closing fails the same way
                if self.failure is None:
                    self.failure = exc
        self.executor.shutdown(wait=True)
        if self.http is not None:
            await self.http.stop()
        log.info("worker stopped")

    # -- health ---------------------------------------------------------------------------
    def _healthy(self) -> tuple[bool, str]:
        if self.failure is not None:
            return False, f"failed: {self.failure}"
        dead = [t.get_name() for t in self.tasks if t.done()]
        if dead and not self.stopping.is_set():
            return False, f"tasks ended: {', '.join(dead)}"
        return True, "ok"

    def _ready(self) -> tuple[bool, str]:
        if self.stopping.is_set():
            return False, "stopping"
        if not self.started:
            return False, "starting"
        ok, reason = self._healthy()
        if not ok:
            return False, reason
        assigned = 0 if self.consumer is None else len(self.consumer.assignment())
        return True, f"consuming {assigned} partitions"

    # -- Kafka clients --------------------------------------------------------------------
    def transactional_id(self, tp: TopicPartition) -> str:
        return f"{self.kc.transactional_id_prefix}-{self.kc.group_id}-{tp.topic}-{tp.partition}"

    async def _create_topics(self) -> None:
        admin = AIOKafkaAdminClient(**self.kc.client_kwargs())
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            new = [
                NewTopic(t, self.kc.topic_partitions, self.kc.replication_factor)
                for t in (self.kc.input_topic, self.kc.output_topic, self.kc.dlq_topic)
                if t not in existing
            ]
            if new:
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics(new)
                log.info("created topics %s", [t.name for t in new])
        finally:
            await admin.close()

    # -- rebalancing ----------------------------------------------------------------------
    async def on_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        revoked = set(revoked)
        self.metrics.rebalances.labels("revoked").inc()
        # Queued batches of these partitions are abandoned: never committed, so the next
        # owner (possibly us again) reads them from the committed offset. The batch being
        # processed right now is finished and committed (bounded: one micro-batch).
        self.revoking |= revoked
        if self.inflight in revoked:
            try:
                await asyncio.wait_for(self._idle.wait(), self.wc.shutdown_timeout_s)
            except TimeoutError:
                log.error("batch of %s still running at revocation; abandoning it", self.inflight)
        for tp in revoked:
            self.epochs.pop(tp, None)
            self.suppress_below.pop(tp, None)
            # (``unsettled`` stays: the store still holds the partition's pages past the
            # group's commit, whoever reads it now; a commit that reaches them settles it,
            # ours or another member's, which ``_lag_loop`` looks for)
            self.committed.pop(tp, None)
            self._paused.discard(tp)
            with contextlib.suppress(KeyError):
                self.metrics.consumer_lag.remove(tp.topic, str(tp.partition))
            producer = self.txn_producers.pop(tp, None)
            if producer is not None:
                with contextlib.suppress(Exception):
                    await producer.stop()
        self.revoking -= revoked
        self.metrics.assigned_partitions.set(len(self.epochs))
        log.info("partitions revoked", extra={"partitions": _names(revoked)})

    async def on_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        assert self.consumer is not None and self.engine is not None
        assigned = set(assigned)
        if assigned:
            STARTUP.end()
        self.metrics.rebalances.labels("assigned").inc()
        # aiokafka starts fetching as soon as the assignment is set, before this listener
        # returns: hold the partitions until their positions and producers are ready.
        self.consumer.pause(*assigned)
        loop = asyncio.get_running_loop()
        stored = await loop.run_in_executor(self.executor, self.engine.stored_offsets)
        noted = await loop.run_in_executor(self.executor, self.engine.checkpoints)
        for tp in sorted(assigned):
            if self.kc.transactions and tp not in self.txn_producers:
                producer = new_producer(self.kc, self.transactional_id(tp))
                await producer.start()  # InitProducerId fences a previous owner of this id
                self.txn_producers[tp] = producer
        group = await self._group_offsets(assigned)  # after the fencing: no pending commit
        # the first offset each partition still holds: pages stored past the commit whose
        # records the topic's retention deleted are never read again, so they cannot hold
        # back the retention sweeps (``unsettled``) until a commit reaches them
        begins = await self.consumer.beginning_offsets(list(assigned))
        # the store's other partitions of the input topic (another member of the group
        # holds them, or no one yet): their pages stored past the group's commit are read
        # again, by us if they come back, and must still be in the store then
        exists = self.consumer.partitions_for_topic(self.kc.input_topic) or set()
        elsewhere = {TopicPartition(t, p) for t, p in stored
                     if t == self.kc.input_topic and p in exists} - assigned
        await self._settle(elsewhere, stored, noted)
        self._warn_if_shared(assigned)
        for tp in sorted(assigned):
            self.unsettled.pop(tp, None)  # decided again below
            committed, published = group.get(tp, (None, False))
            in_store = stored.get((tp.topic, tp.partition))
            noted_published = noted.get((tp.topic, tp.partition))
            if committed is not None:
                self.committed[tp] = committed
            elif noted_published is not None:
                log.warning("%s: the group has no committed offset (expired, deleted or a new "
                            "group id); resuming after the pages it records as published, "
                            "at offset %d", tp, noted_published)
                committed, published = noted_published, True
            elif in_store is not None:
                # stored before the partition's first commit (a crash came between): their
                # matches were never published; read again, they are replays, published now
                log.warning("%s: the group has no committed offset and the store records "
                            "no publication of its pages (next offset %d); reading the "
                            "partition from its beginning", tp, in_store)
                await self.consumer.seek_to_beginning(tp)
                self._unsettle(tp, 0, in_store, begins[tp])
                continue
            if committed is None:
                continue  # new partition: auto_offset_reset applies
            if in_store is not None and in_store < committed:
                if published:
                    log.warning("%s: store is behind the group (%d < %d), whose commit says "
                                "that range was published; re-indexing it without publishing",
                                tp, in_store, committed)
                    self.suppress_below[tp] = committed
                else:
                    log.warning("%s: store is behind the group (%d < %d), whose commit does "
                                "not say that range was published; re-indexing and publishing "
                                "it", tp, in_store, committed)
                self.consumer.seek(tp, in_store)
            else:
                if in_store is None:
                    log.warning("%s: the store has no pages of this partition before offset "
                                "%d; they cannot be matched", tp, committed)
                elif in_store > committed:
                    self._unsettle(tp, committed, in_store, begins[tp])
                self.consumer.seek(tp, max(committed, begins[tp]))
        # Only now (producers ready, positions set) do fetched batches of these count.
        for tp in assigned:
            self._epoch_counter += 1
            self.epochs[tp] = self._epoch_counter
        self.consumer.resume(*assigned)
        self.metrics.assigned_partitions.set(len(self.epochs))
        log.info("partitions assigned", extra={"partitions": _names(assigned)})

    def _unsettle(self, tp: TopicPartition, committed: int, in_store: int, begin: int
                  ) -> None:
        """The store holds pages of ``tp`` up to ``in_store`` past the commit: no sweep until
        a commit reaches them, unless the topic no longer holds their records."""
        if begin < in_store:
            self.unsettled[tp] = in_store
        else:
            log.warning("%s: offsets %d to %d were stored but their matches not committed, "
                        "and the topic no longer holds them (its log starts at %d): they "
                        "cannot be published again", tp, committed, in_store - 1, begin)

    async def _settle(self, tps: Iterable[TopicPartition], stored: dict[tuple[str, int], int],
                      noted: dict[tuple[str, int], int]) -> None:
        """``unsettled`` of partitions this worker does not hold: the store's next offset
        while the group's commit (without one, the store's note of what it published) is
        below it and the topic still holds those records; dropped once a commit reaches it."""
        tps = sorted(tps)
        if not tps:
            return
        assert self.consumer is not None
        group = await self._group_offsets(tps)
        begins = await self.consumer.beginning_offsets(tps)
        held = self.consumer.assignment()  # (assigned meanwhile: on_assigned decided)
        for tp in tps:
            if tp in held:
                continue
            self.unsettled.pop(tp, None)
            in_store = stored.get((tp.topic, tp.partition))
            committed = group.get(tp, (noted.get((tp.topic, tp.partition)), False))[0]
            if in_store is not None and (committed is None or committed < in_store):
                self._unsettle(tp, committed or 0, in_store, begins[tp])

    def _warn_if_shared(self, assigned: set[TopicPartition]) -> None:
        """The single worker compares a page with the pages of its own store only: another
        member of its group (a second instance) splits the index between them."""
        assert self.consumer is not None
        every = self.consumer.partitions_for_topic(self.kc.input_topic) or set()
        held = {tp.partition for tp in assigned if tp.topic == self.kc.input_topic}
        if every and held != every:
            log.warning("this worker holds partitions %s of %s; another member of group %s "
                        "holds the others: each single worker matches pages against its own "
                        "store only. Run one per group (replicas: 1), or the roles "
                        "(docs/topology.md) to scale out", sorted(held), self.kc.input_topic,
                        self.kc.group_id)

    async def _group_offsets(self, tps: Iterable[TopicPartition]
                             ) -> dict[TopicPartition, tuple[int, bool]]:
        """The group's committed offset per partition, and whether it carries PUBLISHED.
        ``AIOKafkaConsumer.committed`` drops the metadata; the group coordinator's fetch,
        which it calls, keeps it (and retries retriable errors the same way)."""
        assert self.consumer is not None
        found = await fetch_committed(self.consumer, tps)
        return {tp: (om.offset, om.metadata == PUBLISHED) for tp, om in found.items()
                if om.offset >= 0}

    # -- the pipeline ---------------------------------------------------------------------
    async def _fetch_loop(self) -> None:
        assert self.consumer is not None
        consumer = self.consumer
        while not self.stopping.is_set():
            self._apply_backpressure()
            # getmany keeps being called while paused, so the group never sees us as stuck.
            batches = await consumer.getmany(timeout_ms=200, max_records=self.wc.batch_size)
            for tp, records in batches.items():
                epoch = self.epochs.get(tp)
                if not records:
                    continue
                if epoch is None:
                    # Fetched while its assignment was being set up: put the position back
                    # rather than skip the records.
                    if tp in consumer.assignment():
                        consumer.seek(tp, records[0].offset)
                    continue
                self.queue.put_nowait(WorkItem(tp, epoch, records))
            self.metrics.queued_batches.set(self.queue.qsize())

    def _apply_backpressure(self) -> None:
        assert self.consumer is not None
        assignment = self.consumer.assignment()
        if self.queue.qsize() >= self.wc.queue_batches:
            to_pause = set(assignment) - self._paused
            if to_pause:
                self.consumer.pause(*to_pause)
                self._paused |= to_pause
        elif self._paused:
            to_resume = self._paused & set(assignment)
            if to_resume:
                self.consumer.resume(*to_resume)
            self._paused.clear()
        self.metrics.paused_partitions.set(len(self._paused))

    async def _process_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stopping.is_set():
            item = await self.queue.get()
            self.metrics.queued_batches.set(self.queue.qsize())
            if self.stopping.is_set():
                break  # not started: left uncommitted, consumed again after restart
            if self.epochs.get(item.tp) != item.epoch or item.tp in self.revoking:
                continue  # revoked since it was fetched
            self.inflight = item.tp
            self._idle.clear()
            try:
                records, decoded = item.records, None
                while records:  # one part at a time, each committed before the next
                    t0 = time.perf_counter()
                    result, records, decoded = await loop.run_in_executor(
                        self.executor, self._process_batch, item.tp, records, decoded,
                        self.suppress_below.get(item.tp, -1),
                    )
                    self.metrics.stage_seconds.labels("engine").observe(
                        time.perf_counter() - t0)
                    await self._publish_and_commit(result)
                    if (self.stopping.is_set() or self.epochs.get(item.tp) != item.epoch
                            or item.tp in self.revoking):
                        break  # the rest is consumed again (here or by the next owner)
            finally:
                self.inflight = None
                self._idle.set()

    def _process_batch(self, tp: TopicPartition, records: list[Any],
                       decoded: list[Page | MessageRejected] | None, suppress_below: int
                       ) -> tuple[BatchResult, list[Any], list[Page | MessageRejected]]:
        """Runs in the engine thread: the batch's first part (``removal_cut``), and the
        records left for the next part with their pages (``decoded``: those of
        ``records``, None if not decoded yet)."""
        engine = self.engine
        if engine is None:
            raise FatalError("engine closed")
        # (here every earlier part is committed: a sweep removes no page whose matches a
        # replay would have to answer from the store)
        self._retention(engine)
        m = self.metrics
        if decoded is None:
            decoded = self._decode(tp, records)
        n = removal_cut(decoded)
        records, rest = records[:n], records[n:]
        result = BatchResult(tp, next_offset=records[-1].offset + 1)
        m.batch_records.observe(len(records))
        engine_out = self._run_engine(engine, tp, records, decoded[:n])
        for rec in records:
            out = self._process_record(engine, tp, rec, result, engine_out)
            if rec.offset < suppress_below:
                result.suppressed += len(out)
                continue
            result.outgoing.extend(out)
            result.timestamps_ms.append(rec.timestamp)
        return result, rest, decoded[n:]

    def _retention(self, engine: Engine) -> None:
        """The retention sweep (``[engine.retention]``), at most every ``every`` seconds, in
        the engine thread before a part, when every page stored earlier is committed (not
        while a partition's store is ahead of its commit, ``unsettled``: those pages are
        answered from the store when read again)."""
        r = engine.config.retention
        now = time.monotonic()
        if not (r.max_pages or r.max_age) or now - self._last_sweep < r.every or self.unsettled:
            return
        self._last_sweep = now
        removed = engine.compact()
        self.metrics.lifecycle.labels("expired").inc(removed)
        if removed:
            log.info("retention: %d pages left the store", removed)

    def _decode(self, tp: TopicPartition, records: list[Any]) -> list[Page | MessageRejected]:
        """Each record's page, or the MessageRejected of a record that is not one."""
        out: list[Page | MessageRejected] = []
        for rec in records:
            value: bytes = rec.value if rec.value is not None else b""
            if len(value) > self.wc.max_message_bytes:
                out.append(MessageRejected(
                    "too_large", f"{len(value)} bytes > worker.max_message_bytes "
                    f"({self.wc.max_message_bytes})"))
                continue
            t0 = time.perf_counter()
            try:  # a null value is a tombstone: a delete, handled in order like a page
                out.append(messages.decode_record(rec.key, rec.value))
            except MessageRejected as exc:
                out.append(exc)
                continue
            self.metrics.stage_seconds.labels("decode").observe(time.perf_counter() - t0)
        return out

    def _run_engine(self, engine: Engine, tp: TopicPartition, records: list[Any],
                    decoded: list[Page | MessageRejected]) -> EngineOut:
        """The part's pages run through the engine, sketch and align on ``worker.jobs``
        processes: per offset, the page with its matches or exception and its report, or
        the MessageRejected of a record that never became a page."""
        out: EngineOut = {}
        items = []
        for rec, page in zip(records, decoded, strict=True):
            if isinstance(page, MessageRejected):
                out[rec.offset] = page
            else:
                items.append((page, (tp.topic, tp.partition, rec.offset)))
        jobs = self.wc.jobs or default_jobs()
        for (page, found), (_, source) in zip(engine.process_many(items, jobs=jobs), items,
                                              strict=True):
            out[source[2]] = (page, found, engine.last_report)
        return out

    def _process_record(self, engine: Engine, tp: TopicPartition, rec: Any,
                        result: BatchResult,
                        engine_out: EngineOut) -> list[Outgoing]:
        m = self.metrics
        source = (tp.topic, tp.partition, rec.offset)
        value: bytes = rec.value if rec.value is not None else b""
        doc_id: str | None = None
        try:
            outcome = engine_out[rec.offset]
            if isinstance(outcome, MessageRejected):
                raise outcome
            page, found_or_error, report = outcome
            doc_id = page.id
            try:
                if isinstance(found_or_error, BaseException):
                    raise found_or_error
                found = found_or_error
            except PageRejected as exc:
                raise MessageRejected(exc.reason, exc.detail, doc_id) from None
            except SYSTEM_FAILURES:
                raise
            except Exception as exc:
                if self.wc.on_engine_error == "fail":
                    raise FatalError(f"engine failed on {source}: {exc!r}") from exc
                log.exception("engine error on %s (sent to DLQ)", source)
                raise MessageRejected("internal_error", f"{type(exc).__name__}: {exc}",
                                      doc_id) from None
        except MessageRejected as exc:
            result.outcomes["rejected"] += 1
            result.dead_letters[exc.reason] += 1
            dl = messages.dead_letter_to_wire(
                error=exc.reason, detail=exc.detail, topic=tp.topic, partition=tp.partition,
                offset=rec.offset, raw=value, key=rec.key, failed_at_ms=_now_ms(),
                doc_id=exc.doc_id or doc_id, raw_max_bytes=self.wc.dlq_raw_max_bytes,
            )
            return [Outgoing(self.kc.dlq_topic, messages.pack(dl),
                             key=messages.dead_letter_key(rec.key), headers=_headers(source))]
        if page.deleted:
            result.outcomes["deleted"] += 1
        elif report.replayed:
            result.outcomes["replayed"] += 1  # answered from the store
        else:
            result.outcomes["processed"] += 1
            for stage in ENGINE_STAGES:
                m.stage_seconds.labels(stage).observe(getattr(report, stage))
            m.psm_probes.observe(report.psm_probes)
            m.near_candidates.inc(report.near_candidates)
            m.cws_pairs.inc(report.cws_pairs)
            m.cws_saved.inc(report.cws_samples_saved)
        now = _now_ms()
        key = page.id.encode("utf-8")
        out = []
        for match in found:
            result.matches[match.kind] += 1
            if match.revisit is not None:
                m.lifecycle.labels(f"revisit_{match.revisit}").inc()
            out.append(Outgoing(self.kc.output_topic, messages.encode_match(match, now),
                                key=key, headers=_headers(source)))
        return out

    async def _publish_and_commit(self, result: BatchResult) -> None:
        tp = result.tp
        if self.epochs.get(tp) is None:
            log.warning("%s was revoked while its batch ran; not committing", tp)
            return
        if not result.outgoing and result.next_offset <= self.suppress_below.get(tp, -1):
            # rebuilding a range the group has committed as published: committing this
            # lower offset would lose the mark; the store alone has advanced
            self._count(result)
            return
        offsets = {tp: (result.next_offset, PUBLISHED)}
        t0 = time.perf_counter()
        try:
            if self.kc.transactions:
                producer = self.txn_producers.get(tp)
                if producer is None:
                    log.warning("%s: no producer (revoked); not committing", tp)
                    return
                async with producer.transaction():
                    await self._send_all(producer, result.outgoing)
                    t1 = time.perf_counter()
                    await producer.send_offsets_to_transaction(offsets, self.kc.group_id)
            else:
                assert self.producer is not None and self.consumer is not None
                await self._send_all(self.producer, result.outgoing)
                t1 = time.perf_counter()
                await self.consumer.commit(offsets)
        except KafkaError as exc:
            if self.epochs.get(tp) is None or tp in self.revoking:
                # Lost the partition (rebalance): the new owner redoes the batch.
                log.warning("%s: batch not committed (%r); it will be consumed again", tp, exc)
                return
            # Still ours: the next batch would commit past this one, whose output is lost.
            if isinstance(exc, MessageSizeTooLargeError):
                largest = max(result.outgoing, key=lambda o: len(o.value or b""), default=None)
                if largest is not None:
                    raise FatalError(
                        f"the broker refused a batch of {tp}: its largest record is "
                        f"{len(largest.value or b'')} bytes for topic {largest.topic}, over that "
                        "topic's max.message.bytes or kafka.max_request_size; raise them "
                        f"({exc!r})") from exc
            raise
        done = time.perf_counter()
        if self.engine is not None:  # the resume point should the group lose its offsets
            await asyncio.get_running_loop().run_in_executor(
                self.executor, self.engine.set_checkpoint, tp.topic, tp.partition,
                result.next_offset)
        m = self.metrics
        m.stage_seconds.labels("publish").observe(t1 - t0)
        m.stage_seconds.labels("commit").observe(done - t1)
        m.last_commit.set(time.time())
        self.committed[tp] = result.next_offset
        if result.next_offset >= self.unsettled.get(tp, result.next_offset):
            self.unsettled.pop(tp, None)
        self._count(result)

    def _count(self, result: BatchResult) -> None:
        """Metrics of a batch that is done (committed, or below a published commit)."""
        m = self.metrics
        tp = result.tp
        for outcome, n in result.outcomes.items():
            m.pages.labels(outcome).inc(n)
        for kind, n in result.matches.items():
            m.matches.labels(kind).inc(n)
        for reason, n in result.dead_letters.items():
            m.dead_letters.labels(reason).inc(n)
        if result.suppressed:
            m.suppressed.inc(result.suppressed)
        now_ms = _now_ms()
        for ts in result.timestamps_ms:
            if ts > 0:
                m.end_to_end.observe(max(0, now_ms - ts) / 1000)
        if tp in self.suppress_below and result.next_offset >= self.suppress_below[tp]:
            del self.suppress_below[tp]

    @staticmethod
    async def _send_all(producer: AIOKafkaProducer, outgoing: list[Outgoing]) -> None:
        futures = [
            await producer.send(o.topic, o.value, key=o.key, headers=o.headers)
            for o in outgoing
        ]
        if futures:
            await asyncio.gather(*futures)  # every send acknowledged before the commit

    # -- periodic gauges ------------------------------------------------------------------
    async def _lag_loop(self) -> None:
        assert self.consumer is not None
        while not self.stopping.is_set():
            away = set(self.unsettled) - set(self.consumer.assignment())
            if away:  # settled by another member's commit?
                with contextlib.suppress(KafkaError):
                    await self._settle(away, {(tp.topic, tp.partition): s
                                              for tp, s in self.unsettled.items()}, {})
            for tp in list(self.consumer.assignment()):
                hw = self.consumer.highwater(tp)
                if hw is None or tp not in self.epochs:
                    continue
                with contextlib.suppress(Exception):
                    pos = await self.consumer.position(tp)
                    self.metrics.consumer_lag.labels(tp.topic, str(tp.partition)).set(
                        max(0, hw - pos))
            await asyncio.sleep(self.wc.lag_interval_s)

    async def _store_size_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stopping.is_set():
            size = await loop.run_in_executor(None, _dir_size, self.store_dir)
            self.metrics.store_bytes.set(size)
            free, total = filesystem_space(self.store_dir)
            self.metrics.store_free_bytes.set(free)
            self.metrics.store_filesystem_bytes.set(total)
            await asyncio.sleep(self.wc.store_size_interval_s)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    # aiokafka only logs what a listener raises: a failure here must stop the worker like
    # one in the pipeline, not leave it in the group with partitions it never consumes
    async def on_partitions_revoked(self, revoked: Any) -> None:
        await self.worker._guard(lambda: self.worker.on_revoked(revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        await self.worker._guard(lambda: self.worker.on_assigned(assigned))


def removal_cut(decoded: list[Page | MessageRejected]) -> int:
    """How many records of a batch go in its first part: up to the first record that
    would remove a page stored earlier in the part (a tombstone of its id, or its id with
    another body: a new version). That page's matches are published and committed first:
    a replay of an uncommitted part after a crash answers its pages from the store by
    their replay keys, which a removal deletes (read again, the page would be indexed as
    new and matched with the pages after it)."""
    bodies: dict[str, bytes | str] = {}
    for n, page in enumerate(decoded):
        if isinstance(page, MessageRejected):
            continue
        if page.id in bodies and (page.deleted or bodies[page.id] != page.body):
            return n
        if not page.deleted:
            bodies[page.id] = page.body
    return len(decoded)


def _headers(source: tuple[str, int, int]) -> list[tuple[str, bytes]]:
    return [(SOURCE_HEADER, f"{source[0]}:{source[1]}:{source[2]}".encode())]


def _names(tps: Iterable[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}:{tp.partition}" for tp in tps)


def _now_ms() -> int:
    return int(time.time() * 1000)


def filesystem_space(path: Path) -> tuple[int, int]:
    """Bytes available to the worker and total bytes of the filesystem holding ``path`` (or
    its nearest existing parent, before the store is created)."""
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def _dir_size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(root, name)).st_size
    return total


# -- logging and command line ---------------------------------------------------------------
class JsonFormatter(logging.Formatter):
    _skip = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3), "level": record.levelname, "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in self._skip})
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(
        "%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(STARTUP)  # first: the folding counts the lines as they go out
    handler.addFilter(RepeatFolder())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiokafka").setLevel(max(logging.WARNING, logging.getLevelName(level)))


def config_from_args(args: argparse.Namespace) -> Config:
    overrides: dict[str, dict[str, Any]] = {}
    if getattr(args, "bootstrap", None):
        overrides.setdefault("kafka", {})["bootstrap_servers"] = args.bootstrap
    if getattr(args, "group", None):
        overrides.setdefault("kafka", {})["group_id"] = args.group
    if getattr(args, "metrics_port", None) is not None:
        overrides.setdefault("metrics", {})["port"] = args.metrics_port
    if getattr(args, "log_level", None):
        overrides.setdefault("worker", {})["log_level"] = args.log_level
    return load_config(getattr(args, "config", None) or os.environ.get("DUPALIGN_CONFIG"),
                       overrides=overrides)


async def serve(config: Config, store_dir: str | Path) -> int:
    worker = Worker(config, store_dir)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, worker.stop)
    try:
        return await worker.run()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def run_worker(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"dupalign worker: invalid configuration: {exc}", file=sys.stderr)
        return 2
    from dupalign.service.roles.launch import ROLES, parse_roles, serve_roles

    try:
        roles = parse_roles(getattr(args, "roles", None) or ",".join(ROLES))
    except ValueError as exc:
        print(f"dupalign worker: --roles: {exc}", file=sys.stderr)
        return 2
    if ("index" in roles or "shard" in roles) and not args.store:
        print("dupalign worker: --store is required (the index and shard roles keep their "
              "stores there)", file=sys.stderr)
        return 2
    if "shard" in roles and config.kafka.index_shards < 2:
        print("dupalign worker: --roles shard needs kafka.index_shards >= 2 (with 1, the "
              "index role holds the whole index)", file=sys.stderr)
        return 2
    setup_logging(config.worker.log_level, config.worker.log_format)
    if roles != ROLES:  # a part of the topology (dupalign/service/roles/launch.py)
        return asyncio.run(serve_roles(config, roles, args.store))
    return asyncio.run(serve(config, args.store))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dupalign-worker")
    add_worker_arguments(parser)
    return run_worker(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
