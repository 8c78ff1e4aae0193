"""The kernels' cache key (dupalign/kernel_cache.py), this checkout against a baseline
revision's, side by side in one process: what keying every kernel module costs a process
that imports them all (each round from cold per-process caches, the files in the page
cache), and what each kernel module's key covers.

Run: python -m tests.bench.bench_kernel_key [--baseline-ref main] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

from dupalign import kernel_cache

ROOT = os.path.dirname(os.path.abspath(kernel_cache.__file__))
KERNEL_MODULES = [rel for rel in kernel_cache._source_files(ROOT)
                  if b"from dupalign.kernel_cache import" in kernel_cache._source(ROOT, rel)]


def _baseline(ref: str) -> Callable[[], None]:
    """The baseline's key of every kernel module: its functions, its guards not installed."""
    text = subprocess.run(["git", "show", f"{ref}:dupalign/kernel_cache.py"], check=True,
                          capture_output=True, text=True).stdout
    names: dict[str, Any] = {}
    exec(compile(text.split("\n_install_guards()")[0], f"{ref}:kernel_cache", "exec"), names)
    digest, package_root = names["_package_digest"], names["_package_root"]

    def keys() -> None:
        digest.cache_clear()
        for rel in KERNEL_MODULES:
            digest(package_root(os.path.dirname(os.path.join(ROOT, rel))))
    return keys


def _this() -> None:
    for cached in (kernel_cache._source_files, kernel_cache._source_set, kernel_cache._source,
                   kernel_cache._source_digest, kernel_cache._imported, kernel_cache._reached,
                   kernel_cache._module_digest):
        cached.cache_clear()
    for rel in KERNEL_MODULES:
        kernel_cache._module_digest(os.path.join(ROOT, rel))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--baseline-ref", default="main")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    runs = {f"{args.baseline_ref} (package digest)": _baseline(args.baseline_ref),
            "this checkout (module digests)": _this}
    spent: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):  # interleaved: the machine's load falls on both alike
        for name, keys in runs.items():
            start = time.perf_counter()
            keys()
            spent[name].append(time.perf_counter() - start)
    print(f"keys of the {len(KERNEL_MODULES)} kernel modules, per process "
          f"(median of {args.rounds} rounds)\n")
    print("| key | ms |\n|---|---:|")
    for name, times in spent.items():
        print(f"| {name} | {statistics.median(times) * 1000:.1f} |")
    files = len(kernel_cache._source_files(ROOT))
    print(f"\n| kernel module | modules its key covers (of {files}) |\n|---|---:|")
    for rel in KERNEL_MODULES:
        reached = kernel_cache._reached(ROOT, rel)
        print(f"| {rel} | {files if reached is None else len(reached)} |")


if __name__ == "__main__":
    main()
