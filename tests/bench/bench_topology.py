"""The topology (``dupalign worker --roles``) against a real broker: throughput, CPU per page
of each role, bytes per page on each topic, end-to-end latency at half load; with 1 and 2
processes per role, and the single worker (all roles in one process, ``worker.jobs = 1``)
side by side as the baseline.

    python -m tests.bench.bench_topology [--pages 600] [--procs 1,2] [--shards 1,2] [--batch 32]
        [--compression none,zstd] [--retained producer,zstd] [--bootstrap H:P]

Pages: the Clough answers and the RFCs cut into ~3 KB pages (tests/bench/bench_worker.py).
For each setup: fresh topics, the role processes started and assigned, then

1. throughput: ``--pages`` pages sent at once; pages/s from the first send to the index's
   commit past the last page; CPU per page of each role = the CPU its processes used in
   that interval (/proc/PID/stat) / pages; bytes per page = the value bytes each topic got,
   and the bytes the broker stores for it (its log segments on disk, compressed with
   ``kafka.compression_type``: what a retained topic costs; only for the broker this
   benchmark starts);
2. latency: ``--pages`` other pages sent at half that rate (or at ``--latency-rate``,
   the same for every setup, to compare two codes); per page with matches, the
   time from the page's record timestamp to its first match's (both stamped by their
   producers): p50 / p99;
3. the published matches compared with one ``scan`` over all the pages in ``sequence``
   order (column "= scan": yes/NO and the number of matches).

With ``--shards 1`` (the default) the index role holds the whole index: with 2 index
processes one owns it and one stands by. With ``--shards S`` > 1 (``kafka.index_shards``)
the index role is the fan-in and ``--procs`` processes of the shard role hold the S shards
(topics ``keys`` and ``partials`` added to the bytes per page). ``--compression`` runs each
setup with each ``kafka.compression_type`` (the producers' codec), ``--retained`` with each
``kafka.retained_compression`` (the codec the broker stores the retained topics with; the
single worker runs with the first of each).
Without --bootstrap a broker is started with deploy/kafka/broker.sh and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from dupalign.page import Page
from dupalign.wire import messages
from tests.bench.bench_worker import corpus, run_with_broker
from tests.service.test_worker_kafka import match_key
from tests.topology_harness import Topology, wait_log

ROLES = ("sketch", "index", "align", "shard")
TOPICS = ("pages", "sequence", "sketches", "align", "aligned", "forward", "matches", "keys",
          "partials")
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


async def published_past(topo: Topology, n: int, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while await topo.index_committed() < n:
        topo.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"index did not publish {n} ordinals\n{topo.logs()}")
        await asyncio.sleep(0.05)


async def last_sequence_offset(topo: Topology) -> int:
    records = await topo.read("sequence")
    return records[-1].offset if records else -1


async def send_paced(topo: Topology, pages: list[Page], rate: float) -> None:
    from tests.bench.stage_baseline import send_paced as send_to_input  # (it imports us)

    await send_to_input(topo.config.kafka, pages, rate)


async def setup(bootstrap: str, tmp: Path, procs: int, batch: int, shards: int = 1,
                compression: str = "none", retained: str = "zstd"
                ) -> tuple[Topology, dict[str, list[int]]]:
    """Fresh topics and ``procs`` processes per role (0: the single worker), all assigned;
    with ``shards`` > 1, ``procs`` shard processes too."""
    topo = await Topology(bootstrap, tmp, batch, index_shards=shards, compression=compression,
                          retained_compression=retained).create()
    pids: dict[str, list[int]] = {}
    if procs == 0:
        text = topo.config_path.read_text().replace("[worker]\n", "[worker]\njobs = 1\n")
        topo.config_path.write_text(text)
        proc, log = topo.start("sketch,index,align", tmp / f"single-{topo.tag}")
        await wait_log(log, "partitions assigned", 180)
        return topo, {"single": [proc.pid]}
    for role in ROLES if shards > 1 else ROLES[:3]:
        for i in range(procs):
            store = tmp / f"{role}-{topo.tag}-{i}" if role in ("index", "shard") else None
            proc, log = topo.start(role, store)
            pids.setdefault(role, []).append(proc.pid)
            await wait_log(log, "owned" if role == "index" and i == 0 else "started", 180)
    await asyncio.sleep(8)  # group joins settle
    return topo, pids


def stored_bytes(topo: Topology, data: Path) -> dict[str, float]:
    """Bytes of each topic's log segments in the broker's data directory ``data``."""
    return {name: float(sum(f.stat().st_size for d in data.glob(f"{topic}-*")
                            for f in d.glob("*.log")))
            for name, topic in topo.topic.items()}


async def measure(bootstrap: str, tmp: Path, procs: int, batch: int, pages: list[Page],
                  later: list[Page], shards: int = 1, compression: str = "none",
                  retained: str = "zstd", latency_rate: float | None = None
                  ) -> dict[str, Any]:
    topo, pids = await setup(bootstrap, tmp, procs, batch, shards, compression, retained)
    try:
        cpu0 = {role: sum(map(cpu_seconds, p)) for role, p in pids.items()}
        t0 = time.monotonic()
        await topo.send(pages)
        if procs == 0:
            await single_done(topo, len(pages))
        else:
            while len(await topo.read("sequence")) < len(pages):
                await asyncio.sleep(0.2)
            await published_past(topo, await last_sequence_offset(topo) + 1)
        elapsed = time.monotonic() - t0
        cpu = {role: (sum(map(cpu_seconds, p)) - cpu0[role]) / len(pages)
               for role, p in pids.items()}
        n = len(pages)
        topics = [t for t in TOPICS if shards > 1 or t not in ("keys", "partials")]
        sizes = {} if procs == 0 else {
            t: sum(len(r.value) for r in await topo.read(t)) / n for t in topics}
        data = tmp / "broker" / "data"  # the broker run_with_broker started, if it did
        stored = {} if procs == 0 or not data.is_dir() else {
            t: b / n for t, b in stored_bytes(topo, data).items() if t in topics}
        rate = n / elapsed
        await send_paced(topo, later, latency_rate or rate / 2)
        if procs == 0:
            await single_done(topo, 2 * n)
        else:
            while len(await topo.read("sequence")) < 2 * n:
                await asyncio.sleep(0.2)
            await published_past(topo, await last_sequence_offset(topo) + 1)
        p50, p99 = await latencies(topo, {p.id for p in later})
        same = "-"
        if procs:  # the published matches against one scan in sequence order
            got = Counter(match_key(messages.decode_match(r.value))
                          for r in await topo.read("matches"))
            expected = await topo.scan_in_sequence_order(tmp / f"oracle-{topo.tag}")
            same = f"{'yes' if got == expected else 'NO'} ({sum(expected.values())})"
        return {"rate": rate, "cpu": cpu, "sizes": sizes, "stored": stored, "p50": p50,
                "p99": p99, "same": same}
    finally:
        topo.stop_all()


async def single_done(topo: Topology, n: int) -> None:
    """The single worker committed ``n`` pages (its group is the configured one)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=topo.bootstrap, group_id=topo.group,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topo.topic["pages"], p)
               for p in range(topo.partitions[topo.topic["pages"]])]
        while sum([await consumer.committed(tp) or 0 for tp in tps]) < n:
            topo.check_alive()
            await asyncio.sleep(0.05)
    finally:
        await consumer.stop()


async def latencies(topo: Topology, ids: set[str]) -> tuple[float, float]:
    sent = {(r.partition, r.offset): r.timestamp for r in await topo.read("pages")}
    first: dict[str, int] = {}
    for r in await topo.read("matches"):
        doc = messages.decode_match(r.value)["doc_id"]
        if doc in ids:
            _, partition, offset = dict(r.headers)["dupalign-source"].decode().rsplit(":", 2)
            lat = r.timestamp - sent[(int(partition), int(offset))]
            first[doc] = min(first.get(doc, lat), lat)
    values = np.array(sorted(first.values()), dtype=float)
    if not len(values):
        return float("nan"), float("nan")
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


async def run(args: argparse.Namespace, bootstrap: str, tmp: Path) -> None:
    pages = corpus(2 * args.pages)
    first, later = pages[:args.pages], [Page(id=f"again-{p.id}", body=p.body)
                                        for p in pages[args.pages:2 * args.pages]]
    codecs = [f"{c}/{r}" for c in args.compression.split(",")
              for r in args.retained.split(",")]
    setups = [(0, 1, codecs[0])] + [(int(p), int(s), c) for c in codecs
                                    for s in args.shards.split(",")
                                    for p in args.procs.split(",")]
    results = {}
    for procs, shards, codec in setups:
        producers, retained = codec.split("/")
        results[procs, shards, codec] = r = await measure(
            bootstrap, tmp, procs, args.batch, first, later, shards, producers, retained,
            args.latency_rate)
        print(f"measured {procs or 'single worker'} x {shards} shard(s), {codec}: {r}",
              file=sys.stderr)
    paced = (f"at {args.latency_rate:g} pages/s" if args.latency_rate
             else "at half of each setup's rate")
    print(f"\n{len(first)} pages (+{len(later)} for latency, {paced}), batch {args.batch}, "
          "2 shared cores\n")
    print(f"{'setup':<34}{'pages/s':>9}{'vs single':>10}{'sketch':>9}{'index':>9}{'align':>9}"
          f"{'shard':>9}{'p50 ms':>9}{'p99 ms':>9}  {'= scan':<10} (CPU ms per page)")
    base = results[0, 1, codecs[0]]["rate"]
    for (procs, shards, codec), r in results.items():
        name = (f"single worker (jobs=1), {codec}" if procs == 0 else
                f"{procs} process(es)/role, S={shards}, {codec}")
        cpu = r["cpu"]
        cells = ([f"{1000 * cpu['single']:>9.2f}"] + [f"{'':>9}"] * 3 if procs == 0 else
                 [f"{1000 * cpu[role]:>9.2f}" if role in cpu else f"{'-':>9}"
                  for role in ROLES])
        print(f"{name:<34}{r['rate']:>9.1f}{r['rate'] / base:>9.2f}x{''.join(cells)}"
              f"{r['p50']:>9.0f}{r['p99']:>9.0f}  {r['same']:<10}")
    for title, column in (("bytes per page", "sizes"), ("stored by the broker", "stored")):
        print(f"\n{title:<34}" + "".join(f"{t:>10}" for t in TOPICS))
        for (procs, shards, codec), r in results.items():
            if r[column]:
                print(f"{f'{procs} per role, S={shards}, {codec}':<34}" +
                      "".join(f"{r[column].get(t, float('nan')):>10.0f}" for t in TOPICS))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=600, help="at most 1,065 (2 x pages are sent)")
    parser.add_argument("--procs", default="1,2", help="processes per role to measure")
    parser.add_argument("--shards", default="1", help="kafka.index_shards values to measure "
                        "(> 1: the index role is the fan-in of shard role processes)")
    parser.add_argument("--batch", type=int, default=32, help="worker.batch_size of every "
                        "process (records per fetch and per transaction)")
    parser.add_argument("--compression", default="none", help="kafka.compression_type values "
                        "to measure (none, gzip, snappy, lz4, zstd)")
    parser.add_argument("--retained", default="zstd", help="kafka.retained_compression "
                        "values to measure (producer: as sent, or a codec)")
    parser.add_argument("--bootstrap", help="use a running broker (no stored bytes then)")
    parser.add_argument("--latency-rate", type=float, help="pages/s of the latency phase "
                        "(default: half of each setup's measured rate)")
    args = parser.parse_args()
    return run_with_broker(args.bootstrap, "bench-topology-", lambda b, tmp: run(args, b, tmp))

if __name__ == "__main__":
    sys.exit(main())
