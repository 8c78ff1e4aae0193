"""The learner as a role (docs/pipeline.md, "Roles on Kafka"; ``stage_launch learner``): one
partition that does ``Partitioned``'s ``Learner`` over the pages added to the near table, in
ordinal order, until the last of ``near.idf_freeze_at``'s counts, and sends each freeze
(``Frozen``: the idf table and the volatility model, in force from the next page on) to
``<in>.idf``, a compacted topic of one partition (key: version ‖ part, in parts over
``kafka.max_request_size``: a table of 10^5 pages is many megabytes).

Why a role of its own, and one: the idf counts and the model are learned from every page in
order (the model pairs each page with the one before it), a serial computation; it needs
the sequence, every decision, every stored page's exact answer and every page's near state
(all R partitions of ``<in>.near_state``), upstream data alone, and nothing downstream of
it waits for it but the routers, at the freeze points only (rule 7). So it never holds a
stage back page by page, and past the last freeze it reads nothing more (its inputs are let
go: ``LearnerRole``). Folded into a router partition, that partition would read every
router's near states during the warm-up and stall its own routing on them.

Its store (restored from its changelog after a crash): the ledger's rows and cursor, the
distinct tokens of each page learned (``learner_pending``, until the last freeze: the idf
counts are rebuilt from them, as ``NearIndex`` does from ``idf_pending``), the tables it
froze (``learner_tables``) and its model (``learner_model``, written after each turn that
learned).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from dupalign.config import EngineConfig
from dupalign.near.idf import IdfTable
from dupalign.near.volatility import VolatilityModel
from dupalign.service.changelog import ensure_changelog
from dupalign.service.config import KafkaConfig
from dupalign.service.parts import part_header, split
from dupalign.service.roles.stage_ledger import LedgerPartition, LedgerSteps
from dupalign.service.roles.stage_role import StagePartition, StageRole
from dupalign.service.sequence_batch import record_page
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import RECORD_OVERHEAD, Outgoing
from dupalign.stages.directory import Decision, directory_owner
from dupalign.stages.exact import ExactAnswer, exact_owner
from dupalign.stages.router import Frozen, Learner
from dupalign.stages.sketch import PageSketch
from dupalign.store import records
from dupalign.store.database import Batch, Store

PENDING, TABLES, MODEL = "learner_pending", "learner_tables", "learner_model"
_KEY = struct.Struct(">QI")  # version, part


def idf_records(topic: str, frozen: Frozen, limit: int) -> list[Outgoing]:
    """``frozen`` as records of ``<in>.idf``, parts keyed apart (a compacted topic keeps
    the last record of a key only)."""
    slices = split(frozen.to_bytes(), limit - RECORD_OVERHEAD)
    n = len(slices)
    return [Outgoing(topic, value, key=_KEY.pack(frozen.version, i), partition=0,
                     headers=[] if n == 1 else [part_header(i, n)])
            for i, value in enumerate(slices)]


def record_version(record: Any) -> int:
    """The version of a ``<in>.idf`` record (its key's first 8 bytes)."""
    return int(_KEY.unpack(record.key)[0])


async def ensure_idf(kc: KafkaConfig, topics: StageTopics) -> None:
    """``<in>.idf``: compacted, one partition (as a changelog: its records never expire)."""
    await ensure_changelog(kc, topics.idf, 1)


def learned(d: Decision, exact: ExactAnswer | None) -> bool:
    """Whether the page of ``d`` is added to the near table, so learned from (the router's
    ``row``)."""
    return (d.kind == "stored" and d.near and exact is not None and exact.original is None)


class LearnerPartition(LedgerPartition):
    def __init__(self, topics: StageTopics, partition: int, store: Store,
                 config: EngineConfig) -> None:
        super().__init__(topics, partition, store)
        shape = topics.shape
        self.limit = topics.kc.max_request_size
        self.ledger = LedgerSteps(self, config, store)
        self.exacts = self.merge(topics.exact, range(shape.exact))
        self.states = self.merge(topics.near_state, range(shape.router))
        raw = records.get_blob(store, MODEL)
        self.learner = Learner.restored(
            config, (IdfTable.from_bytes(t) for _, t in records.log_items(store, TABLES)),
            (np.frombuffer(u, dtype="<u8") for _, u in records.log_items(store, PENDING)),
            None if raw is None else VolatilityModel.from_bytes(raw))
        self.count = sum(1 for _ in records.log_items(store, PENDING))
        self.changed: list[tuple[str, int, bytes]] = []  # (log, index, value) to write
        self.model_changed = self.finished = False

    @property
    def done(self) -> bool:
        """Past the last freeze (or nothing to learn): nothing more to read."""
        return not self.learner.learning

    def key_of(self, topic: str, record: Any) -> Any:
        if topic == self.topics.near_state:
            return record_page(record)
        return self.ledger.key_of(record)

    def positions(self) -> dict[Any, int]:
        return {} if self.done else super().positions()

    def turn(self, fetched: dict[Any, list[Any]]) -> list[Outgoing]:
        if self.done:  # (read before its inputs were let go)
            return []
        return super().turn(fetched)

    def note(self, batch: Batch) -> None:
        self.ledger.note(batch)
        for log, index, value in self.changed:
            records.log_put(batch, log, index, value)
        self.changed = []
        if self.model_changed:
            records.put_blob(batch, MODEL, self.learner.model.to_bytes())
            self.model_changed = False
        if self.finished:  # (the counts are frozen for good: the tokens can go)
            records.log_delete_below(batch, PENDING, self.count)
            self.finished = False

    def advance(self) -> list[Outgoing]:
        out: list[Outgoing] = []
        while not self.done and (ref := self.seq.page(o := self.ledger.next_seq)) is not None:
            if not self.ledger.sweep_before(o, lambda expired: None):  # (nothing to forget)
                break
            d = self.ledger.peek()
            if d is None:
                break
            part = directory_owner(d.doc_id, self.topics.shape.router)
            exact_part = None
            if d.kind == "stored":
                if d.content_hash is None:
                    raise ValueError(f"stored page {o} has no content hash")
                exact_part = exact_owner(d.content_hash, self.topics.shape.exact)
                if self.exacts.peek(exact_part, o) is None:
                    break
            if self.states.peek(part, (ref.batch, ref.index)) is None:
                break
            exact = None
            if exact_part is not None:
                raw = self.exacts.take(exact_part, o)
                assert raw is not None
                exact = ExactAnswer.from_bytes(raw)
            state = self.states.take(part, (ref.batch, ref.index))
            assert state is not None
            self.ledger.next(d)  # (the decision peeked: not decoded again)
            if learned(d, exact):
                out += self._learn(PageSketch.from_bytes(state, passage=False))
        return out

    def _learn(self, sk: PageSketch) -> list[Outgoing]:
        near = sk.near
        if near is None or near.unique is None:
            raise ValueError(f"page {sk.id!r} is near-indexed and has no near sketch")
        frozen = self.learner.learn(near)
        self.changed.append((PENDING, self.count, near.unique.astype("<u8").tobytes()))
        self.count += 1
        self.model_changed = True
        if frozen is None:
            return []
        self.changed.append((TABLES, frozen.version, frozen.table.to_bytes()))
        self.finished = self.done
        return idf_records(self.topics.idf, frozen, self.limit)


class LearnerRole(StageRole):
    """One partition (``StageTopics.partitions``); a second copy stands by."""

    name = stage = "learner"

    async def on_start(self) -> None:
        await super().on_start()
        await ensure_idf(self.kc, self.topics_)

    def open_partition(self, partition: int, store: Store) -> StagePartition:
        return LearnerPartition(self.topics_, partition, store, self.config.engine)

    async def _work(self, batches: dict[Any, list[Any]]) -> None:
        await super()._work(batches)
        for tp, part in self.parts.items():
            if isinstance(part, LearnerPartition) and part.done and self.inputs.get(tp):
                self.inputs[tp] = frozenset()  # (past the last freeze: read nothing more;
                if self.reader is not None:  # a restart reads nothing: ``positions``)
                    self.reader.pause(*self.reader.assignment())

