"""``dupalign produce``: pages from JSON Lines or WARC files into a Kafka topic.

Each page becomes one msgpack ``page`` message (validated against the schema before it is
sent), keyed by the page id so that all versions of a document land in one partition, in
order. Items that are not usable pages are reported on stderr and skipped. The producer is
idempotent (acks=all); every send is acknowledged before the command exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import IO

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError

from dupalign.errors import PageRejected
from dupalign.page import Page, check_unicode
from worker import messages
from worker.capped import CappedLines
from worker.config import KafkaConfig, load_config
from worker.exits import KAFKA_HINT, CliError, Exit, check_broker_reachable
from worker.inputs import InputError, check_inputs, iter_input
from worker.progress import Progress


@dataclass
class ProduceStats:
    sent: int = 0
    skipped: int = 0
    bytes: int = 0


def new_producer(kafka: KafkaConfig) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        **kafka.client_kwargs(), enable_idempotence=True, acks="all",
        linger_ms=max(kafka.linger_ms, 5), max_request_size=kafka.max_request_size,
        compression_type=None if kafka.compression_type == "none" else kafka.compression_type,
    )


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


async def produce_files(
    paths: list[str], kafka: KafkaConfig, topic: str, limit: int | None = None,
    progress: Progress | None = None, err: IO[str] = sys.stderr,
) -> ProduceStats:
    stats = ProduceStats()

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

    producer = new_producer(kafka)
    try:
        await producer.start()
        await send_pages(producer, topic, pages(), stats, progress)
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


def add_produce_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="FILE",
                        help="JSON Lines (.jsonl[.gz]), WARC (.warc[.gz]), a directory of "
                        ".txt/.html files, or one document (page ids as for `scan`)")
    parser.add_argument("--bootstrap", metavar="HOST:PORT",
                        help="Kafka bootstrap servers (overrides kafka.bootstrap_servers)")
    parser.add_argument("--topic", help="target topic (default: kafka.input_topic, 'pages')")
    parser.add_argument("--config", metavar="FILE", help="TOML config (its [kafka] table)")
    parser.add_argument("--limit", type=int, help="stop after this many pages")
    parser.add_argument("--quiet", action="store_true", help="no progress line")


def run_produce(args: argparse.Namespace) -> int:
    """Raises ConfigError, InputsUnusable or CliError (one-line errors, see worker.exits)."""
    overrides = {"kafka": {"bootstrap_servers": args.bootstrap}} if args.bootstrap else {}
    config = load_config(args.config, overrides=overrides)
    check_inputs(args.inputs)
    check_broker_reachable(config.kafka.bootstrap_servers)
    topic = args.topic or config.kafka.input_topic
    # every failure reaches us as an exception, reported below in one line: aiokafka's own
    # log lines about it would only say it again, in another format
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    progress = Progress(sys.stderr, enabled=not args.quiet)
    try:
        stats = asyncio.run(produce_files(args.inputs, config.kafka, topic, args.limit, progress))
    except KafkaConnectionError as exc:
        raise CliError(f"cannot reach the Kafka broker at {config.kafka.bootstrap_servers} "
                       f"({exc}): {KAFKA_HINT}", Exit.KAFKA) from None
    except KafkaError as exc:
        raise CliError(f"Kafka error: {exc!r}", Exit.KAFKA) from None
    print(f"produced {stats.sent} pages to {topic}, skipped {stats.skipped}", file=sys.stderr)
    if stats.sent == 0:
        raise CliError("nothing was produced: no usable page in the inputs", Exit.NOTHING_DONE)
    return 0


if __name__ == "__main__":
    from worker.cli import main

    sys.exit(main(["produce", *sys.argv[1:]]))
