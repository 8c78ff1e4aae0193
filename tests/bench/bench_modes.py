"""Benchmark: the engine in each passage mode (OPH, weighted MonoActive), this checkout next
to a baseline checkout.

The Clough short answers and the RFCs of the shared test data (their first 20 KB),
processed one by one by ``Engine.process`` (one process per checkout and mode, alternating
``--pairs`` times; a checkout's first process may compile its numba kernels, so the best
of the pairs is shown): pages per second, CPU per page, and the number of matches, which
must be equal.

Run: .venv/bin/python -m tests.bench.bench_modes [--pairs 2] [--modes oph,weighted]
     [--baseline DIR | --baseline-rev REV]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def run_engine(mode: str) -> dict[str, float | int | str]:
    """In a child process: every page through one engine in passage mode ``mode``."""
    import dupalign
    from dupalign.config import EngineConfig, PassageConfig
    from dupalign.page import Page
    from dupalign.runtime.engine import Engine
    from tests.role_processes import rfc_pages
    from tests.service.test_worker_kafka import clough_pages

    pages = clough_pages() + rfc_pages(max_bytes=20_000)  # (weighted mode was 0.4 s a page)
    config = EngineConfig(passage=PassageConfig(mode=mode)).validate()  # type: ignore[arg-type]
    work = Path(tempfile.mkdtemp(prefix="bench-modes-"))
    try:
        with Engine.open(work / "store", config) as engine:
            # kernels compiled (or loaded from numba's cache) before the clock starts: a
            # page, a near copy and a page that copies a passage of it
            words = [f"w{(i * 7919) % 1009}" for i in range(600)]
            for n, text in enumerate((words, [*words[:-3], "x", "y", "z"],
                                      [f"v{i}" for i in range(300)] + words[200:500])):
                engine.process(Page(f"warm-up-{n}", " ".join(text)))
            matches = 0
            cpu, wall = time.process_time(), time.perf_counter()
            for page in pages:
                matches += len(engine.process(page))
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"module": dupalign.__file__, "pages": len(pages), "cpu": cpu, "wall": wall,
            "matches": matches}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--modes", default="oph,weighted")
    ap.add_argument("--baseline", type=Path, help="a checkout to compare with")
    ap.add_argument("--baseline-rev", default="main",
                    help="else this revision, checked out in a temporary git worktree")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(run_engine(args.worker)))
        return 0
    # (here, not at the top: the child runs this file in the baseline checkout, which may
    # predate the module)
    from tests.bench.checkouts import REPO, baseline_checkout, run_in

    with baseline_checkout(args.baseline, args.baseline_rev) as baseline:
        print(f"\n## Engine.process per passage mode: baseline {baseline} vs ours {REPO}; "
              f"best of {args.pairs} processes each, alternating")
        head = (f"{'mode':<9} {'side':<9} {'pages':>6} {'pages/s':>8} {'CPU ms/page':>12} "
                f"{'matches':>8}")
        print(head)
        print("-" * len(head))
        for mode in args.modes.split(","):
            rows: dict[str, list[dict[str, float | int | str]]] = {"baseline": [], "ours": []}
            for _ in range(args.pairs):
                rows["baseline"].append(run_in(baseline, HERE, "--worker", mode))
                rows["ours"].append(run_in(REPO, HERE, "--worker", mode))
            cpu = {}
            for side, runs in rows.items():
                best = min(runs, key=lambda r: float(r["cpu"]))
                n = int(best["pages"])
                cpu[side] = float(best["cpu"]) / n
                print(f"{mode:<9} {side:<9} {n:>6} {n / float(best['wall']):>8.1f} "
                      f"{1e3 * cpu[side]:>12.2f} {int(best['matches']):>8}")
            same = len({int(r["matches"]) for runs in rows.values() for r in runs}) == 1
            print(f"{mode:<9} ours / baseline CPU per page: {cpu['ours'] / cpu['baseline']:.2f}"
                  f" ({cpu['baseline'] / cpu['ours']:.2f}x faster)"
                  + ("" if same else "  MATCH COUNTS DIFFER"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
