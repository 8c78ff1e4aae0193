"""What a combine partition spends per page it owns and per page it does not, with no broker:
each partition of the combine stage (2 by default) fed every input the way its reader would
(turns of ``--turn`` records per input partition), the align role's answers as soon as it
asks. The cost of a page a partition does not own is what every partition pays for every
page (the ledger over all decisions, the ids of every page alive), whatever the partitions:
it bounds the rate of one partition (issue 43, "What bounds a role").

    python -m tests.bench.combine_partition_costs [--pages 200] [--turn 16] [--profile]
        [--rounds 1] [--foreign] [--every 4 --max-pages 3] [--shapes 1,4] [--baseline-ref REV]

The two partitions own different numbers of pages, so a line through their CPU seconds gives
the cost per page owned and per page not owned (noisy on a loaded machine: run it twice).
``--foreign`` takes only pages of ids partition 1 owns: partition 0 owns none, so its CPU per
page is the cost of a page not owned, measured alone. ``--every``/``--max-pages``: the
retention sweeps (the tests' CONFIG sweeps every 4 ordinals down to 3 pages alive).

``--shapes 1,4``: every stage at 1, then at 4 partitions (the broker bench's ``--partitions
1,4``: a page then has 4 near answers and 4 list partials), all combine partitions summed;
the fixed cost a partition is (CPU at the most − at 1) / (most − 1), per page of the stream,
as bench_stage_roles' projection models it (per-partition work on every page, and the work
of a page that grows with the partitions upstream). ``--turn 100000``: every input in one
turn, a backlog's. ``--baseline-ref REV``: the same ``--shapes`` measure of a warmed checkout
of REV (tests/bench/checkouts.py) and of this tree, each in a child process, alternately
``--rounds`` times, the least CPU of each kept.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import json
import pstats
import random
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

from dupalign.config import RetentionConfig
from dupalign.service.roles.stage_align import record_upto
from dupalign.service.roles.stage_combine import CombinePartition
from dupalign.service.stage_topics import StageTopics
from dupalign.service.topology import encode_aligned, ordinal_header, record_ordinal
from dupalign.stages.directory import directory_owner
from dupalign.stages.partitioned import Shape
from tests.bench.bench_worker import corpus
from tests.reused_stores import temporary_stores
from tests.service import test_stage_combine as harness
from tests.service.test_stage_partitions import Owner, _Tp


def run_partition(c: int, log: Any, oracle: Any, stores: Any, turn: int) -> tuple[float, int]:
    """CPU seconds of combine partition ``c`` over the whole log, and its turns (the log
    as given: the align answers go to a copy)."""
    log = defaultdict(list, {k: list(v) for k, v in log.items()})
    owner = Owner(f"c{c}", functools.partial(CombinePartition, harness.TOPICS, c,
                                             config=harness.CONFIG), stores)
    cpu0, turns, answered = time.process_time(), 0, set()
    while True:
        fetched = {}
        for (topic, p), at in owner.read.items():
            chunk = log.get((topic, p), [])[at:at + turn]
            if chunk:
                fetched[_Tp(topic, p)] = chunk
                owner.read[(topic, p)] = at + len(chunk)
        if not fetched:
            return time.process_time() - cpu0, turns
        for out in owner.part.turn(fetched):
            if (out.topic == harness.TOPICS.align_requests and record_upto(out) is None
                    and record_ordinal(out) not in answered):
                o = record_ordinal(out)  # (the align role's answer, at once: one whole
                answered.add(o)  # answer for a request in parts, which the combine takes)
                harness._append(log, harness.TOPICS.aligned, c,
                                encode_aligned(o, oracle.passages[o]), [ordinal_header(o)])
        owner.changelog.outgoing()
        turns += 1


def shaped(n: int) -> None:
    """The harness's shape: every stage at ``n`` partitions."""
    harness.SHAPE = Shape(n, n, n, n, n, n, n)
    harness.TOPICS = StageTopics(harness.KC, harness.SHAPE)


def measure(args: argparse.Namespace) -> tuple[int, list[tuple[int, int, int, float]]]:
    """The pages, and (partition, pages owned, turns, least CPU seconds) of each combine
    partition of the harness's shape."""
    pages = corpus(4 * args.pages if args.foreign else args.pages)
    if args.foreign:
        pages = [pg for pg in pages if directory_owner(pg.id, harness.SHAPE.combine) == 1]
    pages = harness._sequenced(pages[:args.pages])
    rows = []
    with temporary_stores("combine-costs-") as stores:
        oracle = harness.Oracle(stores, pages)
        log = harness.inputs(pages, oracle, random.Random(1))
        for c in range(harness.SHAPE.combine):
            prof = cProfile.Profile() if args.profile else None
            if prof:
                prof.enable()
            runs = [run_partition(c, log, oracle, stores, args.turn) for _ in range(args.rounds)]
            cpu, turns = min(runs)
            if prof:
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(45)
            owned = sum(directory_owner(pg.id, harness.SHAPE.combine) == c for pg in pages)
            rows.append((c, owned, turns, cpu))
    return len(pages), rows


def shapes(args: argparse.Namespace) -> dict[int, float]:
    """CPU ms per page of the stream of all combine partitions, at each of ``--shapes``."""
    out = {}
    for n in args.shapes:
        shaped(n)
        pages, rows = measure(args)
        out[n] = 1000 * sum(r[3] for r in rows) / pages
    return out


def fixed_table(by_code: dict[str, dict[int, float]], counts: list[int]) -> str:
    top = max(counts)
    lines = ["| code | " + " | ".join(f"{n} partitions" for n in counts)
             + " | fixed ms a partition | bound pages/s at half a core |",
             "|---" * (len(counts) + 3) + "|"]
    for label, ms in by_code.items():
        fixed = (ms[top] - ms[min(counts)]) / (top - min(counts))
        lines.append(f"| {label} | " + " | ".join(f"{ms[n]:.3f}" for n in counts)
                     + f" | {fixed:.3f} | {500 / fixed if fixed > 0 else float('inf'):,.0f} |")
    return "\n".join(lines)


def compare(args: argparse.Namespace) -> None:
    """``--baseline-ref``: both trees in child processes, alternately (module docstring)."""
    from tests.bench.checkouts import REPO, commit_of, run_in, warm_checkout

    trees = {f"{args.baseline_ref} ({commit_of(args.baseline_ref)[:7]})":
             warm_checkout(args.baseline_ref), f"this ({commit_of('HEAD')[:7]}+)": REPO}
    child = ["--child", "--pages", str(args.pages), "--turn", str(args.turn), "--every",
             str(args.every), "--max-pages", str(args.max_pages), "--shapes",
             ",".join(map(str, args.shapes))]
    best: dict[str, dict[int, float]] = {label: {} for label in trees}
    for k in range(args.rounds):  # (alternately, the order turned each round)
        for label, tree in (list(trees.items()) if k % 2 == 0 else
                            list(reversed(trees.items()))):
            for n, ms in run_in(tree, Path(__file__), *child)["ms"].items():
                got = best[label]
                got[int(n)] = min(got.get(int(n), float("inf")), ms)
    print(f"{args.pages} pages (Clough + RFC), turns of {args.turn} records per input "
          f"partition, sweeps every {args.every} ordinals to {args.max_pages} pages; CPU ms per "
          f"page of all combine partitions, least of {args.rounds} rounds")
    print(fixed_table(best, args.shapes))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pages", type=int, default=200)
    p.add_argument("--turn", type=int, default=16, help="records per input partition a turn")
    p.add_argument("--profile", action="store_true", help="cProfile each partition's run")
    p.add_argument("--rounds", type=int, default=1,
                   help="runs of each partition (the least CPU is kept: a loaded machine)")
    p.add_argument("--foreign", action="store_true",
                   help="only pages partition 1 owns (partition 0: pages not owned alone)")
    p.add_argument("--every", type=int, default=harness.CONFIG.retention.every,
                   help="ordinals between retention sweeps")
    p.add_argument("--max-pages", type=int, default=harness.CONFIG.retention.max_pages,
                   help="pages alive after a sweep (0: no sweeps)")
    p.add_argument("--shapes", type=lambda s: [int(x) for x in s.split(",")],
                   help="partitions of every stage, several: the fixed cost (docstring)")
    p.add_argument("--baseline-ref", help="also this revision, side by side (docstring)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    harness.CONFIG = replace(harness.CONFIG, retention=RetentionConfig(
        max_pages=args.max_pages, every=args.every)).validate()
    if args.baseline_ref:
        if not args.shapes or args.foreign:
            p.error("--baseline-ref measures --shapes (without --foreign)")
        compare(args)
        return 0
    if args.shapes:
        ms = shapes(args)
        if args.child:  # (one JSON line: ``checkouts.run_in``)
            import dupalign

            print(json.dumps({"module": dupalign.__file__, "ms": ms}))
            return 0
        print(f"{args.pages} pages (Clough + RFC), turns of {args.turn} records per input "
              f"partition; CPU ms per page of all combine partitions")
        print(fixed_table({"this": ms}, args.shapes))
        return 0
    n, rows = measure(args)
    print(f"{n} pages (Clough + RFC{', ids of partition 1 only' if args.foreign else ''}), "
          f"{harness.SHAPE.combine} combine partitions, turns of {args.turn} records per input "
          f"partition, sweeps every {args.every} ordinals to {args.max_pages} pages")
    print("| partition | pages owned | turns | CPU ms per page of the stream |")
    print("|---|---|---|---|")
    for c, owned, turns, cpu in rows:
        print(f"| {c} | {owned} | {turns} | {1000 * cpu / n:.3f} |")
    (_, o0, _, c0), (_, o1, _, c1) = rows[0], rows[-1]
    if o0 == 0:
        print(f"\nper page not owned {1000 * c0 / n:.3f} ms (partition 0 owns none)")
    elif o0 != o1:
        per_owned = (c1 - c0) / (o1 - o0)
        per_other = (c0 - o0 * per_owned) / n
        print(f"\nper page owned {1000 * (per_owned + per_other):.3f} ms, per page not owned "
              f"{1000 * per_other:.3f} ms (a line through the partitions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
