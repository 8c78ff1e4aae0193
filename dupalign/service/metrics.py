"""Prometheus metrics of one worker, in their own registry (several workers can share a
process in tests). Names are prefixed ``dupalign_``; rates such as pages/s come from
``rate(dupalign_pages_total[1m])`` in Prometheus (see deploy/grafana)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dupalign.service.audit_metrics import AuditMetrics

# Sub-millisecond to tens of seconds: engine stages are ~ms, batches and e2e up to seconds.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)
COUNT_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.pages = Counter(
            "dupalign_pages", "Input messages handled, by outcome "
            "(processed, replayed = seen before and answered from the store, deleted = a "
            "tombstone or deleted page, rejected = DLQ)",
            ["outcome"], registry=r,
        )
        self.lifecycle = Counter(
            "dupalign_lifecycle_pages", "Pages that replaced, kept or left the store, by "
            "event (revisit_unchanged, revisit_changed, expired = removed by retention; "
            "deletes are dupalign_pages{outcome=\"deleted\"})", ["event"], registry=r,
        )
        self.matches = Counter(
            "dupalign_matches", "Match messages published, by kind", ["kind"], registry=r
        )
        self.dead_letters = Counter(
            "dupalign_dead_letters", "Messages sent to the dead-letter topic, by reason",
            ["reason"], registry=r,
        )
        self.suppressed = Counter(
            "dupalign_suppressed_outputs",
            "Output messages not republished while rebuilding the store below the committed "
            "offset", registry=r,
        )
        self.stage_seconds = Histogram(
            "dupalign_stage_seconds", "Latency per stage: decode, text, exact, near, passage, "
            "store (per page); engine, publish, commit (per batch)",
            ["stage"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.end_to_end = Histogram(
            "dupalign_end_to_end_seconds",
            "From the input record's timestamp to the commit of its batch",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.batch_records = Histogram(
            "dupalign_batch_records", "Records per micro-batch", buckets=COUNT_BUCKETS,
            registry=r,
        )
        self.psm_probes = Histogram(
            "dupalign_psm_probes_per_page", "PSM/VOSH probes per near-duplicate lookup",
            buckets=COUNT_BUCKETS, registry=r,
        )
        self.near_candidates = Counter(
            "dupalign_near_candidates", "Simhash candidates verified with CWS sketches",
            registry=r,
        )
        self.cws_pairs = Counter(
            "dupalign_cws_pairs", "CWS sketch pairs compared", registry=r
        )
        self.cws_saved = Counter(
            "dupalign_cws_samples_saved",
            "CWS sample comparisons saved by early termination", registry=r,
        )
        self.consumer_lag = Gauge(
            "dupalign_consumer_lag", "Highwater minus position, per assigned input partition",
            ["topic", "partition"], registry=r,
        )
        self.store_bytes = Gauge(
            "dupalign_store_bytes", "Size of the RocksDB store directory", registry=r
        )
        self.store_free_bytes = Gauge(
            "dupalign_store_free_bytes",
            "Bytes available to the worker on the filesystem of the store", registry=r
        )
        self.store_filesystem_bytes = Gauge(
            "dupalign_store_filesystem_bytes", "Size of the filesystem of the store", registry=r
        )
        # the engine's memory by part (Engine.memory_bytes) beside cache.memory_mb's split
        self.memory_bytes = Gauge(
            "dupalign_memory_bytes",
            "Bytes held by each engine cache and the near table, and free in the allocator",
            ["part"], registry=r,
        )
        self.memory_budget_bytes = Gauge(
            "dupalign_memory_budget_bytes", "Configured budget of each cache (0: unbounded)",
            ["part"], registry=r,
        )
        self.assigned_partitions = Gauge(
            "dupalign_assigned_partitions", "Input partitions assigned to this worker",
            registry=r,
        )
        self.paused_partitions = Gauge(
            "dupalign_paused_partitions", "Partitions paused by back-pressure", registry=r
        )
        self.queued_batches = Gauge(
            "dupalign_queued_batches", "Fetched micro-batches waiting for the engine",
            registry=r,
        )
        self.last_commit = Gauge(
            "dupalign_last_commit_timestamp_seconds", "Unix time of the last offset commit",
            registry=r,
        )
        self.rebalances = Counter(
            "dupalign_rebalances", "Partition revocations and assignments", ["event"],
            registry=r,
        )
        self.kafka_outage = Gauge(
            "dupalign_kafka_outage_seconds", "How long the worker has been waiting for Kafka, "
            "unreachable or failing with retriable errors (0: not waiting); it exits after "
            "kafka.max_outage_s",
            registry=r,
        )
        # the recall audit (dupalign.audit): counts of this process, estimates of the store
        self.audit = AuditMetrics(r)

