"""The partitioned pipeline's stage roles on a real broker (docs/pipeline.md, "Roles on
Kafka"): CPU per page of each role with 1, 2 and 4 copies, and bytes per page on each
topic between them (issue 43, deliver 6).

    python -m tests.bench.bench_stage_roles [--pages 600] [--copies 1,2,4] [--partitions 4]
        [--batch 32] [--bootstrap H:P] [--no-passages]

Pages: the Clough answers and the RFCs cut into ~3 KB pages (tests/bench/bench_worker.py),
under the default engine configuration but for ``near.idf_freeze_at = []`` (the stage roles
refuse learned idf tables yet). Every stage has ``--partitions`` partitions whatever the
copies, so each setup does the same work and a copy owns partitions/copies of them: the
per-copy CPU falls as copies are added unless a partition repeats work for every page (a
ledger over all decisions does). For each number of copies: fresh topics, ``copies``
processes of each role started and every partition taken, then ``--pages`` pages sent at
once; a role's CPU is what its processes used (/proc/PID/stat) from the send until every
page is decided and no topic has had a record for 3 s, less what they use idle (measured
for 5 s after), per page. The align role is not run yet (it needs forward records no stage
role sends): a page with align tasks stays waiting in the combine, so the combine's CPU
leaves out its merge of align answers; the pages without align tasks are published at once,
and on these corpora none of them has a match (the table of pages waiting and published
says so: passage and near matches come with align tasks), so the output topic stays empty
until align runs. ``--no-passages``: passages off, every page is published at once.
Copies share this machine's cores: read CPU, not rate.
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

from dupalign.service.sequence_batch import SequenceBatch
from dupalign.service.topology import ensure_topics, record_ordinal
from dupalign.stages.partitioned import Shape
from tests.bench.bench_topology import cpu_seconds
from tests.bench.bench_worker import corpus, run_with_broker
from tests.service.test_stage_roles_kafka import Roles
from tests.topology_harness import check_alive, read_topic, stop_all

# the roles built, in pipeline order (the align role is not run: pages with align tasks stay
# waiting in the combine)
ROLES = ("sketch", "directory", "exact", "router", "near", "lists", "combine")
ENGINE = """
[engine.near]
idf_freeze_at = []
"""
NO_PASSAGES = """
[engine.passage]
enabled = false
"""
QUIET_S = 3.0  # no record on any topic for this long: every stage is done


class Setup(Roles):
    """``copies`` processes of every role over fresh topics, ``partitions`` partitions for
    every stage."""

    def __init__(self, bootstrap: str, tmp: Path, partitions: int, copies: int,
                 batch: int, engine: str = ENGINE) -> None:
        where = tmp / f"c{copies}-{uuid.uuid4().hex[:8]}"
        where.mkdir(parents=True)
        p = partitions
        super().__init__(bootstrap, where, Shape(p, p, p, p, p, p), engine, batch, p)
        self.copies = copies

    def start_all(self) -> None:
        for role in ROLES:
            for i in range(self.copies):
                self.start(role, None if role == "sketch" else f"{role}-{i}")

    def of(self, role: str) -> list[tuple[subprocess.Popen[bytes], Path]]:
        return [(p, log) for p, log in self.procs if log.name.startswith(f"{role}-")]

    async def started(self, timeout: float = 300) -> None:
        """Every role consuming, every stage partition taken by one of its copies."""
        deadline = time.monotonic() + timeout
        while True:
            check_alive(self.procs)
            ready = all("assigned" in log.read_text() for _, log in self.of("sketch"))
            for role in ROLES[1:]:
                taken = {line.split(" partition ")[1].split(" ")[0]
                         for _, log in self.of(role) for line in log.read_text().splitlines()
                         if "taken:" in line}
                ready &= len(taken) == self.topics.partitions(role)
            if ready:
                return
            if time.monotonic() > deadline:
                raise TimeoutError("roles not started:\n" + "\n".join(
                    f"== {lg.name}\n{lg.read_text()[-2000:]}" for _, lg in self.procs))
            await asyncio.sleep(0.5)

    def topic_names(self) -> dict[str, tuple[str, int]]:
        t, s = self.topics, self.shape
        return {"batches": (t.batches, 1), "entries": (t.entries, s.directory),
                "decisions": (t.decisions, s.directory), "exact": (t.exact, s.exact),
                "near_state": (t.near_state, s.router), "near_ops": (t.near_ops, s.near),
                "near_answers": (t.near_answers, s.combine), "windows": (t.windows, s.lists),
                "partials": (t.partials, s.combine), "sketches": (t.sketches, s.combine),
                "matches": (self.kc.output_topic, self.kc.topic_partitions),
                "align": (t.align_requests, s.align)}

    async def done(self, n_pages: int, timeout: float = 1800) -> dict[str, list[Any]]:
        """Once every page is decided and no topic got a record for ``QUIET_S``: the
        records of each topic between the roles."""
        deadline = time.monotonic() + timeout
        bootstrap = self.kc.bootstrap_servers
        last: dict[str, int] = {}
        since = time.monotonic()
        while True:
            check_alive(self.procs)
            got = {name: await read_topic(bootstrap, topic, n)
                   for name, (topic, n) in self.topic_names().items()}
            counts = {name: len(recs) for name, recs in got.items()}
            dead = await read_topic(bootstrap, self.kc.dlq_topic, self.kc.topic_partitions)
            sequenced = sum(SequenceBatch.from_bytes(r.value).n for r in got["batches"])
            if counts != last:
                last, since = counts, time.monotonic()
            elif (sequenced + len(dead) == n_pages and counts["decisions"] == sequenced
                  and time.monotonic() - since > QUIET_S):
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sequenced} sequenced, {len(dead)} dead, {counts}, "
                                   f"of {n_pages}")
            await asyncio.sleep(0.5)

    def cpu(self) -> dict[str, float]:
        return {role: sum(cpu_seconds(p.pid) for p, _ in self.of(role)) for role in ROLES}


async def measure(bootstrap: str, tmp: Path, pages: list[Any], partitions: int, copies: int,
                  batch: int, engine: str = ENGINE) -> dict[str, Any]:
    setup = Setup(bootstrap, tmp, partitions, copies, batch, engine)
    await ensure_topics(setup.kc, setup.topics.wanted())
    try:
        setup.start_all()
        await setup.started()
        before, t0 = setup.cpu(), time.monotonic()
        await setup.send(pages)
        got = await setup.done(len(pages))
        seconds = time.monotonic() - t0 - QUIET_S
        after = setup.cpu()
        # what the roles use idle (their turns poll every 200 ms), measured once every
        # stage is done (before the send it would catch their start), taken off below
        await asyncio.sleep(5)
        idle = setup.cpu()
        idle_s = time.monotonic() - t0 - seconds - QUIET_S
    finally:
        stop_all(setup.procs)
    n = len(pages)
    cpu = {r: after[r] - before[r] - (idle[r] - after[r]) / idle_s * (seconds + QUIET_S)
           for r in ROLES}
    # (passages on: a page with align tasks waits in the combine, unpublished, for align,
    # which is not run; a page without has no match on these corpora)
    waiting = len({record_ordinal(r) for r in got["align"]})
    published = len({record_ordinal(r) for r in got["matches"]})
    return {"copies": copies, "seconds": seconds, "pages": n, "waiting": waiting,
            "published": published, "cpu_ms": {r: 1000 * c / n for r, c in cpu.items()},
            "bytes": {t: sum(len(r.value or b"") for r in recs) / n for t, recs in got.items()}}


def table(rows: list[dict[str, Any]], partitions: int) -> str:
    roles = list(ROLES)
    lines = [f"CPU ms per page of each role (all its copies; per copy in brackets), "
             f"{partitions} partitions per stage, {rows[0]['pages']} pages",
             "| copies | pages/s | " + " | ".join(roles) + " | all roles |",
             "|---|---|" + "---|" * (len(roles) + 1)]
    for r in rows:
        c = r["copies"]
        cells = [f"{r['cpu_ms'][role]:.2f} ({r['cpu_ms'][role] / c:.2f})" for role in roles]
        total = sum(r["cpu_ms"].values())
        lines.append(f"| {c} | {r['pages'] / r['seconds']:.0f} | " + " | ".join(cells)
                     + f" | {total:.2f} |")
    lines += ["", "pages waiting for align (sent a request) and pages with matches published",
              "| copies | waiting | published |", "|---|---|---|"]
    lines += [f"| {r['copies']} | {r['waiting']} | {r['published']} |" for r in rows]
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
        rows.append(await measure(bootstrap, tmp, pages, args.partitions, copies, args.batch,
                                  ENGINE + NO_PASSAGES if args.no_passages else ENGINE))
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
    p.add_argument("--no-passages", action="store_true",
                   help="passages off: every page is published at once (no align tasks)")
    args = p.parse_args()
    if any(c > args.partitions for c in args.copies):
        p.error("more copies than partitions: the extra copies would stand by")
    return run_with_broker(args.bootstrap, "bench-stage-", lambda b, t: run(args, b, t))


if __name__ == "__main__":
    sys.exit(main())
