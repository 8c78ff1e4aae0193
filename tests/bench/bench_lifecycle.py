"""A crawl with revisits, deletes and retention: store size and memory stay flat.

A stream of ``--pages`` operations (default 10^5) on one engine: 30 % revisits of a page
still stored (half unchanged: the same words in other bytes; half edited: 5 % of the words
replaced), 5 % deletes (tombstones) of a page still stored, the rest new pages (300-word
windows of the RFCs in ../shared/testdata/rfc, or the demo RFCs, so that new pages copy
passages from each other). Retention ``max_pages`` (default half the stream) runs every
``--every`` operations, as the worker's sweep does.

Printed: the curve every ``--report`` operations (pages stored, store size on disk and
the write-ahead log's part of it, RSS of this process, wall ms per operation since the last
row, the largest column families), then the store's live bytes per column family; the CPU
(this thread) per operation kind, with ratios to a new page; and the check that every
revisit got exactly one ``revisit`` message.

Run: .venv/bin/python -m tests.bench.bench_lifecycle [--pages 100000] [--max-pages N]
"""

from __future__ import annotations

import argparse
import random
import re
import shutil
import tempfile
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from dupalign.config import EngineConfig, RetentionConfig
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from tests.corpora import DEMO, RFC


def words() -> list[str]:
    files = sorted(RFC.glob("rfc*.txt")) or sorted((DEMO / "rfc").glob("*.txt"))
    return re.findall(r"\S+", " ".join(f.read_text(errors="replace") for f in files))


def rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096 / 2**20


def dir_mb(path: Path, suffix: str = "") -> float:
    return sum(f.stat().st_size for f in path.rglob(f"*{suffix}") if f.is_file()) / 2**20


def family_mb(engine: Engine, top: int = 99) -> str:
    """The store's live bytes (SST files and memtables) per column family, largest first:
    where the size is."""
    sizes = {name: sum(int(cf.property_int_value(p) or 0) for p in (
        "rocksdb.total-sst-files-size", "rocksdb.size-all-mem-tables"))
        for name, cf in engine.store._cfs.items()}
    return ", ".join(f"{name} {b / 2**20:.1f}" for name, b in
                     sorted(sizes.items(), key=lambda x: -x[1])[:top] if b >= 2**16)


class Stream:
    """Pages as (start, edit seed): the body is made again when the page is revisited."""

    def __init__(self, seed: int) -> None:
        self.words = words()
        self.rng = random.Random(seed)

    def body(self, start: int, edit: int) -> str:
        w = self.words[start : start + 300]
        if edit:
            r = random.Random(edit)
            w = list(w)
            for _ in range(len(w) // 20):
                w[r.randrange(len(w))] = r.choice(self.words)
        return " ".join(w)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=100_000)
    ap.add_argument("--max-pages", type=int, default=0, help="default: half of --pages")
    ap.add_argument("--every", type=int, default=1000, help="operations between sweeps")
    ap.add_argument("--report", type=int, default=5000, help="operations between rows")
    ap.add_argument("--store", help="store directory (default: a temporary one)")
    ap.add_argument("--lists-mb", type=int, default=0,
                    help="cache.lists_mb (default: the config's); RSS is bounded by it")
    ap.add_argument("--idf-freeze-at", default="",
                    help="near.idf_freeze_at, comma-separated (default: the config's); every "
                         "page's distinct tokens are kept in the store until the last freeze")
    args = ap.parse_args()
    max_pages = args.max_pages or args.pages // 2
    tmp = Path(args.store or tempfile.mkdtemp(prefix="bench-lifecycle-"))
    stream = Stream(13)
    rng = stream.rng
    n_words = len(stream.words) - 300
    cfg = replace(EngineConfig(), retention=RetentionConfig(max_pages=max_pages))
    if args.idf_freeze_at:
        freeze = tuple(int(n) for n in args.idf_freeze_at.split(","))
        cfg = replace(cfg, near=replace(cfg.near, idf_freeze_at=freeze))
    if args.lists_mb:
        cfg = replace(cfg, cache=replace(cfg.cache, lists_mb=args.lists_mb))
    cfg = cfg.validate()
    cpu: dict[str, list[float]] = defaultdict(list)
    revisits = revisit_messages = wrong = 0
    issued: list[str] = []  # ids in the order they were first sent
    pages: dict[str, tuple[int, int]] = {}  # id -> its current (start, edit)
    print(f"{args.pages:,} operations, retention.max_pages {max_pages:,}, sweep every "
          f"{args.every:,}, cache.lists_mb {cfg.cache.budgets_mb()['lists']}, near.idf_freeze_at "
          f"{cfg.near.idf_freeze_at}; words {len(stream.words):,}")
    print(f"| {'ops':>8} | {'stored':>7} | {'store MB':>8} | {'WAL MB':>6} | {'RSS MB':>7} "
          f"| {'ms/op':>6} | {'s':>6} | largest families (live MB) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    t_start = t_row = time.perf_counter()
    with Engine.open(tmp / "store", cfg) as engine:
        for op in range(1, args.pages + 1):
            r = rng.random()
            kind = "new"
            doc_id = None
            if r < 0.35 and issued:
                for _ in range(8):  # a page still stored (retention removes the oldest)
                    cand = issued[rng.randrange(max(0, len(issued) - max_pages), len(issued))]
                    if cand in pages and engine.indexer.current(cand) is not None:
                        doc_id = cand
                        break
                if doc_id is not None:
                    kind = ("unchanged" if r < 0.15 else "edited" if r < 0.30 else "delete")
            if kind == "new":
                doc_id = f"page-{op}"
                pages[doc_id] = (rng.randrange(n_words), 0)
                issued.append(doc_id)
                page = Page(doc_id, stream.body(*pages[doc_id]), fetched_at=op)
            elif kind == "delete":
                assert doc_id is not None
                del pages[doc_id]
                page = Page(doc_id, "", deleted=True)
            else:
                assert doc_id is not None
                start, edit = pages[doc_id]
                if kind == "edited":
                    pages[doc_id] = (start, op)
                    body = stream.body(start, op)
                else:  # the same words in other bytes: not a replay
                    body = stream.body(start, edit) + "\n" * (1 + op % 7)
                page = Page(doc_id, body, fetched_at=op)
            c0 = time.thread_time()
            found = engine.process(page)
            cpu[kind].append(time.thread_time() - c0)
            n_rv = sum(m.kind == "revisit" for m in found)
            if kind in ("unchanged", "edited"):
                revisits += 1
                revisit_messages += n_rv
                wrong += n_rv != 1 or found[0].revisit != ("unchanged" if kind == "unchanged"
                                                          else "changed")
            else:
                wrong += n_rv != 0
            if op % args.every == 0:
                c0 = time.thread_time()
                engine.compact()
                cpu["sweep"].append(time.thread_time() - c0)
                for gone in [i for i in pages if engine.indexer.current(i) is None]:
                    del pages[gone]
            if op % args.report == 0:
                now = time.perf_counter()
                print(f"| {op:>8,} | {engine.indexer.alive:>7,} | "
                      f"{dir_mb(tmp / 'store'):>8.1f} | {dir_mb(tmp / 'store', '.log'):>6.1f} | "
                      f"{rss_mb():>7.0f} | {(now - t_row) * 1e3 / args.report:>6.1f} | "
                      f"{now - t_start:>6.0f} | {family_mb(engine, 3)} |", flush=True)
                t_row = now
        print(f"\nlive MB per column family (SST + memtables): {family_mb(engine)}")
    new = sum(cpu["new"]) / max(1, len(cpu["new"]))
    print("\nCPU per operation (this thread):\n")
    print(f"| {'operation':<10} | {'count':>7} | {'ms':>7} | {'/ new page':>10} |")
    print("|---|---:|---:|---:|")
    for kind in ("new", "unchanged", "edited", "delete", "sweep"):
        xs = cpu[kind]
        mean = sum(xs) / max(1, len(xs))
        print(f"| {kind:<10} | {len(xs):>7,} | {mean * 1e3:>7.3f} | {mean / new:>10.3f} |")
    print(f"\nrevisits {revisits:,}, revisit messages {revisit_messages:,}, operations with a "
          f"wrong number of revisit messages: {wrong}")
    if not args.store:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
