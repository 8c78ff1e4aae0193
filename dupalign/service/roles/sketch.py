"""The sketch role: pages in, their sketches out, each page given its ordinal.

Per batch of one ``pages`` partition, in one transaction: every page that sketches is sent
to the single-partition ``sequence`` topic (page id + where it is in ``pages``); the offsets
acknowledged there are the pages' ordinals; then each page's ``PageSketch`` goes to the
``sketches`` topic with its ordinal in a header; pages that cannot be processed go to the
dead-letter topic (they take no ordinal, as in ``scan``); then the batch's offsets. A sketch
over the topic's record limit goes as parts (dupalign/service/parts.py). An
aborted transaction leaves gaps in the ordinals, which read_committed readers never see.
A delete (a tombstone: the page id as key and a null value, or a page with ``deleted:
true``) is sequenced like a page: its sketch says ``deleted`` and the index removes the
page at its ordinal.

Sketches are made under the uniform idf table (version 0): the index recomputes the
fingerprint of a page sketched under an older table than its own (dupalign.near.index), so
the matches do not depend on it (the cost is index CPU once the table is frozen).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition

from dupalign.near.idf import UNIFORM_IDF
from dupalign.page import Page
from dupalign.service.config import Config
from dupalign.service.parts import in_parts
from dupalign.service.roles.base import StatelessRole
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.service.topology import (
    Outgoing,
    encode_sequence,
    last_sequenced,
    ordinal_header,
    record_limit,
    send_all,
    source_header,
)
from dupalign.stages.sketch import PageSketch, Sketcher
from dupalign.wire import messages
from dupalign.wire.messages import MessageRejected

log = logging.getLogger("dupalign.roles.sketch")


@dataclass
class SketchedBatch:
    sequence: list[Outgoing] = field(default_factory=list)
    # per page, its sketch or the sketch's parts (ordinal header added on send)
    sketches: list[list[Outgoing]] = field(default_factory=list)
    dead_letters: list[Outgoing] = field(default_factory=list)


class SketchRole(StatelessRole):
    name = "sketch"

    def __init__(self, config: Config, metrics: RoleMetrics | None = None) -> None:
        super().__init__(config, metrics)
        self.sketcher = Sketcher(config.engine)
        self.pages = 0
        self.sketch_limit = self.kc.max_request_size  # the largest record it may send

    @property
    def input_topic(self) -> str:
        return self.kc.input_topic

    async def on_start(self) -> None:
        # parts fit the topic's own limit too (a topic made elsewhere may take less): a
        # record over it would stop the role at this page after every restart
        self.sketch_limit = await record_limit(self.kc, self.kc.sketch_topic)

    async def take(self, tp: TopicPartition, committed: int | None) -> int | None:
        """Without a committed offset (the group's expired offsets.retention.minutes after
        it emptied, or was deleted), after the partition's last page in ``sequence``: its
        pages before are sequenced already, and sequencing them again would publish their
        matches again. (Pages dead-lettered after it go to the dead-letter topic again.)"""
        if committed is not None:
            return committed
        if not self.kc.transactions:
            # at-least-once: the last batch may have been sequenced without its sketches
            # (a stop between the two sends), so read again from before it: after the page
            # sequenced before its at most batch_size pages (offsets may have gaps, and
            # its dead letters before its first page were not sent either). Pages with a
            # sketch are sent again (duplicates, as at-least-once allows); the others are
            # sequenced again, which the index takes in place of the first ordinals
            before = await last_sequenced(self.kc, tp, skip=self.config.worker.batch_size)
            log.warning("no committed offset for %s:%d: resuming at offset %s, after the "
                        "pages sequenced before its last batch (at-least-once)",
                        tp.topic, tp.partition, "0" if before is None else before + 1)
            return None if before is None else before + 1
        last = await last_sequenced(self.kc, tp)
        if last is None:
            return None  # none sequenced: from the beginning
        log.warning("no committed offset for %s:%d: resuming after its last sequenced page "
                    "(offset %d)", tp.topic, tp.partition, last)
        return last + 1

    def prepare(self, tp: TopicPartition, records: list[Any]) -> SketchedBatch:
        out = SketchedBatch()
        for rec in records:
            source = (tp.topic, tp.partition, rec.offset)
            sketched = sketch_record(self.sketcher, self.config, tp, rec)
            if isinstance(sketched, Outgoing):
                out.dead_letters.append(sketched)
                continue
            page, sk = sketched
            headers = [source_header(source)]
            out.sequence.append(Outgoing(self.kc.sequence_topic, encode_sequence(page.id, source),
                                         partition=0, headers=headers))
            # one index shard holds the whole index (kafka.index_shards = 1); a sketch over
            # the topic's record limit goes as parts (dupalign/service/parts.py)
            out.sketches.append(in_parts(Outgoing(self.kc.sketch_topic, sk.to_bytes(),
                                                  partition=0, headers=list(headers)),
                                         self.sketch_limit))
        return out

    async def produce(self, producer: AIOKafkaProducer, prepared: SketchedBatch) -> None:
        ordinals = await send_all(producer, prepared.sequence)  # acknowledged offsets
        for parts, ordinal in zip(prepared.sketches, ordinals, strict=True):
            for part in parts:
                part.headers = [*part.headers, ordinal_header(ordinal)]
        await send_all(producer, [*_flat(prepared.sketches), *prepared.dead_letters])
        self.pages += len(ordinals)
        if ordinals:  # (an aborted transaction's ordinals are gaps: the end moved anyway)
            self.metrics.ordinal_sequenced.set(max(ordinals))

    def outgoing(self, prepared: SketchedBatch) -> list[Outgoing]:
        return [*prepared.sequence, *_flat(prepared.sketches), *prepared.dead_letters]


def sketch_record(sketcher: Sketcher, config: Config, tp: TopicPartition, rec: Any
                  ) -> tuple[Page, PageSketch] | Outgoing:
    """The page of ``rec`` (of ``tp``) and its sketch under the uniform idf table, or its
    dead letter: a page over ``worker.max_message_bytes``, one that does not decode, one
    the sketch rejects, or one that makes the sketch fail."""
    source = (tp.topic, tp.partition, rec.offset)
    value: bytes = rec.value if rec.value is not None else b""
    try:
        if len(value) > config.worker.max_message_bytes:
            raise MessageRejected("too_large", f"{len(value)} bytes > "
                                  f"worker.max_message_bytes")
        # a null value is a tombstone: a delete, sequenced like a page
        page = messages.decode_record(rec.key, rec.value)
        try:
            sk = sketcher.sketch(page, UNIFORM_IDF)
        except Exception as exc:  # a defect the page triggers: recurs on replay
            log.exception("sketch error on %s (sent to DLQ)", source)
            raise MessageRejected("internal_error", f"{type(exc).__name__}: {exc}",
                                  page.id) from None
        if sk.rejected is not None:
            raise MessageRejected(sk.rejected[0], sk.rejected[1], page.id)
        return page, sk
    except MessageRejected as exc:
        dl = messages.dead_letter_to_wire(
            error=exc.reason, detail=exc.detail, topic=tp.topic,
            partition=tp.partition, offset=rec.offset, raw=value, key=rec.key,
            failed_at_ms=int(time.time() * 1000), doc_id=exc.doc_id,
            raw_max_bytes=config.worker.dlq_raw_max_bytes)
        return Outgoing(config.kafka.dlq_topic, messages.pack(dl),
                        messages.dead_letter_key(rec.key), headers=[source_header(source)])


def _flat(sketches: list[list[Outgoing]]) -> list[Outgoing]:
    return [part for parts in sketches for part in parts]
