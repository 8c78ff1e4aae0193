"""The align role: alignment requests in, passages out. Stateless: a request carries the
candidate pages' forward records (``AlignRequest.to_bytes(forward=True)``), so no store is
needed and any number of copies share the ``pages.align`` partitions. Its result is a pure
function of the request, so which copy aligns a page, or how often after a crash, does not
change it; the index takes the first result per ordinal and drops the others.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition

from dupalign.align import Aligner
from dupalign.index import AlignRequest
from worker.config import Config
from worker.role_base import StatelessRole
from worker.role_metrics import RoleMetrics
from worker.topology import (
    Outgoing,
    encode_aligned,
    ordinal_header,
    record_ordinal,
    send_all,
)


class AlignRole(StatelessRole):
    name = "align"

    def __init__(self, config: Config, metrics: RoleMetrics | None = None) -> None:
        super().__init__(config, metrics)
        self.aligner = Aligner(config.engine)
        self.requests = 0

    @property
    def input_topic(self) -> str:
        return self.kc.align_topic

    def prepare(self, tp: TopicPartition, records: list[Any]) -> list[Outgoing]:
        out = []
        for rec in records:
            ordinal = record_ordinal(rec)
            passages = self.aligner.align(AlignRequest.from_bytes(rec.value))
            # back to the index shard that asked (one shard: partition 0)
            out.append(Outgoing(self.kc.aligned_topic, encode_aligned(ordinal, passages),
                                partition=0, headers=[ordinal_header(ordinal)]))
        return out

    async def produce(self, producer: AIOKafkaProducer, prepared: list[Outgoing]) -> None:
        await send_all(producer, prepared)
        self.requests += len(prepared)

    def outgoing(self, prepared: list[Outgoing]) -> list[Outgoing]:
        return prepared
