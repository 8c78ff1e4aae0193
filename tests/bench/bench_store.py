"""Benchmark: reading inverted lists from RocksDB, three layouts side by side.

A passage query reads a few hundred inverted lists per page (those not in memory), most of
them short or absent. The same lists are stored three ways and read in batches of
``--batch`` lists, as a page's query does:

- ``scan, plain``: one key per entry (bin ‖ min-hash ‖ ordinal ‖ seq), read by a prefix scan
  with a new iterator per list, in a RocksDB with whole-key Bloom filters only (the first
  layout);
- ``scan, store``: the same keys in the store's ``oph_long`` family (prefix Bloom filters,
  shared block cache), read through one iterator per batch (``Store.prefix_reader``; how
  long lists are still read);
- ``head+archives``: store format 3 (dupalign.passages): a head value per list and archives
  of 16 entries, read by ``PassageIndex._read_lists``: two multi-gets per batch.

Lists have ``--lengths`` entries each (0: absent); all stores are flushed to SST files
before reading. Times are CPU µs per list (thread time: the machine is shared), best of 3.

Run: .venv/bin/python -m tests.bench.bench_store [--lists 20000] [--lengths 0,1,4,16,64]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np
from rocksdict import BlockBasedOptions, DBCompressionType, Options, Rdict, ReadOptions

from dupalign.config import EngineConfig
from dupalign.passages import _ENTRY, _HEAD, _SEG, ARCHIVE_ENTRIES, PassageIndex, _head_key
from dupalign.store import Store, _prefix_upper_bound, u32, u64


def plain_store(path: str) -> Rdict:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(DBCompressionType.lz4())
    table = BlockBasedOptions()
    table.set_bloom_filter(10, False)
    opts.set_block_based_table_factory(table)
    return Rdict(path, opts)


def plain_read(db: Rdict, prefix: bytes) -> int:
    ropts = ReadOptions()
    upper = _prefix_upper_bound(prefix)
    if upper is not None:
        ropts.set_iterate_upper_bound(upper)
    return sum(1 for _ in db.items(from_key=prefix, read_opt=ropts))


def timed(fn: Callable[[list[bytes]], int], batches: list[list[bytes]]) -> tuple[float, int]:
    """Best of 3 passes over all batches: CPU µs per list, and the entries read."""
    best, found = float("inf"), 0
    for _ in range(3):
        t = time.thread_time()
        found = sum(fn(b) for b in batches)
        best = min(best, time.thread_time() - t)
    return 1e6 * best / sum(len(b) for b in batches), found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lists", type=int, default=20000, help="lists of each length")
    ap.add_argument("--lengths", default="0,1,4,16,64")
    ap.add_argument("--batch", type=int, default=200, help="lists read together (a page)")
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    rng = np.random.default_rng(0)
    rect = np.zeros(4, dtype="<i4").tobytes()
    root = tempfile.mkdtemp()
    try:
        store = Store(f"{root}/store", {"bench": 1})
        plain = plain_store(f"{root}/plain")
        index = PassageIndex(store, EngineConfig())
        heads: dict[int, list[bytes]] = {}
        total = 0
        for length in lengths:
            keys = [_head_key(int(b), int(k)) for b, k in zip(
                rng.integers(0, 64, args.lists), rng.integers(0, 2**63, args.lists),
                strict=True)]
            heads[length] = keys
            batch = store.batch()
            for head in keys:
                entries = np.zeros(length, dtype=_ENTRY)
                entries["ordinal"] = np.sort(rng.choice(10**6, length, replace=False))
                for o in entries["ordinal"].tolist():
                    key = head + u64(o) + u32(0)
                    batch.put("oph_long", key, rect)
                    plain[key] = rect
                packed = entries.tobytes()
                n_arch = max(length - 1, 0) // ARCHIVE_ENTRIES
                size = ARCHIVE_ENTRIES * _ENTRY.itemsize
                for j in range(n_arch):
                    batch.put("oph_arch", head + _SEG.pack(j), packed[j * size : (j + 1) * size])
                if length:
                    batch.put("oph", head, _HEAD.pack(n_arch) + packed[n_arch * size :])
                if len(batch) > 100_000:
                    store.write(batch)
                    batch = store.batch()
            store.write(batch)
            total += length * args.lists
        store.flush()
        plain.flush()
        print(f"{len(lengths)} × {args.lists:,} lists, {total:,} entries per layout; "
              f"reads in batches of {args.batch} lists\n")
        print(f"{'entries/list':>12} {'scan, plain':>12} {'scan, store':>12} "
              f"{'head+archives':>14} {'vs plain':>9} {'vs store scan':>14}")
        for length in lengths:
            keys = heads[length]
            batches = [keys[i : i + args.batch] for i in range(0, len(keys), args.batch)]

            def scan_store(b: list[bytes]) -> int:
                reader = store.prefix_reader("oph_long")
                return sum(len(reader.items(p)[0]) for p in b)

            p_us, p_n = timed(lambda b: sum(plain_read(plain, p) for p in b), batches)
            s_us, s_n = timed(scan_store, batches)
            h_us, h_n = timed(lambda b: len(index._read_lists(b)[2]), batches)
            assert p_n == s_n == h_n == length * args.lists
            print(f"{length:>12} {p_us:>10.1f}µs {s_us:>10.1f}µs {h_us:>12.1f}µs "
                  f"{p_us / h_us:>8.1f}x {s_us / h_us:>13.1f}x")
        store.close()
        plain.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
