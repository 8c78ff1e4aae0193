"""One retention sweep's pages (``Ledger.expired``) on a ledger of ``--slots`` pages, side
by side with the scan of every used slot it replaced (tests/stages/test_ledger_sweep.py's
``scanned``): a crawl at its ``max_pages`` bound, where each sweep takes the few pages that
arrived since the last, and a tenth of the slots dead (versions replaced), spread evenly.

    python -m tests.bench.ledger_sweep [--slots 1000000] [--rounds 200]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from dupalign.stages.ledger import Expired, Ledger
from tests.stages.test_ledger_sweep import scanned


def filled(slots: int) -> Ledger:
    """``slots`` pages stored, every tenth one's slot dead (its page replaced)."""
    ledger = Ledger(slots=slots)
    ordinals = np.arange(slots, dtype=np.int64)
    ledger._seq[:slots], ledger._ordinal[:slots] = ordinals, ordinals
    ledger._fetched[:slots], ledger._live[:slots] = ordinals, ordinals % 10 != 5
    ledger._used, ledger._alive = slots, int(ledger._live[:slots].sum())
    ledger.next_ordinal = ledger.next_seq = slots
    return ledger


def per_sweep(expired: Callable[[Ledger, int], list[Expired]], slots: int, rounds: int,
              leaving: int) -> float:
    """Seconds of CPU a sweep (its pages found, then removed) at the ``max_pages`` bound
    with ``leaving`` pages over it."""
    ledger = filled(slots)
    total = 0.0
    for _ in range(rounds):
        bound = ledger.alive - leaving
        c0 = time.process_time()
        gone = expired(ledger, bound)
        total += time.process_time() - c0
        assert len(gone) == leaving
        ledger.remove(gone)
    return total / rounds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--slots", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=200)
    args = p.parse_args()
    ways: dict[str, Callable[[Ledger, int], list[Expired]]] = {
        "scan of every slot": lambda ledger, bound: scanned(ledger, bound, 0, 0),
        "Ledger.expired": lambda ledger, bound: ledger.expired(bound, 0, 0),
    }
    print(f"{args.slots:,} slots, {args.rounds} sweeps a row, CPU ms a sweep\n")
    print(f"| {'pages leaving':>13} | " + " | ".join(f"{w:>18}" for w in ways) + " |")
    print("|" + "---:|" * (len(ways) + 1))
    for leaving in (0, 10, 1000):
        ms = [per_sweep(way, args.slots, args.rounds, leaving) * 1e3 for way in ways.values()]
        print(f"| {leaving:>13} | " + " | ".join(f"{m:>18.3f}" for m in ms) + " |")


if __name__ == "__main__":
    main()
