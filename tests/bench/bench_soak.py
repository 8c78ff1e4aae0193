"""Benchmark: the engine's memory over a long stream (issue 42, "memory that plateaus").

    nice python -m tests.bench.bench_soak [--pages 20000] [--every 1000] [--memory-mb N]

Runs ``Engine.process`` in this process over a crawl-like stream of RFC sentences (pages
copy passages of recent pages, some are near or exact duplicates; built as it goes, so the
stream itself holds no growing memory) and every ``--every`` pages prints, in MB:

  rss       this process's resident set (/proc/self/status VmRSS)
  peak      its highest resident set since the previous sample (VmHWM, reset each sample:
            RSS between two samples, which a sample alone misses)
  lists     the inverted-list cache's arrays (allocated, not only in use; budget lists_mb)
  fwd       the forward record caches' buffers (align and index stage; budget forward_mb each)
  blocks    RocksDB's block cache in use (budget blocks_mb)
  memtab    every family's memtables (rocksdb.cur-size-all-mem-tables, summed)
  readers   index and filter blocks held outside the block cache (none since they are charged to it)
            (rocksdb.estimate-table-readers-mem, summed)
  near      the near-duplicate table (SimHash fingerprints: grows with the store by design)
  free      what the allocator's heaps hold free (dupalign.runtime.allocator)
  store     the store's table files plus memtables (Store.size_bytes)
  heap      resident in glibc's main heap ([heap] in /proc/self/smaps)
  anon      resident in other anonymous mappings (other heaps, numpy arrays and RocksDB
            blocks from 1 MB up, thread stacks, Python's arenas)
  file      resident in file mappings (libraries, numba's code, table files RocksDB maps)
  pyobj     Python's allocated blocks, in thousands (sys.getallocatedblocks)

then the growth per 1,000 pages of each over the last half of the run, and whether RSS
stayed flat (within 10 %) over the last half, below ``memory_mb``. ``Engine.process`` is
what the single worker runs per page with one job (``worker.jobs`` 1); Kafka is left out.

The numba kernels are compiled first in another process (``tests.warm_kernels``: at once
if cached), so that RSS is the steady state's: a process that compiles them keeps about
350 MB more. Needs the RFCs of $DUPALIGN_SHARED/testdata.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from dupalign.config import EngineConfig
from dupalign.page import Page
from dupalign.runtime import allocator
from dupalign.runtime.engine import Engine
from tests.corpora import RFC, rfc_numbers, words

MB = 1 << 20
trims: list[float] = [0, 0.0]  # allocator.trim's calls and seconds (timed by ``timed_trim``)
_trim = allocator.trim


def timed_trim() -> None:
    t = time.perf_counter()
    _trim()
    trims[0] += 1
    trims[1] += time.perf_counter() - t
COLUMNS = ("rss", "peak", "lists", "fwd", "blocks", "memtab", "readers", "near", "free", "store",
           "heap", "anon", "file", "pyobj")


def stream(n: int, seed: int = 7, recent: int = 2000) -> Iterator[Page]:
    """``n`` pages as tests.role_processes.synthetic_pages makes them (every RFC), copying
    only from the last ``recent`` pages so that the generator's memory stays bounded."""
    rng = np.random.default_rng(seed)
    sources = [words((RFC / f"rfc{k}.txt").read_text("utf-8", "replace"))
               for k in rfc_numbers()]
    texts: collections.deque[list[str]] = collections.deque(maxlen=recent)
    for i in range(n):
        vocab = sources[int(rng.integers(0, len(sources)))]
        start = int(rng.integers(0, max(1, len(vocab) - 400)))
        body = vocab[start:start + int(rng.integers(60, 300))]
        if texts and rng.random() < 0.4:  # a copied passage
            src = texts[int(rng.integers(0, len(texts)))]
            a = int(rng.integers(0, max(1, len(src) - 40)))
            body = body[:len(body) // 2] + src[a:a + int(rng.integers(30, 80))] + \
                body[len(body) // 2:]
        elif texts and rng.random() < 0.15:  # a near or exact duplicate
            body = list(texts[int(rng.integers(0, len(texts)))])
            if rng.random() < 0.7:
                body[int(rng.integers(0, len(body)))] = "changed"
        texts.append(body)
        yield Page(id=f"soak-{i}", body=" ".join(body), content_type="text/plain")


def status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) << 10
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_bytes() -> int:
    """The highest RSS since the previous call (VmHWM, then reset: Linux's clear_refs 5)."""
    peak = status_bytes("VmHWM")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return peak


def mapped_bytes() -> dict[str, int]:
    """Resident bytes by kind of mapping: the main heap, other anonymous ones, files."""
    out = {"heap": 0, "anon": 0, "file": 0}
    kind = "anon"
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=6)
            if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
                name = head[5].strip() if len(head) > 5 else ""
                kind = ("heap" if name == "[heap]" else "file" if name.startswith("/")
                        else "anon")
            elif line.startswith("Rss:"):
                out[kind] += int(line.split()[1]) << 10
    return out


def sample(engine: Engine) -> dict[str, int]:
    """Bytes of each thing this bench watches (see the module docstring)."""
    m = engine.memory_bytes()  # what the worker's /metrics shows as dupalign_memory_bytes
    return {"rss": status_bytes("VmRSS"), "peak": peak_bytes(), "lists": m["lists"],
            "fwd": m["forward"], "blocks": m["blocks"],
            "memtab": m["memtables"], "readers": m["table_readers"], "near": m["near_table"],
            "free": m["allocator_free"], "store": engine.store.size_bytes(),
            **mapped_bytes(), "pyobj": sys.getallocatedblocks() * MB // 1000}


def soak(pages: int, every: int, config: EngineConfig) -> list[tuple[int, float, dict[str, int]]]:
    rows: list[tuple[int, float, dict[str, int]]] = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as where, \
            Engine.open(where, config) as engine:
        print(f"{'pages':>7} {'s':>6} " + " ".join(f"{c:>7}" for c in COLUMNS), flush=True)
        for i, page in enumerate(stream(pages), 1):
            engine.process(page)
            if i % every == 0 or i == pages:
                s = sample(engine)
                rows.append((i, time.perf_counter() - t0, s))
                print(f"{i:>7} {rows[-1][1]:>6.0f} " +
                      " ".join(f"{s[c] / MB:>7.0f}" for c in COLUMNS), flush=True)
    return rows


def growth(rows: list[tuple[int, float, dict[str, int]]]) -> dict[str, float]:
    """MB per 1,000 pages of each column between the middle sample and the last."""
    (p0, _, a), (p1, _, b) = rows[len(rows) // 2], rows[-1]
    return {c: (b[c] - a[c]) / MB / max(1, p1 - p0) * 1000 for c in COLUMNS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=20000)
    ap.add_argument("--every", type=int, default=1000)
    ap.add_argument("--memory-mb", type=int, default=0,
                    help="cache.memory_mb (0: the per-cache defaults)")
    args = ap.parse_args()
    config = EngineConfig()
    if args.memory_mb:
        config = replace(config, cache=replace(config.cache, memory_mb=args.memory_mb))
    c = config.validate().cache
    print(f"budgets (MB): {c.budgets_mb()} (memtables 0: unbounded)", flush=True)
    subprocess.run([sys.executable, "-m", "tests.warm_kernels"], check=True)
    allocator.trim = timed_trim  # (the engine calls it through the module)
    rows = soak(args.pages, args.every, config)
    g = growth(rows)
    print(f"growth over the last half, MB per 1,000 pages (pages {rows[len(rows) // 2][0]}"
          f"-{rows[-1][0]}): " + ", ".join(f"{k} {v:+.1f}" for k, v in g.items()))
    for col in ("rss", "peak"):
        v = [s[col] for p, _, s in rows if p >= rows[-1][0] / 2]
        print(f"{col} over the last half: {min(v) / MB:.0f}-{max(v) / MB:.0f} MB, spread "
              f"{(max(v) - min(v)) / max(v):.1%} of the highest"
              + (f"; budget {c.memory_mb} MB" if c.memory_mb else ""))
    print(f"allocator.trim: {trims[0]:.0f} calls, {trims[1]:.1f} s in all", flush=True)


if __name__ == "__main__":
    main()
