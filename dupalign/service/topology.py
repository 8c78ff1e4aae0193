"""Kafka plumbing shared by the single worker and the roles of ``dupalign stage``
(dupalign/service/roles/launch.py): the topics and their partition counts, the records that
travel between roles and transactional producers. The checkpoint unit (produced records +
consumed offsets, one Kafka transaction) is dupalign/service/loop.py's ``Checkpoint``.

Every record a role produces is sent in the transaction that also commits the input offsets
it was made from (pre-KIP-447 aiokafka: one transactional id per input partition, so the
next owner of a partition fences the previous one before it reads the committed offset).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code
from aiokafka.structs import OffsetAndMetadata

from dupalign.match import Match, Span
from dupalign.service.config import KafkaConfig
from dupalign.wire import messages
from dupalign.wire.versions import ALIGNED, ALIGNED_WHOLE

if TYPE_CHECKING:  # (the engine's import, numba, is not the producer's: produce fails fast)
    from dupalign.stages.align import RankedPage

log = logging.getLogger("dupalign.topology")

ORDINAL_HEADER = "dupalign-ordinal"  # the page's ordinal
SOURCE_HEADER = "dupalign-source"  # topic:partition:offset of the page in the input topic
REPLY_HEADER = "dupalign-reply"  # topic:partition an align request is answered to
RECORD_OVERHEAD = 4096  # room for a record's key, headers and batch framing
# a producer's batch, at most (``batch_bytes``): aiokafka sends one batch per partition a
# request and one request per broker at a time, so a transaction's N batches to one
# partition cost N round trips; at its default 16 KB a sketch batch's records to the
# sketches partition alone were ~30 (14 KB a page)
BATCH_BYTES = 1 << 20


class TopologyError(RuntimeError):
    """A topic is missing or has a partition count that breaks the sharding."""


@dataclass
class Outgoing:
    topic: str
    value: bytes | None  # None: a tombstone
    key: bytes | None = None
    partition: int | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


# -- topics ---------------------------------------------------------------------------------
# a changelog keeps each key's last record forever, and a removed key's tombstone for a day
COMPACTED = {"cleanup.policy": "compact"}


def page_record_limit(kc: KafkaConfig, max_message_bytes: int) -> int:
    """The largest record of the pages topic: a page of ``worker.max_message_bytes``,
    which the worker takes, must fit, whatever ``kafka.max_request_size`` says."""
    return max(kc.max_request_size, max_message_bytes + RECORD_OVERHEAD)


async def ensure_topics(kc: KafkaConfig, wanted: dict[str, int | None],
                        max_message_bytes: int = 0, compacted: Collection[str] = (),
                        counts_from: str = "") -> dict[str, int]:
    """Check (and with ``kafka.create_topics``, create) ``wanted`` topics; their partition
    counts. Raises TopologyError for a missing topic (without create_topics) or one whose
    partition count breaks the sharding. ``max_message_bytes``: the largest page the
    input topic must take (``worker.max_message_bytes``). ``compacted``: topics made
    compacted (the stores' changelogs). ``counts_from``: the end of the error when a topic
    has another partition count, "topic t has n partitions, not the m that ..."."""
    admin = AIOKafkaAdminClient(**kc.client_kwargs())
    await admin.start()
    try:
        counts = await _partition_counts(admin, wanted)
        missing = [t for t in wanted if t not in counts]
        if missing and kc.create_topics:
            # records between roles can be large (a big page's sketch, an align request
            # with its candidates' forward records): the topic takes what the producer sends
            compact = {**COMPACTED, "compression.type": kc.retained_compression}
            new = [NewTopic(t, wanted[t] or kc.topic_partitions, kc.replication_factor,
                            topic_configs={"max.message.bytes": str(
                                page_record_limit(kc, max_message_bytes)
                                if t == kc.input_topic else kc.max_request_size),
                                           **(compact if t in compacted else {})})
                   for t in missing]
            response = await admin.create_topics(new)
            for name, code, *_ in response.topic_errors:  # the admin client does not raise
                if code not in (0, TopicAlreadyExistsError.errno):  # raced another process
                    raise TopologyError(f"creating topic {name!r} failed: "
                                        f"{for_code(code).__name__}")
            log.info("created topics %s", missing)
            for _ in range(50):  # metadata catches up with the creation
                counts = await _partition_counts(admin, wanted)
                if all(t in counts for t in wanted):
                    break
                await asyncio.sleep(0.1)
        missing = [t for t in wanted if t not in counts]
        if missing:
            # an authorizer hides the topics a principal may not describe
            acl = ("" if kc.security_protocol == "PLAINTEXT" else
                   f"; or no ACL lets {kc.sasl_plain_username or 'this client'} describe "
                   "them: `dupalign acls` prints what a role needs, docs/security.md")
            raise TopologyError(f"topics {missing} do not exist (create them, or set "
                                f"kafka.create_topics = true){acl}")
        for topic, need in wanted.items():
            if need is not None and counts[topic] != need:
                raise TopologyError(f"topic {topic!r} has {counts[topic]} partitions, not "
                                    f"the {need} that {counts_from or 'it needs'}")
        return counts
    finally:
        await admin.close()


async def _partition_counts(admin: AIOKafkaAdminClient, topics: Iterable[str]
                            ) -> dict[str, int]:
    # describe only topics that exist: a metadata request naming a missing topic makes a
    # broker with auto.create.topics.enable create it, with the default partition count
    present = [t for t in topics if t in set(await admin.list_topics())]
    out: dict[str, int] = {}
    for t in await admin.describe_topics(present) if present else []:
        if t["error_code"] == 0 and t["partitions"]:
            out[t["topic"]] = len(t["partitions"])
    return out


# -- clients --------------------------------------------------------------------------------
def new_producer(kc: KafkaConfig, transactional_id: str | None = None,
                 linger_ms: int | None = None, max_request_size: int | None = None
                 ) -> AIOKafkaProducer:
    """The one way every process makes a producer: idempotent, acks from all replicas;
    transactional with ``transactional_id``; ``linger_ms`` and ``max_request_size``: None
    takes kc's."""
    kw: dict[str, Any] = {}
    if transactional_id is not None:
        kw["transactional_id"] = transactional_id
        kw["transaction_timeout_ms"] = kc.transaction_timeout_ms
    return AIOKafkaProducer(
        **kc.client_kwargs(), enable_idempotence=True, acks="all",
        max_batch_size=batch_bytes(kc),
        linger_ms=kc.linger_ms if linger_ms is None else linger_ms,
        max_request_size=kc.max_request_size if max_request_size is None else max_request_size,
        compression_type=None if kc.compression_type == "none" else kc.compression_type, **kw)


def batch_bytes(kc: KafkaConfig) -> int:
    """A producer's largest batch: ``BATCH_BYTES``, or less when records are capped lower (a
    batch must fit every topic's ``max.message.bytes``, which ``ensure_topics`` makes at
    least ``kafka.max_request_size``)."""
    return min(kc.max_request_size, BATCH_BYTES)


def new_consumer(kc: KafkaConfig, group_id: str, max_records: int, **kw: Any
                 ) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        **kc.client_kwargs(), group_id=group_id, enable_auto_commit=False,
        auto_offset_reset="earliest", isolation_level="read_committed",
        max_poll_records=max_records, session_timeout_ms=kc.session_timeout_ms,
        heartbeat_interval_ms=kc.heartbeat_interval_ms,
        max_poll_interval_ms=kc.max_poll_interval_ms,
        max_partition_fetch_bytes=kc.max_partition_fetch_bytes,
        fetch_max_bytes=kc.fetch_max_bytes, **kw)


def transactional_id(kc: KafkaConfig, group_id: str, tp: TopicPartition) -> str | None:
    """One per input partition (pre-KIP-447 fencing): the next owner of ``tp`` aborts what
    the previous one left open before it reads the committed offset. None with
    ``kafka.transactions = false`` (at-least-once: see dupalign/service/loop.py ``Checkpoint``)."""
    if not kc.transactions:
        return None
    return f"{kc.transactional_id_prefix}-{group_id}-{tp.topic}-{tp.partition}"


async def fetch_committed(consumer: AIOKafkaConsumer, tps: Iterable[TopicPartition]
                          ) -> dict[TopicPartition, OffsetAndMetadata]:
    """The group's committed offsets with their metadata, in one request (offset -1: never
    committed). ``AIOKafkaConsumer.committed`` asks per partition and drops the metadata;
    its group coordinator's fetch, which it calls, keeps both, and retries retriable errors.
    The coordinator is private to aiokafka: this is the one place that reaches it
    (tests/service/test_aiokafka_privates.py fails if aiokafka changes it)."""
    coordinator = consumer._coordinator
    if coordinator is None:
        raise RuntimeError("the consumer is not started: it has no group coordinator")
    found: dict[TopicPartition, OffsetAndMetadata] = (
        await coordinator.fetch_committed_offsets(list(tps)))
    return found


async def committed_offsets(consumer: AIOKafkaConsumer, tps: Iterable[TopicPartition]
                            ) -> dict[TopicPartition, int]:
    """The group's committed offsets (absent: never committed)."""
    found = await fetch_committed(consumer, tps)
    return {tp: om.offset for tp, om in found.items() if om.offset >= 0}


async def send_all(producer: AIOKafkaProducer, outgoing: list[Outgoing]) -> list[int]:
    """Send and wait for every acknowledgement; the offsets the records got. A failure is
    raised once: when a send raises (a fenced producer, a broker gone), the records sent
    before it fail with the same cause, which is not news (gather does the same for the
    ones it awaits)."""
    futures: list[asyncio.Future[Any]] = []
    try:
        for o in outgoing:
            futures.append(await producer.send(o.topic, o.value, key=o.key,
                                               partition=o.partition, headers=o.headers))
    except BaseException:
        for future in [*futures, *internal_waiters(producer)]:
            future.add_done_callback(mark_retrieved)
        raise
    return [md.offset for md in await asyncio.gather(*futures)]


def mark_retrieved(future: asyncio.Future[Any]) -> None:
    """A done callback: the future's exception counts as seen (its cause is reported
    elsewhere), so asyncio does not log it as never retrieved."""
    if not future.cancelled():
        future.exception()


def internal_waiters(producer: AIOKafkaProducer) -> list[asyncio.Future[Any]]:
    """The futures a failed producer fails with the cause its send raised, which nothing
    awaits: the drain waiters of its batches no send waited on, and the transaction's
    waiter (no abort follows a fatal failure). aiokafka keeps them private; a change there
    brings the tracebacks back, not an error (tests/service/test_aiokafka_privates.py)."""
    accumulator = getattr(producer, "_message_accumulator", None)
    batches = getattr(accumulator, "_batches", None) or {}
    txn = getattr(producer, "_txn_manager", None)
    found = [getattr(b, "_drain_waiter", None) for tp in list(batches) for b in batches[tp]]
    found.append(getattr(txn, "_transaction_waiter", None))
    return [f for f in found if isinstance(f, asyncio.Future)]


def add_to_transaction(producer: AIOKafkaProducer, tps: Iterable[TopicPartition]) -> None:
    """``tps`` added to the producer's open transaction at once (one AddPartitionsToTxn),
    before records for them are sent. aiokafka adds a partition when a batch for it is
    handed over, and sends one transactional request at a time (AddPartitionsToTxn,
    AddOffsetsToTxn, TxnOffsetCommit, EndTxn): a transaction whose records go in two
    rounds (the sketch role's sequence record first, whose offset the others' headers
    name) waits for a second AddPartitionsToTxn, queued behind the offsets' requests.
    A partition added and then not written gets a marker only. Private to aiokafka
    (tests/service/test_aiokafka_privates.py)."""
    txn = producer._txn_manager
    if txn is None or txn.transactional_id is None:
        return
    for tp in tps:
        txn.maybe_add_partition_to_txn(tp)


def background_failure(producer: AIOKafkaProducer) -> BaseException | None:
    """What failed the producer's sender task, if it did (a ProducerFenced in the reply to a
    request of its own): aiokafka then moves the transaction to a fatal state, and a later
    ``send`` says only IllegalOperation, ``begin_transaction`` an AssertionError. Private
    to aiokafka (tests/service/test_aiokafka_privates.py)."""
    task = getattr(getattr(producer, "_sender", None), "sender_task", None)
    if isinstance(task, asyncio.Task) and task.done() and not task.cancelled():
        return task.exception()
    return None


async def stop_quietly(*clients: AIOKafkaConsumer | AIOKafkaProducer | None) -> None:
    """Stop clients on the way out (a producer flushes); their errors are not the news.
    A consumer stopped while Kafka is away raises CancelledError: its fetcher awaits the
    fetch task it cancelled, asleep in a retry's backoff. Only a cancel of our own task
    goes on."""
    for client in clients:
        if client is not None:
            try:
                with contextlib.suppress(Exception):
                    await client.stop()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise


# -- records between roles ------------------------------------------------------------------
def ordinal_header(ordinal: int) -> tuple[str, bytes]:
    return ORDINAL_HEADER, struct.pack(">q", ordinal)


def header(record: Any, name: str) -> bytes | None:
    for k, v in record.headers or ():
        if k == name:
            return bytes(v)
    return None


def reply_header(topic: str, partition: int) -> tuple[str, bytes]:
    return REPLY_HEADER, f"{topic}:{partition}".encode()


def record_reply(record: Any) -> tuple[str, int] | None:
    """Where a request with a ``reply_header`` is answered (None: it has none)."""
    raw = header(record, REPLY_HEADER)
    if raw is None:
        return None
    topic, _, partition = raw.decode().rpartition(":")
    return topic, int(partition)


def record_ordinal(record: Any) -> int:
    raw = header(record, ORDINAL_HEADER)
    if raw is None:
        raise ValueError(f"record {record.topic}:{record.partition}:{record.offset} has no "
                         f"{ORDINAL_HEADER} header")
    return int(struct.unpack(">q", raw)[0])


def encode_aligned(ordinal: int, passages: list[tuple[str, list[Span]]]) -> bytes:
    """An ``aligned`` record (``ALIGNED_WHOLE``): what align found for a whole request, one that
    carried its candidates' forward records."""
    return bytes(msgpack.packb({
        "v": ALIGNED_WHOLE, "ordinal": ordinal,
        "passages": [[other, [s.to_dict() for s in spans]] for other, spans in passages]},
        use_bin_type=True))


def encode_aligned_part(ordinal: int, part: int, ranked: list[RankedPage] | None) -> bytes:
    """An ``aligned`` record (``ALIGNED.writes``): the best pages of one part of a request (its
    align partition ``part``), with their rank keys (``align.merge_ranked``); None: the
    part could not be aligned here (a candidate's forward record is missing)."""
    pages = None if ranked is None else [
        [r.ordinal, r.doc_id, r.covered, r.best_est, [s.to_dict() for s in r.spans]]
        for r in ranked]
    return bytes(msgpack.packb({"v": ALIGNED.writes, "ordinal": ordinal, "part": part,
                                "pages": pages}, use_bin_type=True))


@dataclass
class Aligned:
    """An ``aligned`` record read: a whole request's passages (version 1, ``part`` None)
    or a part's best pages (``ranked``; None: not aligned, ``encode_aligned_part``)."""

    ordinal: int
    part: int | None
    passages: list[tuple[str, list[Span]]] | None = None
    ranked: list[RankedPage] | None = None


def aligned_part(raw: bytes) -> int | None:
    """``decode_aligned(raw).part`` without making its spans (the combine keys every
    answer by it before it reads it)."""
    d = msgpack.unpackb(raw, raw=False)
    return None if ALIGNED.check(d.get("v")) == ALIGNED_WHOLE else int(d["part"])


def decode_aligned(raw: bytes) -> Aligned:
    from dupalign.stages.align import RankedPage

    d = msgpack.unpackb(raw, raw=False)
    if ALIGNED.check(d.get("v")) == ALIGNED_WHOLE:
        return Aligned(int(d["ordinal"]), None, passages=[
            (str(o), [Span.from_dict(s) for s in spans]) for o, spans in d["passages"]])
    pages = d["pages"]
    ranked = None if pages is None else [
        RankedPage(int(o), int(c), float(x), [Span.from_dict(s) for s in spans], str(i))
        for o, i, c, x, spans in pages]
    return Aligned(int(d["ordinal"]), int(d["part"]), ranked=ranked)


def source_header(source: tuple[str, int, int]) -> tuple[str, bytes]:
    return SOURCE_HEADER, f"{source[0]}:{source[1]}:{source[2]}".encode()


def published(kc: KafkaConfig, doc_id: str, matches: list[Match], source: tuple[str, int, int],
              now_ms: int, ordinal: int | None = None) -> list[Outgoing]:
    """A page's matches as the output topic's records: keyed by the page's id, with its
    place in the input (and its ordinal, if given: the stage roles')."""
    key = doc_id.encode("utf-8")
    headers = [source_header(source)]
    if ordinal is not None:
        headers.append(ordinal_header(ordinal))
    return [Outgoing(kc.output_topic, messages.encode_match(m, now_ms), key=key,
                     headers=list(headers)) for m in matches]
