"""Benchmark: the CPU of writing a page's inverted-list entries, by memtable.

The index stage writes one key per list a page joins (~1,600 a page with passages on the
llvm pages), in one WriteBatch, holding the GIL: on llvm-13/14 it is the largest part of
the stage that cannot run in parallel. This writes ``--pages`` batches of ``--keys``
random list keys (bin ‖ min-hash ‖ ordinal, 18 bytes, empty values, as the ``oph``
family holds them) into the store's ``oph`` options (a hash table of small skip lists)
and into the same options with other memtables, one after the other, and prints the CPU
of ``write`` per key and its ratio to the store's. (A vector memtable is cheap to fill
but sorts on every read: the lists are read while they are written.)

Run: .venv/bin/python -m tests.bench.bench_memtable [--pages 600] [--keys 1600]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time

import numpy as np
from rocksdict import MemtableFactory, Options, Rdict, WriteBatch

from dupalign.store.options import MEMTABLE_BUCKETS, family_options

_KEY = np.dtype([("bin", ">u2"), ("key", ">u8"), ("ordinal", ">u8")])


def _memtable(name: str) -> Options:
    if name == "skip list (RocksDB's default)":
        return family_options()  # the store's options without the family's memtable
    opts = family_options("oph")  # the store's options for the list family
    if name == "hash linked list":
        opts.set_memtable_factory(MemtableFactory.hash_link_list(MEMTABLE_BUCKETS))
    elif name == "vector":
        opts.set_memtable_factory(MemtableFactory.vector())
    return opts


def write_cpu(name: str, pages: int, keys: int, seed: int = 1) -> float:
    """CPU seconds per key of ``Rdict.write`` over ``pages`` batches of ``keys`` keys."""
    where = tempfile.mkdtemp(prefix="bench-memtable-")
    db = Rdict(where, _memtable(name))
    rng = np.random.default_rng(seed)
    cpu = 0.0
    try:
        for ordinal in range(pages):
            k = np.empty(keys, dtype=_KEY)
            k["bin"] = rng.integers(0, 1024, keys)
            k["key"] = rng.integers(0, 2**63, keys)
            k["ordinal"] = ordinal
            raw = k.tobytes()
            batch = WriteBatch(raw_mode=True)
            for i in range(keys):
                batch.put(raw[i * 18:(i + 1) * 18], b"")
            c0 = time.thread_time()
            db.write(batch)
            cpu += time.thread_time() - c0
    finally:
        db.close()
        shutil.rmtree(where, ignore_errors=True)
    return cpu / (pages * keys)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=600)
    parser.add_argument("--keys", type=int, default=1600, help="list keys a page writes")
    args = parser.parse_args()
    names = ["store (hash skip list)", "skip list (RocksDB's default)", "hash linked list",
             "vector"]
    got = {name: write_cpu(name, args.pages, args.keys) for name in names}
    base = got[names[0]]
    print(f"{args.pages} batches of {args.keys} list keys; CPU of Rdict.write per key")
    print(f"{'memtable':<32} {'ns/key':>8} {'vs store':>9} {'ms/page':>8}")
    for name, per_key in got.items():
        print(f"{name:<32} {per_key * 1e9:8.0f} {per_key / base:8.2f}x "
              f"{per_key * args.keys * 1e3:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
