"""The single worker beside the stage roles in one run of bench_stage_roles, and each setup's
end-to-end latency at half its own rate (issue 43, acceptance: the topology's CPU per page
≤ 1.5× the single worker's, its p50 latency at half load ≤ 2×).

The single worker is ``dupalign worker`` with ``worker.jobs = 1`` over the same
configuration (kafka and engine tables) as the roles, on fresh topics with as many input
partitions, fed the same pages. A page's latency: from its record's timestamp in the input
topic to its first match's in the output topic; pages without matches have none, so both
setups are measured over the same pages (the same matches).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition

from dupalign.page import Page
from dupalign.service.config import KafkaConfig
from dupalign.service.sequence_batch import PAGE_HEADER, SequenceBatch, record_page
from dupalign.service.topology import ORDINAL_HEADER, header, new_producer, record_ordinal
from dupalign.wire import messages
from tests.role_processes import (
    REPO,
    check_alive,
    cpu_seconds,
    read_topic,
    stop_all,
    wait_log,
)

SOURCE_HEADER = "dupalign-source"  # the single worker's matches: "topic:partition:offset"


async def send_paced(kc: KafkaConfig, pages: list[Page], rate: float) -> None:
    """``pages`` to the input topic at ``rate`` pages a second."""
    producer = new_producer(kc)
    await producer.start()
    try:
        start, futures = time.monotonic(), []
        for i, page in enumerate(pages):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            futures.append(await producer.send(kc.input_topic, messages.encode_page(page),
                                               key=page.id.encode()))
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def percentiles(latency_ms: dict[Any, float]) -> tuple[float, float, int]:
    """p50, p99 and count of ``latency_ms``'s values."""
    values = np.array(list(latency_ms.values()), dtype=float)
    if not len(values):
        return float("nan"), float("nan"), 0
    return float(np.percentile(values, 50)), float(np.percentile(values, 99)), len(values)


async def sent_at(kc: KafkaConfig, partitions: int) -> dict[tuple[int, int], int]:
    """(partition, offset) -> timestamp of every input record."""
    return {(r.partition, r.offset): r.timestamp
            for r in await read_topic(kc.bootstrap_servers, kc.input_topic, partitions)}


async def stage_latencies(kc: KafkaConfig, batches: list[Any], matches: list[Any],
                          partitions: int, earlier: set[tuple[int, int]]
                          ) -> dict[tuple[int, int], float]:
    """(partition, offset) of a page not in ``earlier`` -> ms to its first match, from the
    roles' sequence (a match's ordinal header; ordinals count the batches' pages in
    order)."""
    where, _ = page_ordinals(batches)
    sent = await sent_at(kc, partitions)
    first: dict[tuple[int, int], float] = {}
    for r in matches:
        page = where[record_ordinal(r)]
        if page in earlier:
            continue
        first[page] = min(first.get(page, np.inf), r.timestamp - sent[page])
    return first


def page_ordinals(batches: list[Any]) -> tuple[list[tuple[int, int]], dict[tuple[int, int], int]]:
    """The input (partition, offset) of each ordinal, and the ordinal of each page (b, i)."""
    where: list[tuple[int, int]] = []
    ordinal: dict[tuple[int, int], int] = {}
    for r in sorted(batches, key=lambda r: r.offset):
        batch = SequenceBatch.from_bytes(r.value)
        for i, o in enumerate(batch.offsets):
            ordinal[(r.offset, i)] = len(where)
            where.append((batch.partition, o))
    return where, ordinal


async def hop_latencies(kc: KafkaConfig, got: dict[str, list[Any]], partitions: int,
                        earlier: set[tuple[int, int]]) -> dict[str, float]:
    """For each topic between the roles, the p50 over the pages not in ``earlier`` of the
    ms from a page's input record to its first record there (by its page header (b, i) or
    its ordinal header): where the latency accumulates along the chain."""
    where, ordinal = page_ordinals(got["batches"])
    sent = await sent_at(kc, partitions)
    out: dict[str, float] = {}
    for name, records in got.items():
        first: dict[tuple[int, int], float] = {}
        for r in records:
            n = _ordinal(r, ordinal)
            if n is None or n >= len(where) or where[n] in earlier:
                continue
            page = where[n]
            first[page] = min(first.get(page, np.inf), r.timestamp - sent[page])
        if first:
            out[name] = float(np.percentile(list(first.values()), 50))
    return out


def _ordinal(record: Any, ordinal: dict[tuple[int, int], int]) -> int | None:
    if header(record, ORDINAL_HEADER) is not None:
        return record_ordinal(record)
    if header(record, PAGE_HEADER) is not None:
        return ordinal.get(record_page(record))
    return None


async def single_latencies(kc: KafkaConfig, partitions: int, earlier: set[tuple[int, int]]
                           ) -> dict[tuple[int, int], float]:
    """The same for the single worker, from its matches' source header."""
    sent = await sent_at(kc, partitions)
    first: dict[tuple[int, int], float] = {}
    for r in await read_topic(kc.bootstrap_servers, kc.output_topic, partitions):
        source = dict(r.headers)[SOURCE_HEADER].decode()
        _, partition, offset = source.rsplit(":", 2)
        page = (int(partition), int(offset))
        if page in earlier:
            continue
        first[page] = min(first.get(page, np.inf), r.timestamp - sent[page])
    return first


class SingleWorker:
    """``dupalign worker`` (jobs = 1) over a roles setup's config file and topics."""

    def __init__(self, config_path: Path, kc: KafkaConfig, tmp: Path) -> None:
        text = config_path.read_text().replace("[worker]\n", "[worker]\njobs = 1\n")
        config_path.write_text(text)
        self.kc, self.log = kc, tmp / "single.log"
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dupalign.service.cli", "worker", "--config",
                 str(config_path), "--store", str(tmp / "single-store")],
                cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.procs = [(self.proc, self.log)]

    async def started(self) -> None:
        await wait_log(self.log, "partitions assigned", 300)

    async def committed(self, n: int, timeout: float = 1800) -> None:
        """The worker's group committed ``n`` input records (pages or dead letters)."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.kc.bootstrap_servers,
                                    group_id=self.kc.group_id, enable_auto_commit=False)
        await consumer.start()
        deadline = time.monotonic() + timeout
        try:
            tps = [TopicPartition(self.kc.input_topic, p)
                   for p in range(self.kc.topic_partitions)]
            while sum([await consumer.committed(tp) or 0 for tp in tps]) < n:
                check_alive(self.procs)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"single worker did not commit {n} pages")
                await asyncio.sleep(0.05)
        finally:
            await consumer.stop()

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        stop_all(self.procs)
