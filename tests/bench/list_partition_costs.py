"""What a list partition spends per page, with no broker, at S = 1 and more list partitions:
the stage sketch role's records of the Clough + RFC pages (its ``prepare``), the directory and
exact partitions run on them, then each list partition given all its inputs at once (a
backlog's turn: the cost at saturation) and timed with ``time.process_time``. What grows
with S in the sum over the partitions is per-partition work on every page (issue 43).

    python -m tests.bench.list_partition_costs [--pages 400] [--lists 1,4] [--rounds 1] [--profile]
        [--baseline-ref REV]

``--profile``: cProfile of the list partitions' turns at each S (inclusive time).
``--baseline-ref REV``: the same measure of a warmed checkout of REV (tests/bench/checkouts.py)
and of this tree, each in a child process, alternately ``--rounds`` times (the least CPU of
each kept), side by side with the fixed cost a partition, (CPU at the most S − at S = 1) /
(S − 1), and the projection's bound at half a core a partition (500 / fixed pages/s).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition

from dupalign.config import EngineConfig
from dupalign.service.config import Config
from dupalign.service.roles.stage_directory import DirectoryPartition
from dupalign.service.roles.stage_exact import ExactPartition
from dupalign.service.roles.stage_lists import ListsPartition
from dupalign.service.roles.stage_role import StagePartition
from dupalign.service.roles.stage_sketch import StageSketchRole
from dupalign.service.sequence_batch import SequenceBatch, page_header
from dupalign.service.stage_topics import StageTopics
from dupalign.stages.partitioned import Shape
from dupalign.wire import messages
from tests.bench.bench_worker import corpus
from tests.reused_stores import temporary_stores

Log = dict[tuple[str, int], list[Any]]


def _record(topic: str, partition: int, offset: int, value: bytes, headers: list[Any]
            ) -> Any:
    return SimpleNamespace(topic=topic, partition=partition, offset=offset, value=value,
                           headers=headers, key=None)


def sketched(config: Config, shape: Shape, pages: list[Any], batch: int) -> Log:
    """The sequence, entries and windows the stage sketch role sends for ``pages`` in
    batches of ``batch``, in order."""
    role = StageSketchRole(config, shape)
    topics = StageTopics(config.kafka, shape)
    tp = TopicPartition("pages", 0)
    recs = [SimpleNamespace(topic="pages", partition=0, offset=o, key=p.id.encode("utf-8"),
                            value=messages.encode_page(p), headers=[])
            for o, p in enumerate(pages)]
    log: Log = {}

    def append(topic: str, partition: int, value: bytes, headers: list[Any]) -> None:
        part = log.setdefault((topic, partition), [])
        part.append(_record(topic, partition, len(part), value, headers))

    for b, at in enumerate(range(0, len(recs), batch)):
        out = role.prepare(tp, recs[at:at + batch])
        seq = SequenceBatch(tp.topic, tp.partition, tuple(out.offsets), tuple(out.dirs),
                            shape.directory, 1_000 * b, tuple(bool(w) for w in out.lists))
        append(topics.batches, 0, seq.to_bytes(), [])
        for i, entry in enumerate(out.entries):
            for o in [entry, *out.lists[i]]:
                o.headers = [page_header(b, i)]
        for o in role.outgoing(out):
            if o.topic in (topics.entries, topics.windows):
                append(o.topic, o.partition or 0, o.value or b"", o.headers)
    return log


def feed(part: StagePartition, log: Log, read: dict[tuple[str, int], int]) -> list[Any]:
    """One turn of ``part`` on every record of its inputs not given yet; its outputs."""
    fetched = {}
    for tp in part.positions():
        key = (tp.topic, tp.partition)
        recs = log.get(key, [])[read.get(key, 0):]
        if recs:
            fetched[tp] = recs
            read[key] = read.get(key, 0) + len(recs)
    return part.turn(fetched)


def run(engine: EngineConfig, shape: Shape, log: Log, stores: Any,
        profile: cProfile.Profile | None) -> tuple[float, int]:
    """The directory and exact partitions to the end, then the list partitions' turns
    timed: their CPU seconds (summed) and the partials they sent."""
    topics = StageTopics(Config().kafka, shape)
    log = {k: list(v) for k, v in log.items()}

    def make(cls: Any, name: str, n: int) -> list[StagePartition]:
        return [cls(topics, k, stores.store(f"{name}{k}", engine.frozen_params()), engine)
                for k in range(n)]

    def drive(parts: list[StagePartition]) -> int:
        reads: list[dict[tuple[str, int], int]] = [{} for _ in parts]
        sent = 0
        while True:
            outs = [o for part, read in zip(parts, reads, strict=True)
                    for o in feed(part, log, read)]
            if not outs:
                return sent
            sent += len(outs)
            for o in outs:
                part = log.setdefault((o.topic, o.partition or 0), [])
                part.append(_record(o.topic, o.partition or 0, len(part), o.value or b"",
                                    o.headers))

    drive(make(DirectoryPartition, "dir", shape.directory))
    drive(make(ExactPartition, "exact", shape.exact))
    lists = make(ListsPartition, "lists", shape.lists)
    if profile:
        profile.enable()
    cpu = time.process_time()
    sent = drive(lists)
    cpu = time.process_time() - cpu
    if profile:
        profile.disable()
    return cpu, sent


def measure(n_pages: int, counts: list[int], batch: int, rounds: int, profile: bool
            ) -> list[tuple[int, float, int]]:
    """(S, CPU seconds of the list partitions, partials sent) for each S of ``counts``,
    the least CPU of ``rounds`` runs each."""
    config = Config()
    engine = config.engine
    pages = corpus(n_pages)
    rows: list[tuple[int, float, int]] = []
    for s in [1, *counts]:  # (the first, on a few pages, loads the kernels: not counted)
        shape = Shape(2, 2, 1, s, 2)
        log = sketched(replace(config, engine=engine), shape, pages if rows else pages[:40],
                       batch)
        runs = []
        for _ in range(rounds if rows else 1):
            prof = cProfile.Profile(time.process_time) if profile and rows else None
            with temporary_stores("list-costs-") as stores:
                runs.append((*run(engine, shape, log, stores, prof), prof))
        cpu, sent, prof = min(runs, key=lambda r: r[0])
        rows.append((s, cpu, sent))
        if prof:
            print(f"== {s} list partitions")
            pstats.Stats(prof).sort_stats("tottime").print_stats(80)
    return rows[1:]


def compare(args: argparse.Namespace) -> None:
    """``--baseline-ref``: both trees in child processes, alternately (module docstring)."""
    from tests.bench.checkouts import REPO, commit_of, run_in, warm_checkout

    trees = {f"{args.baseline_ref} ({commit_of(args.baseline_ref)[:7]})":
             warm_checkout(args.baseline_ref), f"this ({commit_of('HEAD')[:7]}+)": REPO}
    best: dict[tuple[str, int], float] = {}
    child = ["--child", "--pages", str(args.pages), "--lists",
             ",".join(map(str, args.lists)), "--batch", str(args.batch)]
    for _ in range(args.rounds):
        for label, tree in trees.items():
            for s, cpu, _ in run_in(tree, Path(__file__), *child)["rows"]:
                best[(label, s)] = min(best.get((label, s), float("inf")), cpu)
    n, top = args.pages, max(args.lists)
    print(f"{n} pages (Clough + RFC); CPU ms per page of all list partitions, least of "
          f"{args.rounds} rounds; fixed a partition: (S{top} - S1) / {top - 1}")
    print("| code | " + " | ".join(f"S = {s}" for s in args.lists)
          + " | fixed per partition | bound pages/s |")
    print("|---" * (len(args.lists) + 3) + "|")
    for label in trees:
        ms = {s: 1000 * best[(label, s)] / n for s in args.lists}
        fixed = (ms[top] - ms[1]) / (top - 1) if 1 in ms and top > 1 else float("nan")
        print(f"| {label} | " + " | ".join(f"{ms[s]:.2f}" for s in args.lists)
              + f" | {fixed:.3f} | {500 / fixed if fixed > 0 else float('inf'):,.0f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pages", type=int, default=400)
    p.add_argument("--lists", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--rounds", type=int, default=1,
                   help="runs of each S (the least CPU is kept: a loaded machine)")
    p.add_argument("--baseline-ref", help="also this revision, side by side (docstring)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.baseline_ref:
        compare(args)
        return 0
    rows = measure(args.pages, args.lists, args.batch, 1 if args.child else args.rounds,
                   args.profile)
    if args.child:  # (one JSON line: ``checkouts.run_in``)
        import dupalign

        print(json.dumps({"module": dupalign.__file__, "rows": rows}))
        return 0
    n = args.pages
    print(f"{n} pages (Clough + RFC), all inputs of each list partition in one turn")
    print("| list partitions | partials sent | CPU ms per page (all partitions) | per partition |")
    print("|---|---|---|---|")
    for s, cpu, sent in rows:
        print(f"| {s} | {sent} | {1000 * cpu / n:.3f} | {1000 * cpu / n / s:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
