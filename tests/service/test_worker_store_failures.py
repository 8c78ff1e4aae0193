"""The worker when its store fails, against a real broker and real filesystems: a tmpfs that
fills up, an ext4 image that the kernel turns read-only; then the restart, and the decision
a store behind the group's committed offset takes (rebuild silently or publish).

Mounting needs root (CAP_SYS_ADMIN); where it is refused these tests skip with the reason,
except under CI=true, where they fail.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from dupalign.config import EngineConfig
from dupalign.runtime.engine import Engine
from dupalign.service.config import Config, load_config, with_kafka
from dupalign.service.worker import Worker
from dupalign.wire import messages
from tests.conftest import _in_ci
from tests.service.test_worker_kafka import (
    Topics,
    _done,
    clough_pages,
    embedded_matches,
    match_key,
    run_worker_to_the_end,
    sample,
    start_worker_process,
    wait_for,
)


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)


def _cannot(what: str, proc: subprocess.CompletedProcess[str]) -> None:
    message = f"{what} not permitted here ({proc.returncode}: {proc.stderr.strip()})"
    if _in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _unmount(mnt: Path) -> None:
    if _run("umount", str(mnt)).returncode != 0:
        _run("umount", "-l", str(mnt))  # still busy (a test failed with a worker running)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs: an empty store takes ~0.2 MB, each Clough page ~20 KB of RocksDB WAL."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    proc = _run("mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt))
    if proc.returncode != 0:
        _cannot("mount -t tmpfs", proc)
    try:
        yield mnt
    finally:
        _unmount(mnt)


class Ext4Image:
    """An ext4 filesystem in a file, loop-mounted with errors=remount-ro. ``fail()`` makes
    the kernel remount it read-only the way it does after an I/O error (ext4's
    trigger_fs_error): writes through files RocksDB already holds open fail with EROFS.
    ``mount -o remount,ro`` cannot do that: it refuses with EBUSY while a file is open for
    writing, and the store's WAL always is."""

    def __init__(self, root: Path) -> None:
        self.image = root / "ext4.img"
        self.mnt = root / "ext4"
        self.mnt.mkdir()

    def create(self) -> None:
        with open(self.image, "wb") as fh:
            fh.truncate(64 << 20)
        proc = _run("mkfs.ext4", "-q", "-F", str(self.image))
        if proc.returncode != 0:
            _cannot("mkfs.ext4", proc)
        self.mount()

    def mount(self) -> None:
        proc = _run("mount", "-o", "loop,errors=remount-ro", str(self.image), str(self.mnt))
        if proc.returncode != 0:
            _cannot("mount -o loop (ext4)", proc)

    def fail(self) -> None:
        """Everything written so far is flushed to the image, then the fs turns read-only."""
        assert _run("sync", "-f", str(self.mnt)).returncode == 0
        device = _run("findmnt", "-n", "-o", "SOURCE", str(self.mnt)).stdout.strip()
        Path(f"/sys/fs/ext4/{Path(device).name}/trigger_fs_error").write_text("dupalign test")

    def repair(self) -> None:
        """Unmount, fsck (0 or 1: clean or fixed), mount read-write again."""
        _unmount(self.mnt)
        assert _run("e2fsck", "-f", "-y", str(self.image)).returncode in (0, 1)
        self.mount()


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[Ext4Image]:
    fs = Ext4Image(tmp_path)
    try:
        fs.create()
        yield fs
    finally:
        _unmount(fs.mnt)


async def published_matches(topics: Topics) -> collections.Counter[tuple[Any, ...]]:
    """Every match on the output topic as a read_committed consumer sees it."""
    records = await topics.read(topics.matches)
    return collections.Counter(match_key(messages.decode_match(r.value)) for r in records)


async def run_worker_until(config: Config, store: Path, done: Callable[[Worker], Awaitable[bool]],
                           what: str) -> Worker:
    """An in-process worker, stopped (SIGTERM's path) once ``done``; it must exit with 0."""
    worker = Worker(config, store)
    task = asyncio.create_task(worker.run())

    async def finished() -> bool:
        assert not task.done(), f"worker stopped early: {worker.failure!r}"
        return await done(worker)

    try:
        await wait_for(finished, 120, what)
    finally:
        worker.stop()
        assert await asyncio.wait_for(task, 60) == 0
    return worker


async def _committed(topics: Topics, n: int) -> bool:
    return await topics.committed_total() == n


def stored_offset(store: Path, topic: str) -> int:
    with Engine.open(store, EngineConfig(), read_only=True) as engine:
        return engine.stored_offsets()[(topic, 0)]


@pytest.mark.testdata
@pytest.mark.kafka
async def test_disk_full_stops_the_worker_without_committing_and_loses_nothing(
    kafka_bootstrap: str, tmp_path: Path, small_fs: Path
) -> None:
    pages = clough_pages()
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    await topics.send(pages)
    _, config_path = topics.config(tmp_path, batch_size=8, min_free_mb=0)
    store, log = small_fs / "store", tmp_path / "worker.log"

    proc = start_worker_process(config_path, store, log)
    try:
        async def stopped_or_all_committed() -> bool:  # a worker that goes on commits all
            return proc.poll() is not None or await topics.committed_total() == len(pages)
        await wait_for(stopped_or_all_committed, 120, "the worker to stop on the full disk")
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        code = proc.poll()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    text = log.read_text()
    dead = await topics.read(topics.dlq)
    assert code == 1, (
        f"exit code {code} (None: still running), the worker must stop on a full disk; "
        f"{await topics.committed_total()} of {len(pages)} offsets committed, "
        f"{len(dead)} dead letters:\n{text[-3000:]}")
    stopped = [line for line in text.splitlines() if " ERROR " in line]
    assert len(stopped) == 1, text[-4000:]  # one clear line, no traceback
    assert f"store write failed: no space left on device at {store}" in stopped[0], stopped[0]

    assert not dead, f"{len(dead)} valid pages dead-lettered: " + ", ".join(
        messages.decode_dead_letter(r.value)["error"] for r in dead[:5])
    committed = await topics.committed_total()
    assert f"nothing committed past offset {committed} of {topics.pages}:0" in stopped[0]
    assert _run("mount", "-o", "remount,size=64m", str(small_fs)).returncode == 0
    in_store = stored_offset(store, topics.pages)
    assert 0 < committed <= in_store < len(pages), (committed, in_store)

    await run_worker_to_the_end(topics, config_path, store, log, len(pages),
                                "all offsets committed after the restart")
    expected = embedded_matches(pages, tmp_path / "scan")
    assert expected
    assert await published_matches(topics) == collections.Counter(expected)
    assert not await topics.read(topics.dlq)


@pytest.mark.testdata
@pytest.mark.kafka
async def test_store_turned_read_only_stops_the_worker_and_loses_nothing(
    kafka_bootstrap: str, tmp_path: Path, ext4: Ext4Image
) -> None:
    pages = clough_pages()
    first = 40
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    await topics.send(pages[:first])
    config, _ = topics.config(tmp_path, min_free_mb=0)
    store = ext4.mnt / "store"

    worker = Worker(config, store)
    task = asyncio.create_task(worker.run())
    try:
        async def first_committed() -> bool:
            assert not task.done(), f"worker stopped early: {worker.failure!r}"
            return await topics.committed_total() == first
        await wait_for(first_committed, 120, "the first pages committed")
        ext4.fail()
        await topics.send(pages[first:])
        code = await asyncio.wait_for(task, 60)
    finally:
        worker.stop()
        if not task.done():
            await asyncio.wait_for(task, 60)
    assert code == 1
    healthy, reason = worker._healthy()  # what /healthz answers (503 unless healthy)
    assert not healthy and "store write failed: read-only file system" in reason, reason
    assert not await topics.read(topics.dlq), "valid pages were dead-lettered"
    assert await topics.committed_total() == first

    ext4.repair()
    assert stored_offset(store, topics.pages) == first
    await run_worker_until(config, store, lambda w: _committed(topics, len(pages)),
                           "all pages after the repair")
    expected = embedded_matches(pages, tmp_path / "scan")
    assert await published_matches(topics) == collections.Counter(expected)


@pytest.mark.testdata
@pytest.mark.kafka
@pytest.mark.parametrize("transactions", [True, False])
async def test_store_behind_a_published_commit_is_rebuilt_without_republishing(
    kafka_bootstrap: str, tmp_path: Path, transactions: bool
) -> None:
    """A store restored from a backup: the group committed (and published) further. Both
    modes mark their commits (without transactions, after the sends are acknowledged)."""
    pages = clough_pages(40)
    half = len(pages) // 2
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    config = with_kafka(topics.config(tmp_path)[0], transactions=transactions)
    store, backup = tmp_path / "store", tmp_path / "backup"
    await topics.send(pages[:half])
    await run_worker_until(config, store, lambda w: _committed(topics, half), "first half")
    shutil.copytree(store, backup)
    await topics.send(pages[half:])
    await run_worker_until(config, store, lambda w: _committed(topics, len(pages)), "all")
    shutil.rmtree(store)
    backup.rename(store)

    worker = await run_worker_until(config, store, lambda w: _done(w, len(pages) - half),
                                    "the rebuild of the second half")
    assert sample(worker, "dupalign_suppressed_outputs_total") > 0
    assert stored_offset(store, topics.pages) == len(pages)
    expected = embedded_matches(pages, tmp_path / "scan")
    assert await published_matches(topics) == collections.Counter(expected)  # each once


@pytest.mark.testdata
@pytest.mark.kafka
async def test_store_behind_a_commit_without_the_published_mark_publishes_the_range(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Offsets committed past pages whose matches were never published (what older workers
    did when the store failed, or an offset reset): the rebuild publishes them."""
    pages = clough_pages(40)
    half = len(pages) // 2
    topics = await Topics(kafka_bootstrap, partitions=1).create()
    config, _ = topics.config(tmp_path)
    store = tmp_path / "store"
    await topics.send(pages[:half])
    await run_worker_until(config, store, lambda w: _committed(topics, half), "first half")
    await topics.send(pages[half:])
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=topics.group,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        tp = TopicPartition(topics.pages, 0)
        consumer.assign([tp])
        await consumer.commit({tp: len(pages)})  # no metadata
    finally:
        await consumer.stop()

    worker = await run_worker_until(config, store, lambda w: _done(w, len(pages) - half),
                                    "the second half re-indexed")
    assert sample(worker, "dupalign_suppressed_outputs_total") == 0
    expected = embedded_matches(pages, tmp_path / "scan")
    assert await published_matches(topics) == collections.Counter(expected)


async def test_worker_refuses_to_start_below_min_free_mb(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(env={}, overrides={"worker": {"min_free_mb": 1 << 30},
                                            "metrics": {"enabled": False}})
    worker = Worker(config, tmp_path / "store")
    assert await worker.run() == 1
    assert not (tmp_path / "store").exists()  # refused before the store was opened
    free_mb = sample(worker, "dupalign_store_free_bytes") / (1 << 20)
    assert 0 < free_mb < 1 << 30
    assert f"refusing to start: {free_mb:.1f} MB free on the filesystem of the store " \
        f"{tmp_path / 'store'}, below worker.min_free_mb (1073741824)" in caplog.text
