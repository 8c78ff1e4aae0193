"""The near stage as a role (docs/pipeline.md, "Roles on Kafka"): partition k of P (the
fingerprint prefix k, ``NearShard``) reads ``<in>.near_ops`` partition k, where every router
partition sends its ops for shard k (dupalign/service/roles/stage_router.py), applies them in
ordinal order (``NearShard.apply``) and sends each answer, ``answer_to_bytes(seq, k,
answer)``, to ``<in>.near_answers`` partition = the combine partition of the query page's id
(from the op's ``near_from`` header; header: the ordinal).

The merge: one partition written by R routers, each in its own ordinal order, interleaved
at random. Ordinal n is applied once every router has said it is past n (its ``UPTO``
record: the next ordinal it routes; all it sent for the ordinals below precede that record
in the partition). So the near partition never waits for an op that will not come (a
router passes every ordinal, with or without ops for k) and never skips one. Within n: the
sweep's removals (``SWEEP``), then the page's ops (``PAGE``), each router's in router order,
as ``Partitioned`` applies them. It needs no sequence and no decisions.

Store: the shard's rows and verification sketches, the cursor (the next ordinal, each
router's progress, the merge's place in the partition).
"""

from __future__ import annotations

import struct
from typing import Any

from aiokafka import TopicPartition

from dupalign.config import EngineConfig
from dupalign.service.roles.stage_role import StagePartition, StageRole
from dupalign.service.roles.stage_router import PAGE, SWEEP, UPTO, record_near_from
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import Outgoing, ordinal_header, record_ordinal
from dupalign.stages.near_shard import NearOps, NearShard, answer_to_bytes
from dupalign.stages.router import prefix_bits
from dupalign.store.database import Store

_COMBINE = struct.Struct(">H")  # held before an op's value: its answer's combine partition


class NearPartition(StagePartition):
    def __init__(self, topics: StageTopics, partition: int, store: Store,
                 config: EngineConfig) -> None:
        super().__init__(topics, partition, store)
        shape = topics.shape
        self.shard = NearShard(store, config, partition, prefix_bits(shape.near))
        self.ops = self.merge(topics.near_ops, [partition])
        self.next_seq: int = self.noted.get("next", 0)
        self.upto: list[int] = list(self.noted.get("upto", [0] * shape.router))

    def positions(self) -> dict[TopicPartition, int]:
        return {tp: o for tp, o in super().positions().items()
                if tp.topic != self.topics.batches}  # (the ops carry their ordinals)

    def turn(self, fetched: dict[TopicPartition, list[Any]]) -> list[Outgoing]:
        for tp, recs in fetched.items():
            for r in recs:
                router, kind, combine = record_near_from(r)
                o = record_ordinal(r)
                if kind == UPTO:  # (held as the last key of the ordinal before, then dropped)
                    self.upto[router] = max(self.upto[router], o)
                    o -= 1
                self.ops.add(tp.partition, r.offset, (o, kind, router),
                             _COMBINE.pack(combine) + (r.value or b""))
        return super().turn({})

    def key_of(self, topic: str, record: Any) -> Any:
        raise AssertionError("the near partition adds its records itself")

    def needed(self) -> int:
        return self.next_seq

    def sequenced(self) -> int:
        return max(self.upto, default=0)  # (it reads no sequence: the routers' progress)

    def extra(self) -> dict[str, Any]:
        return {"next": self.next_seq, "upto": self.upto}

    def advance(self) -> list[Outgoing]:
        out: list[Outgoing] = []
        routers = range(self.topics.shape.router)
        while min(self.upto) > (o := self.next_seq):
            for kind in (SWEEP, PAGE):
                for r in routers:
                    held = self.ops.take(self.partition, (o, kind, r))
                    if held is not None:
                        out += self._applied(o, held)
            for r in routers:
                self.ops.take(self.partition, (o, UPTO, r))
            self.next_seq = o + 1
        return out

    def _applied(self, o: int, held: bytes) -> list[Outgoing]:
        (combine,) = _COMBINE.unpack_from(held)
        ops = NearOps.from_bytes(held[_COMBINE.size:])
        if ops.seq != o or ops.shard != self.partition:
            raise ValueError(f"near ops of page {ops.seq} for shard {ops.shard} came as "
                             f"ordinal {o} to near partition {self.partition}")
        answer = self.shard.apply(ops)
        if answer is None:
            return []
        return [Outgoing(self.topics.near_answers, answer_to_bytes(o, ops.shard, answer),
                         partition=combine, headers=[ordinal_header(o)])]


class NearRole(StageRole):
    name = stage = "near"

    def open_partition(self, partition: int, store: Store) -> StagePartition:
        return NearPartition(self.topics_, partition, store, self.config.engine)
