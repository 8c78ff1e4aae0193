"""What a combine partition spends per page it owns and per page it does not, with no broker:
each partition of the combine stage (2 by default) fed every input the way its reader would
(turns of ``--turn`` records per input partition), the align role's answers as soon as it
asks. The cost of a page a partition does not own is what every partition pays for every
page (the ledger over all decisions, the ids of every page alive), whatever the partitions:
it bounds the rate of one partition (issue 43, "What bounds a role").

    python -m tests.bench.combine_partition_costs [--pages 200] [--turn 16] [--profile]
        [--rounds 1] [--foreign] [--every 4 --max-pages 3]

The two partitions own different numbers of pages, so a line through their CPU seconds gives
the cost per page owned and per page not owned (noisy on a loaded machine: run it twice).
``--foreign`` takes only pages of ids partition 1 owns: partition 0 owns none, so its CPU per
page is the cost of a page not owned, measured alone. ``--every``/``--max-pages``: the
retention sweeps (the tests' CONFIG sweeps every 4 ordinals down to 3 pages alive).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import random
import sys
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any

from dupalign.config import RetentionConfig
from dupalign.service.roles.stage_align import record_upto
from dupalign.service.roles.stage_combine import CombinePartition
from dupalign.service.topology import encode_aligned, ordinal_header, record_ordinal
from dupalign.stages.directory import directory_owner
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
    cpu0, turns = time.process_time(), 0
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
            if out.topic == harness.TOPICS.align_requests and record_upto(out) is None:
                o = record_ordinal(out)  # (the align role's answer, at once)
                harness._append(log, harness.TOPICS.aligned, c,
                                encode_aligned(o, oracle.passages[o]), [ordinal_header(o)])
        owner.changelog.outgoing()
        turns += 1


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
    args = p.parse_args()
    harness.CONFIG = replace(harness.CONFIG, retention=RetentionConfig(
        max_pages=args.max_pages, every=args.every)).validate()
    pages = corpus(4 * args.pages if args.foreign else args.pages)
    if args.foreign:
        pages = [pg for pg in pages if directory_owner(pg.id, harness.SHAPE.combine) == 1]
    pages = harness._sequenced(pages[:args.pages])
    n = len(pages)
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
