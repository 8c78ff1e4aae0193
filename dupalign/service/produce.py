"""``dupalign produce``: pages from JSON Lines or WARC files into a Kafka topic.

Each page becomes one msgpack ``page`` message (validated against the schema before it is
sent), keyed by the page id so that all versions of a document land in one partition, in
order. Items that are not usable pages are reported on stderr and skipped; those that are
input lost rather than merely unusable (a WARC record the file holds only part of) are also
sent to the dead-letter topic, so that nothing is dropped silently. The producer is
idempotent (acks=all); every send is acknowledged before the command exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import IO, Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError

from dupalign.errors import PageRejected
from dupalign.page import Page, check_unicode
from dupalign.service.capped import CappedLines
from dupalign.service.config import KafkaConfig, load_config
from dupalign.service.exits import KAFKA_HINT, CliError, Exit, check_broker_reachable
from dupalign.service.inputs import InputError, check_inputs, iter_input
from dupalign.service.kafka_security import check_security, refusal
from dupalign.service.progress import Progress
from dupalign.service.topology import new_producer, page_record_limit
from dupalign.wire import messages


@dataclass
class ProduceStats:
    sent: int = 0
    skipped: int = 0
    bytes: int = 0
    dead_letters: int = 0  # of the skipped: sent to the dead-letter topic


async def send_pages(
    producer: AIOKafkaProducer, topic: str, pages: Iterable[Page] | AsyncIterator[Page],
    stats: ProduceStats | None = None, progress: Progress | None = None,
    max_in_flight: int = 10_000,
) -> ProduceStats:
    """Send pages and wait until every one is acknowledged."""
    stats = stats or ProduceStats()
    pending: list[asyncio.Future[object]] = []

    async def one(page: Page) -> None:
        value = messages.encode_page(page)
        messages.validate("page", messages.page_to_wire(page))
        pending.append(await producer.send(topic, value, key=page.id.encode("utf-8")))
        stats.sent += 1
        stats.bytes += len(value)
        if len(pending) >= max_in_flight:
            await asyncio.gather(*pending)
            pending.clear()
        if progress is not None:
            progress.update(1, f"{stats.bytes / 1e6:.1f} MB, skipped {stats.skipped}")

    if isinstance(pages, AsyncIterator):
        async for page in pages:
            await one(page)
    else:
        for page in pages:
            await one(page)
    await asyncio.gather(*pending)
    return stats


def file_dead_letter(
    item: InputError, path: str, number: int, raw_max_bytes: int | None
) -> dict[str, Any]:
    """The dead letter of an input record lost in a file (``item.code`` set): its source is
    the file, the record's byte offset and its number, not a Kafka record."""
    dl = messages.dead_letter_to_wire(
        error=item.code or "input", detail=f"{item.where}: {item.reason}", topic=path,
        partition=0, offset=0, raw=item.raw,
        key=None if item.doc_id is None else item.doc_id.encode("utf-8"),
        failed_at_ms=int(time.time() * 1000), doc_id=item.doc_id, raw_max_bytes=raw_max_bytes)
    dl["source"] = {"file": path, "offset": item.offset or 0, "record": number or None}
    messages.validate("dead_letter", dl)
    return dl


async def produce_files(
    paths: list[str], kafka: KafkaConfig, topic: str, limit: int | None = None,
    progress: Progress | None = None, err: IO[str] = sys.stderr,
    dlq_raw_max_bytes: int | None = None, max_message_bytes: int = 0,
) -> ProduceStats:
    """Send the pages of ``paths`` to ``topic``; records lost in a file (an InputError with a
    code) also go to ``kafka.dlq_topic`` as dead letters. ``max_message_bytes``: the
    largest page record the worker takes (``worker.max_message_bytes``), which the
    producer must be able to send."""
    stats = ProduceStats()
    dead: list[asyncio.Future[object]] = []

    def report(message: str) -> None:
        if progress is not None:
            progress.write(message)
        else:
            print(message, file=err)

    shown = CappedLines(report)

    async def pages() -> AsyncIterator[Page]:
        for path in paths:
            for number, item in iter_input(path):
                if limit is not None and stats.sent >= limit:
                    return
                if isinstance(item, InputError):
                    stats.skipped += 1
                    shown.add(f"skipped {item.where}: {item.reason}")
                    if item.code is not None:
                        dl = file_dead_letter(item, path, number, dlq_raw_max_bytes)
                        dead.append(await producer.send(
                            kafka.dlq_topic, messages.pack(dl),
                            key=messages.dead_letter_key(dl["key"])))
                        stats.dead_letters += 1
                    continue
                try:
                    _check_encodable(item)
                    messages.validate("page", messages.page_to_wire(item))
                except (PageRejected, messages.MessageRejected) as exc:
                    stats.skipped += 1
                    shown.add(f"skipped {path}:{number} ({item.id}): {exc}")
                    continue
                yield item
                await asyncio.sleep(0)  # let the producer's sender run

    # no transaction; lingering at least 5 ms sends a stream of pages in batches
    producer = new_producer(kafka, linger_ms=max(kafka.linger_ms, 5),
                            max_request_size=page_record_limit(kafka, max_message_bytes))
    try:
        await producer.start()
        await send_pages(producer, topic, pages(), stats, progress)
        await asyncio.gather(*dead)
    finally:
        await producer.stop()
        if progress is not None:
            progress.close()
        shown.close("skipped")
    return stats


def _check_encodable(page: Page) -> None:
    """Raise PageRejected('bad_unicode') for a page whose strings msgpack cannot send as
    UTF-8 (a lone surrogate, which JSON's escapes can carry): the check `scan` makes, and
    ``meta``'s strings too, which are sent though the engine never reads them."""
    check_unicode(page)
    if page.meta is not None:
        try:
            messages.pack(page.meta)
        except UnicodeEncodeError as exc:
            raise PageRejected("bad_unicode", f"page meta is not valid Unicode ({exc.reason})"
                               ) from None


def run_produce(args: argparse.Namespace) -> int:
    """Raises ConfigError, InputsUnusable or CliError (one-line errors, see
    dupalign.service.exits)."""
    overrides = {"kafka": {"bootstrap_servers": args.bootstrap}} if args.bootstrap else {}
    config = load_config(args.config, overrides=overrides)
    check_inputs(args.inputs)
    check_broker_reachable(config.kafka.bootstrap_servers)
    asyncio.run(check_security(config.kafka))
    topic = args.topic or config.kafka.input_topic
    # every failure reaches us as an exception, reported below in one line: aiokafka's own
    # log lines about it would only say it again, in another format
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    progress = Progress(sys.stderr, enabled=not args.quiet)
    try:
        stats = asyncio.run(produce_files(args.inputs, config.kafka, topic, args.limit, progress,
                                          dlq_raw_max_bytes=config.worker.dlq_raw_max_bytes,
                                          max_message_bytes=config.worker.max_message_bytes))
    except KafkaConnectionError as exc:
        raise CliError(f"cannot reach the Kafka broker at {config.kafka.bootstrap_servers} "
                       f"({exc}): {KAFKA_HINT}", Exit.KAFKA) from None
    except KafkaError as exc:
        raise CliError(refusal(exc, config.kafka) or f"Kafka error: {exc!r}", Exit.KAFKA
                       ) from None
    dead = (f" ({stats.dead_letters} of them cut or corrupt records, sent to "
            f"{config.kafka.dlq_topic})" if stats.dead_letters else "")
    print(f"produced {stats.sent} pages to {topic}, skipped {stats.skipped}{dead}",
          file=sys.stderr)
    if stats.sent == 0:
        raise CliError("nothing was produced: no usable page in the inputs", Exit.NOTHING_DONE)
    return 0

