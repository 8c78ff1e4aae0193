"""The partitioned pipeline's stage roles on a real broker (docs/pipeline.md, "Roles on
Kafka"): CPU per page of each role with 1, 2 and 4 copies, and bytes per page on each
topic between them (issue 43, deliver 6).

    python -m tests.bench.bench_stage_roles [--pages 600] [--copies 1,2,4] [--partitions 4]
        [--batch 32] [--warm 0] [--single] [--latency N] [--bootstrap H:P] [--profile DIR]
        [--no-passages] [--backlog]

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
``--backlog``: beside each setup, the same pages as a backlog (tests/bench/stage_backlog.py):
all in the input topic first, then the stages one group at a time in upstream order, each
until it has applied every page: each role's CPU and transactions per page at saturation,
beside the burst's and the single worker's, and the projection from them. Also printed for
every setup: the pages each committed turn of each stage applied (tests/bench/stage_turns.py).
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
from pathlib import Path
from typing import Any

from dupalign.service.topology import ensure_topics, record_ordinal
from tests.bench.bench_worker import corpus, run_with_broker
from tests.bench.stage_backlog import backlog_table, measure_backlog
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
from tests.bench.stage_setup import (
    ENGINE,
    NO_PASSAGES,
    QUIET_S,
    ROLES,
    Applied,
    Setup,
    changelogs,
    moves,
    spied,
    turns,
)
from tests.bench.stage_turns import turns_table
from tests.role_processes import stop_all


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
        since = await applied.lowest()  # (the ordinals of the pages measured: from here)
        taken = moves(setup)
        if profile is not None:
            spies = spied(setup.procs, profile, f"c{copies}")
            await asyncio.sleep(1)  # (py-spy attaching)
        before, t0 = setup.cpu(), time.monotonic()
        await setup.send(pages[warm:])
        got = await setup.done(len(pages), applied)
        until = await applied.lowest()
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
    logs = await changelogs(setup)
    turned = turns(logs, got["batches"], since, until)
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
            "turns": turned,
            "transactions": {role: len(turned[role]) / n for role in ROLES[1:]},
            # (keys too: a changelog's key is a store key, often as long as its value)
            "changelog_bytes": {f"{t} changelog": sum(len(r.key or b"") + len(r.value or b"")
                                                      for r in recs) / n
                                for t, recs in logs.items()}}


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
    lines += ["", "transactions per page of each stage (all its partitions, the pages measured; "
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
    rows, backlog = [], []
    for partitions in args.partitions:
        for copies in (c for c in args.copies if c <= partitions):
            rows.append(await measure(bootstrap, tmp, pages, partitions, copies, args.batch,
                                      args.warm, args.profile, engine, later))
            print(f"{setup_name(rows[-1])}: {rows[-1]['seconds']:.1f} s", file=sys.stderr)
            if args.backlog:
                backlog.append(await measure_backlog(bootstrap, tmp, pages, partitions,
                                                     copies, args.batch, args.warm, engine,
                                                     args.profile))
                print(f"{setup_name(backlog[-1])} backlog: {backlog[-1]['seconds']:.1f} s",
                      file=sys.stderr)
    print(table(rows))
    print("\n" + turns_table([(f"{setup_name(r)} {r.get('mode', 'burst')}", r["turns"])
                              for r in rows + backlog]))
    if single or later:
        print("\n" + baseline_table(rows, single))
    if backlog:
        print("\n" + backlog_table(rows + backlog, single))
    if len({r["partitions"] for r in rows}) > 1:
        print("\n" + projection(rows, list(ROLES)))
        if backlog:
            print("\nat saturation (the backlog's costs): "
                  + projection(backlog, list(ROLES)))
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
    p.add_argument("--backlog", action="store_true",
                   help="beside each setup, the same with every page in the input first and "
                        "the stages run one group at a time (tests/bench/stage_backlog.py)")
    p.add_argument("--no-passages", action="store_true",
                   help="passages off: every page is published at once (no align tasks)")
    args = p.parse_args()
    if min(args.copies) > max(args.partitions):
        p.error("more copies than partitions: the extra copies would stand by")
    return run_with_broker(args.bootstrap, "bench-stage-", lambda b, t: run(args, b, t))


if __name__ == "__main__":
    sys.exit(main())
