"""The index role's exchange with the align shards: the align request of each page with
passage tasks (one part per align partition that owns some of its candidates), the answers
taken back and merged, and the forward records (a stored page's passages, keyed by ordinal,
on the align partition that owns it) sent as pages are stored, removed, or taken over.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer

from dupalign.match import Span
from dupalign.runtime.engine import Engine, Source
from dupalign.service.config import Config, KafkaConfig
from dupalign.service.loop import Checkpoint
from dupalign.service.topology import (
    RECORD_OVERHEAD,
    Aligned,
    Outgoing,
    TopologyError,
    ordinal_header,
)
from dupalign.stages.align import RankedPage, merge_ranked
from dupalign.stages.messages import AlignRequest, IndexResult
from dupalign.wire.forward_record import encode_forward, forward_key

log = logging.getLogger("dupalign.roles.index")

# (notes in the index's store: "forward_sent", the store's next ordinal at its last commit:
# the forward records of the pages below it are in the forward topic; "align_partitions",
# the align partition count it keys by)
FORWARD_CHUNK = 500  # forward records per transaction when sent again at a takeover


@dataclass
class Waiting:
    """A page indexed (in the store) whose matches are not published yet."""

    ordinal: int
    source: Source  # where the page is in the input topic
    sketch_offset: int
    result: IndexResult
    passages: list[tuple[str, list[Span]]] | None = None  # align's answer, once it came
    parts: dict[int, list[RankedPage]] | None = None  # align shards' answers, by partition
    expected_parts: frozenset[int] = frozenset()  # the align partitions asked
    undecided: bool = False  # index shards: waiting for the partials of its shards
    align_here: bool = False  # align's answer was unreadable: aligned by the index itself

    @property
    def ready(self) -> bool:
        return not self.undecided and (self.result.align is None or self.passages is not None)


def align_parts(topic: str, request: AlignRequest, ordinal: int, n_parts: int, limit: int
                ) -> list[Outgoing] | None:
    """``request`` in parts to ``topic``, one per align partition (of ``n_parts``) that owns
    some of its candidates (their forward records), keyed and headed by ``ordinal``; None:
    a part is too big for one record of ``limit`` bytes (a huge page's passages)."""
    parts = {p: r.to_bytes(forward=False) for p, r in request.split(n_parts).items()}
    if not parts or max(map(len, parts.values())) > limit - RECORD_OVERHEAD:
        return None
    return [Outgoing(topic, raw, key=struct.pack(">q", ordinal), partition=p,
                     headers=[ordinal_header(ordinal)]) for p, raw in parts.items()]


class AlignExchange:
    """The index role's side of the align shards (``IndexRole``): the align requests of its
    pages, their answers, and the forward records that tell each align shard the pages it
    aligns against."""

    config: Config
    kc: KafkaConfig
    engine: Engine | None
    executor: ThreadPoolExecutor
    group_id: str
    align_parts: int
    align_limit: int
    forward_limit: int
    applying: int
    silent_below: int
    tombstones: list[int]

    def _request(self, waiting: Waiting, out: list[Outgoing]) -> None:
        """The align request of a decided page with passage tasks."""
        assert self.engine is not None
        result, ordinal = waiting.result, waiting.ordinal
        if result.align is None:
            return
        parts = align_parts(self.kc.align_topic, result.align, ordinal, self.align_parts,
                            self.align_limit)
        if parts is None:  # too big for one record (a huge page's passages): aligned here
            waiting.passages = self.engine.align(result)
            return
        waiting.parts = {}
        waiting.expected_parts = frozenset(o.partition for o in parts
                                           if o.partition is not None)
        out.extend(parts)

    def _answer(self, waiting: Waiting, answer: Aligned) -> None:
        """An align answer for a page waiting for it: a whole one (an align process from
        before align shards), a part's best pages (the page's passages once every part
        it asked answered: ``merge_ranked``), or "not aligned there": aligned here."""
        if answer.part is None:
            waiting.passages = answer.passages
        elif answer.ranked is None:
            waiting.align_here = True
        elif waiting.parts is not None and answer.part in waiting.expected_parts:
            waiting.parts.setdefault(answer.part, answer.ranked)
            if len(waiting.parts) == len(waiting.expected_parts):
                waiting.passages = merge_ranked(list(waiting.parts.values()),
                                                self.config.engine.passage.max_matches)

    def _forward(self, out: list[Outgoing], ordinal: int, doc_id: str) -> None:
        """The forward record of the page stored at ``ordinal`` (internal ordinal: what
        requests name candidates by), to the align shard that owns it. A page without
        passages has none; one too big for a record is not sent: a request naming it is
        answered "not aligned there" and aligned here."""
        assert self.engine is not None
        record = self.engine.forward_record(ordinal)
        if record is None:
            return
        value = encode_forward(doc_id, *record)
        if len(value) > self.forward_limit - RECORD_OVERHEAD:
            log.warning("page %r: its forward record (%d bytes) is over the forward topic's "
                        "record limit; the pages that name it are aligned by the index",
                        doc_id, len(value))
            return
        out.append(Outgoing(self.kc.forward_topic, value, key=forward_key(ordinal),
                            partition=ordinal % self.align_parts))

    def _removed(self, ordinals: list[int]) -> None:
        """Pages that left the store (``Indexer.on_removed``): their forward records leave
        the align shards (tombstones; not while rebuilding: sent before)."""
        if self.applying >= self.silent_below:
            self.tombstones.extend(ordinals)

    def _note_forward_sent(self, below: int) -> None:
        assert self.engine is not None
        self.engine.put_note("forward_sent", below)

    def _keyed_by(self, parts: int) -> None:
        """The align partition count is fixed per deployment: the forward topic is keyed
        by it."""
        assert self.engine is not None
        keyed_by = self.engine.note("align_partitions")
        if keyed_by is None:
            self.engine.put_note("align_partitions", parts)
        elif keyed_by != parts:
            raise TopologyError(
                f"topic {self.kc.align_topic!r} has {parts} partitions, but this index store "
                f"was built with {keyed_by}: the align shards hold pages by ordinal "
                "modulo that count. Changing it means new align and forward topics and "
                "a rebuild by replay (docs/topology.md)")

    async def _send_forward_again(self, producer: AIOKafkaProducer, consumer: Any) -> None:
        """Takeover: the forward records of the stored pages from the mark on (all of
        them in a store from before align shards), in transactions of ``FORWARD_CHUNK``
        records that commit no offsets. Sending one again is harmless: keyed by ordinal."""
        engine = self.engine
        assert engine is not None
        first = engine.note("forward_sent") or 0
        loop = asyncio.get_running_loop()

        def chunk(start: int) -> tuple[list[Outgoing], int | None]:
            out: list[Outgoing] = []
            for o in engine.stored_ordinals(start):
                if len(out) >= FORWARD_CHUNK:
                    return out, o
                self._forward(out, o, engine.doc_id(o))
            return out, None

        sent, at = 0, first
        while True:
            out, at_next = await loop.run_in_executor(self.executor, chunk, at)
            if out:
                await Checkpoint({}, out).commit(producer, self.group_id,
                                                 None if self.kc.transactions else consumer)
                sent += len(out)
            if at_next is None:
                break
            at = at_next
        await loop.run_in_executor(self.executor, self._note_forward_sent, engine.next_ordinal)
        if sent:
            log.info("index: %d forward records sent again (stored pages from ordinal %d)",
                     sent, first)
