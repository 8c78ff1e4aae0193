"""Riding out a Kafka outage (a broker restarting, a network cut): while Kafka is unreachable
or answers with retriable errors, the caller retries with a capped exponential backoff and
keeps its store and engine open; one WARNING when the outage starts, one INFO when it ends,
and the failure is raised only once the outage has lasted ``kafka.max_outage_s``.

What a retry must redo so that nothing is lost or repeated is the caller's: the single
worker's checkpoint starts a new producer with the partition's transactional id, which
aborts the transaction the outage cut (dupalign/service/worker.py ``_publish_and_commit``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, KafkaTimeoutError, ProducerFenced
from prometheus_client import Gauge

from dupalign.service.topology import internal_waiters, mark_retrieved

log = logging.getLogger("dupalign.kafka")

T = TypeVar("T")

FIRST_BACKOFF_S = 0.5


class KafkaUnavailable(KafkaError):
    """An outage that lasted ``kafka.max_outage_s``."""

    retriable = False


def retriable(exc: BaseException) -> bool:
    """A Kafka failure that a later attempt can overcome: aiokafka's retriable errors
    (connection, no leader or coordinator, unknown topic while a broker loads) and its
    timeouts (records that no broker took in time)."""
    return isinstance(exc, KafkaTimeoutError) or (
        isinstance(exc, KafkaError) and bool(getattr(exc, "retriable", False)))


class KafkaOutage:
    """The outage state of one process: ``retry`` and ``until_ok`` run an operation until
    it succeeds or the outage outlasts ``max_outage_s`` (its failure is raised); ``retry``
    also stops once ``wanted`` turns false (the operation no longer matters, e.g. its
    partition was revoked). Any success ends the outage."""

    def __init__(self, max_outage_s: float, seconds: Gauge | None = None,
                 max_backoff_s: float = 10.0) -> None:
        self.max_outage_s = max_outage_s
        self.max_backoff_s = max_backoff_s  # (kafka.outage_backoff_max_s)
        self.since: float | None = None  # monotonic start of the current outage
        self._failures = 0
        if seconds is not None:  # how long the current outage has lasted (0: none)
            seconds.set_function(self.lasted)

    def lasted(self) -> float:
        return 0.0 if self.since is None else time.monotonic() - self.since

    def failed(self, exc: BaseException, what: str) -> float:
        """A failure of ``what``: the seconds to wait before the next attempt. Raises ``exc``
        when it is not retriable or the outage has lasted ``max_outage_s``."""
        # (fenced during an outage: the broker timed out the transaction the outage cut)
        if not retriable(exc) and not (self.since is not None and isinstance(exc, ProducerFenced)):
            raise exc
        now = time.monotonic()
        if self.since is None:
            self.since, self._failures = now, 0
            log.warning("waiting for Kafka: %s failed (%r); retrying for up to %.0f s "
                        "(kafka.max_outage_s)", what, exc, self.max_outage_s)
        elif now - self.since >= self.max_outage_s:
            raise KafkaUnavailable(f"Kafka unreachable or failing for {now - self.since:.0f} s "
                                   f"(kafka.max_outage_s): {what} failed ({exc!r})") from exc
        delay = min(self.max_backoff_s, FIRST_BACKOFF_S * 2 ** self._failures)
        self._failures += 1
        return min(delay, max(0.0, self.since + self.max_outage_s - now) + 0.01)

    def succeeded(self) -> None:
        if self.since is not None:
            log.info("Kafka is back; waited %.1f s for it", time.monotonic() - self.since)
            self.since = None

    async def retry(self, what: str, operation: Callable[[], Awaitable[T]],
                    wanted: Callable[[], bool] = lambda: True) -> T | None:
        """``operation``'s result; None once ``wanted()`` is false after a failure."""
        while True:
            try:
                return await self._attempt(what, operation)
            except _Again:
                if not wanted():
                    return None

    async def until_ok(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        while True:
            with contextlib.suppress(_Again):
                return await self._attempt(what, operation)

    async def _attempt(self, what: str, operation: Callable[[], Awaitable[T]]) -> T:
        try:
            result = await operation()
        except KafkaError as exc:
            await asyncio.sleep(self.failed(exc, what))
            raise _Again from exc
        self.succeeded()
        return result


class _Again(Exception):
    """An attempt failed with a retriable error and the backoff has passed."""


async def within(operation: Awaitable[T], limit_s: float) -> T:
    """``operation``'s result, or KafkaTimeoutError (retriable) after ``limit_s``: then it
    is cancelled, for at most a few seconds more, and the caller drops the client it used."""
    task = asyncio.ensure_future(operation)
    try:
        await asyncio.wait({task}, timeout=limit_s)
    except BaseException:
        task.cancel()
        raise
    if task.done():
        return task.result()
    # a cancelled transaction aborts, and waits for that abort (shielded): cancelled again,
    # it stops waiting; the new producer of the next attempt aborts it at the broker
    for _ in range(3):
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
        if task.done():
            break
    else:
        _abandoned.add(task)
        task.add_done_callback(_abandoned.discard)
    task.add_done_callback(mark_retrieved)
    raise KafkaTimeoutError(f"no answer from Kafka in {limit_s:.0f} s")


async def stop_within(producer: AIOKafkaProducer, limit_s: float = 5.0) -> None:
    """Stop a producer given up on, waiting at most ``limit_s``: it flushes what it holds,
    which waits for a broker that may be gone (until its records expire or the broker is
    back and fences them), so the stop may go on in the background; its errors are not
    the news: neither are the futures its failure fails that nothing awaits (a producer fenced
    by its successor while it aborts the transaction the outage cut)."""
    _forget_waiters(producer)
    sender = getattr(getattr(producer, "_sender", None), "sender_task", None)
    if isinstance(sender, asyncio.Task):  # (called after aiokafka's own ``_fail_all``)
        sender.add_done_callback(lambda _: _forget_waiters(producer))
    stopping = asyncio.ensure_future(producer.stop())
    _abandoned.add(stopping)  # (collected while pending, asyncio would log it as an error)
    stopping.add_done_callback(_abandoned.discard)
    stopping.add_done_callback(mark_retrieved)
    await asyncio.wait({stopping}, timeout=limit_s)


_abandoned: set[asyncio.Future[Any]] = set()


def _forget_waiters(producer: AIOKafkaProducer) -> None:
    for waiter in internal_waiters(producer):
        waiter.add_done_callback(mark_retrieved)
