"""Helpers for tests and benchmarks of role processes (``dupalign stage``) on a real broker:
their liveness, CPU and stop, readers of their topics and logs; and the corpora they run on
(the RFCs, a synthetic crawl-like stream of pages, one with deletes and revisits)."""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
from aiokafka import AIOKafkaConsumer, TopicPartition

from dupalign.page import Page
from dupalign.wire import messages
from tests.corpora import RFC, rfc_numbers, words

REPO = Path(__file__).resolve().parent.parent
BIG = 32 << 20  # a large RFC's align request carries MBs of candidates' forward records
Procs = list[tuple[subprocess.Popen[bytes], Path]]  # role processes and their logs
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """The CPU seconds process ``pid`` has used (user + system, from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


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


async def read_topic(bootstrap: str, topic: str, partitions: int,
                     timeout_s: float = 600) -> list[Any]:
    """Every committed record of ``topic`` up to its last stable offset when called (read to
    those offsets, not until nothing new comes for a while: a consumer slow to start on a
    loaded machine would cut that short)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed",
        enable_auto_commit=False, max_partition_fetch_bytes=BIG, fetch_max_bytes=2 * BIG)
    await consumer.start()
    out: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        end = await consumer.end_offsets(tps)  # read_committed: the last stable offsets
        deadline = time.monotonic() + timeout_s
        while any([await consumer.position(tp) < end[tp] for tp in tps]):
            assert time.monotonic() < deadline, f"{topic}: not read to {end} in {timeout_s} s"
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
