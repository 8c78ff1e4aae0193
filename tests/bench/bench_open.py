"""Benchmark: start-up of a large store, this checkout next to a baseline checkout.

The engine loads the simhash table (one fingerprint and ordinal per page) into memory when
it opens a store. A store of ``--pages`` fingerprints is written once (random fingerprints,
the ``simhash`` family only), then each checkout, in its own process (one ``dupalign`` per
process), alternating ``--pairs`` times, builds ``NearIndex`` over it: wall seconds, then
(a second load, traced: tracemalloc slows it) the peak Python heap, numpy's arrays included.

Run: .venv/bin/python -m tests.bench.bench_open [--pages 2e6] [--pairs 2]
     [--baseline DIR | --baseline-rev REV]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()


def make_store(path: Path, pages: int) -> None:
    from dupalign.config import EngineConfig
    from dupalign.runtime.engine import Engine
    from dupalign.store.keys import u64

    with Engine.open(path, EngineConfig().validate()) as engine:
        fps = np.random.default_rng(0).integers(0, 2**63, pages, dtype=np.int64).tolist()
        for at in range(0, pages, 100_000):
            part = fps[at:at + 100_000]
            batch = engine.store.batch()
            batch.put_many("simhash", [u64(f) + u64(o) for o, f in enumerate(part, at)],
                           [b""] * len(part))
            engine.store.write(batch)


def load(path: Path) -> dict[str, float | str]:
    """In a child process: NearIndex over the store, timed, its heap traced."""
    import dupalign
    from dupalign.config import EngineConfig
    from dupalign.near.index import NearIndex
    from dupalign.store.database import Store

    config = EngineConfig().validate()
    store = Store(path, {}, read_only=True)  # a reader takes the store's parameters
    t = time.perf_counter()
    NearIndex(store, config, 0)
    wall = time.perf_counter() - t
    tracemalloc.start()  # a second load, traced (tracemalloc slows it)
    near = NearIndex(store, config, 0)
    peak = tracemalloc.get_traced_memory()[1]
    rows = len(near.table.fps)
    store.close()
    return {"module": dupalign.__file__, "wall": wall, "peak_mb": peak / 2**20, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=float, default=2e6)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--baseline", type=Path, help="a checkout to compare with")
    ap.add_argument("--baseline-rev", default="main",
                    help="else this revision, checked out in a temporary git worktree")
    ap.add_argument("--load-worker", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.load_worker:
        print(json.dumps(load(args.load_worker)))
        return 0
    pages = int(args.pages)
    # (here, not at the top: the child runs this file in the baseline checkout, which may
    # predate the module)
    from tests.bench.checkouts import REPO, baseline_checkout, run_in

    work = Path(tempfile.mkdtemp(prefix="bench-open-"))
    try:
        with baseline_checkout(args.baseline, args.baseline_rev) as baseline:
            make_store(work / "store", pages)
            rows: dict[str, list[dict[str, float | str]]] = {"baseline": [], "ours": []}
            for _ in range(args.pairs):
                for side, checkout in (("baseline", baseline), ("ours", REPO)):
                    rows[side].append(run_in(checkout, HERE, "--load-worker",
                                             str(work / "store")))
        print(f"\n## Loading the simhash table of {pages:,} pages: baseline {baseline} vs "
              f"ours {REPO}; best of {args.pairs} processes each, alternating")
        head = f"{'side':<9} {'seconds':>8} {'peak heap MB':>12} {'bytes/page':>10} {'rows':>10}"
        print(head)
        print("-" * len(head))
        for side, runs in rows.items():
            wall = min(float(r["wall"]) for r in runs)
            peak = min(float(r["peak_mb"]) for r in runs)
            print(f"{side:<9} {wall:>8.2f} {peak:>12.0f} {peak * 2**20 / pages:>10.0f} "
                  f"{int(runs[0]['rows']):>10,}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
