"""The worker against a real Kafka broker (see conftest.py): same matches as the embedded
engine, nothing lost or duplicated across a SIGKILL, malformed input to the DLQ."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import gc
import json
import os
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from dupalign.config import EngineConfig, RetentionConfig
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.service.config import Config, KafkaConfig, load_config
from dupalign.service.produce import send_pages
from dupalign.service.sticky import StickyAssignor
from dupalign.service.topology import new_producer
from dupalign.service.worker import SOURCE_HEADER, Worker
from dupalign.wire import messages
from tests.corpora import CLOUGH, demo_pages
from tests.kafka_topics import create_topics
from tests.role_processes import read_topic
from tests.runtime.test_lifecycle import _words

pytestmark = pytest.mark.kafka

REPO = Path(__file__).resolve().parents[2]


def clough_pages(limit: int | None = None) -> list[Page]:
    """Real short answers and their Wikipedia originals: cut/light/heavy copies and non-copies."""
    files = sorted(CLOUGH.glob("*.txt"))
    if not files:  # never run a test on no pages: its callers carry @pytest.mark.testdata
        raise FileNotFoundError(f"no Clough answers in {CLOUGH}")
    files = sorted(files, key=lambda p: (not p.name.startswith("orig"), p.name))[:limit]
    return [Page(id=p.name, body=p.read_bytes(), content_type="text/plain") for p in files]


def match_key(d: dict[str, Any]) -> tuple[Any, ...]:
    spans = tuple(
        (tuple(s["tokens"]), tuple(s["chars"]), tuple(s["match_tokens"]),
         tuple(s["match_chars"]), round(s["est_jaccard"], 6), s.get("jaccard"),
         s.get("containment"), s.get("match_containment"))
        for s in d.get("spans") or ()
    )
    est = d.get("est_jaccard")
    return (d["doc_id"], d["kind"], d["match_doc_id"], d.get("hamming"),
            None if est is None else round(est, 6), d.get("jaccard"), spans)


def embedded_matches(pages: Iterable[Page], store: Path) -> list[tuple[Any, ...]]:
    out = []
    with Engine.open(store, EngineConfig()) as engine:
        for page in pages:
            out.extend(match_key(m.to_dict(0)) for m in engine.process(page))
    return out


class Topics:
    def __init__(self, bootstrap: str, partitions: int) -> None:
        tag = uuid.uuid4().hex[:8]
        self.bootstrap = bootstrap
        self.partitions = partitions
        self.pages, self.matches, self.dlq = f"pages-{tag}", f"matches-{tag}", f"dlq-{tag}"
        self.group = f"g-{tag}"

    async def create(self) -> Topics:
        await create_topics(self.bootstrap, [
            NewTopic(self.pages, self.partitions, 1), NewTopic(self.matches, 2, 1),
            NewTopic(self.dlq, 1, 1),
        ])
        return self

    def config(self, tmp: Path, **worker: Any) -> tuple[Config, Path]:
        text = f"""
[kafka]
bootstrap_servers = "{self.bootstrap}"
input_topic = "{self.pages}"
output_topic = "{self.matches}"
dlq_topic = "{self.dlq}"
group_id = "{self.group}"
session_timeout_ms = 6000
heartbeat_interval_ms = 500
[worker]
batch_size = {worker.pop("batch_size", 8)}
log_format = "text"
lag_interval_s = 0.5
""" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in worker.items()) + """
[metrics]
port = 0
"""
        path = tmp / f"worker-{uuid.uuid4().hex[:6]}.toml"
        path.write_text(text, "utf-8")
        return load_config(path, env={}), path

    async def send(self, pages: list[Page]) -> None:
        producer = new_producer(KafkaConfig(bootstrap_servers=self.bootstrap))
        await producer.start()
        try:
            await send_pages(producer, self.pages, pages)
        finally:
            await producer.stop()

    async def send_raw(self, values: list[tuple[bytes | None, bytes | None]],
                       partition: int = 0) -> None:
        producer = new_producer(KafkaConfig(bootstrap_servers=self.bootstrap))
        await producer.start()
        try:
            futs = [await producer.send(self.pages, v, key=k, partition=partition)
                    for k, v in values]
            await asyncio.gather(*futs)
        finally:
            await producer.stop()

    async def committed_total(self) -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=self.group,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            total = 0
            for p in range(self.partitions):
                total += await consumer.committed(TopicPartition(self.pages, p)) or 0
            return total
        finally:
            await consumer.stop()

    async def read(self, topic: str, timeout_s: float = 60) -> list[Any]:
        """Every committed record of ``topic`` up to its last stable offset when called."""
        parts = {self.pages: self.partitions, self.matches: 2, self.dlq: 1}[topic]
        return await read_topic(self.bootstrap, topic, parts, timeout_s)


async def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if await predicate():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


def sample(worker: Worker, name: str, **labels: str) -> float:
    value = worker.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_worker_matches_equal_embedded_engine(kafka_bootstrap: str, tmp_path: Path) -> None:
    pages = demo_pages()
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    await topics.send(pages)
    config, _ = topics.config(tmp_path, store_size_interval_s=0.2)
    worker = Worker(config, tmp_path / "store")
    task = asyncio.create_task(worker.run())
    try:
        await wait_for(lambda: _done(worker, len(pages)), 120, "all pages processed")
        await wait_for(lambda: _memory_sampled(worker), 30, "the caches' bytes in /metrics")
        assert sample(worker, "dupalign_memory_budget_bytes", part="lists") == 1024 << 20
        # The HTTP endpoint serves metrics and health while the worker runs.
        assert worker.http is not None and worker.http.port
        base = f"http://127.0.0.1:{worker.http.port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as resp:
                assert resp.status == 200
            async with http.get(f"{base}/readyz") as resp:
                assert resp.status == 200 and "consuming 1 partitions" in await resp.text()
            async with http.get(f"{base}/metrics") as resp:
                text = await resp.text()
                assert f'dupalign_pages_total{{outcome="processed"}} {len(pages)}.0' in text
                assert "dupalign_stage_seconds_bucket" in text
                assert 'dupalign_memory_bytes{part="lists"}' in text
                assert 'dupalign_memory_bytes{part="allocator_free"}' in text
    finally:
        worker.stop()
        assert await asyncio.wait_for(task, 60) == 0
    records = await topics.read(topics.matches)
    published = [match_key(messages.decode_match(r.value)) for r in records]
    expected = embedded_matches(pages, tmp_path / "embedded")
    assert collections.Counter(published) == collections.Counter(expected)
    assert {k[1] for k in expected} == {"exact", "near", "passage"}, "demo/README.md lists them"
    for r in records:  # keyed by doc id, traceable to the input record
        assert r.key == messages.decode_match(r.value)["doc_id"].encode()
        assert dict(r.headers)[SOURCE_HEADER].startswith(f"{topics.pages}:0:".encode())
    assert await topics.committed_total() == len(pages)
    assert sample(worker, "dupalign_matches_total", kind="passage") == sum(
        1 for k in expected if k[1] == "passage")


async def _memory_sampled(worker: Worker) -> bool:
    """Every cache that the demo pages fill shows bytes (the forward caches fill only on a
    passage alignment, the block cache only on a read from a table file)."""
    return all(sample(worker, "dupalign_memory_bytes", part=p) > 0
               for p in ("lists", "forward", "memtables", "near_table"))


async def run_until_done(topics: Topics, tmp_path: Path, n: int) -> Worker:
    """A worker over ``topics`` until it has handled ``n`` records, then stopped cleanly."""
    config, _ = topics.config(tmp_path)
    worker = Worker(config, tmp_path / "store")
    task = asyncio.create_task(worker.run())
    try:
        await wait_for(lambda: _done(worker, n), 120, "all records handled")
    finally:
        worker.stop()
        assert await asyncio.wait_for(task, 60) == 0
    return worker


async def _done(worker: Worker, n: int) -> bool:
    return sum(sample(worker, "dupalign_pages_total", outcome=o)
               for o in ("processed", "replayed", "rejected", "deleted")) >= n


async def test_tombstones_deletes_and_revisits_on_the_kafka_path(kafka_bootstrap: str,
                                                                  tmp_path: Path) -> None:
    """A tombstone (key = page id, null value) and a page with ``deleted: true`` remove the
    page in order with the pages around them; a new version of an id gets one revisit
    message and replaces the old one; every record is committed once."""
    words = (REPO / "demo" / "rfc" / "rfc2821.txt").read_text().split()
    t1, t2 = " ".join(words[:400]), " ".join(words[2000:2400])

    def page(doc_id: str, body: str) -> bytes:
        return messages.encode_page(Page(doc_id, body))

    records: list[tuple[bytes | None, bytes | None]] = [
        (b"a", page("a", t1)), (b"b", page("b", t1 + " one more line")),
        (b"a", None),  # Kafka's delete convention
        (b"b", messages.pack({"v": 1, "id": "b", "deleted": True})),
        (b"c", page("c", t1)),  # nothing left to match
        (b"c", page("c", t2)),  # a new version: one revisit message
        (b"d", page("d", t1)),  # c's old version is gone: nothing to match
    ]
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    await topics.send_raw(records)
    worker = await run_until_done(topics, tmp_path, len(records))
    published = [messages.decode_match(r.value) for r in await topics.read(topics.matches)]
    assert [(m["doc_id"], m["kind"], m["match_doc_id"], m.get("revisit"))
            for m in published] == [("b", "near", "a", None), ("c", "revisit", "c", "changed")]
    assert await topics.committed_total() == len(records)
    assert sample(worker, "dupalign_pages_total", outcome="deleted") == 2
    assert sample(worker, "dupalign_lifecycle_pages_total", event="revisit_changed") == 1
    assert await topics.read(topics.dlq) == []


def start_worker_process(config_path: Path, store: Path, log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log, "ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "dupalign.service.worker", "--store", str(store),
             "--config", str(config_path)],
            cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT,
        )


async def run_worker_to_the_end(topics: Topics, config_path: Path, store: Path, log: Path,
                                n_pages: int, what: str) -> None:
    """A worker process until it has committed ``n_pages`` input offsets, then SIGTERM: it
    must exit 0."""
    await stop_when_committed(start_worker_process(config_path, store, log), topics, log,
                              n_pages, what)


async def stop_when_committed(proc: subprocess.Popen[bytes], topics: Topics, log: Path,
                              n_pages: int, what: str, timeout: float = 120,
                              before_stop: Callable[[], None] | None = None) -> None:
    """``proc``, a worker process, until its group has committed ``n_pages`` input offsets;
    then ``before_stop()`` and SIGTERM: it must exit 0."""
    try:
        async def finished() -> bool:
            assert proc.poll() is None, log.read_text()[-4000:]
            return await topics.committed_total() == n_pages
        await wait_for(finished, timeout, what)
        if before_stop is not None:
            before_stop()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


@pytest.mark.testdata
async def test_sigkill_mid_stream_loses_and_duplicates_nothing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    pages = clough_pages()
    topics = await Topics(kafka_bootstrap, partitions=2).create()
    await topics.send(pages)
    _, config_path = topics.config(tmp_path, batch_size=4)
    store, log = tmp_path / "store", tmp_path / "worker.log"

    proc = start_worker_process(config_path, store, log)
    try:
        async def some_progress() -> bool:
            assert proc.poll() is None, log.read_text()
            return await topics.committed_total() >= len(pages) // 4
        await wait_for(some_progress, 120, "first commits")
        proc.send_signal(signal.SIGKILL)  # a crash: no flush, no commit, no close
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    killed_at = await topics.committed_total()
    assert killed_at < len(pages), "the worker finished before it could be killed"

    proc = start_worker_process(config_path, store, log)
    try:
        async def finished() -> bool:
            assert proc.poll() is None, log.read_text()
            return await topics.committed_total() == len(pages)
        try:
            await wait_for(finished, 120, "all offsets committed after restart")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log.read_text()[-6000:]}") from None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()

    records = await topics.read(topics.matches)
    published = [match_key(messages.decode_match(r.value)) for r in records]
    counts = collections.Counter(published)
    twice = [(r.partition, r.offset, dict(r.headers)[SOURCE_HEADER]) for r, k in
             zip(records, published, strict=True) if counts[k] > 1]
    assert published and not twice, f"published twice (killed at {killed_at}): {twice[:20]}"
    # Nothing lost: every match the store holds for every page (a replay through the engine
    # returns exactly them, writing nothing) was published, and nothing else was.
    stored = []
    with Engine.open(store, EngineConfig()) as engine:
        offsets = engine.stored_offsets()
        for page in pages:
            stored.extend(match_key(m.to_dict(0)) for m in engine.process(page))
    # on failure: which pages differ, where the store stood, what both worker runs logged
    unpublished = collections.Counter(stored) - counts
    not_stored = counts - collections.Counter(stored)
    assert not unpublished and not not_stored, (
        f"killed at {killed_at} committed; store offsets {offsets}; pages stored but not "
        f"published as stored: {sorted({k[0] for k in unpublished})}; published but not "
        f"stored: {sorted({k[0] for k in not_stored})}\nworker log:\n{log.read_text()[-8000:]}")


@pytest.mark.testdata
async def test_pages_stored_before_a_partitions_first_commit_are_published_after_a_crash(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A crash after the worker stored a partition's first pages but before any batch of it
    was committed leaves the group no offset for it (the shape of a CI failure of the
    SIGKILL test above, where one partition was read first). The restart must read those
    pages again, as replays, and publish their stored matches, not resume at the store's
    offset past them."""
    pages = clough_pages(40)
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    await topics.send(pages)
    _, config_path = topics.config(tmp_path, batch_size=4)
    store, log = tmp_path / "store", tmp_path / "worker.log"
    stored_first = 12
    # what the killed worker left: its first pages stored with their offsets, no commit
    with Engine.open(store, EngineConfig()) as engine:
        for offset, page in enumerate(pages[:stored_first]):
            engine.process(page, (topics.pages, 0, offset))
    expected = collections.Counter(embedded_matches(pages, tmp_path / "embedded"))
    assert any(key[0] in {p.id for p in pages[:stored_first]} for key in expected)

    await run_worker_to_the_end(topics, config_path, store, log, len(pages),
                                "all offsets committed after the crash")
    published = collections.Counter(match_key(messages.decode_match(r.value))
                                     for r in await topics.read(topics.matches))
    assert published == expected, (expected - published, published - expected)


@pytest.mark.testdata
async def test_a_group_without_offsets_resumes_where_the_store_says_matches_were_published(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The group's offsets gone while its store stays (offsets expire after
    offsets.retention.minutes of an empty group; a group deleted or renamed): the worker
    resumes after the pages the store records as published, publishing none twice."""
    pages = clough_pages(40)
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    await topics.send(pages[:20])
    store, log = tmp_path / "store", tmp_path / "worker.log"
    _, config_path = topics.config(tmp_path, batch_size=4)
    await run_worker_to_the_end(topics, config_path, store, log, 20, "first half committed")

    topics.group = f"g-{uuid.uuid4().hex[:8]}"  # a group with no offsets, the same store
    _, config_path = topics.config(tmp_path, batch_size=4)
    await topics.send(pages[20:])
    await run_worker_to_the_end(topics, config_path, store, log, len(pages),
                                "second half committed by the new group")
    published = collections.Counter(match_key(messages.decode_match(r.value))
                                    for r in await topics.read(topics.matches))
    expected = collections.Counter(embedded_matches(pages, tmp_path / "embedded"))
    assert published == expected, (expected - published, published - expected)
    assert "resuming after the pages it records as published" in log.read_text()


async def set_max_message_bytes(bootstrap: str, topic: str, size: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic,
                                                  configs={"max.message.bytes": str(size)})])
    finally:
        await admin.close()


# (a new version removes the page as a delete does: removal_cut's unit test has both)
@pytest.mark.parametrize("removal", ["delete", "retention sweep"])
async def test_a_batch_read_again_after_a_failed_commit_publishes_as_one_run_despite_a_removal(
    kafka_bootstrap: str, tmp_path: Path, removal: str
) -> None:
    """After a first page P, committed, a batch [X, Y = a copy of X, then X removed: a
    tombstone, or a retention sweep that keeps one page] whose commit
    fails (the output topic refuses its matches) is read again after a restart. Its pages
    are answered from the store by their replay keys, which X's removal deletes: so X's
    removal waits for X's commit (the batch is cut before a tombstone or a new version; a
    sweep waits until the pages read again are committed), and X is not indexed again as
    a new page matching Y."""
    base = _words(300, 21)
    first = Page("P", _words(300, 20))
    pages = [Page("X", base), Page("Y", base)] + {
        "delete": [Page("X", "", deleted=True)], "retention sweep": []}[removal]
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    await set_max_message_bytes(kafka_bootstrap, topics.matches, 100)
    _, config_path = topics.config(tmp_path, batch_size=8)
    if removal == "retention sweep":  # due before every part, once a second
        config_path.write_text(config_path.read_text()
                               + "[engine.retention]\nmax_pages = 1\nevery = 1\n")
    store, log = tmp_path / "store", tmp_path / "worker.log"
    await topics.send([first])  # no match: its batch commits
    proc = start_worker_process(config_path, store, log)
    try:
        async def first_committed() -> bool:
            assert proc.poll() is None, log.read_text()[-4000:]
            return await topics.committed_total() == 1
        await wait_for(first_committed, 120, "the first page committed")
        await asyncio.sleep(1.5)  # a sweep is due again
        await topics.send_raw([(p.id.encode(), None if p.deleted else messages.encode_page(p))
                               for p in pages])
        assert proc.wait(120) == 1, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert await topics.read(topics.matches) == []
    await set_max_message_bytes(kafka_bootstrap, topics.matches, 1 << 20)
    await run_worker_to_the_end(topics, config_path, store, log, 1 + len(pages),
                                "every offset committed after the topic was fixed")
    published = collections.Counter(match_key(messages.decode_match(r.value))
                                    for r in await topics.read(topics.matches))
    assert published == collections.Counter(embedded_matches([first, *pages],
                                                             tmp_path / "one-run"))
    assert ("X", "exact", "Y") not in published


async def _stored_past_the_commit(topics: Topics, tmp_path: Path
                                  ) -> tuple[Config, Path]:
    """A worker (retention: 2 pages, a sweep due every second) stores P on partition 0
    and commits it, then stores X and Y (a copy of X) and stops: the output topic refuses
    Y's match. Its store holds partition 0 up to offset 3, the group's commit is 1."""
    config, _ = topics.config(tmp_path, batch_size=8)
    config = dataclasses.replace(config, engine=dataclasses.replace(
        config.engine, retention=RetentionConfig(max_pages=2, every=1)))
    store = tmp_path / "store"
    await set_max_message_bytes(topics.bootstrap, topics.matches, 100)
    first = Worker(config, store)
    run = asyncio.create_task(first.run())
    await topics.send_raw([(b"P", messages.encode_page(Page("P", _words(300, 20))))])
    await wait_for(lambda: _total_is(topics, 1), 120, "P committed")
    await asyncio.sleep(1.2)
    base = _words(300, 21)
    await topics.send_raw([(p.id.encode(), messages.encode_page(p))
                           for p in (Page("X", base), Page("Y", base))])
    assert await asyncio.wait_for(run, 120) == 1  # the matches topic refused Y's match
    await set_max_message_bytes(topics.bootstrap, topics.matches, 1 << 20)
    return config, store


async def test_pages_stored_past_the_commit_whose_records_the_topic_deleted_hold_back_no_sweep(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """X and Y (a copy of X) are stored on partition 0 past its commit (the output topic
    refused Y's match), and the topic's retention then deletes their records. They can
    never be read again, so nothing will commit past them: the worker used to wait for that
    commit before every retention sweep, forever, while partition 1's pages piled up."""
    topics = await Topics(kafka_bootstrap, partitions=2).create()
    config, store = await _stored_past_the_commit(topics, tmp_path)
    tp0 = TopicPartition(topics.pages, 0)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.delete_records({tp0: RecordsToDelete(3)})  # X and Y's records gone
    finally:
        await admin.close()

    worker = Worker(config, store)
    run = asyncio.create_task(worker.run())
    try:
        for i in range(4):
            await topics.send_raw([(f"Q{i}".encode(), messages.encode_page(
                Page(f"Q{i}", _words(300, 40 + i))))], partition=1)
            await wait_for(lambda i=i: _true(sample(worker, "dupalign_pages_total",
                                                    outcome="processed") > i), 120, f"Q{i}")
            await asyncio.sleep(1.1)  # a sweep is due before the next part
        assert worker.unsettled == {}
        assert sample(worker, "dupalign_lifecycle_pages_total", event="expired") > 0
        assert worker.engine is not None and worker.engine.indexer.alive <= 3
    finally:
        worker.stop()
        assert await asyncio.wait_for(run, 60) == 0


async def test_a_partition_stored_past_its_commit_keeps_its_pages_while_another_member_has_it(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's store holds X and Y (a copy of X) of partition 0 past the group's
    commit. A second member joins, takes partition 0 and leaves before its first commit
    (a crash). Meanwhile this worker's retention (2 pages) must not sweep X and Y: they
    are read again when partition 0 comes back, and answered from the store as first
    computed. It used to forget them at the revocation and sweep them, and X, read again,
    was indexed as new and published as an exact copy of Z, a later page."""
    topics = await Topics(kafka_bootstrap, partitions=2).create()
    config, store = await _stored_past_the_commit(topics, tmp_path)
    tp0, tp1 = TopicPartition(topics.pages, 0), TopicPartition(topics.pages, 1)
    worker = Worker(config, store)
    assigned = worker.on_assigned
    calls = 0

    async def on_assigned(tps: Any) -> None:
        # the first assignment: partition 0's replay held back (the worker busy with other
        # partitions when the rebalance comes), so that the timing is certain
        nonlocal calls
        await assigned(tps)
        calls += 1
        if calls == 1:
            assert worker.unsettled == {tp0: 3} and worker.consumer is not None
            worker.consumer.pause(tp0)

    worker.on_assigned = on_assigned  # type: ignore[method-assign,assignment]
    run = asyncio.create_task(worker.run())
    await wait_for(lambda: _true(calls >= 1), 60, "the worker assigned")
    # the other member: it claims partition 0 as given at a later epoch than the worker's,
    # so the sticky assignment gives it partition 0
    claim = StickyAssignor()
    claim.owned, claim.epoch = [(topics.pages, 0)], 1 << 20
    other = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=topics.group,
                             client_id="aaa-other", enable_auto_commit=False,
                             session_timeout_ms=6000, heartbeat_interval_ms=500,
                             partition_assignment_strategy=(claim,))
    other.subscribe([topics.pages])
    await other.start()
    try:
        await wait_for(lambda: _true(other.assignment() == {tp0}), 60, "partition 0 moved")
        assert worker.consumer is not None
        await wait_for(lambda: _true(worker.consumer.assignment() == {tp1}), 60,
                       "the worker keeps partition 1")
        assert worker.unsettled == {tp0: 3}
        for i in range(4):  # sweeps are due between these
            await topics.send_raw([(f"Q{i}".encode(), messages.encode_page(
                Page(f"Q{i}", _words(300, 30 + i))))], partition=1)
            await wait_for(lambda i=i: _true(sample(worker, "dupalign_pages_total",
                                                    outcome="processed") > i), 120, f"Q{i}")
            await asyncio.sleep(1.1)
        await topics.send_raw([(b"Z", messages.encode_page(Page("Z", _words(300, 21))))],
                              partition=1)  # a later copy of X
        await wait_for(lambda: _true(sample(worker, "dupalign_pages_total",
                                            outcome="processed") >= 5), 120, "Z")
        assert sample(worker, "dupalign_lifecycle_pages_total", event="expired") == 0
    finally:
        await other.stop()  # leaves the group without a commit: partition 0 comes back
    await wait_for(lambda: _total_is(topics, 3 + 5), 120, "partition 0 read again")
    worker.stop()
    assert await asyncio.wait_for(run, 60) == 0
    published = [match_key(messages.decode_match(r.value))
                 for r in await topics.read(topics.matches)]
    assert sorted(k[:3] for k in published if k[0] in ("X", "Y")) == [("Y", "exact", "X")]
    # a second member splits the index between two stores: said in the log
    assert any("another member of group" in r.getMessage() for r in caplog.records)


async def _total_is(topics: Topics, total: int) -> bool:
    return await topics.committed_total() == total


async def _true(value: bool) -> bool:
    return value


@pytest.mark.testdata
async def test_an_output_topic_that_refuses_the_matches_stops_the_worker_and_loses_nothing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """A producer failure (the broker refuses the batch's matches: larger than the output
    topic's max.message.bytes) aborts the batch's transaction: its input offsets are not
    committed, the worker stops with the cause in one line, and once the topic is fixed a
    restart publishes every match exactly once."""
    pages = clough_pages(30)
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    await set_max_message_bytes(kafka_bootstrap, topics.matches, 100)  # below any match batch
    await topics.send(pages)
    _, config_path = topics.config(tmp_path, batch_size=4)
    store, log = tmp_path / "store", tmp_path / "worker.log"
    expected = collections.Counter(embedded_matches(pages, tmp_path / "embedded"))
    assert expected

    proc = start_worker_process(config_path, store, log)
    try:
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert code == 1, text[-4000:]
    stopped = [line for line in text.splitlines() if "worker stopped" in line]
    assert stopped and f"bytes for topic {topics.matches}, over that topic's max.message.bytes" \
        in stopped[-1], text[-4000:]
    committed = await topics.committed_total()
    assert committed < len(pages)  # the refused batch's offsets were not committed
    assert f"nothing committed past offset {committed} " in stopped[-1] or committed == 0, \
        stopped[-1]
    assert await topics.read(topics.matches) == []  # its transaction was aborted

    await set_max_message_bytes(kafka_bootstrap, topics.matches, 1 << 20)
    await run_worker_to_the_end(topics, config_path, store, log, len(pages),
                                "all offsets committed after the topic was fixed")
    published = [match_key(messages.decode_match(r.value))
                 for r in await topics.read(topics.matches)]
    assert collections.Counter(published) == expected


@pytest.mark.testdata
async def test_malformed_messages_go_to_dlq_while_pages_flow(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    good = clough_pages(12)
    big = messages.pack({"v": 1, "id": "big", "body": "word " * 5000})
    bad: list[tuple[bytes | None, bytes, str]] = [
        (b"garbage", b"\xc1\x00 not msgpack at all", "not_msgpack"),
        (b"noschema", msgpack.packb({"v": 1, "id": "x", "body": 42}), "schema"),
        (b"nobody", msgpack.packb({"v": 1, "id": "y"}), "schema"),
        (b"v9", msgpack.packb({"v": 9, "id": "z", "body": "b"}), "unsupported_version"),
        (b"big", big, "too_large"),
        (b"utf8", b"\x83\xa1v\x01\xa2id\xa2bd\xa4body\xa3\xff\xfe\xfd", "undecodable"),
        (b"binary", messages.pack({"v": 1, "id": "bin", "body": bytes(range(256)) * 8}),
         "undecodable"),
        # a key near the broker's limit: its dead letter once carried it twice, too large
        (b"K" * 700_000, b"\xc1\x00 huge key", "not_msgpack"),
    ]
    values: list[tuple[bytes | None, bytes]] = []
    expected: dict[int, tuple[str, bytes]] = {}
    for i, page in enumerate(good):
        values.append((page.id.encode(), messages.encode_page(page)))
        if i < len(bad):
            key, raw, reason = bad[i]
            expected[len(values)] = (reason, raw)
            values.append((key, raw))
    await topics.send_raw(values)
    config, _ = topics.config(tmp_path, max_message_bytes=20_000, dlq_raw_max_bytes=1000)
    worker = Worker(config, tmp_path / "store")
    task = asyncio.create_task(worker.run())
    try:
        await wait_for(lambda: _done(worker, len(values)), 120, "all messages handled")
    finally:
        worker.stop()
        assert await asyncio.wait_for(task, 60) == 0
    dead = {}
    for r in await topics.read(topics.dlq):
        d = messages.decode_dead_letter(r.value)
        assert d["source"]["topic"] == topics.pages and d["source"]["partition"] == 0
        dead[d["source"]["offset"]] = d
    assert sorted(dead) == sorted(expected)
    for offset, (reason, raw) in expected.items():
        d = dead[offset]
        assert d["error"] == reason, (offset, d["error"], d["detail"])
        assert d["detail"]
        assert d["raw_size"] == len(raw)
        assert d["raw"] == raw[:1000] and d["raw_truncated"] == (len(raw) > 1000)
    huge = dead[max(expected)]
    assert huge["key"] == b"K" * messages.KEY_MAX_BYTES and huge["key_size"] == 700_000
    assert sample(worker, "dupalign_pages_total", outcome="processed") == len(good)
    assert sample(worker, "dupalign_pages_total", outcome="rejected") == len(bad)
    assert sum(sample(worker, "dupalign_dead_letters_total", reason=r)
               for r in {b[2] for b in bad}) == len(bad)
    assert await topics.committed_total() == len(values)


async def test_produce_skips_a_page_that_is_not_valid_unicode_and_sends_the_rest(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """JSON escapes can carry a lone surrogate, which a msgpack string (UTF-8) cannot:
    `dupalign produce` names the line it skips and why, as `scan` does, and sends the rest."""
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(line) for line in [  # ASCII: "\ud800" as an escape
        {"id": "a", "body": "the first page"},
        {"id": "s", "body": "a lone \ud800 surrogate"},
        {"id": "m", "body": "fine words", "meta": {"note": "a lone \udfff surrogate"}},
        {"id": "b", "body": "the last page"},
    ]) + "\n")
    run = subprocess.run(
        [sys.executable, "-m", "dupalign.service.cli", "produce", str(src), "--bootstrap",
         kafka_bootstrap, "--topic", topics.pages, "--quiet"],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert run.returncode == 0, run.stderr
    skipped = [line for line in run.stderr.splitlines() if line.startswith("skipped")]
    assert [line.split()[1] for line in skipped] == [f"{src}:2", f"{src}:3"], run.stderr
    assert all("bad_unicode" in line for line in skipped), run.stderr
    assert "body" in skipped[0] and "meta" in skipped[1]
    assert "produced 2 pages" in run.stderr and "skipped 2" in run.stderr
    sent = [messages.decode_page(r.value).id for r in await topics.read(topics.pages)]
    assert sent == ["a", "b"]


async def test_a_stop_before_the_loops_ran_leaves_no_coroutine_unawaited(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Issue 14: a worker stopped before its loops had run printed "RuntimeWarning: coroutine
    'Worker._fetch_loop' was never awaited" (the tasks wrapped coroutines made in advance)."""
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    config, _ = topics.config(tmp_path)
    worker = Worker(config, tmp_path / "store")
    worker.stop()  # already stopping: the loops' tasks are cancelled before their first step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert await worker.run() == 0
        del worker  # its finished tasks hold what they ran: collect it all
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []


@pytest.mark.parametrize("creates", ["worker", "broker"])
async def test_a_first_start_on_topics_that_do_not_exist_logs_no_error(
    kafka_bootstrap: str, tmp_path: Path, creates: str
) -> None:
    """Issue 40: a healthy first start logged aiokafka's "ERROR Topic pages not found in
    cluster metadata" (the consumer subscribes before the broker has auto-created it). The
    worker creates missing topics by default; with ``kafka.create_topics = false`` the
    broker does, and aiokafka's line is said at INFO while the worker starts (after that
    aiokafka's ERROR stands: tests/service/test_log_repeats.py)."""
    topics = Topics(kafka_bootstrap, partitions=1)  # not created
    _, config_path = topics.config(tmp_path)
    if creates == "broker":
        config_path.write_text(config_path.read_text("utf-8").replace(
            "[kafka]\n", "[kafka]\ncreate_topics = false\n", 1), "utf-8")
    log = tmp_path / "worker.log"
    proc = start_worker_process(config_path, tmp_path / "store", log)
    try:
        async def assigned() -> bool:
            assert proc.poll() is None, log.read_text()[-4000:]
            return "partitions assigned" in log.read_text()
        await wait_for(assigned, 120, "the worker's first assignment")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    lines = log.read_text().splitlines()
    assert [line for line in lines if " ERROR " in line or " WARNING " in line] == [], lines
    if creates == "worker":
        assert any(" INFO dupalign.worker: created topics" in line for line in lines), lines
    else:
        assert any(f" INFO aiokafka.cluster: Topic {topics.pages} not found in cluster "
                   "metadata (usual while a worker starts" in line for line in lines), lines


async def test_produce_shows_the_first_skipped_lines_and_counts_the_rest(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Issue 40: garbage input gave one stderr line per bad line, without end."""
    from dupalign.service.capped import LIMIT

    topics = await Topics(kafka_bootstrap, partitions=1).create()
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "body": "the one page"}) + "\n"
                   + "".join(f"garbage {n}\n" for n in range(300)))
    run = subprocess.run(
        [sys.executable, "-m", "dupalign.service.cli", "produce", str(src), "--bootstrap",
         kafka_bootstrap, "--topic", topics.pages, "--quiet"],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == [
        *(f"skipped {src}:{n}: Expecting value: line 1 column 1 (char 0)"
          for n in range(2, 2 + LIMIT)),
        f"... and {300 - LIMIT} more skipped (not shown: the first {LIMIT} are)",
        f"produced 1 pages to {topics.pages}, skipped 300"]
    assert [messages.decode_page(r.value).id for r in await topics.read(topics.pages)] == ["a"]
