"""A topology on a real broker for tests and benchmarks: fresh topics, a config file, role
processes (``dupalign worker --roles ...``), readers of its topics, and the ``scan`` oracle
over the pages in ``sequence`` order; and a synthetic crawl-like stream of pages."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.admin import DeleteGroupsRequest

from dupalign.config import EngineConfig
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.service.config import load_config
from dupalign.service.produce import send_pages
from dupalign.service.topics import topology_topics
from dupalign.service.topology import (
    decode_sequence,
    ensure_topics,
    new_producer,
    page_record_limit,
)
from dupalign.wire import messages
from tests.corpora import RFC, rfc_numbers, words
from tests.service.test_worker_kafka import match_key

REPO = Path(__file__).resolve().parent.parent
BIG = 32 << 20  # a large RFC's align request carries MBs of candidates' forward records


class Topology:
    """Fresh topics and a config file for one test; role processes started from it."""

    def __init__(self, bootstrap: str, tmp: Path, batch_size: int = 4,
                 engine: EngineConfig | None = None, engine_toml: str = "",
                 transactions: bool = True, index_shards: int = 1,
                 partials_kept: int = 4096, compression: str = "none",
                 retained_compression: str = "zstd", default_limits: bool = False) -> None:
        """``engine_toml``: ``[engine...]`` tables for the roles, the same settings as
        ``engine`` (the oracle's configuration); ``transactions``: ``kafka.transactions``;
        ``index_shards``: ``kafka.index_shards`` (> 1: shard processes, ``--roles shard``);
        ``partials_kept``: ``kafka.shard_partials_kept``; ``compression``:
        ``kafka.compression_type``; ``retained_compression``: the retained topics';
        ``default_limits``: the record and fetch sizes a user gets (else large ones, for
        requests that carry their candidates' forward records)."""
        tag = uuid.uuid4().hex[:8]
        self.bootstrap, self.tmp, self.tag = bootstrap, tmp, tag
        self.group = f"g-{tag}"
        names = ("pages", "matches", "dlq", "sequence", "sketches", "align", "aligned",
                 "forward", "keys", "partials")
        self.topic = {n: f"{n}-{tag}" for n in names}
        t = self.topic
        self.config_path = tmp / f"topology-{tag}.toml"
        self.config_path.write_text(f"""
[kafka]
bootstrap_servers = "{bootstrap}"
input_topic = "{t['pages']}"
output_topic = "{t['matches']}"
dlq_topic = "{t['dlq']}"
sequence_topic = "{t['sequence']}"
sketch_topic = "{t['sketches']}"
align_topic = "{t['align']}"
aligned_topic = "{t['aligned']}"
forward_topic = "{t['forward']}"
keys_topic = "{t['keys']}"
partials_topic = "{t['partials']}"
index_shards = {index_shards}
shard_partials_kept = {partials_kept}
group_id = "{self.group}"
create_topics = true
transactions = {str(transactions).lower()}
compression_type = "{compression}"
retained_compression = "{retained_compression}"
topic_partitions = 2
align_partitions = 4
session_timeout_ms = 6000
heartbeat_interval_ms = 500
transaction_timeout_ms = 15000
{'' if default_limits else f'''max_request_size = {BIG}
max_partition_fetch_bytes = {BIG}
fetch_max_bytes = {2 * BIG}'''}
[worker]
batch_size = {batch_size}
log_format = "text"
[metrics]
enabled = false
{engine_toml}""", "utf-8")
        self.engine = engine if engine is not None else EngineConfig()
        self.config = load_config(self.config_path, env={})
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.partitions: dict[str, int] = {}
        # the oracle's matches and pages scanned, per store
        self.scanned: dict[Path, tuple[collections.Counter[Any], int]] = {}

    async def create(self) -> Topology:
        self.partitions = await ensure_topics(self.config.kafka,
                                              topology_topics(self.config.kafka),
                                              self.config.worker.max_message_bytes)
        return self

    def start(self, role: str, store: Path | None = None, metrics_port: int | None = None,
              env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
        """A role process; with ``metrics_port``, serving /metrics, /healthz and /readyz;
        ``env``: more of its environment (``DUPALIGN_KAFKA_*``: another listener, a user)."""
        log = self.tmp / f"{role}-{len(self.procs)}.log"
        cmd = [sys.executable, "-m", "dupalign.service.cli", "worker", "--roles", role,
               "--config", str(self.config_path)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        if store is not None:
            cmd += ["--store", str(store)]
        if metrics_port is not None:
            cmd += ["--metrics-port", str(metrics_port)]
            env["DUPALIGN_METRICS_ENABLED"] = "true"
        with open(log, "ab") as fh:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
        self.procs.append((proc, log))
        return proc, log

    def check_alive(self) -> None:
        check_alive(self.procs)

    def log_lines(self, text: str) -> list[str]:
        """Every line of every role process's log that contains ``text``."""
        return [line for _, log in self.procs for line in log.read_text().splitlines()
                if text in line]

    def logs(self) -> str:
        return "\n".join(f"== {log.name}\n{log.read_text()[-3000:]}" for _, log in self.procs)

    def stop_all(self) -> None:
        stop_all(self.procs)

    async def send(self, pages: list[Page]) -> None:
        kc = self.config.kafka
        producer = new_producer(kc, max_request_size=page_record_limit(
            kc, self.config.worker.max_message_bytes))
        await producer.start()
        try:
            await send_pages(producer, self.topic["pages"], pages)
        finally:
            await producer.stop()

    async def send_records(self, records: list[tuple[bytes, bytes | None]]) -> None:
        """Raw (key, value) records on the pages topic: a None value is a tombstone."""
        producer = new_producer(self.config.kafka)
        await producer.start()
        try:
            sent = [await producer.send(self.topic["pages"], value, key=key)
                    for key, value in records]
            await asyncio.gather(*sent)
        finally:
            await producer.stop()

    async def read(self, name: str) -> list[Any]:
        """Every committed record of a topic, up to its last stable offset when called."""
        topic = self.topic[name]
        return await read_topic(self.bootstrap, topic, self.partitions[topic])

    async def index_committed(self) -> int:
        """The index group's committed sequence offset: every page before it is published."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap,
                                    group_id=f"{self.group}-index", enable_auto_commit=False)
        await consumer.start()
        try:
            return await consumer.committed(TopicPartition(self.topic["sequence"], 0)) or 0
        finally:
            await consumer.stop()

    async def delete_group(self, role: str) -> None:
        """Delete a role's consumer group (it must have no member): its committed offsets
        are gone, as when they expire after the broker's offsets.retention.minutes.
        (aiokafka's admin client has no call for it: its DeleteGroups request is sent to
        the group's coordinator.)"""
        group = f"{self.group}-{role}"
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            node = await admin.find_coordinator(group)
            response = await admin._send_request_to_node(node, DeleteGroupsRequest([group]))
            assert [tuple(r) for r in response.results] == [(group, 0)], response
        finally:
            await admin.close()

    async def published(self, n_pages: int, timeout: float) -> list[Any]:
        """Wait until ``n_pages`` are sequenced and all their matches published; the matches."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            sequence = await self.read("sequence")
            if len(sequence) >= n_pages and await self.index_committed() > sequence[-1].offset:
                assert len(sequence) == n_pages, "a page was sequenced twice"
                return await self.read("matches")
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(sequence)}/{n_pages} pages sequenced, index at "
                                     f"{await self.index_committed()}\n{self.logs()}")
            await asyncio.sleep(1)

    async def scan_in_sequence_order(self, store: Path,
                                     key: Callable[[dict[str, Any]], Any] = match_key
                                     ) -> collections.Counter[Any]:
        """The oracle: one engine (its store at ``store``) over the pages in the sequence
        topic's order (tombstones: deletes), with the retention sweeps of
        ``self.engine.retention`` before the first page at or after each multiple of
        ``every`` ordinals, at the time of that page's sequence record; called again, it
        goes on with the pages sequenced since, and returns the matches of all the pages
        so far (by ``key``)."""
        pages = {(r.partition, r.offset): messages.decode_record(r.key, r.value)
                 for r in await self.read("pages")}
        sequence = await self.read("sequence")
        done, n = self.scanned.get(store, (collections.Counter(), 0))
        r = self.engine.retention
        last = sequence[n - 1].offset if n else -1
        with Engine.open(store, self.engine) as engine:
            for rec in sequence[n:]:  # the store has the pages before
                if (r.max_pages or r.max_age) and rec.offset // r.every > last // r.every:
                    engine.compact(now_ms=rec.timestamp)
                last = rec.offset
                _, (_, partition, offset) = decode_sequence(rec.value)
                done.update(key(m.to_dict(0))
                            for m in engine.process(pages[(partition, offset)]))
        self.scanned[store] = (done, len(sequence))
        return collections.Counter(done)


Procs = list[tuple[subprocess.Popen[bytes], Path]]  # role processes and their logs


def check_alive(procs: Procs) -> None:
    """AssertionError with its log's tail if a process exited on its own with an error."""
    for proc, log in procs:
        code = proc.poll()
        if code is not None and code not in (0, -signal.SIGKILL, -signal.SIGTERM):
            raise AssertionError(f"{log.name} exited {code}:\n{log.read_text()[-4000:]}")


def stop_all(procs: Procs) -> None:
    for proc, _ in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc, _ in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def read_topic(bootstrap: str, topic: str, partitions: int) -> list[Any]:
    """Every committed record of ``topic`` up to its last stable offset when called."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed",
        enable_auto_commit=False, max_partition_fetch_bytes=BIG, fetch_max_bytes=2 * BIG)
    await consumer.start()
    out: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)
        while any([await consumer.position(tp) < end[tp] for tp in tps]):
            for records in (await consumer.getmany(timeout_ms=500)).values():
                out.extend(records)
    finally:
        await consumer.stop()
    return out


async def wait_log(log: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"{text!r} not in {log.name}:\n{log.read_text()}"
        await asyncio.sleep(0.2)


def rfc_pages(max_bytes: int = 1 << 30) -> list[Page]:
    """The RFCs of the shared test data up to ``max_bytes`` each."""
    files = [RFC / f"rfc{n}.txt" for n in rfc_numbers()]
    return [Page(id=f.stem, body=f.read_bytes(), content_type="text/plain")
            for f in files if f.stat().st_size <= max_bytes]


def synthetic_pages(n: int, seed: int = 7, every_rfc: bool = False) -> list[Page]:
    """A crawl-like stream: pages of RFC sentences, some copying passages of earlier pages,
    some near or exact duplicates of an earlier page. The sentences come from one RFC
    (19,385 words), or with ``every_rfc`` from all 19 of the test data (558,266 words): from
    one, pages overlap by chance more as the stream grows (at 5,000 pages each word is in
    about 45 pages, 14.6 matches a page: dense duplication rather than a crawl)."""
    rng = np.random.default_rng(seed)
    sources = [words((RFC / f"rfc{n}.txt").read_text("utf-8", "replace"))
               for n in (rfc_numbers() if every_rfc else [1945])]
    texts: list[list[str]] = []
    for _ in range(n):
        vocab = sources[int(rng.integers(0, len(sources)))] if every_rfc else sources[0]
        start = int(rng.integers(0, len(vocab) - 400))
        body = vocab[start:start + int(rng.integers(60, 300))]
        if texts and rng.random() < 0.4:  # a copied passage from an earlier page
            src = texts[int(rng.integers(0, len(texts)))]
            a = int(rng.integers(0, max(1, len(src) - 40)))
            body = body[:len(body) // 2] + src[a:a + int(rng.integers(30, 80))] + \
                body[len(body) // 2:]
        elif texts and rng.random() < 0.15:  # a near (one word changed) or exact duplicate
            body = list(texts[int(rng.integers(0, len(texts)))])
            if rng.random() < 0.7:
                body[int(rng.integers(0, len(body)))] = "changed"
        texts.append(body)
    return [Page(id=f"syn-{i}", body=" ".join(t), content_type="text/plain")
            for i, t in enumerate(texts)]


async def owner_of(index: list[tuple[subprocess.Popen[bytes], Path]],
                   timeout: float = 60) -> int:
    """Which of the index processes holds the shard, once one alone says so (by its log's
    last word on it: a process continued after a stop says it owns the shard until it
    finds out)."""
    deadline = time.monotonic() + timeout
    while True:
        owners = []
        for i, (proc, log) in enumerate(index):
            said = [line for line in log.read_text().splitlines()
                    if "index shard owned" in line or "index shard released" in line
                    or "stepping down" in line]
            if proc.poll() is None and said and "index shard owned" in said[-1]:
                owners.append(i)
        if len(owners) == 1:
            return owners[0]
        assert time.monotonic() < deadline, f"owners {owners}"
        await asyncio.sleep(0.2)


async def progressed(topo: Topology, beyond: int, timeout: float = 180) -> int:
    """Wait until the index has published past ordinal ``beyond``; where it is."""
    deadline = time.monotonic() + timeout
    while (at := await topo.index_committed()) <= beyond:
        topo.check_alive()
        assert time.monotonic() < deadline, f"index stuck at {at}\n{topo.logs()}"
        await asyncio.sleep(0.5)
    return at




def lifecycle_stream(n_pages: int, seed: int = 5) -> tuple[list[tuple[bytes, bytes | None]],
                                                            collections.Counter[str]]:
    """``synthetic_pages(n_pages)`` as (key, value) records with, after some pages, one of:
    an unchanged revisit of a stored id (its body with other whitespace: the same words),
    an edited revisit (a word changed), a tombstone, a ``deleted: true`` page, a deleted id
    sent again (a new page), or a page sent again as it was (a replay); and the count of
    each kind."""
    rng = np.random.default_rng(seed)
    alive: dict[str, str] = {}  # id -> body sent last
    gone: list[str] = []
    kinds: collections.Counter[str] = collections.Counter()
    out: list[tuple[bytes, bytes | None]] = []

    def send(doc_id: str, body: str, kind: str) -> None:
        fetched_at = 1_700_000_000_000 + 1000 * len(out)
        out.append((doc_id.encode(), messages.encode_page(
            Page(id=doc_id, body=body, content_type="text/plain", fetched_at=fetched_at))))
        alive[doc_id] = body
        kinds[kind] += 1

    def delete(doc_id: str, kind: str) -> None:
        value = None if kind == "tombstone" else messages.pack(
            {"v": 1, "id": doc_id, "deleted": True})
        out.append((doc_id.encode(), value))
        del alive[doc_id]
        gone.append(doc_id)
        kinds[kind] += 1

    for i, page in enumerate(synthetic_pages(n_pages, seed)):
        assert isinstance(page.body, str)
        send(page.id, page.body, "new")
        if i < 10:
            continue
        r = rng.random()
        doc_id = sorted(alive)[int(rng.integers(0, len(alive)))]
        words = alive[doc_id].split()
        if r < 0.12:
            send(doc_id, "\n".join(words), "unchanged")
        elif r < 0.24:
            words[int(rng.integers(0, len(words)))] = f"revised{i}"
            send(doc_id, " ".join(words), "edited")
        elif r < 0.29:
            delete(doc_id, "tombstone")
        elif r < 0.34:
            delete(doc_id, "deleted")
        elif r < 0.37 and gone:
            send(gone.pop(0), " ".join(words[: len(words) // 2]), "again")
        elif r < 0.40:
            send(doc_id, alive[doc_id], "replay")
    return out, kinds
