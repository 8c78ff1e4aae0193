"""Worker throughput and latency against a real Kafka broker.

    python -m tests.bench.bench_worker [--pages 600] [--latency-seconds 20] [--bootstrap H:P]

Three measurements in one run, on the same messages (real text: the Clough & Stevenson
answers and the RFCs of shared/testdata cut into ~3 KB pages):

1. raw: an aiokafka consumer group reading the pages and producing each value to another
   topic, committing per batch — the ceiling the transport sets;
2. worker: ``dupalign worker`` (a separate process, default config, transactions on) over the
   same topic: pages/s between its first and last commit;
3. latency: a fresh worker, pages produced at half the rate measured in 2; for each page,
   the time from its send to the commit of its offset (polled every 10 ms): p50 / p99.

Without --bootstrap a broker is started with deploy/kafka/broker.sh and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from dupalign.config import EngineConfig
from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.wire import messages
from tests.corpora import TESTDATA

REPO = Path(__file__).resolve().parents[2]


def corpus(n: int) -> list[Page]:
    clough = sorted((TESTDATA / "clough").glob("*.txt"))
    pages = [Page(id=p.name, body=p.read_bytes()) for p in clough]
    for rfc in sorted((TESTDATA / "rfc").glob("rfc*.txt")):
        text = rfc.read_text("utf-8", errors="replace")
        for i in range(0, len(text), 3000):
            pages.append(Page(id=f"{rfc.name}#{i}", body=text[i:i + 3000]))
    if len(pages) < n:  # a bench waiting for pages that never come would hang
        raise SystemExit(f"asked for {n} pages, the Clough + RFC corpus has {len(pages)}")
    return pages[:n]


async def create_topics(bootstrap: str, *names: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, 1, 1) for t in names])
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, values: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                linger_ms=5)
    await producer.start()
    try:
        futs = [await producer.send(topic, v, key=k) for k, v in values]
        await asyncio.gather(*futs)
    finally:
        await producer.stop()


async def raw_rate(bootstrap: str, src: str, dst: str, n: int) -> float:
    """Consume + produce + commit, no processing: the transport's ceiling."""
    consumer = AIOKafkaConsumer(src, bootstrap_servers=bootstrap, group_id=f"raw-{src}",
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                isolation_level="read_committed", max_poll_records=64)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                linger_ms=5)
    await consumer.start()
    await producer.start()
    done, t0 = 0, None
    try:
        while done < n:
            batch = await consumer.getmany(timeout_ms=500, max_records=64)
            for tp, records in batch.items():
                if t0 is None:
                    t0 = time.perf_counter()
                futs = [await producer.send(dst, r.value, key=r.key) for r in records]
                await asyncio.gather(*futs)
                await consumer.commit({tp: records[-1].offset + 1})
                done += len(records)
        assert t0 is not None
        return n / (time.perf_counter() - t0)
    finally:
        await producer.stop()
        await consumer.stop()


def embedded_rate(pages: list[Page], store: Path) -> float:
    """The engine without Kafka, same pages, one thread: what the worker can at most reach."""
    with Engine.open(store, EngineConfig()) as engine:
        engine.process(Page(id="warm-up", body="warm up the numba kernels " * 20))
        t0 = time.perf_counter()
        for page in pages:
            with contextlib.suppress(PageRejected):
                engine.process(page)
        return len(pages) / (time.perf_counter() - t0)


def write_config(tmp: Path, bootstrap: str, topic: str, group: str) -> Path:
    path = tmp / f"{group}.toml"
    path.write_text(f"""
[kafka]
bootstrap_servers = "{bootstrap}"
input_topic = "{topic}"
output_topic = "{topic}.matches"
dlq_topic = "{topic}.dlq"
group_id = "{group}"
create_topics = true
[worker]
log_format = "text"
log_level = "WARNING"
[metrics]
enabled = false
""", "utf-8")
    return path


def start_worker(config: Path, store: Path, log: Path, env: dict[str, str] | None = None
                 ) -> subprocess.Popen[bytes]:
    with open(log, "ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "dupalign.service.worker", "--store", str(store), "--config",
             str(config)], cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
        )


class CommitWatcher:
    """Polls the group's committed offset of partition 0."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.tp = TopicPartition(topic, 0)
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                         enable_auto_commit=False)

    async def __aenter__(self) -> CommitWatcher:
        await self.consumer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.consumer.stop()

    async def committed(self) -> int:
        return await self.consumer.committed(self.tp) or 0


async def worker_rate(bootstrap: str, topic: str, n: int, tmp: Path, tag: str = "rate",
                      env: dict[str, str] | None = None) -> float:
    """Pages/s of a fresh worker (``env``: more environment) over ``topic``, from its first
    commit to its last."""
    group = f"bench-{topic}" + ("" if tag == "rate" else f"-{tag}")
    log = tmp / f"worker-{tag}.log"
    proc = start_worker(write_config(tmp, bootstrap, topic, group), tmp / f"store-{tag}", log,
                        env)
    try:
        async with CommitWatcher(bootstrap, topic, group) as w:
            first = None
            while True:
                c = await w.committed()
                now = time.perf_counter()
                if c and first is None:
                    first = (now, c)
                if c >= n:
                    break
                if proc.poll() is not None:
                    raise RuntimeError(log.read_text())
                await asyncio.sleep(0.02)
        assert first is not None
        if c == first[1]:
            raise RuntimeError("all pages committed at once; use more --pages")
        return (c - first[1]) / (now - first[0])
    finally:
        proc.terminate()
        proc.wait(60)


async def latency(bootstrap: str, topic: str, pages: list[Page], rate: float, seconds: float,
                  tmp: Path) -> tuple[float, float, int]:
    group = f"bench-{topic}"
    await create_topics(bootstrap, topic)
    proc = start_worker(write_config(tmp, bootstrap, topic, group), tmp / "store-lat",
                        tmp / "worker-lat.log")
    sent: dict[int, float] = {}
    lat: list[float] = []
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                linger_ms=0)
    await producer.start()
    try:
        # Warm up (numba cache load, group join) before measuring.
        for i in range(5):
            fut = await producer.send(topic, messages.encode_page(pages[i]),
                                      key=pages[i].id.encode())
            await fut
        async with CommitWatcher(bootstrap, topic, group) as w:
            while await w.committed() < 5:
                if proc.poll() is not None:
                    raise RuntimeError((tmp / "worker-lat.log").read_text())
                await asyncio.sleep(0.05)

            async def send_paced() -> None:
                t0 = time.perf_counter()
                i = 0
                while time.perf_counter() - t0 < seconds:
                    target = t0 + i / rate
                    await asyncio.sleep(max(0.0, target - time.perf_counter()))
                    page = pages[(5 + i) % len(pages)]
                    page = Page(id=f"{page.id}@{i}", body=page.body)  # new id: not a replay
                    ts = time.perf_counter()
                    meta = await producer.send(topic, messages.encode_page(page),
                                               key=page.id.encode())
                    md = await meta
                    sent[md.offset] = ts
                    i += 1

            sender = asyncio.create_task(send_paced())
            seen = 5
            while not sender.done() or seen < (max(sent) + 1 if sent else 0):
                c = await w.committed()
                now = time.perf_counter()
                for off in range(seen, c):
                    if off in sent:
                        lat.append(now - sent[off])
                seen = max(seen, c)
                if proc.poll() is not None:
                    raise RuntimeError((tmp / "worker-lat.log").read_text())
                await asyncio.sleep(0.01)
            await sender
    finally:
        await producer.stop()
        proc.terminate()
        proc.wait(60)
    lat.sort()
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))], len(lat)


async def run(args: argparse.Namespace, bootstrap: str, tmp: Path) -> None:
    pages = corpus(args.pages)
    values = [(p.id.encode(), messages.encode_page(p)) for p in pages]
    tag = uuid.uuid4().hex[:6]
    src, dst = f"bench-pages-{tag}", f"bench-copy-{tag}"
    await create_topics(bootstrap, src, dst)
    await produce(bootstrap, src, values)
    raw = await raw_rate(bootstrap, src, dst, len(values))
    emb = embedded_rate(pages, tmp / "store-embedded")
    wrk = await worker_rate(bootstrap, src, len(values), tmp)
    p50, p99, n = await latency(bootstrap, f"bench-lat-{tag}", pages, wrk / 2,
                                args.latency_seconds, tmp)
    mb = sum(len(v) for _, v in values) / 1e6
    print(f"\n{len(pages)} pages, {mb:.1f} MB (Clough answers + RFC text, ~3 KB pages), "
          f"1 partition, transactions on, {os.cpu_count()} CPUs")
    print(f"{'measurement':<44} {'value':>12}")
    print(f"{'raw aiokafka consume+produce+commit':<44} {raw:>8.0f} p/s")
    print(f"{'dupalign worker (first→last commit)':<44} {wrk:>8.1f} p/s")
    print(f"{'engine alone, embedded (same pages)':<44} {emb:>8.1f} p/s")
    print(f"{'worker / raw':<44} {wrk / raw:>10.1%}")
    print(f"{'worker / embedded engine':<44} {wrk / emb:>10.1%}")
    print(f"{f'latency at {wrk / 2:.1f} p/s (half max), n={n}: p50':<44} {p50 * 1000:>8.0f} ms")
    print(f"{'                                          p99':<44} {p99 * 1000:>8.0f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=600)
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--bootstrap", help="use a running broker")
    args = parser.parse_args()
    return run_with_broker(args.bootstrap, "bench-worker-", lambda b, tmp: run(args, b, tmp))


def run_with_broker(bootstrap: str | None, prefix: str,
                    body: Callable[[str, Path], Coroutine[Any, Any, None]]) -> int:
    """``body(bootstrap, tmp)`` against ``bootstrap``, or, when None, a broker started with
    deploy/kafka/broker.sh in a temporary directory and stopped at the end."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmpdir:
        tmp = Path(tmpdir)
        broker = REPO / "deploy" / "kafka" / "broker.sh"
        address = bootstrap
        if address is None:
            out = subprocess.run(["bash", str(broker), "start", str(tmp / "broker")],
                                 capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(out.stderr, file=sys.stderr)
                return 1
            address = out.stdout.strip().splitlines()[-1]
        try:
            asyncio.run(body(address, tmp))
        finally:
            if bootstrap is None:
                subprocess.run(["bash", str(broker), "stop", str(tmp / "broker")], check=False)
    return 0

if __name__ == "__main__":
    sys.exit(main())
