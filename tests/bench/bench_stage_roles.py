"""The partitioned pipeline's stage roles on a real broker (docs/pipeline.md, "Roles on
Kafka"): CPU per page of each role with 1, 2 and 4 copies, and bytes per page on each
topic between them (issue 43, deliver 6).

    python -m tests.bench.bench_stage_roles [--pages 600] [--copies 1,2,4] [--partitions 4]
        [--batch 32] [--warm 0] [--single] [--latency N] [--bootstrap H:P] [--profile DIR]
        [--no-passages]

Pages: the Clough answers and the RFCs cut into ~3 KB pages (tests/bench/bench_worker.py),
under the default engine configuration (the learner role runs: one partition, whatever
``--partitions``; its other copies stand by). Every other stage has ``--partitions``
partitions whatever the copies, so each setup does the same work and a copy owns
partitions/copies of them: the per-copy CPU falls as copies are added unless a partition
repeats work for every page (a ledger over all decisions does). For each number of copies:
fresh topics, ``copies`` processes of each role started and every partition taken, then
``--pages`` pages sent at once; a role's CPU is what its processes used (/proc/PID/stat)
from the send until every stage partition has applied every page (``Applied``) and no topic
has had a record for 3 s, less what they use idle (measured for 5 s after, printed), per
page. ``--warm N``: N more pages sent and done before (a role's first pages load its
kernels: a cost per process, not per page). A row says if the group moved partitions while
it was measured (a copy timed out under load: a restore was counted).
The align stage runs too (A = ``--partitions``): a page with align tasks is published once
its answers are merged. ``--no-passages``: passages off, no page has align tasks. Copies
share this machine's cores: read CPU, not rate.
``--partitions 1,4``: a setup for each count (with each of ``--copies`` up to it), and from
two that differ in partitions only the projection to 10^3 and 10^4 pages/s
(tests/bench/stage_projection.py). ``--single``: the single worker on the same pages first,
the ratio of the whole topology's CPU to its own (tests/bench/stage_baseline.py).
``--latency N``: N more pages sent at half each setup's measured rate: p50/p99 from a
page's input record to its first match, the p50 to each topic between the roles, and the
CPU per page at that rate (idle polling included). Also printed: the transactions per page
of each stage (the commit markers in its changelog) and the bytes written to the
changelogs.
``--profile DIR``: every role process sampled by py-spy from the send until done (raw
collapsed stacks, DIR/c<copies>-<role>-<i>.txt; summed by function with
``python -m tests.bench.spy_summary DIR/c1-lists-*.txt``); its CPU figures are then the
profiled processes', not to be quoted.
Without --bootstrap a broker is started with deploy/kafka/broker.sh and stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import msgpack
from aiokafka import AIOKafkaConsumer, TopicPartition

from dupalign.service.changelog import encode_key
from dupalign.service.roles.stage_align import record_upto
from dupalign.service.sequence_batch import SequenceBatch
from dupalign.service.topology import ensure_topics, record_ordinal
from dupalign.stages.partitioned import Shape
from dupalign.store.keys import read_u64
from tests.bench.bench_topology import cpu_seconds
from tests.bench.bench_worker import corpus, run_with_broker
from tests.bench.stage_baseline import (
    SingleWorker,
    hop_latencies,
    percentiles,
    send_paced,
    sent_at,
    single_latencies,
    stage_latencies,
)
from tests.bench.stage_projection import projection
from tests.service.test_stage_roles_kafka import Roles
from tests.topology_harness import check_alive, read_topic, stop_all

# every role of the shape, in pipeline order
ROLES = ("sketch", "directory", "exact", "learner", "router", "near", "lists", "combine",
         "align")
ENGINE = ""  # the default engine configuration (idf tables learned: the learner role runs)
NO_PASSAGES = """
[engine.passage]
enabled = false
"""
QUIET_S = 3.0  # no record on any topic for this long: every stage is done
NEXT_SEQ = encode_key("meta", b"ledger_next_seq")  # (a ledger's next ordinal, records.NOTES)
CURSOR = encode_key("meta", b"stage_cursor")  # (the near partition's: "next")


class Applied:
    """How far every stage partition has applied the sequence, as committed: the last
    ledger ``next_seq`` note (the near partition's cursor "next") in its changelog, read
    as it comes. A role still busy with the pages sent writes no record on a topic for a
    while (its first pages load its kernels): quiet topics alone do not say it is done."""

    def __init__(self, setup: Setup) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=setup.kc.bootstrap_servers, group_id=None,
            isolation_level="read_committed", enable_auto_commit=False,
            auto_offset_reset="earliest")
        self.tps = [TopicPartition(setup.topics.changelog(role), p) for role in ROLES[1:]
                    for p in range(setup.topics.partitions(role))]
        self.at = dict.fromkeys(self.tps, 0)

    async def start(self) -> None:
        await self.consumer.start()
        self.consumer.assign(self.tps)
        await self.consumer.seek_to_beginning(*self.tps)

    async def lowest(self) -> int:
        """The lowest ordinal any stage partition is still to apply."""
        while True:
            got = await self.consumer.getmany(timeout_ms=100, max_records=100_000)
            if not any(got.values()):
                return min(self.at.values())
            for tp, recs in got.items():
                for r in recs:
                    if r.key == NEXT_SEQ and r.value is not None:
                        self.at[tp] = read_u64(r.value)
                    elif r.key == CURSOR and ".near." in tp.topic and r.value is not None:
                        self.at[tp] = msgpack.unpackb(r.value)["next"]


class Setup(Roles):
    """``copies`` processes of every role over fresh topics, ``partitions`` partitions for
    every stage."""

    def __init__(self, bootstrap: str, tmp: Path, partitions: int, copies: int,
                 batch: int, engine: str = ENGINE) -> None:
        where = tmp / f"c{copies}-{uuid.uuid4().hex[:8]}"
        where.mkdir(parents=True)
        p = partitions
        super().__init__(bootstrap, where, Shape(p, p, p, p, p, p, p), engine, batch, p)
        self.copies = copies

    def start_all(self) -> None:
        for role in ROLES:
            for i in range(self.copies):
                self.start(role, None if role == "sketch" else f"{role}-{i}")

    def of(self, role: str) -> list[tuple[subprocess.Popen[bytes], Path]]:
        return [(p, log) for p, log in self.procs if log.name.startswith(f"{role}-")]

    def held(self, role: str) -> list[list[str]] | None:
        """What each copy of ``role`` holds now: the partitions of its last "role assigned"
        line (eager rebalances: each names the whole set); None while a copy has none."""
        sets = []
        for _, log in self.of(role):
            lines = [ln for ln in log.read_text().splitlines() if " role assigned " in ln]
            if not lines:
                return None
            named = lines[-1].split(" role assigned [")[1].split("]")[0]
            sets.append([tp for tp in named.split(", ") if tp])
        return sets

    async def started(self, timeout: float = 300) -> None:
        """Every role consuming, every stage partition taken, each copy holding some (or
        standing by, past the partitions): a
        copy that joins late makes the group move partitions (a restore), which must not
        fall inside the measurement."""
        deadline = time.monotonic() + timeout
        while True:
            check_alive(self.procs)
            ready = True
            for role in ROLES:
                sets = self.held(role)
                want = self.kc.topic_partitions if role == "sketch" else \
                    self.topics.partitions(role)
                # (copies past the partitions, the learner's, stand by with none)
                ready &= (sets is not None and sum(1 for s in sets if s) == min(len(sets), want)
                          and len({tp for s in sets for tp in s}) == want
                          and sum(map(len, sets)) == want)
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
                "align": (t.align_requests, s.align), "passages": (t.passages, s.align),
                "aligned": (t.aligned, s.combine)}

    async def done(self, n_pages: int, applied: Applied, timeout: float = 1800
                   ) -> dict[str, list[Any]]:
        """Once every page is applied by every stage partition (``Applied``) and no topic
        got a record for ``QUIET_S``: the records of each topic between the roles."""
        deadline = time.monotonic() + timeout
        bootstrap = self.kc.bootstrap_servers
        last: dict[str, int] = {}
        since = time.monotonic()
        while True:
            check_alive(self.procs)
            got = {name: await read_topic(bootstrap, topic, n)
                   for name, (topic, n) in self.topic_names().items()}
            # (the combines' UPTO records to the align partitions are not requests)
            got["align"] = [r for r in got["align"] if record_upto(r) is None]
            counts = {name: len(recs) for name, recs in got.items()}
            dead = await read_topic(bootstrap, self.kc.dlq_topic, self.kc.topic_partitions)
            sequenced = sum(SequenceBatch.from_bytes(r.value).n for r in got["batches"])
            if counts != last:
                last, since = counts, time.monotonic()
            elif (sequenced + len(dead) == n_pages and counts["decisions"] == sequenced
                  and await applied.lowest() == sequenced
                  and time.monotonic() - since > QUIET_S):
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"{sequenced} sequenced, {len(dead)} dead, {counts}, "
                                   f"of {n_pages}")
            await asyncio.sleep(0.5)

    def cpu(self) -> dict[str, float]:
        return {role: sum(cpu_seconds(p.pid) for p, _ in self.of(role)) for role in ROLES}


def spied(setup: Setup, profile: Path, copies: int) -> list[subprocess.Popen[bytes]]:
    """A py-spy recorder on every role process (raw collapsed stacks, one file each)."""
    profile.mkdir(parents=True, exist_ok=True)
    spy = Path(sys.executable).with_name("py-spy")
    return [subprocess.Popen([str(spy), "record", "--pid", str(p.pid), "--format", "raw",
                              "--rate", "200", "--nonblocking", "-o",
                              str(profile / f"c{copies}-{log.stem}.txt")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for p, log in setup.procs]


def moves(setup: Setup) -> int:
    """Stage partitions taken so far, in every process (a move after the start: more)."""
    return sum(log.read_text().count(" taken: ") for _, log in setup.procs)


async def measure(bootstrap: str, tmp: Path, pages: list[Any], partitions: int, copies: int,
                  batch: int, warm: int = 0, profile: Path | None = None,
                  engine: str = ENGINE, later: list[Any] | None = None) -> dict[str, Any]:
    """``pages[:warm]`` sent and done first (the roles' first pages load their kernels
    and fill their caches), then the rest measured; then ``later`` sent at half the
    measured rate for the latency and the CPU at that rate (stage_baseline)."""
    setup = Setup(bootstrap, tmp, partitions, copies, batch, engine)
    await ensure_topics(setup.kc, setup.topics.wanted())
    spies: list[subprocess.Popen[bytes]] = []
    applied = Applied(setup)
    try:
        setup.start_all()
        await setup.started()
        await applied.start()  # (after the roles made the changelogs: its metadata
        # request would make them with the broker's default partition count)
        if warm:
            await setup.send(pages[:warm])
            await setup.done(warm, applied)
        taken = moves(setup)
        if profile is not None:
            spies = spied(setup, profile, copies)
            await asyncio.sleep(1)  # (py-spy attaching)
        before, t0 = setup.cpu(), time.monotonic()
        await setup.send(pages[warm:])
        got = await setup.done(len(pages), applied)
        for spy in spies:
            spy.send_signal(signal.SIGINT)  # (it writes its file and exits)
        for spy in spies:
            spy.wait(60)
        seconds = time.monotonic() - t0 - QUIET_S
        after = setup.cpu()
        # what the roles use idle (their turns poll every 200 ms), measured once every
        # stage is done (before the send it would catch their start), taken off below
        await asyncio.sleep(5)
        idle = setup.cpu()
        idle_s = time.monotonic() - t0 - seconds - QUIET_S
        moved = moves(setup) - taken
        latency: dict[Any, float] = {}
        hops: dict[str, float] = {}
        paced: dict[str, float] = {}
        if later:
            earlier = set(await sent_at(setup.kc, setup.kc.topic_partitions))
            before_paced = setup.cpu()
            await send_paced(setup.kc, later, (len(pages) - warm) / seconds / 2)
            late = await setup.done(len(pages) + len(later), applied)
            paced = {r: 1000 * (c - before_paced[r]) / len(later)
                     for r, c in setup.cpu().items()}
            latency = await stage_latencies(setup.kc, late["batches"], late["matches"],
                                            setup.kc.topic_partitions, earlier)
            hops = await hop_latencies(setup.kc, late, setup.kc.topic_partitions, earlier)
    finally:
        stop_all(setup.procs)
        await applied.consumer.stop()
    n = len(pages) - warm
    changelogs = {f"{role} changelog": await read_topic(
        bootstrap, setup.topics.changelog(role), setup.topics.partitions(role))
        for role in ROLES[1:]}
    cpu = {r: after[r] - before[r] - (idle[r] - after[r]) / idle_s * (seconds + QUIET_S)
           for r in ROLES}
    waiting = len({record_ordinal(r) for r in got["align"]})
    published = len({record_ordinal(r) for r in got["matches"]})
    return {"partitions": partitions, "copies": copies, "seconds": seconds, "pages": n,
            "moved": moved,
            "waiting": waiting, "published": published,
            "cpu_ms": {r: 1000 * c / n for r, c in cpu.items()}, "latency": latency, "hops": hops,
            "paced_cpu_ms": paced,
            "idle": {r: 100 * (idle[r] - after[r]) / idle_s for r in ROLES},
            "bytes": {t: sum(len(r.value or b"") for r in recs) / n
                      for t, recs in got.items()},
            "transactions": {role: transactions(changelogs[f"{role} changelog"])
                             / (len(pages) + len(later or []))
                             for role in ROLES[1:]},
            # (keys too: a changelog's key is a store key, often as long as its value)
            "changelog_bytes": {t: sum(len(r.key or b"") + len(r.value or b"")
                                       for r in recs) / n for t, recs in changelogs.items()}}


async def measure_single(bootstrap: str, tmp: Path, pages: list[Any], partitions: int,
                         batch: int, warm: int, engine: str, later: list[Any]
                         ) -> dict[str, Any]:
    """The single worker on the same pages, as ``measure`` does the roles."""
    setup = Setup(bootstrap, tmp, partitions, 0, batch, engine)
    single = SingleWorker(setup.config_path, setup.kc, setup.tmp)
    try:
        await single.started()
        if warm:
            await setup.send(pages[:warm])
            await single.committed(warm)
        before, t0 = single.cpu(), time.monotonic()
        await setup.send(pages[warm:])
        await single.committed(len(pages))
        seconds, after = time.monotonic() - t0, single.cpu()
        await asyncio.sleep(5)
        idle = (single.cpu() - after) / 5
        latency: dict[Any, float] = {}
        paced = float("nan")
        if later:
            earlier = set(await sent_at(setup.kc, setup.kc.topic_partitions))
            before_paced = single.cpu()
            await send_paced(setup.kc, later, (len(pages) - warm) / seconds / 2)
            await single.committed(len(pages) + len(later))
            paced = 1000 * (single.cpu() - before_paced) / len(later)
            latency = await single_latencies(setup.kc, setup.kc.topic_partitions, earlier)
    finally:
        single.stop()
    n = len(pages) - warm
    return {"seconds": seconds, "pages": n, "latency": latency, "hops": {}, "idle": 100 * idle,
            "paced_cpu_ms": paced,
            "cpu_ms": 1000 * (after - before - idle * seconds) / n}


def baseline_table(rows: list[dict[str, Any]], single: dict[str, Any] | None) -> str:
    """The whole topology's CPU per page against the single worker's, and the latencies."""
    lines = ["the whole topology against the single worker (jobs = 1), same pages, same run",
             "| setup | pages/s | CPU ms per page | vs single | at half rate: CPU ms per page "
             "(idle included) | vs single | p50 ms | p99 ms | pages timed |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = single["cpu_ms"] if single else float("nan")
    base_paced = single["paced_cpu_ms"] if single else float("nan")
    for r in ([dict(single, copies=0)] if single else []) + rows:
        cpu = r["cpu_ms"] if r["copies"] == 0 else sum(r["cpu_ms"].values())
        paced = (r["paced_cpu_ms"] if r["copies"] == 0
                 else sum(r["paced_cpu_ms"].values()) or float("nan"))
        p50, p99, timed = percentiles(r["latency"])
        name = "single worker" if r["copies"] == 0 else f"roles, {setup_name(r)}"
        lines.append(f"| {name} | {r['pages'] / r['seconds']:.0f} | {cpu:.2f} | "
                     f"{cpu / base:.2f} | {paced:.2f} | {paced / base_paced:.2f} | {p50:.0f} | "
                     f"{p99:.0f} | {timed} |")
    hopped = [r for r in rows if r["hops"]]
    if hopped:
        names = sorted(hopped[0]["hops"], key=hopped[0]["hops"].__getitem__)
        lines += ["", "p50 ms from a page's input record to its first record on each topic "
                  "(the latency pages)", "| setup | " + " | ".join(names) + " |",
                  "|---|" + "---|" * len(names)]
        lines += [f"| {setup_name(r)} | " + " | ".join(
            f"{r['hops'].get(t, float('nan')):.0f}" for t in names) + " |" for r in hopped]
    return "\n".join(lines)


def transactions(records: list[Any]) -> int:
    """The committed transactions that wrote these changelog records (every turn that
    changed its store writes its changelog): a partition's offsets hold its records and a
    commit marker per transaction, the last one after its last record."""
    last: dict[int, int] = {}
    count: dict[int, int] = {}
    for r in records:
        last[r.partition] = max(last.get(r.partition, -1), r.offset)
        count[r.partition] = count.get(r.partition, 0) + 1
    return sum(last[p] + 2 - count[p] for p in last)


def setup_name(r: dict[str, Any]) -> str:
    return f"{r['partitions']} × {r['copies']}"


def table(rows: list[dict[str, Any]]) -> str:
    roles = list(ROLES)
    lines = [f"CPU ms per page of each role (all its copies; per copy in brackets), "
             f"{rows[0]['pages']} pages; setup: partitions per stage × copies of each role",
             "| setup | pages/s | " + " | ".join(roles) + " | all roles |",
             "|---|---|" + "---|" * (len(roles) + 1)]
    for r in rows:
        c = r["copies"]
        cells = [f"{r['cpu_ms'][role]:.2f} ({r['cpu_ms'][role] / c:.2f})" for role in roles]
        total = sum(r["cpu_ms"].values())
        moved = f" ({r['moved']} partitions moved while measured)" if r["moved"] else ""
        lines.append(f"| {setup_name(r)}{moved} | {r['pages'] / r['seconds']:.0f} | "
                     + " | ".join(cells) + f" | {total:.2f} |")
    lines += ["", "idle CPU of each role (all its copies), % of a core",
              "| setup | " + " | ".join(roles) + " |", "|---|" + "---|" * len(roles)]
    for r in rows:
        lines.append(f"| {setup_name(r)} | " + " | ".join(f"{r['idle'][role]:.1f}"
                                                         for role in roles) + " |")
    stages = list(ROLES[1:])
    lines += ["", "transactions per page of each stage (all its partitions, every page sent; "
              "from the commit markers in its changelog)",
              "| setup | " + " | ".join(stages) + " |", "|---|" + "---|" * len(stages)]
    lines += [f"| {setup_name(r)} | " + " | ".join(f"{r['transactions'][s]:.2f}"
                                                  for s in stages) + " |" for r in rows]
    lines += ["", "pages with align requests and pages with matches published",
              "| setup | with requests | published |", "|---|---|---|"]
    lines += [f"| {setup_name(r)} | {r['waiting']} | {r['published']} |" for r in rows]
    for kind, title in (("bytes", "bytes per page on each topic between the roles (values)"),
                        ("changelog_bytes", "bytes per page written to each stage's "
                                            "changelog (keys and values)")):
        topics = list(rows[0][kind])
        lines += ["", title, "| setup | " + " | ".join(topics) + " | all |",
                  "|---|" + "---|" * (len(topics) + 1)]
        for r in rows:
            lines.append(f"| {setup_name(r)} | "
                         + " | ".join(f"{r[kind][t]:.0f}" for t in topics)
                         + f" | {sum(r[kind].values()):.0f} |")
    return "\n".join(lines)


async def run(args: argparse.Namespace, bootstrap: str, tmp: Path) -> None:
    everything = corpus(args.warm + args.pages + args.latency)
    pages, later = everything[:args.warm + args.pages], everything[args.warm + args.pages:]
    engine = ENGINE + NO_PASSAGES if args.no_passages else ENGINE
    single = None
    if args.single:
        single = await measure_single(bootstrap, tmp, pages, max(args.partitions), args.batch,
                                      args.warm, engine, later)
        print(f"single worker: {single['seconds']:.1f} s", file=sys.stderr)
    rows = []
    for partitions in args.partitions:
        for copies in (c for c in args.copies if c <= partitions):
            rows.append(await measure(bootstrap, tmp, pages, partitions, copies, args.batch,
                                      args.warm, args.profile, engine, later))
            print(f"{setup_name(rows[-1])}: {rows[-1]['seconds']:.1f} s", file=sys.stderr)
    print(table(rows))
    if single or later:
        print("\n" + baseline_table(rows, single))
    if len({r["partitions"] for r in rows}) > 1:
        print("\n" + projection(rows, list(ROLES)))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pages", type=int, default=600)
    p.add_argument("--copies", type=lambda s: [int(x) for x in s.split(",")],
                   default=[1, 2, 4])
    p.add_argument("--partitions", type=lambda s: [int(x) for x in s.split(",")],
                   default=[4], help="partitions of every stage; several: a setup each "
                   "(with each of --copies up to it) and the projection to 10^3 and 10^4 "
                   "pages/s from their difference")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--warm", type=int, default=0,
                   help="pages sent and done before the measured ones")
    p.add_argument("--single", action="store_true",
                   help="the single worker (jobs = 1) on the same pages first: the ratio")
    p.add_argument("--latency", type=int, default=0, metavar="N",
                   help="N more pages sent at half each setup's measured rate: p50/p99 "
                        "from a page's input record to its first match")
    p.add_argument("--bootstrap")
    p.add_argument("--profile", type=Path, help="py-spy every role process into this folder")
    p.add_argument("--no-passages", action="store_true",
                   help="passages off: every page is published at once (no align tasks)")
    args = p.parse_args()
    if min(args.copies) > max(args.partitions):
        p.error("more copies than partitions: the extra copies would stand by")
    return run_with_broker(args.bootstrap, "bench-stage-", lambda b, t: run(args, b, t))


if __name__ == "__main__":
    sys.exit(main())
