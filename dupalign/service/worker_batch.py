"""The single worker's engine side: what one partition's micro-batch becomes in the engine
thread (decoded pages, the engine's matches, dead letters), cut where a record removes a
page stored earlier in the batch. The worker (dupalign/service/worker.py) publishes and
commits each part (dupalign/service/loop.py ``Checkpoint``) before the next one runs.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from dupalign.errors import PageRejected, StoreError
from dupalign.match import Match
from dupalign.page import Page
from dupalign.runtime.engine import Engine, PageReport
from dupalign.runtime.pipeline import default_jobs
from dupalign.service.config import KafkaConfig, WorkerConfig
from dupalign.service.metrics import WorkerMetrics
from dupalign.service.topology import Outgoing
from dupalign.wire import messages
from dupalign.wire.messages import MessageRejected

log = logging.getLogger("dupalign.worker")

SOURCE_HEADER = "dupalign-source"
ENGINE_STAGES = ("text", "exact", "near", "passage", "store")


# per input offset: (page, its matches or the exception it raised, its report), or why the
# record never became a page
EngineOut = dict[int, "tuple[Page, list[Match] | BaseException, PageReport] | MessageRejected"]


@dataclass
class BatchResult:
    """What the engine thread made of one partition's micro-batch."""

    tp: TopicPartition
    next_offset: int
    outgoing: list[Outgoing] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    matches: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    suppressed: int = 0
    timestamps_ms: list[int] = field(default_factory=list)


class FatalError(RuntimeError):
    """Stop the worker without committing more (e.g. the store cannot be written)."""


# Failures of the machine, never of one page: they stop the worker (docs/delivery.md).
SYSTEM_FAILURES = (StoreError, OSError, MemoryError, FatalError)




class BatchProcessing:
    """The engine-thread half of ``Worker``: only that thread calls these."""

    engine: Engine | None
    metrics: WorkerMetrics
    wc: WorkerConfig
    kc: KafkaConfig
    store_dir: Path
    unsettled: dict[TopicPartition, int]
    _last_sweep: float

    def _process_batch(self, tp: TopicPartition, records: list[Any],
                       decoded: list[Page | MessageRejected] | None, suppress_below: int
                       ) -> tuple[BatchResult, list[Any], list[Page | MessageRejected]]:
        """Runs in the engine thread: the batch's first part (``removal_cut``), and the
        records left for the next part with their pages (``decoded``: those of
        ``records``, None if not decoded yet)."""
        engine = self.engine
        if engine is None:
            raise FatalError("engine closed")
        # (here every earlier part is committed: a sweep removes no page whose matches a
        # replay would have to answer from the store)
        self._retention(engine)
        # the pages sampled by the recall audit in earlier parts, now that their output is
        # committed: off their path (engine.audit)
        if engine.audit is not None:
            self.metrics.audit.audited(engine.run_audits(), engine.audit_tally().estimates())
        m = self.metrics
        if decoded is None:
            decoded = self._decode(tp, records)
        n = removal_cut(decoded)
        records, rest = records[:n], records[n:]
        result = BatchResult(tp, next_offset=records[-1].offset + 1)
        m.batch_records.observe(len(records))
        engine_out = self._run_engine(engine, tp, records, decoded[:n])
        for rec in records:
            out = self._process_record(engine, tp, rec, result, engine_out)
            if rec.offset < suppress_below:
                result.suppressed += len(out)
                continue
            result.outgoing.extend(out)
            result.timestamps_ms.append(rec.timestamp)
        return result, rest, decoded[n:]

    def _retention(self, engine: Engine) -> None:
        """The retention sweep (``[engine.retention]``), at most every ``every`` seconds, in
        the engine thread before a part, when every page stored earlier is committed (not
        while a partition's store is ahead of its commit, ``unsettled``: those pages are
        answered from the store when read again)."""
        r = engine.config.retention
        now = time.monotonic()
        if not (r.max_pages or r.max_age) or now - self._last_sweep < r.every or self.unsettled:
            return
        self._last_sweep = now
        removed = engine.compact()
        self.metrics.lifecycle.labels("expired").inc(removed)
        if removed:
            log.info("retention: %d pages left the store", removed)

    def _decode(self, tp: TopicPartition, records: list[Any]) -> list[Page | MessageRejected]:
        """Each record's page, or the MessageRejected of a record that is not one."""
        out: list[Page | MessageRejected] = []
        for rec in records:
            value: bytes = rec.value if rec.value is not None else b""
            if len(value) > self.wc.max_message_bytes:
                out.append(MessageRejected(
                    "too_large", f"{len(value)} bytes > worker.max_message_bytes "
                    f"({self.wc.max_message_bytes})"))
                continue
            t0 = time.perf_counter()
            try:  # a null value is a tombstone: a delete, handled in order like a page
                out.append(messages.decode_record(rec.key, rec.value))
            except MessageRejected as exc:
                out.append(exc)
                continue
            self.metrics.stage_seconds.labels("decode").observe(time.perf_counter() - t0)
        return out

    def _run_engine(self, engine: Engine, tp: TopicPartition, records: list[Any],
                    decoded: list[Page | MessageRejected]) -> EngineOut:
        """The part's pages run through the engine, sketch and align on ``worker.jobs``
        processes: per offset, the page with its matches or exception and its report, or
        the MessageRejected of a record that never became a page."""
        out: EngineOut = {}
        items = []
        for rec, page in zip(records, decoded, strict=True):
            if isinstance(page, MessageRejected):
                out[rec.offset] = page
            else:
                items.append((page, (tp.topic, tp.partition, rec.offset)))
        jobs = self.wc.jobs or default_jobs()
        for (page, found), (_, source) in zip(engine.process_many(items, jobs=jobs), items,
                                              strict=True):
            out[source[2]] = (page, found, engine.last_report)
        return out

    def _process_record(self, engine: Engine, tp: TopicPartition, rec: Any,
                        result: BatchResult,
                        engine_out: EngineOut) -> list[Outgoing]:
        m = self.metrics
        source = (tp.topic, tp.partition, rec.offset)
        value: bytes = rec.value if rec.value is not None else b""
        doc_id: str | None = None
        try:
            outcome = engine_out[rec.offset]
            if isinstance(outcome, MessageRejected):
                raise outcome
            page, found_or_error, report = outcome
            doc_id = page.id
            try:
                if isinstance(found_or_error, BaseException):
                    raise found_or_error
                found = found_or_error
            except PageRejected as exc:
                raise MessageRejected(exc.reason, exc.detail, doc_id) from None
            except SYSTEM_FAILURES:
                raise
            except Exception as exc:
                if self.wc.on_engine_error == "fail":
                    raise FatalError(f"engine failed on {source}: {exc!r}") from exc
                log.exception("engine error on %s (sent to DLQ)", source)
                raise MessageRejected("internal_error", f"{type(exc).__name__}: {exc}",
                                      doc_id) from None
        except MessageRejected as exc:
            result.outcomes["rejected"] += 1
            result.dead_letters[exc.reason] += 1
            dl = messages.dead_letter_to_wire(
                error=exc.reason, detail=exc.detail, topic=tp.topic, partition=tp.partition,
                offset=rec.offset, raw=value, key=rec.key, failed_at_ms=now_ms(),
                doc_id=exc.doc_id or doc_id, raw_max_bytes=self.wc.dlq_raw_max_bytes,
            )
            return [Outgoing(self.kc.dlq_topic, messages.pack(dl),
                             key=messages.dead_letter_key(rec.key), headers=_headers(source))]
        if page.deleted:
            result.outcomes["deleted"] += 1
        elif report.replayed:
            result.outcomes["replayed"] += 1  # answered from the store
        else:
            result.outcomes["processed"] += 1
            for stage in ENGINE_STAGES:
                m.stage_seconds.labels(stage).observe(getattr(report, stage))
            m.psm_probes.observe(report.psm_probes)
            m.near_candidates.inc(report.near_candidates)
            m.cws_pairs.inc(report.cws_pairs)
            m.cws_saved.inc(report.cws_samples_saved)
        now = now_ms()
        key = page.id.encode("utf-8")
        out = []
        for match in found:
            result.matches[match.kind] += 1
            if match.revisit is not None:
                m.lifecycle.labels(f"revisit_{match.revisit}").inc()
            out.append(Outgoing(self.kc.output_topic, messages.encode_match(match, now),
                                key=key, headers=_headers(source)))
        return out


def removal_cut(decoded: list[Page | MessageRejected]) -> int:
    """How many records of a batch go in its first part: up to the first record that
    would remove a page stored earlier in the part (a tombstone of its id, or its id with
    another body: a new version). That page's matches are published and committed first:
    a replay of an uncommitted part after a crash answers its pages from the store by
    their replay keys, which a removal deletes (read again, the page would be indexed as
    new and matched with the pages after it)."""
    bodies: dict[str, bytes | str] = {}
    for n, page in enumerate(decoded):
        if isinstance(page, MessageRejected):
            continue
        if page.id in bodies and (page.deleted or bodies[page.id] != page.body):
            return n
        if not page.deleted:
            bodies[page.id] = page.body
    return len(decoded)


def _headers(source: tuple[str, int, int]) -> list[tuple[str, bytes]]:
    return [(SOURCE_HEADER, f"{source[0]}:{source[1]}:{source[2]}".encode())]


def now_ms() -> int:
    return int(time.time() * 1000)
