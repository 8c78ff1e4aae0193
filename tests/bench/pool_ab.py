"""``--jobs 2`` against ``--jobs 1`` of this tree and of a baseline revision, side by side.

The default engine from the extracted text of a docs corpus (tests.corpora.DOCS_CORPORA),
``--jobs 1`` and ``--jobs 2`` of this tree and of ``--baseline-ref`` (default ``main``,
checked out and warmed by tests.bench.checkouts), each run in a process of its own
(``bench_scan.run_staged_apart``: the clock stops when the store is closed), in rounds
whose order alternates (ABBA), so that a machine shared with other work weighs on both
trees alike. Per run: wall seconds and CPU ms a page (the pool's processes included); per
round and tree: ``--jobs 2`` / ``--jobs 1`` in pages/s; and whether every run found the
same exact and near pairs and matches by kind.

    python -m tests.bench.pool_ab [--corpus llvm|boost] [--baseline-ref main] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import tempfile
from pathlib import Path

from dupalign.page import Page
from tests.bench.bench_scan import HERE, Run, load_pages, main_text, run_staged_apart
from tests.bench.checkouts import commit_of, warm_checkout
from tests.corpora import DOCS_CORPORA, LLVM_DOCS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=sorted(DOCS_CORPORA), default="llvm")
    ap.add_argument("--baseline-ref", default="main")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="pages per release (default all)")
    args = ap.parse_args()
    old, new = load_pages(LLVM_DOCS, args.limit, args.corpus)
    pages = [Page(id=p.id, body=main_text(p), content_type="text/plain") for p in old + new]
    base = warm_checkout(args.baseline_ref)
    trees = {"this tree": HERE, f"{args.baseline_ref} ({commit_of(args.baseline_ref)[:7]})": base}
    tmp = Path(tempfile.mkdtemp(prefix="pool-ab-"))
    n = len(pages)
    runs: list[Run] = []
    try:
        pages_file = tmp / "pages.pickle"
        pages_file.write_bytes(pickle.dumps(pages))
        print(f"{args.corpus}: {n} pages from text; default engine")
        print(f"{'round':<6}{'tree':<24}{'jobs':>5}{'seconds':>9}{'CPU ms/page':>12}"
              f"{'load':>6}")
        for r in range(args.rounds):
            order = list(trees.items())
            ratios: dict[str, dict[int, float]] = {}
            for name, code in order if r % 2 == 0 else order[::-1]:
                for jobs in (1, 2) if r % 2 == 0 else (2, 1):
                    run = run_staged_apart(f"{name} --jobs {jobs}", code, pages_file,
                                           tmp / f"s{r}-{len(runs)}", True, jobs)
                    runs.append(run)
                    ratios.setdefault(name, {})[jobs] = run.seconds
                    print(f"{r:<6}{name:<24}{jobs:>5}{run.seconds:9.2f}"
                          f"{run.cpu / n * 1e3:12.2f}{os.getloadavg()[0]:6.1f}", flush=True)
            for name, secs in ratios.items():
                print(f"      {name}: --jobs 2 / --jobs 1 = {secs[1] / secs[2]:.2f}x")
        same = all(r.pairs == runs[0].pairs and r.kinds == runs[0].kinds for r in runs)
        print(f"exact and near pairs and matches by kind the same in all {len(runs)} runs: "
              f"{'yes' if same else 'NO'} {runs[0].kinds}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
