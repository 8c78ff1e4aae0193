"""The sketch role of the partitioned pipeline (docs/pipeline.md, "Roles on Kafka"): per batch of
one ``pages`` partition, in one transaction, the batch's ``SequenceBatch`` first (to the one
partition of ``<in>.batches``: its acknowledged offset b names the batch), then per page i
its ``DirectoryEntry`` to ``<in>.entries`` partition ``directory_owner(id, D)`` (key: the
id; header: (b, i)), its near state (``near_state``: its sketch without the passage sketch)
to ``<in>.near_state`` partition ``directory_owner(id, R)``, the router that owns the id
(key: the id; header: (b, i)), its ``ListWindows`` to ``<in>.windows`` partition s for every
list partition s if it has passages (``list_windows``; the sequence record says which pages
have: a list partition knows whether to wait for one), the dead letters, and the batch's
input offsets. A page that cannot be processed is dead-lettered (``sketch_record``) and
takes no place in the batch; a batch of dead letters only sends no
sequence record.

Per page also its ``PageSketch`` to ``<in>.sketches`` partition ``directory_owner(id, C)`` (the
combine partition that owns the id; key the id, header (b, i)), and per page with passages
(the pages whose list windows it sends) its forward record (``forward_value``) to
``<in>.passages`` partition ``directory_owner(id, A)``, the align partition that owns the id
(key the id, header (b, i); in parts over ``kafka.max_request_size``). Pages are sketched
under the uniform idf table: the role runs ahead of the learner, so it cannot know the table
in force at a page; the router of the page's id makes its fingerprint again under that
table (docs/pipeline.md, rule 7).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition

from dupalign.near.idf import UNIFORM_IDF
from dupalign.page import Page
from dupalign.service.config import Config
from dupalign.service.parts import in_parts
from dupalign.service.roles.base import StatelessRole
from dupalign.service.roles.metrics import RoleMetrics
from dupalign.service.send_batches import send_batched
from dupalign.service.sequence_batch import SequenceBatch, page_header
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import (
    Outgoing,
    TopologyError,
    add_to_transaction,
    batch_bytes,
    send_all,
    source_header,
)
from dupalign.stages.directory import directory_owner, entry_of
from dupalign.stages.forward_stage import forward_value
from dupalign.stages.list_shard import list_windows
from dupalign.stages.partitioned import Shape
from dupalign.stages.sketch import PageSketch, Sketcher
from dupalign.wire import messages
from dupalign.wire.messages import MessageRejected

log = logging.getLogger("dupalign.roles.sketch")


@dataclass
class StageBatch:
    topic: str
    partition: int
    at_ms: int
    offsets: list[int] = field(default_factory=list)  # of the pages sequenced
    dirs: list[int] = field(default_factory=list)
    entries: list[Outgoing] = field(default_factory=list)  # (page header added on send)
    near_states: list[Outgoing] = field(default_factory=list)  # (page header added on send)
    dead_letters: list[Outgoing] = field(default_factory=list)
    # per page its list windows, one record per list partition, or none
    lists: list[list[Outgoing]] = field(default_factory=list)
    sketches: list[Outgoing] = field(default_factory=list)  # to the combine (page header too)
    # per page its forward record to the align stage, or none (page header added on send)
    passages: list[Outgoing | None] = field(default_factory=list)


class StageSketchRole(StatelessRole):
    name = "stage-sketch"

    def __init__(self, config: Config, shape: Shape, metrics: RoleMetrics | None = None
                 ) -> None:
        super().__init__(config, metrics)
        if not self.kc.transactions:
            raise TopologyError("the stage roles need kafka.transactions = true")
        self.shape = shape
        self.topics_ = StageTopics(self.kc, shape)
        self.sketcher = Sketcher(config.engine)
        self.pages = 0

    @property
    def input_topic(self) -> str:
        return self.kc.input_topic

    def topics(self) -> dict[str, int | None]:
        return self.topics_.wanted()

    def topic_options(self) -> dict[str, Any]:
        return self.topics_.options()

    def prepare(self, tp: TopicPartition, records: list[Any]) -> StageBatch:
        out = StageBatch(tp.topic, tp.partition, int(time.time() * 1000))
        d = self.shape.directory
        for rec in records:
            sketched = sketch_record(self.sketcher, self.config, tp, rec)
            if isinstance(sketched, Outgoing):
                out.dead_letters.append(sketched)
                continue
            page, sk = sketched
            owner = directory_owner(page.id, d)
            out.offsets.append(rec.offset)
            out.dirs.append(owner)
            # (its ordinal is known to the stages only: the directory sets it)
            out.entries.append(Outgoing(self.topics_.entries, entry_of(0, sk).to_bytes(),
                                        key=page.id.encode("utf-8"), partition=owner))
            # (ordinal 0: the list partition sets it, as the directory an entry's)
            out.lists.append([Outgoing(self.topics_.windows, w.to_bytes(), partition=w.shard)
                              for w in list_windows(0, sk.passage, self.shape.lists)])
            out.near_states.append(Outgoing(
                self.topics_.near_state, near_state(sk), key=page.id.encode("utf-8"),
                partition=directory_owner(page.id, self.shape.router)))
            out.sketches.append(Outgoing(self.topics_.sketches, sk.to_combine_bytes(),
                                         key=page.id.encode("utf-8"),
                                         partition=directory_owner(page.id,
                                                                   self.shape.combine)))
            fwd = forward_value(page.id, sk.passage)
            out.passages.append(None if fwd is None else Outgoing(
                self.topics_.passages, fwd, key=page.id.encode("utf-8"),
                partition=directory_owner(page.id, self.shape.align)))
        return out

    async def produce(self, producer: AIOKafkaProducer, prepared: StageBatch) -> None:
        # every partition the batch writes, added before the sequence record is sent: one
        # AddPartitionsToTxn, not a second one after its acknowledgement
        add_to_transaction(producer, {TopicPartition(o.topic, o.partition) for o in (
            *prepared.entries, *prepared.near_states, *(w for ws in prepared.lists for w in ws),
            *prepared.sketches, *(f for f in prepared.passages if f is not None))
            if o.partition is not None} | ({TopicPartition(self.topics_.batches, 0)}
                                           if prepared.entries else set()))
        if prepared.entries:
            seq = SequenceBatch(prepared.topic, prepared.partition, tuple(prepared.offsets),
                                tuple(prepared.dirs), self.shape.directory, prepared.at_ms,
                                tuple(bool(w) for w in prepared.lists))
            (b,) = await send_all(producer, [Outgoing(self.topics_.batches, seq.to_bytes(),
                                                      partition=0)])
            for i, entry in enumerate(prepared.entries):
                entry.headers = [page_header(b, i)]
                for w in prepared.lists[i]:
                    w.headers = [page_header(b, i)]
            for i, state in enumerate(prepared.near_states):
                state.headers = [page_header(b, i)]
            for i, sketch in enumerate(prepared.sketches):
                sketch.headers = [page_header(b, i)]
            for i, fwd in enumerate(prepared.passages):
                if fwd is not None:
                    fwd.headers = [page_header(b, i)]
        # (a batch per partition, not a send per record: ~5 records a page)
        await send_batched(producer, self.outgoing(prepared), alone=batch_bytes(self.kc))
        self.pages += len(prepared.entries)

    def outgoing(self, prepared: StageBatch) -> list[Outgoing]:
        # (a big page's records go in parts: 7.3 MB of windows for a 3 MB page of distinct
        # words, S = 1; its sketch and near state over 1 MB from a page of about 100 KB)
        limit = self.kc.max_request_size
        return [*prepared.entries,
                *(part for s in prepared.near_states for part in in_parts(s, limit)),
                *(part for ws in prepared.lists for w in ws for part in in_parts(w, limit)),
                *(part for s in prepared.sketches for part in in_parts(s, limit)),
                *(part for f in prepared.passages if f is not None for part in in_parts(f, limit)),
                *prepared.dead_letters]


def near_state(sk: PageSketch) -> bytes:
    """What the router of the page's id reads of it (``Router.route``'s ``near``): its
    sketch without the passage sketch, for every sequenced page (so the router takes one
    for each page of its ids, whatever the directory decides)."""
    return replace(sk, passage=None).to_bytes()


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
