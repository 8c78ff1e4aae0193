"""Benchmark: removing pages from the simhash table as a crawl deletes and revises them.

Ours: ``SimhashTable.remove`` (a tombstone per row, found by its fingerprint; tombstones
merged away with the buffer). Baseline: the rows dropped at once, the way the table did
before (``np.isin`` over every ordinal, the arrays compacted, the directory rebuilt: O(n)
a page). Tables of random fingerprints; ``--removals`` pages removed one call each (a
revisit or a delete removes one page), ms per removed page (the baseline timed on fewer
removals at large sizes: each costs the same). Both tables must end with the same rows.

Run: .venv/bin/python -m tests.bench.bench_removal [--sizes 1e6,1e7,5e7] [--removals 20000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dupalign.near.simhash_table import SimhashTable


def drop_at_once(table: SimhashTable, ordinals: list[int]) -> None:
    """The baseline: rebuild the sorted arrays without the pages' rows."""
    keep = ~np.isin(table.ordinals, np.array(ordinals, dtype=np.int64))
    table.fps = np.ascontiguousarray(table.fps[keep])
    table.ordinals = np.ascontiguousarray(table.ordinals[keep])
    table.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e6,1e7,5e7")
    ap.add_argument("--removals", type=int, default=20000)
    args = ap.parse_args()
    head = (f"{'rows':>12} {'removals':>9} {'ours ms/page':>12} {'baseline ms/page':>16} "
            f"{'speed-up':>9} {'same rows':>9}")
    print(head)
    print("-" * len(head))
    for n in (int(float(x)) for x in args.sizes.split(",")):
        rng = np.random.default_rng(0)
        fps = np.sort(rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64))
        order = rng.permutation(n)[:args.removals]
        ours = SimhashTable.from_arrays(fps, np.arange(n), ordered=True)
        t = time.perf_counter()
        for i in order.tolist():
            ours.remove([fps[i]], [i])
        ms_ours = 1000 * (time.perf_counter() - t) / len(order)
        base = SimhashTable.from_arrays(fps, np.arange(n), ordered=True)
        timed = order[:max(5, min(len(order), 2 * 10**8 // n))]
        t = time.perf_counter()
        for i in timed.tolist():
            drop_at_once(base, [i])
        ms_base = 1000 * (time.perf_counter() - t) / len(timed)
        drop_at_once(base, order[len(timed):].tolist())  # the rest in one call, untimed
        ours.flush()
        same = np.array_equal(ours.fps, base.fps) and np.array_equal(ours.ordinals,
                                                                        base.ordinals)
        print(f"{n:>12,} {len(order):>9,} {ms_ours:>12.3f} {ms_base:>16.2f} "
              f"{ms_base / ms_ours:>8.0f}x {'yes' if same else 'NO':>9}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
