"""The router of the near stage as a role (docs/pipeline.md, "Roles on Kafka"): partition r of R
(by page id, ``Router.owns``) reads the sequence, every directory partition's decisions
(``<in>.decisions``, placed by its ledger, swept at the same points as every stage), every
exact partition's answers (``<in>.exact``) and its own partition of ``<in>.near_state`` (the
near state of its ids' pages, from the sketch role), and for each ordinal in order does what
``Partitioned`` does for router r: ``Router.route`` for the decision and, at each sweep
point, ``Router.forget``. Each ``NearOps`` goes to ``<in>.near_ops`` partition ``op.shard``
(headers: the ordinal, and ``near_from``: this router, the kind of op, the combine partition
of the query page's id, which the op does not carry and the near role routes its answer by).

What it waits for, and why it never waits forever: the decision of ordinal n (its directory
partition is in the sequence); if the decision stores a page, that page's exact answer, which
exactly one exact partition sends, ``exact_owner(content_hash, E)`` (``ExactShard.apply``
answers every stored page of the hashes it owns and nothing else); if the page's id is
this router's, its near state (the sketch role sends one for every sequenced page). Each
input is looked at (``peek``) before any is taken, so a step is taken whole or not at all.

How the near role knows which ordinals have ops for it: after a turn that routed at least
one ordinal the router sends every near partition an ``UPTO`` record (empty; ordinal
header: the next ordinal it will route): everything it sends for the ordinals below came
before it in that partition. One record per near partition per turn, not per page (an
empty op for every shard and page would cost R x P records per page).

The idf table and the volatility model in force (rule 7): the learner role's freezes, read
from ``<in>.idf`` (compacted; every record from its first offset at every restore: they are
never taken, only looked at) into ``InForce``, which counts the pages learned from the
decisions and exact answers. When that count reaches a freeze, the next step waits for its
record: a wait on the learner, upstream, at the freeze points only. A changed revisit of a
near-indexed page of its ids gets its distance to the replaced version here
(``Router.relate``), sent to the combine partition of its id on ``<in>.revisits`` (header:
the ordinal; value: the distance or nil, msgpack): the sketch role sketches under the
uniform table, and the directory, upstream of the tables, leaves the distance out.

Store: the ledger's rows, the router's rows (``StoredRows``: ordinal -> fingerprint, which
removals and sweeps need) and its exact copies' fingerprints (``router_kept``, for a later
revisit), the count of pages learned, the cursor.
"""

from __future__ import annotations

import functools
import struct
from typing import Any

import msgpack

from dupalign.config import EngineConfig
from dupalign.service.roles.stage_learner import ensure_idf, record_version
from dupalign.service.roles.stage_ledger import LedgerSteps
from dupalign.service.roles.stage_role import StagePartition, StageRole
from dupalign.service.sequence_batch import PageRef, record_page
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import Outgoing, header, ordinal_header, record_ordinal
from dupalign.stages.directory import Decision, directory_owner
from dupalign.stages.exact import ExactAnswer, exact_owner
from dupalign.stages.ledger import Expired
from dupalign.stages.near_shard import NearOps
from dupalign.stages.router import Frozen, InForce, Router
from dupalign.stages.router_store import StoredRows
from dupalign.stages.sketch import PageSketch
from dupalign.store import records
from dupalign.store.database import Store

NEAR_FROM = "dupalign-near-from"  # (router partition, kind, combine partition)
_FROM = struct.Struct(">HBH")
SWEEP, PAGE, UPTO = 0, 1, 2  # a sweep's removals, a page's ops, the router's progress
KEPT, LEARNED = "router_kept", "router_learned"  # (the store's exact copies; count learned)


def near_from(router: int, kind: int, combine: int = 0) -> tuple[str, bytes]:
    return NEAR_FROM, _FROM.pack(router, kind, combine)


def record_near_from(record: Any) -> tuple[int, int, int]:
    """(router partition, kind, combine partition) of a ``<in>.near_ops`` record."""
    raw = header(record, NEAR_FROM)
    if raw is None:
        raise ValueError(f"record {record.topic}:{record.partition}:{record.offset} has no "
                         f"{NEAR_FROM} header")
    router, kind, combine = _FROM.unpack(raw)
    return int(router), int(kind), int(combine)


class RouterPartition(StagePartition):
    def __init__(self, topics: StageTopics, partition: int, store: Store,
                 config: EngineConfig) -> None:
        super().__init__(topics, partition, store)
        shape = topics.shape
        self.rows, self.kept = StoredRows(store), StoredRows(store, KEPT)
        self.in_force = InForce(config, records.get_note(store, LEARNED) or 0)
        self._learned = self.in_force.learned  # (as written)
        self.router = Router(config, self.in_force, shape.near, partition, shape.router,
                             rows=self.rows, kept=self.kept)
        self.ledger = LedgerSteps(self, config, store)
        self.exacts = self.merge(topics.exact, range(shape.exact))
        self.states = self.merge(topics.near_state, [partition])
        self.frozen = self.merge(topics.idf, [0])  # (by version, never taken)

    def key_of(self, topic: str, record: Any) -> Any:
        if topic == self.topics.near_state:
            return record_page(record)
        if topic == self.topics.idf:
            return record_version(record)
        return record_ordinal(record)  # (a decision or an exact answer)

    def needed(self) -> int:
        return self.ledger.next_seq

    def note(self, batch: Any) -> None:
        self.ledger.note(batch)
        self.rows.write(batch)
        self.kept.write(batch)
        if self.in_force.learned != self._learned:
            records.put_note(batch, LEARNED, self.in_force.learned)
            self._learned = self.in_force.learned

    def _ready_tables(self) -> bool:
        """The freeze in force at the next page is at hand (read from ``<in>.idf``)."""
        v = self.in_force.version
        if not self.in_force.ready():
            raw = self.frozen.peek(0, v)
            if raw is None:
                return False
            self.in_force.take(Frozen.from_bytes(raw))
        return True

    def extra(self) -> dict[str, Any]:
        return self.ledger.extra()

    def advance(self) -> list[Outgoing]:
        out: list[Outgoing] = []
        start = self.ledger.next_seq
        while (ref := self.seq.page(o := self.ledger.next_seq)) is not None:
            self.ledger.sweep_before(o, functools.partial(self._forget, out, o))
            d = self._ready(ref)
            if d is None or not self._ready_tables():
                break
            step = self.ledger.next(d)  # (the decision read: not decoded again)
            assert step is not None
            _, placed = step  # (the decision peeked)
            exact = near = None
            if d.kind == "stored":
                raw = self.exacts.take(self._exact_partition(d), o)
                assert raw is not None
                exact = ExactAnswer.from_bytes(raw)
            if self.router.owns(d.doc_id):
                raw = self.states.take(self.partition, (ref.batch, ref.index))
                assert raw is not None
                near = PageSketch.from_bytes(raw, passage=False).near
            combine = directory_owner(d.doc_id, self.topics.shape.combine)  # (CombineShard.owns)
            if near is not None and Router.relates(d):
                hamming = self.router.relate(d, placed, near)
                out.append(Outgoing(self.topics.revisits, msgpack.packb(hamming),
                                    partition=combine, headers=[ordinal_header(o)]))
            out += self._sent(self.router.route(d, placed, exact, near), PAGE, combine)
        if self.ledger.next_seq > start:
            upto = self.ledger.next_seq
            out += [Outgoing(self.topics.near_ops, b"", partition=k,
                             headers=[ordinal_header(upto), near_from(self.partition, UPTO)])
                    for k in range(self.topics.shape.near)]
        return out

    def _forget(self, out: list[Outgoing], o: int, expired: list[Expired]) -> None:
        """The sweep before page ``o`` (the ledger is at o): its removals."""
        out += self._sent(self.router.forget(o, expired), SWEEP, 0)

    def _ready(self, ref: PageRef) -> Decision | None:
        """The decision of ``ref`` if it and every input its step takes are read (None:
        not yet), none of them taken."""
        o = ref.ordinal
        raw = self.ledger.decisions.peek(ref.dir, o)
        if raw is None:
            return None
        d = Decision.from_bytes(raw, self.ledger.engine)
        if d.kind == "stored" and self.exacts.peek(self._exact_partition(d), o) is None:
            return None
        if (self.router.owns(d.doc_id)
                and self.states.peek(self.partition, (ref.batch, ref.index)) is None):
            return None
        return d

    def _exact_partition(self, d: Decision) -> int:
        if d.content_hash is None:
            raise ValueError(f"stored page {d.seq} has no content hash")
        return exact_owner(d.content_hash, self.topics.shape.exact)

    def _sent(self, ops: list[NearOps], kind: int, combine: int) -> list[Outgoing]:
        return [Outgoing(self.topics.near_ops, op.to_bytes(), partition=op.shard,
                         headers=[ordinal_header(op.seq), near_from(self.partition, kind,
                                                                   combine)])
                for op in ops]


class RouterRole(StageRole):
    name = stage = "router"

    async def on_start(self) -> None:
        await super().on_start()
        await ensure_idf(self.kc, self.topics_)

    def open_partition(self, partition: int, store: Store) -> StagePartition:
        return RouterPartition(self.topics_, partition, store, self.config.engine)
