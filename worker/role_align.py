"""The align role: alignment requests in, passages out. Stateless: a request carries the
candidate pages' forward records (``AlignRequest.to_bytes(forward=True)``), so no store is
needed and any number of copies share the ``pages.align`` partitions. Its result is a pure
function of the request, so which copy aligns a page, or how often after a crash, does not
change it; the index takes the first result per ordinal and drops the others.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiokafka import AIOKafkaProducer, TopicPartition

from dupalign.align import Aligner
from dupalign.index import AlignRequest
from worker import messages
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

log = logging.getLogger("dupalign.roles.align")


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
            try:
                ordinal = record_ordinal(rec)
            except ValueError as exc:  # no index waits for it: only dead-lettered
                out.append(self._dead_letter(tp, rec, exc))
                continue
            try:
                passages = self.aligner.align(AlignRequest.from_bytes(rec.value or b""))
            except Exception as exc:  # unreadable (another wire version), or a defect it
                # triggers: recurs on every replay. Dead-lettered, and answered with no
                # passages, so the index publishes the page's other matches and goes on
                log.exception("align request %s:%d:%d failed (sent to DLQ)",
                              tp.topic, tp.partition, rec.offset)
                out.append(self._dead_letter(tp, rec, exc))
                passages = []
            # back to the index shard that asked (one shard: partition 0)
            out.append(Outgoing(self.kc.aligned_topic, encode_aligned(ordinal, passages),
                                partition=0, headers=[ordinal_header(ordinal)]))
        return out

    def _dead_letter(self, tp: TopicPartition, rec: Any, exc: Exception) -> Outgoing:
        dl = messages.dead_letter_to_wire(
            error="internal_error", detail=f"align request: {type(exc).__name__}: {exc}",
            topic=tp.topic, partition=tp.partition, offset=rec.offset,
            raw=rec.value or b"", key=rec.key, failed_at_ms=int(time.time() * 1000),
            doc_id=None, raw_max_bytes=self.config.worker.dlq_raw_max_bytes)
        return Outgoing(self.kc.dlq_topic, messages.pack(dl), messages.dead_letter_key(rec.key))

    async def produce(self, producer: AIOKafkaProducer, prepared: list[Outgoing]) -> None:
        await send_all(producer, prepared)
        self.requests += len(prepared)

    def outgoing(self, prepared: list[Outgoing]) -> list[Outgoing]:
        return prepared
