"""The align stage as a role (docs/pipeline.md, "Roles on Kafka"): partition a of A owns the
pages whose id has ``directory_owner(id, A)`` = a, keeps their forward records by store
ordinal (a ``ForwardStage``, as ``Partitioned``'s) and answers the combine's align requests
against them in the state ``Partitioned`` aligns page n in: after the ordinals up to n were
applied, before n + 1 is.

Inputs in ordinal order (the sequence says which ordinal comes next): every decision (every
directory partition's, placed by its ledger, swept at the same points as every stage), the
exact answer of every stored page (``<in>.exact`` partition ``exact_owner(hash, E)``), and
the forward record (``forward_value``) of each page of its ids with passages, which the
sketch role sends to ``<in>.passages`` partition a (keyed by (b, i); the sequence's windows
bit says which pages have one). None is taken before all are in.

Requests (``<in>.align_requests`` partition a, written by the C combine partitions): the part
of page n's ``AlignRequest`` against the candidates whose ids a owns (``request_parts``:
split by ``directory_owner(candidate id, A)``; headers the ordinal and the reply,
``<in>.aligned``:c), in parts over ``kafka.max_request_size``. After each turn that stepped,
a combine partition sends every align partition an empty ``UPTO`` record (headers: the next
ordinal it steps, ``FROM``: its partition): every request it sent for the ordinals below
came before it. Page n can have a request only from the combine partition of its id, and
only if it is a stored page, not an exact copy, with passages (the combine's rule for align
tasks). So once n is applied, such a page is answered when that combine is past n (an
``align_ranked`` answer, ``encode_aligned_part``, to where the request's reply says; no
record: nothing asked here), and only then is n + 1 applied: a removal at a later ordinal
(a new version, a delete, a sweep) never overtakes a request naming the page it removes. A
wait on upstream only: a combine never waits for align to step (its pages wait in its
store).

Store: the ``ForwardStage``'s records (of its own ids only: the removal of a page another
partition holds writes nothing), the ledger's rows, the cursor (with each combine's
progress and the offset of the record that said it, and the page applied whose answer is
still to come). After a restart the requests partition is read again from its low-water
mark: a combine's progress noted counts again only once the reader has passed the record
it came from, so a request read again (in parts: perhaps not whole yet) is never passed.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np
from aiokafka import TopicPartition

from dupalign.config import EngineConfig
from dupalign.service.changelog import LeaveOut
from dupalign.service.parts import in_parts
from dupalign.service.roles.stage_ledger import LedgerPartition, LedgerSteps
from dupalign.service.roles.stage_lists import exact_partition, has_windows
from dupalign.service.roles.stage_role import StagePartition, StageRole
from dupalign.service.sequence_batch import record_page
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import (
    Outgoing,
    encode_aligned_part,
    header,
    ordinal_header,
    record_ordinal,
    record_reply,
    reply_header,
)
from dupalign.stages.align import Aligner
from dupalign.stages.directory import directory_owner
from dupalign.stages.exact import ExactAnswer
from dupalign.stages.forward_stage import DERIVED, ForwardStage
from dupalign.stages.ledger import Expired, Placed
from dupalign.stages.messages import AlignRequest
from dupalign.store import tables
from dupalign.store.database import Store
from dupalign.store.forward_reader import StoreForward
from dupalign.wire.forward_record import decode_forward

log = logging.getLogger("dupalign.roles.stage")
FROM = "dupalign-align-from"  # an UPTO record's combine partition
_FROM = struct.Struct(">H")


def request_parts(topics: StageTopics, request: AlignRequest, seq: int, combine: int,
                  ids: Mapping[int, str], limit: int) -> list[Outgoing]:
    """Page ``seq``'s request from combine partition ``combine``, one part per align
    partition owning some of its candidates (``ids``: store ordinal -> id of the pages
    alive), each in records of at most ``limit`` bytes."""
    others, at = np.unique(request.tasks.t_o, return_inverse=True)
    owner = np.array([directory_owner(ids[o], topics.shape.align) for o in others.tolist()],
                     dtype=np.int64)[at]
    out: list[Outgoing] = []
    for a, part in request.split_by(owner).items():
        out += in_parts(Outgoing(topics.align_requests, part.to_bytes(forward=False),
                                 key=struct.pack(">q", seq), partition=a,
                                 headers=[ordinal_header(seq),
                                          reply_header(topics.aligned, combine)]), limit)
    return out


def upto_records(topics: StageTopics, combine: int, upto: int) -> list[Outgoing]:
    """Combine partition ``combine`` is past every ordinal below ``upto``: one record to
    each align partition."""
    return [Outgoing(topics.align_requests, b"", partition=a,
                     headers=[ordinal_header(upto), (FROM, _FROM.pack(combine))])
            for a in range(topics.shape.align)]


def record_upto(record: Any) -> int | None:
    """The combine partition of an ``UPTO`` record (None: a request)."""
    raw = header(record, FROM)
    return None if raw is None else int(_FROM.unpack(raw)[0])


class AlignPartition(LedgerPartition):
    def __init__(self, topics: StageTopics, partition: int, store: Store,
                 config: EngineConfig) -> None:
        super().__init__(topics, partition, store)
        shape = topics.shape
        self.forward = ForwardStage(store, config)
        self.aligner = Aligner(config, StoreForward(store))
        self.ledger = LedgerSteps(self, config, store)
        self.exacts = self.merge(topics.exact, range(shape.exact))
        self.passages = self.merge(topics.passages, [partition])
        self.requests = self.merge(topics.align_requests, [partition])
        self.upto: list[int] = list(self.noted.get("upto", [0] * shape.combine))
        # the offset of the record each combine's progress was read from: after a restart
        # it counts once the reader is past it again (the requests below it read again)
        self.upto_at: list[int] = list(self.noted.get("upto_at", [-1] * shape.combine))
        # the ordinal applied last if a request may come for it, and the combine
        # partition that would send it (None: nothing to wait for)
        asking = self.noted.get("asking")
        self.asking: tuple[int, int] | None = None if asking is None else (asking[0],
                                                                           asking[1])

    def leave_out(self) -> LeaveOut | None:
        """The forward records: the stage rebuilds them from the positions and units when
        it opens a restored store (``ForwardStage``)."""
        return DERIVED

    def key_of(self, topic: str, record: Any) -> Any:
        t = self.topics
        if topic == t.passages:
            return record_page(record)
        if topic == t.align_requests:
            reply = record_reply(record)
            if reply is None or reply[0] != t.aligned:
                raise ValueError(f"align request {record.topic}:{record.partition}:"
                                 f"{record.offset} does not ask for an answer on {t.aligned}")
            return record_ordinal(record), reply[1]
        return self.ledger.key_of(record)  # (decisions, exact answers: by ordinal)

    def turn(self, fetched: dict[TopicPartition, list[Any]]) -> list[Outgoing]:
        """The requests in their order, the combines' ``UPTO`` records among them noted
        (not held: the merge only moves past them); the rest as every stage's."""
        t = self.topics.align_requests
        for tp, recs in fetched.items():
            if tp.topic != t:
                continue
            for r in recs:
                c = record_upto(r)
                if c is None:
                    self._add(t, r)
                    continue
                if record_ordinal(r) > self.upto[c]:
                    self.upto[c], self.upto_at[c] = record_ordinal(r), r.offset
                nxt = self.requests.next
                nxt[r.partition] = max(nxt[r.partition], r.offset + 1)
        return super().turn({tp: recs for tp, recs in fetched.items() if tp.topic != t})

    def extra(self) -> dict[str, Any]:
        return {**self.ledger.extra(), "upto": self.upto, "upto_at": self.upto_at,
                "asking": None if self.asking is None else list(self.asking)}

    def advance(self) -> list[Outgoing]:
        out: list[Outgoing] = []
        while True:
            if self.asking is not None:
                o, c = self.asking
                if self.upto[c] <= o or self.requests.next[self.partition] <= self.upto_at[c]:
                    break  # (its combine may still ask, or its request is not read again yet)
                out += self._answer(o, c)
                self.asking = None
            elif not self._apply_next():
                break
        return out

    def _apply_next(self) -> bool:
        """The next ordinal applied if all its records are in (False: not yet)."""
        o = self.ledger.next_seq
        ref = self.seq.page(o)
        if ref is None or not self.ledger.sweep_before(o, self._forget):
            return False
        d = self.ledger.peek()
        if d is None:
            return False
        e = exact_partition(d, self.topics.shape.exact)
        mine = (has_windows(ref)
                and directory_owner(d.doc_id, self.topics.shape.align) == self.partition)
        page = (ref.batch, ref.index)
        if ((e is not None and self.exacts.peek(e, o) is None)
                or (mine and self.passages.peek(self.partition, page) is None)):
            return False  # (nothing taken: the next turn starts at o again)
        step = self.ledger.next(d)  # (the decision peeked: not decoded again)
        assert step is not None
        d, placed = step
        exact = record = None
        if e is not None:
            raw = self.exacts.take(e, o)
            assert raw is not None
            exact = ExactAnswer.from_bytes(raw)
        if mine:
            raw = self.passages.take(self.partition, page)
            assert raw is not None
            record = decode_forward(raw)
        self.forward.apply(d, self._here(placed), exact, record)
        if (d.kind == "stored" and exact is not None and exact.original is None
                and has_windows(ref)):  # (the combine's rule for align tasks)
            self.asking = (o, directory_owner(d.doc_id, self.topics.shape.combine))
        return True

    def _answer(self, o: int, c: int) -> list[Outgoing]:
        """The part of page ``o``'s request asked here, answered (none asked: nothing)."""
        raw = self.requests.take(self.partition, (o, c))
        if raw is None:
            return []
        try:
            ranked = self.aligner.align_ranked(AlignRequest.from_bytes(raw))
        except Exception:  # a defect it triggers recurs on every replay: answered "not
            # aligned here" (the combine publishes the other parts' passages)
            log.exception("align partition %d: the request of page %d failed", self.partition,
                          o)
            ranked = None
        return [Outgoing(self.topics.aligned, encode_aligned_part(o, self.partition, ranked),
                         partition=c, headers=[ordinal_header(o)])]

    def _held(self, ordinals: list[int]) -> list[int]:
        """The pages among ``ordinals`` whose records are here."""
        return [o for o in ordinals if tables.docs.get(self.store, o) is not None]

    def _here(self, placed: Placed) -> Placed:
        if placed.removed is None or self._held([placed.removed]):
            return placed
        return dataclasses.replace(placed, removed=None)

    def _forget(self, expired: list[Expired]) -> None:
        here = set(self._held([e.ordinal for e in expired]))
        self.forward.forget(e for e in expired if e.ordinal in here)


class AlignStageRole(StageRole):
    name, stage = "stage-align", "align"

    def open_partition(self, partition: int, store: Store) -> StagePartition:
        return AlignPartition(self.topics_, partition, store, self.config.engine)
