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
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]


def run_engine(mode: str) -> dict[str, float | int | str]:
    """In a child process: every page through one engine in passage mode ``mode``."""
    import dupalign
    from dupalign.config import EngineConfig, PassageConfig
    from dupalign.engine import Engine
    from dupalign.page import Page
    from tests.test_worker_kafka import clough_pages
    from tests.topology_harness import rfc_pages

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


def run_in(checkout: Path, mode: str) -> dict[str, float | int | str]:
    # (the shared test data beside this checkout: a temporary worktree has none beside it)
    env = dict(os.environ, PYTHONPATH=str(checkout),
               DUPALIGN_SHARED=os.environ.get("DUPALIGN_SHARED", str(REPO.parent / "shared")))
    res = subprocess.run([sys.executable, str(HERE), "--worker", mode], env=env,
                         cwd=str(checkout), check=True, capture_output=True, text=True)
    out: dict[str, float | int | str] = json.loads(res.stdout.strip().splitlines()[-1])
    if not str(out["module"]).startswith(str(checkout)):
        raise SystemExit(f"{checkout}: imported {out['module']} instead")
    return out


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
    work = Path(tempfile.mkdtemp(prefix="bench-modes-"))
    baseline, tree = args.baseline, None
    try:
        if baseline is None:
            tree = work / "tree"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree),
                            args.baseline_rev], check=True, capture_output=True)
            baseline = tree
        print(f"\n## Engine.process per passage mode: baseline {baseline} vs ours {REPO}; "
              f"best of {args.pairs} processes each, alternating")
        head = (f"{'mode':<9} {'side':<9} {'pages':>6} {'pages/s':>8} {'CPU ms/page':>12} "
                f"{'matches':>8}")
        print(head)
        print("-" * len(head))
        for mode in args.modes.split(","):
            rows: dict[str, list[dict[str, float | int | str]]] = {"baseline": [], "ours": []}
            for _ in range(args.pairs):
                rows["baseline"].append(run_in(baseline, mode))
                rows["ours"].append(run_in(REPO, mode))
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
    finally:
        if tree is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                           check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
