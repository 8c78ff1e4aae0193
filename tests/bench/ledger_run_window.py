"""What a stage partition's runs of pages it does not own cost against the backlog of a turn
(``LedgerSteps.run``): a partition of P that owns every P-th page asks for a run at each of
its own, over a turn whose sequence holds ``--backlog`` ordinals (a backlog's turn), in
batches of ``--batch`` pages. The run read the sequence 10,000 ordinals ahead each time
(``--window 1000000`` gives that again); it now reads windows that double from
``RUN_WINDOW``.

    python -m tests.bench.ledger_run_window [--backlog 400,2000,10000] [--batch 32] [--parts 4]
"""

from __future__ import annotations

import argparse
import sys
import time

from dupalign.config import EngineConfig
from dupalign.service.config import KafkaConfig
from dupalign.service.roles import stage_ledger
from dupalign.service.roles.stage_ledger import LedgerSteps
from dupalign.service.roles.stage_role import StagePartition
from dupalign.service.sequence_batch import SequenceBatch
from dupalign.service.stage_topics import StageTopics
from dupalign.stages.directory import Decision
from dupalign.stages.partitioned import Shape
from tests.reused_stores import temporary_stores


def walk(n: int, batch: int, parts: int) -> float:
    """CPU seconds of one partition's steps over ``n`` ordinals: a run of the others' pages,
    then its own page one by one (``next``), to the end."""
    with temporary_stores("ledger-run-window-") as stores:
        part = StagePartition(StageTopics(KafkaConfig(), Shape(1, 1, 1, 1, parts)), 0,
                              stores.store("p", {"p": 1}))
        steps = LedgerSteps(part, EngineConfig(), part.store)
        for b, at in enumerate(range(0, n, batch)):
            size = min(batch, n - at)
            part.seq.add(b, SequenceBatch("pages", 0, tuple(range(size)), (0,) * size, 1, 0))
        for o in range(n):
            steps.decisions.add(0, o, o, Decision(o, f"d{o}", "unchanged").to_bytes())
        cpu = time.process_time()
        while steps.next_seq < n:
            if steps.run(lambda f: int(f["id"][1:]) % parts != 0) is None:
                assert steps.next() is not None  # (its own page)
        return time.process_time() - cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backlog", type=lambda s: [int(x) for x in s.split(",")],
                   default=[400, 2000, 10000])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--parts", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    windows = {"10,000 ahead (before)": 1_000_000, "doubling (now)": stage_ledger.RUN_WINDOW}
    print(f"one partition of {args.parts} (a run at each of its pages), sequence batches of "
          f"{args.batch}; CPU µs a page of the stream, least of {args.rounds}")
    print("| backlog (ordinals in the turn) | " + " | ".join(windows) + " | ratio |")
    print("|---|---|---|---|")
    for n in args.backlog:
        got = []
        for window in windows.values():
            stage_ledger.RUN_WINDOW = window
            got.append(min(walk(n, args.batch, args.parts) for _ in range(args.rounds)))
        print(f"| {n:,} | " + " | ".join(f"{1e6 * t / n:.1f}" for t in got)
              + f" | {got[0] / got[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
