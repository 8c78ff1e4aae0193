"""The partitioned pipeline's stage roles on a real broker (docs/pipeline.md, "Roles on
Kafka"): CPU per page of each role with 1, 2 and 4 copies, and bytes per page on each
topic between them (issue 43, deliver 6).

    python -m tests.bench.bench_stage_roles [--pages 600] [--copies 1,2,4] [--partitions 4]
        [--batch 32] [--bootstrap H:P]

Pages: the Clough answers and the RFCs cut into ~3 KB pages (tests/bench/bench_worker.py),
under the default engine configuration but for ``near.idf_freeze_at = []`` (the stage roles
refuse learned idf tables yet). Every stage has ``--partitions`` partitions whatever the
copies, so each setup does the same work and a copy owns partitions/copies of them: the
per-copy CPU falls as copies are added unless a partition repeats work for every page (a
ledger over all decisions does). For each number of copies: fresh topics, ``copies``
processes of each role started and every partition taken, then ``--pages`` pages sent at
once; a role's CPU is what its processes used (/proc/PID/stat) from the send until the last
stage is done (every page decided and every stored page answered by the exact stage), per
page. Copies share this machine's cores: read CPU, not rate.
Without --bootstrap a broker is started with deploy/kafka/broker.sh and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from dupalign.service.config import load_config
from dupalign.service.produce import send_pages
from dupalign.service.sequence_batch import SequenceBatch
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import ensure_topics, new_producer
from dupalign.stages.directory import Decision
from dupalign.stages.partitioned import Shape
from tests.bench.bench_topology import cpu_seconds
from tests.bench.bench_worker import corpus, run_with_broker
from tests.topology_harness import REPO, check_alive, read_topic, stop_all

# the roles built, in pipeline order, and whether they keep stores
ROLES = {"sketch": False, "directory": True, "exact": True}


class Setup:
    """``copies`` processes of every role over fresh topics."""

    def __init__(self, bootstrap: str, tmp: Path, partitions: int, copies: int,
                 batch: int) -> None:
        tag = uuid.uuid4().hex[:8]
        self.tmp = tmp / f"c{copies}-{tag}"
        self.tmp.mkdir(parents=True)
        self.copies = copies
        self.shape = Shape(partitions, partitions, 1, 1, 1)
        self.config_path = self.tmp / "stage.toml"
        self.config_path.write_text(f"""
[kafka]
bootstrap_servers = "{bootstrap}"
input_topic = "pages-{tag}"
output_topic = "matches-{tag}"
dlq_topic = "dlq-{tag}"
group_id = "g-{tag}"
create_topics = true
topic_partitions = {partitions}
[worker]
batch_size = {batch}
log_format = "text"
[metrics]
enabled = false
[engine.near]
idf_freeze_at = []
""", "utf-8")
        self.config = load_config(self.config_path, env={})
        self.kc = self.config.kafka
        self.topics = StageTopics(self.kc, self.shape)
        self.procs: dict[str, list[tuple[subprocess.Popen[bytes], Path]]] = {}

    @property
    def all_procs(self) -> list[tuple[subprocess.Popen[bytes], Path]]:
        return [p for procs in self.procs.values() for p in procs]

    def start(self) -> None:
        s = self.shape
        shape = f"{s.directory},{s.exact},{s.near},{s.lists},{s.combine}"
        for role, stateful in ROLES.items():
            for i in range(self.copies):
                log = self.tmp / f"{role}-{i}.log"
                cmd = [sys.executable, "-m", "dupalign.service.roles.stage_launch", role,
                       "--config", str(self.config_path), "--shape", shape]
                if stateful:
                    cmd += ["--store", str(self.tmp / f"{role}-{i}")]
                with open(log, "ab") as fh:
                    proc = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
                self.procs.setdefault(role, []).append((proc, log))

    async def started(self, timeout: float = 300) -> None:
        """Every role consuming, every stage partition taken by one of its copies."""
        deadline = time.monotonic() + timeout
        while True:
            check_alive(self.all_procs)
            ready = True
            for role, stateful in ROLES.items():
                text = [log.read_text() for _, log in self.procs[role]]
                if stateful:
                    taken = {line.split(" partition ")[1].split(" ")[0]
                             for t in text for line in t.splitlines() if "taken:" in line}
                    ready &= len(taken) == self.topics.partitions(role)
                else:
                    ready &= all("assigned" in t for t in text)
            if ready:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("roles not started:\n" + "\n".join(
                    f"== {lg.name}\n{lg.read_text()[-2000:]}" for _, lg in self.all_procs))
            await asyncio.sleep(0.5)

    async def send(self, pages: list[Any]) -> None:
        producer = new_producer(self.kc)
        await producer.start()
        try:
            await send_pages(producer, self.kc.input_topic, pages)
        finally:
            await producer.stop()

    async def done(self, n_pages: int, timeout: float = 1800) -> dict[str, list[Any]]:
        """Once every page is sequenced or dead-lettered, every sequenced page decided and
        every stored page answered: the records of each topic between the roles."""
        deadline = time.monotonic() + timeout
        bootstrap = self.kc.bootstrap_servers
        while True:
            check_alive(self.all_procs)
            got = {
                "batches": await read_topic(bootstrap, self.topics.batches, 1),
                "entries": await read_topic(bootstrap, self.topics.entries,
                                            self.shape.directory),
                "decisions": await read_topic(bootstrap, self.topics.decisions,
                                              self.shape.directory),
                "exact": await read_topic(bootstrap, self.topics.exact, self.shape.exact)}
            dead = await read_topic(bootstrap, self.kc.dlq_topic, self.shape.directory)
            sequenced = sum(SequenceBatch.from_bytes(r.value).n for r in got["batches"])
            stored = sum(Decision.from_bytes(r.value).kind == "stored"
                         for r in got["decisions"])
            if (sequenced + len(dead) == n_pages and len(got["decisions"]) == sequenced
                    and len(got["exact"]) == stored):
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sequenced} sequenced, {len(dead)} dead, "
                                   f"{len(got['decisions'])} decided, {len(got['exact'])} "
                                   f"of {stored} answered, of {n_pages}")
            await asyncio.sleep(0.2)

    def cpu(self) -> dict[str, list[float]]:
        return {role: [cpu_seconds(p.pid) for p, _ in procs]
                for role, procs in self.procs.items()}


async def measure(bootstrap: str, tmp: Path, pages: list[Any], partitions: int, copies: int,
                  batch: int) -> dict[str, Any]:
    setup = Setup(bootstrap, tmp, partitions, copies, batch)
    await ensure_topics(setup.kc, setup.topics.wanted())
    try:
        setup.start()
        await setup.started()
        before = setup.cpu()
        t0 = time.monotonic()
        await setup.send(pages)
        got = await setup.done(len(pages))
        seconds = time.monotonic() - t0
        after = setup.cpu()
    finally:
        stop_all(setup.all_procs)
    n = len(pages)
    cpu = {role: sum(after[role]) - sum(before[role]) for role in ROLES}
    return {"copies": copies, "seconds": seconds, "pages": n,
            "cpu_ms": {r: 1000 * c / n for r, c in cpu.items()},
            "bytes": {t: sum(len(r.value) for r in recs) / n for t, recs in got.items()}}


def table(rows: list[dict[str, Any]], partitions: int) -> str:
    roles = list(ROLES)
    lines = [f"CPU ms per page of each role (all its copies; per copy in brackets), "
             f"{partitions} partitions per stage, {rows[0]['pages']} pages",
             "| copies | pages/s | " + " | ".join(roles) + " |",
             "|---|---|" + "---|" * len(roles)]
    for r in rows:
        c = r["copies"]
        cells = [f"{r['cpu_ms'][role]:.2f} ({r['cpu_ms'][role] / c:.2f})" for role in roles]
        lines.append(f"| {c} | {r['pages'] / r['seconds']:.0f} | " + " | ".join(cells) + " |")
    topics = list(rows[0]["bytes"])
    lines += ["", "bytes per page on each topic (values)",
              "| copies | " + " | ".join(topics) + " |", "|---|" + "---|" * len(topics)]
    for r in rows:
        lines.append(f"| {r['copies']} | "
                     + " | ".join(f"{r['bytes'][t]:.0f}" for t in topics) + " |")
    return "\n".join(lines)


async def run(args: argparse.Namespace, bootstrap: str, tmp: Path) -> None:
    pages = corpus(args.pages)
    rows = []
    for copies in args.copies:
        rows.append(await measure(bootstrap, tmp, pages, args.partitions, copies, args.batch))
        print(f"{copies} copies: {rows[-1]['seconds']:.1f} s", file=sys.stderr)
    print(table(rows, args.partitions))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pages", type=int, default=600)
    p.add_argument("--copies", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 2, 4])
    p.add_argument("--partitions", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--bootstrap")
    args = p.parse_args()
    if any(c > args.partitions for c in args.copies):
        p.error("more copies than partitions: the extra copies would stand by")
    return run_with_broker(args.bootstrap, "bench-stage-", lambda b, t: run(args, b, t))


if __name__ == "__main__":
    sys.exit(main())
