"""Index shards by key (dupalign.stages.shards), in one process: where the index CPU goes.

The same stream of pages (bench_passages' steady stream: real text in blocks, 10% with a
planted copy of an earlier page's passage) through ``Engine.process`` (``--jobs 1``: every
stage on this thread) with the single Indexer and with S index shards. Per page, CPU
seconds of this thread (``time.thread_time``): the index stage (``Indexer.index`` and
``finish``: lookups, combine, every store write), split for S shards into each shard's
own work (``IndexShard.busy``: its list reads and heads, verifications, writes: what
it would cost as a process of its own) and the fan-in's (the rest). The matches must be
the same for every S (checked). Numbers from one run on a shared machine: compare the
columns of one run, not runs.

Run: .venv/bin/python -m tests.bench.bench_shards [--pages N] [--shards 2,4] [--store DIR]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.stages.shards import ShardedIndexer
from tests.bench.bench_passages import page_stream


def run(pages: list[Page], store: Path, shards: int) -> tuple[list[Any], float, list[float]]:
    """The matches, the index CPU seconds, and each shard's (empty for the single one)."""
    with Engine.open(store, shards=shards) as engine:
        indexer = engine.indexer
        spent = [0.0]
        index, finish = indexer.index, indexer.finish

        def timed(fn: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                t0 = time.thread_time()
                try:
                    return fn(*args, **kwargs)
                finally:
                    spent[0] += time.thread_time() - t0
            return call

        indexer.index = timed(index)  # type: ignore[method-assign]
        indexer.finish = timed(finish)  # type: ignore[method-assign]
        matches = [[m.to_dict() for m in engine.process(p)] for p in pages]
        busy = ([s.busy for s in indexer.shards] if isinstance(indexer, ShardedIndexer)
                else [])
    for page in matches:
        for m in page:
            m.pop("detected_at", None)
    return matches, spent[0], busy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=600)
    ap.add_argument("--shards", default="2,4")
    ap.add_argument("--store", help="directory for the stores (default: a temporary one)")
    args = ap.parse_args()
    rng = np.random.default_rng(12)
    pages = [Page(f"p{i}", text) for i, (text, _) in
             enumerate(page_stream(args.pages, rng, use_docs=False))]
    root = Path(tempfile.mkdtemp(dir=args.store))
    try:
        # a warm-up run: numba compiles (cached) and the page cache fills
        run(pages[:50], root / "warm", 2)
        counts = [1] + [int(s) for s in args.shards.split(",")]
        results = {s: run(pages, root / f"s{s}", s) for s in counts}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    want = results[1][0]
    n = len(pages)
    n_matches = sum(len(m) for m in want)
    print(f"{n} pages, {n_matches} matches; index CPU per page (ms, this thread)\n")
    print(f"{'shards':>6} {'same':>5} {'index':>8} {'fan-in':>8} {'per shard':>24} "
          f"{'max shard':>9} {'index/1':>8}")
    base = results[1][1]
    for s in counts:
        matches, spent, busy = results[s]
        fan_in = spent - sum(busy)
        per = " ".join(f"{1000 * b / n:.2f}" for b in busy) or "-"
        top = f"{1000 * max(busy) / n:.2f}" if busy else "-"
        print(f"{s:>6} {'yes' if matches == want else 'NO':>5} {1000 * spent / n:>8.2f} "
              f"{1000 * fan_in / n:>8.2f} {per:>24} {top:>9} {spent / base:>8.2f}")


if __name__ == "__main__":
    main()
