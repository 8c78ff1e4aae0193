"""The exact stage as a role (docs/pipeline.md, "Roles on Kafka"): partition e of E reads
every directory partition's decisions from ``<in>.decisions`` in ordinal order (merged by
the sequence), places them with its ledger, sweeps at the same points as every stage, and
answers each stored page of a content hash it owns (``ExactShard``) on ``<in>.exact``
partition e (header: the ordinal). Store: the shard's tables, the ledger's rows, the
cursor."""

from __future__ import annotations

from dupalign.config import EngineConfig
from dupalign.service.roles.stage_ledger import LedgerPartition, LedgerSteps
from dupalign.service.roles.stage_role import StagePartition, StageRole
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import Outgoing, ordinal_header
from dupalign.stages.exact import ExactShard
from dupalign.store.database import Store


class ExactPartition(LedgerPartition):
    def __init__(self, topics: StageTopics, partition: int, store: Store,
                 config: EngineConfig) -> None:
        super().__init__(topics, partition, store)
        self.shard = ExactShard(store, partition, topics.shape.exact)
        self.ledger = LedgerSteps(self, config, store)

    def advance(self) -> list[Outgoing]:
        out: list[Outgoing] = []
        while self.seq.page(o := self.ledger.next_seq) is not None:
            self.ledger.sweep_before(o, self.shard.forget)  # (the ledger is at o)
            step = self.ledger.next()
            if step is None:
                break
            d, placed = step
            answer = self.shard.apply(d, placed)
            if answer is not None:
                out.append(Outgoing(self.topics.exact, answer.to_bytes(),
                                    partition=self.partition, headers=[ordinal_header(o)]))
        return out


class ExactRole(StageRole):
    name = stage = "exact"

    def open_partition(self, partition: int, store: Store) -> StagePartition:
        return ExactPartition(self.topics_, partition, store, self.config.engine)
