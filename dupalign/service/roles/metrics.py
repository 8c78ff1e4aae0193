"""Prometheus metrics of the roles of ``dupalign stage``, one registry per process shared by
the roles it runs, labelled by role. Served by dupalign/service/http.py like the single
worker's (dupalign/service/metrics.py); deploy/grafana/dashboards/dupalign-stages.json plots
them. Names are prefixed ``dupalign_role_`` (every role) or ``dupalign_stage_`` (a stage
partition's progress).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from dupalign.service.outage import KafkaOutage
from dupalign.service.topology import Outgoing


class RoleMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._outage: KafkaOutage | None = None
        self.kafka_outage = Gauge(
            "dupalign_kafka_outage_seconds", "How long the process has been waiting for "
            "Kafka, unreachable or failing with retriable errors (0: not waiting); it exits "
            "after kafka.max_outage_s", registry=r,
        )
        self.records = Counter(
            "dupalign_role_records", "Records a role consumed (in) or produced in a committed "
            "transaction (out), per topic", ["role", "direction", "topic"], registry=r,
        )
        self.bytes = Counter(
            "dupalign_role_bytes", "Value bytes of those records, per topic",
            ["role", "direction", "topic"], registry=r,
        )
        self.transactions = Counter(
            "dupalign_role_transactions", "Kafka transactions of a role, by outcome (commit, "
            "abort: a failure or a stop inside it; the input is read again)",
            ["role", "outcome"], registry=r,
        )
        self.assigned = Gauge(
            "dupalign_role_assigned_partitions", "Input partitions assigned to the role",
            ["role"], registry=r,
        )
        # per stage partition held here: how far the sequence goes and how far the
        # partition has applied it
        self.stage_sequenced = Gauge(
            "dupalign_stage_ordinal_sequenced", "A stage partition held by this process: the "
            "ordinal after the last page it has read from the sequence (a near partition: "
            "the last its routers have routed)", ["role", "partition"], registry=r,
        )
        self.stage_applied = Gauge(
            "dupalign_stage_ordinal_applied", "A stage partition held by this process: the "
            "next ordinal it applies (sequenced minus applied: the pages it is behind)",
            ["role", "partition"], registry=r,
        )

    def stage_progress(self, role: str, partition: int, sequenced: int, applied: int) -> None:
        self.stage_sequenced.labels(role, str(partition)).set(sequenced)
        self.stage_applied.labels(role, str(partition)).set(applied)

    def stage_released(self, role: str, partition: int) -> None:
        """A partition let go: its series leave with it (its next owner exports them)."""
        for gauge in (self.stage_sequenced, self.stage_applied):
            with contextlib.suppress(KeyError):
                gauge.remove(role, str(partition))

    def outage(self, max_outage_s: float, max_backoff_s: float) -> KafkaOutage:
        """The process's one outage state, shared by its roles: one WARNING and one INFO
        per outage, whichever role meets it."""
        if self._outage is None:
            self._outage = KafkaOutage(max_outage_s, self.kafka_outage, max_backoff_s)
        return self._outage

    def add_role(self, role: str) -> None:
        """Series of the role at 0 from the start: rates and increases over them then have
        data before the first event (an abort may never come)."""
        for outcome in ("commit", "abort"):
            self.transactions.labels(role, outcome)
        self.assigned.labels(role).set(0)

    def consumed(self, role: str, topic: str, records: list[Any]) -> None:
        self.records.labels(role, "in", topic).inc(len(records))
        self.bytes.labels(role, "in", topic).inc(sum(len(r.value or b"") for r in records))

    def produced(self, role: str, outgoing: Iterable[Outgoing]) -> None:
        for o in outgoing:
            self.records.labels(role, "out", o.topic).inc()
            self.bytes.labels(role, "out", o.topic).inc(len(o.value or b""))

    @contextlib.asynccontextmanager
    async def transaction(self, role: str) -> AsyncIterator[None]:
        """Counts how the transaction run inside the block ends."""
        try:
            yield
        except BaseException:
            self.transactions.labels(role, "abort").inc()
            raise
        self.transactions.labels(role, "commit").inc()
