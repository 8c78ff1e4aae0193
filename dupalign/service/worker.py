"""The Kafka worker: pages in, matches and dead letters out, one page at a time through the
engine, offsets committed only after the page's output is durable.

The delivery guarantee (write, produce, commit), what stops the worker and how it resumes from
the group's committed offset and the store's own: docs/delivery.md. Each batch is committed
with the service's checkpoint unit (dupalign/service/loop.py ``Checkpoint``); the engine side
of a batch is dupalign/service/worker_batch.py, the rebalances worker_rebalance.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, MessageSizeTooLargeError, TopicAlreadyExistsError

from dupalign.config import WORKER_AUDIT_SAMPLE
from dupalign.errors import ConfigError, StoreError
from dupalign.runtime.engine import Engine
from dupalign.service.config import Config, load_config
from dupalign.service.exits import Exit
from dupalign.service.http import HttpServer
from dupalign.service.kafka_args import REMOVED_TOPOLOGY, add_worker_arguments
from dupalign.service.kafka_security import quiet_refusals, refusal
from dupalign.service.log_repeats import STARTUP
from dupalign.service.logs import setup_logging
from dupalign.service.loop import Ahead, Checkpoint, Listener, run_loop
from dupalign.service.metrics import WorkerMetrics
from dupalign.service.outage import KafkaOutage, stop_within, within
from dupalign.service.sticky import claim_path, leaving, sticky
from dupalign.service.topology import (
    fetch_committed,
    new_producer,
    page_record_limit,
    stop_quietly,
)
from dupalign.service.worker_batch import (
    SOURCE_HEADER,
    BatchProcessing,
    BatchResult,
    FatalError,
    now_ms,
    removal_cut,
)
from dupalign.service.worker_rebalance import PUBLISHED, Rebalancing
from dupalign.wire import messages

__all__ = ["SOURCE_HEADER", "FatalError", "Worker", "add_worker_arguments", "main",
           "removal_cut", "run_worker", "serve"]

log = logging.getLogger("dupalign.worker")


class Worker(Rebalancing, BatchProcessing):
    """One worker process: a consumer-group member with its own engine and store."""

    def __init__(self, config: Config, store_dir: str | Path) -> None:
        self.config = config
        self.store_dir = Path(store_dir)
        self.kc = config.kafka
        self.wc = config.worker
        self.metrics = WorkerMetrics()
        self.outage = KafkaOutage(self.kc.max_outage_s, self.metrics.kafka_outage,
                                  self.kc.outage_backoff_max_s)
        self.engine: Engine | None = None
        # The engine is not thread-safe: exactly one thread ever touches it.
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.consumer: AIOKafkaConsumer | None = None
        self.strategy: tuple[Any, ...] = ()  # the consumer's assignors
        self.producer: AIOKafkaProducer | None = None  # non-transactional mode
        self.txn_producers: dict[TopicPartition, AIOKafkaProducer] = {}
        self.ahead = Ahead(self.wc.queue_batches, self._queue_gauges, self.outage)
        self.suppress_below: dict[TopicPartition, int] = {}
        # per assigned partition whose store is ahead of the group's commit: the store's
        # offset S; until a commit reaches S, pages in the store await their replay, so no
        # retention sweep may remove them
        self.unsettled: dict[TopicPartition, int] = {}
        self._last_sweep = time.monotonic()  # retention: the first sweep after one period
        # the group's committed offset per assigned partition, for the failure log line
        self.committed: dict[TopicPartition, int] = {}
        self.stopping = asyncio.Event()
        self.started = False
        self.failure: BaseException | None = None
        self.http: HttpServer | None = None
        self.tasks: list[asyncio.Task[None]] = []
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
                self.executor, partial(Engine.open, self.store_dir, self.config.engine,
                                       audit_default=WORKER_AUDIT_SAMPLE))
            for part, mb in self.config.engine.cache.budgets_mb().items():
                self.metrics.memory_budget_bytes.labels(part).set(mb << 20)
            if self.kc.create_topics:
                await self._create_topics()
            if not self.kc.transactions:
                self.producer = new_producer(self.kc, None)
                await self.producer.start()
            # the store holds its partitions' pages: one moved is rebuilt elsewhere
            self.strategy = sticky(claim_path(self.store_dir, self.kc.group_id))
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
                partition_assignment_strategy=self.strategy,
            )
            STARTUP.begin()
            self.consumer.subscribe([self.kc.input_topic], listener=Listener(self))
            await self.consumer.start()
            self.started = True
            log.info("worker started", extra={"config": self.config.redacted()})
            self.tasks = [
                asyncio.create_task(self._guard(self._consume), name="loop"),
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
            return (Exit.KAFKA if isinstance(self.failure, KafkaError)
                    or refusal(self.failure, self.kc) else Exit.INTERNAL)
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
        elif (refused := refusal(exc, self.kc)) is not None:
            cause = refused
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
        leaving(self.strategy)

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
        for t in self.tasks:
            if t.get_name() != "loop":
                t.cancel()
        # The loop finishes (publishes and commits) the batch it holds, then stops.
        consuming = [t for t in self.tasks if t.get_name() == "loop"]
        if consuming:
            try:
                await asyncio.wait_for(self.ahead.idle.wait(), self.wc.shutdown_timeout_s)
            except TimeoutError:
                log.error("in-flight batch did not finish in %.0fs; its offsets stay "
                          "uncommitted and it will be reprocessed", self.wc.shutdown_timeout_s)
            consuming[0].cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        # (the non-transactional producer flushes its pending sends)
        await stop_quietly(self.consumer, *self.txn_producers.values(), self.producer)
        self.txn_producers.clear()
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
    async def _create_topics(self) -> None:
        admin = AIOKafkaAdminClient(**self.kc.client_kwargs())
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            # the pages topic takes every page the worker takes
            pages = {"max.message.bytes": str(page_record_limit(self.kc,
                                                                self.wc.max_message_bytes))}
            new = [
                NewTopic(t, self.kc.topic_partitions, self.kc.replication_factor,
                         topic_configs=pages if t == self.kc.input_topic else {})
                for t in (self.kc.input_topic, self.kc.output_topic, self.kc.dlq_topic)
                if t not in existing
            ]
            if new:
                with contextlib.suppress(TopicAlreadyExistsError):
                    await admin.create_topics(new)
                log.info("created topics %s", [t.name for t in new])
        finally:
            await admin.close()

    # -- the pipeline ---------------------------------------------------------------------
    async def _consume(self) -> None:
        assert self.consumer is not None
        await run_loop(self, self.consumer, self.wc.batch_size, self._process, ahead=self.ahead)

    def _queue_gauges(self, queued: int, paused: int) -> None:
        self.metrics.queued_batches.set(queued)
        self.metrics.paused_partitions.set(paused)

    async def _process(self, batches: dict[TopicPartition, list[Any]]) -> None:
        """One partition's fetched batch (the loop's turn, ``Ahead``), one part at a time,
        each committed before the next."""
        loop = asyncio.get_running_loop()
        for tp, fetched in batches.items():
            epoch = self.ahead.epochs[tp]  # (the loop hands over only a held partition's)
            records, decoded = fetched, None
            while records:
                t0 = time.perf_counter()
                result, records, decoded = await loop.run_in_executor(
                    self.executor, self._process_batch, tp, records, decoded,
                    self.suppress_below.get(tp, -1),
                )
                self.metrics.stage_seconds.labels("engine").observe(time.perf_counter() - t0)
                await self._publish_and_commit(result, epoch)
                if self.stopping.is_set() or not self.ahead.held(tp, epoch):
                    break  # the rest is consumed again (here or by the next owner)

    async def _publish_and_commit(self, result: BatchResult, epoch: int) -> None:
        tp = result.tp
        if tp not in self.ahead.epochs:
            log.warning("%s was revoked while its batch ran; not committing", tp)
            return
        if not result.outgoing and result.next_offset <= self.suppress_below.get(tp, -1):
            # rebuilding a range the group has committed as published: committing this
            # lower offset would lose the mark; the store alone has advanced
            self._count(result)
            return
        loop = asyncio.get_running_loop()

        async def noted() -> None:
            if self.engine is not None:  # the resume point should the group lose its offsets
                await loop.run_in_executor(self.executor, self.engine.set_checkpoint,
                                           tp.topic, tp.partition, result.next_offset)

        unit = Checkpoint({tp: (result.next_offset, PUBLISHED)}, result.outgoing, after=noted)
        try:
            done = await self.outage.retry(
                f"the commit of a batch of {tp.topic}:{tp.partition}",
                lambda: self._commit(unit, tp, result.next_offset),
                wanted=lambda: self.ahead.held(tp, epoch) and not self.stopping.is_set())
        except KafkaError as exc:
            if not self.ahead.held(tp):
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
        if not done:
            log.warning("%s: revoked or stopping while Kafka was away: its batch is not "
                        "committed, and will be consumed again", tp)
            return
        m = self.metrics
        m.stage_seconds.labels("publish").observe(unit.publish_s)
        m.stage_seconds.labels("commit").observe(unit.commit_s)
        m.last_commit.set(time.time())
        self.committed[tp] = result.next_offset
        if result.next_offset >= self.unsettled.get(tp, result.next_offset):
            self.unsettled.pop(tp, None)
        self._count(result)

    async def _commit(self, unit: Checkpoint, tp: TopicPartition, next_offset: int) -> bool:
        """One attempt at ``unit``'s commit (``_publish_and_commit`` retries it while Kafka
        is away); False: the partition was revoked meanwhile. Each step is cut after
        ``kafka.request_timeout_ms``: a transaction the broker never answers is abandoned
        with its producer. The next attempt's new producer, with the partition's
        transactional id, aborts what that one left open, and finds in the group's offsets
        whether its commit went through before the outage (then it is not made twice)."""
        limit_s = self.kc.request_timeout_ms / 1000
        if not self.kc.transactions:  # at-least-once: a retry may send the records again
            assert self.producer is not None and self.consumer is not None
            await within(unit.commit(self.producer, self.kc.group_id, self.consumer,
                                     lost_commit_ok=False), limit_s)
            return True
        producer = self.txn_producers.get(tp)
        if producer is None:  # the last attempt failed (or the partition was revoked)
            assert self.consumer is not None
            producer = new_producer(self.kc, self.transactional_id(tp))
            try:
                await within(producer.start(), limit_s)  # fences the failed attempt's
                if not self.ahead.held(tp) or tp in self.txn_producers:
                    await stop_within(producer)
                    return False
                self.txn_producers[tp] = producer
                found = await within(fetch_committed(self.consumer, [tp]), limit_s)
            except BaseException:
                if self.txn_producers.get(tp) is producer:
                    del self.txn_producers[tp]
                await stop_within(producer)
                raise
            if tp in found and found[tp].offset >= next_offset:
                log.info("%s: the batch's commit went through before Kafka went away", tp)
                if unit.after is not None:
                    await unit.after()
                return True
        try:
            await within(unit.commit(producer, self.kc.group_id), limit_s)
        except BaseException:
            if self.txn_producers.get(tp) is producer:
                del self.txn_producers[tp]
            await stop_within(producer)
            raise
        return True

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
        now = now_ms()
        for ts in result.timestamps_ms:
            if ts > 0:
                m.end_to_end.observe(max(0, now - ts) / 1000)
        if tp in self.suppress_below and result.next_offset >= self.suppress_below[tp]:
            del self.suppress_below[tp]

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
                if hw is None or tp not in self.ahead.epochs:
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
            if (engine := self.engine) is not None:  # (on the engine's own thread)
                with contextlib.suppress(Exception):  # closing meanwhile: next time
                    memory = await loop.run_in_executor(self.executor, engine.memory_bytes)
                    for part, value in memory.items():
                        self.metrics.memory_bytes.labels(part).set(value)
            await asyncio.sleep(self.wc.store_size_interval_s)


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


def config_from_args(args: argparse.Namespace) -> Config:
    overrides: dict[str, dict[str, Any]] = {}
    if getattr(args, "bootstrap", None):
        overrides.setdefault("kafka", {})["bootstrap_servers"] = args.bootstrap
    if getattr(args, "group", None):
        overrides.setdefault("kafka", {})["group_id"] = args.group
    if getattr(args, "shape", None):
        overrides.setdefault("kafka", {})["shape"] = args.shape
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
    if getattr(args, "roles", None) is not None:
        print(f"dupalign worker: --roles: {REMOVED_TOPOLOGY}", file=sys.stderr)
        return 2
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"dupalign worker: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if not args.store:
        print("dupalign worker: --store is required", file=sys.stderr)
        return 2
    setup_logging(config.worker.log_level, config.worker.log_format)
    quiet_refusals()
    return asyncio.run(serve(config, args.store))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dupalign-worker")
    add_worker_arguments(parser)
    return run_worker(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
