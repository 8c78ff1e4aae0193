"""OPH benchmark: compact window generation, OPH vs k-mins window counts, alignment time.

Run: .venv/bin/python -m tests.bench.bench_oph [--quick]

Tokens are real text: the IETF RFCs in $DUPALIGN_SHARED/testdata/rfc (tests/corpora.py; word
tokens, case folded), concatenated in file order and cut to the first n tokens, as in the
paper's Exp-1.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from dupalign.passage.interval_scan import align, align_sketch
from dupalign.passage.oph import (
    U64,
    compact_windows,
    compact_windows_binned,
    oph_bins,
    oph_sketch,
    oph_values,
)
from dupalign.text.hashing import token_hashes
from tests.corpora import RFC


def rfc_tokens(n: int) -> list[str]:
    out: list[str] = []
    for f in sorted(RFC.glob("rfc*.txt")):
        if f.name == "rfc-index.txt":
            continue
        out += re.findall(r"\w+", f.read_text(encoding="utf-8", errors="replace").casefold())
        if len(out) >= n:
            break
    return out[:n]


def best_of(fn: Callable[[], object], reps: int) -> float:
    """Median wall time in ms of ``reps`` runs (after one warm-up run)."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kmins_windows(th: U64, k: int) -> int:
    """Classical compact windows of k independent hash functions (one bin each)."""
    zeros = np.zeros(th.shape[0], dtype=np.int64)
    return sum(len(compact_windows_binned(oph_values(th, 1000 + s), zeros, 1)) for s in range(k))


def brute_force_align(
    qh: U64, th: U64, k: int, p: int, q: int, min_len: int
) -> list[tuple[int, int]]:
    """Reference: grow every start i to the right keeping per-bin minima (numpy), test
    q·N_mat + p·N_emp ≥ k·p for every [i, j], keep the longest-only ranges."""
    qm, qe = oph_sketch(qh, k)
    bins = oph_bins(th, k)
    n = th.shape[0]
    best_end = np.full(n, -1)
    for i in range(n):
        mins = np.zeros(k, dtype=np.uint64)
        empty = np.ones(k, dtype=bool)
        for j in range(i, n):
            b = bins[j]
            if empty[b] or th[j] < mins[b]:
                mins[b] = th[j]
                empty[b] = False
            if j - i + 1 >= min_len:
                n_emp = np.count_nonzero(empty & qe)
                n_mat = np.count_nonzero(~empty & ~qe & (mins == qm))
                if q * n_mat + p * n_emp >= k * p:
                    best_end[i] = j
    out, z = [], -1
    for i in range(n):
        if best_end[i] > z:
            out.append((i, int(best_end[i]) + 1))
            z = best_end[i]
    return out


def edited_passage(toks: list[str], start: int, length: int, rng: np.random.Generator) -> list[str]:
    """A copied passage with ~10% of its tokens replaced."""
    p = list(toks[start : start + length])
    for x in rng.choice(length, size=length // 10, replace=False):
        p[x] = f"edit{x}"
    return p


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, no n = 10^5 k-mins")
    args = ap.parse_args()
    reps = 3 if args.quick else 7
    toks = rfc_tokens(100_000)
    th_all = token_hashes(toks)
    h_all = oph_values(th_all)
    compact_windows(h_all[:100], 16)  # compile / load the numba cache outside the timings

    print("## OPH compact window generation (RFC text, first n tokens)")
    print(f"{'n':>7} {'k':>4} {'windows':>8} {'non-empty':>9} {'empty':>7} {'w/n':>5} "
          f"{'ms':>7} {'k-mins windows':>14} {'k-mins ms':>9}")  # fmt: skip
    for n in (1_000, 10_000, 100_000):
        h, th = h_all[:n], th_all[:n]
        for k in (16, 64, 256):
            w = compact_windows(h, k)
            ms = best_of(partial(compact_windows, h, k), reps)
            ne = int((~w.empty).sum())
            if args.quick and n == 100_000:
                km, km_ms = "-", "-"
            else:
                km = str(kmins_windows(th, k))
                km_ms = f"{best_of(partial(kmins_windows, th, k), 1):.1f}"
            print(f"{n:>7} {k:>4} {len(w):>8} {ne:>9} {len(w) - ne:>7} {len(w) / n:>5.2f} "
                  f"{ms:>7.2f} {km:>14} {km_ms:>9}")  # fmt: skip

    print()
    print("## Alignment: query = a 64-token RFC passage with 10% of tokens edited, θ = 1/2")
    print(f"{'n':>7} {'k':>4} {'windows':>8} {'results':>7} {'align ms':>9} {'brute ms':>9} same")
    rng = np.random.default_rng(1)
    for n, k in ((100, 16), (200, 16), (400, 16), (400, 64), (10_000, 64), (100_000, 64)):
        h = h_all[:n]
        q = oph_values(token_hashes(edited_passage(toks, n // 3, min(64, n // 2), rng)))
        w = compact_windows(h, k)
        got = align(q, w, k, (1, 2), min_len=8)
        ms = best_of(partial(align, q, w, k, (1, 2), 8), reps)
        if n <= 400:
            t0 = time.perf_counter()
            want = brute_force_align(q, h, k, 1, 2, 8)
            bms = f"{(time.perf_counter() - t0) * 1e3:.0f}"
            same = str(got == want)
        else:
            bms, same = "-", "-"
        print(f"{n:>7} {k:>4} {len(w):>8} {len(got):>7} {ms:>9.3f} {bms:>9} {same}")

    print()
    print("## align_sketch (collisions + scan): an exact copied passage vs 10^5 RFC tokens")
    n, k = 100_000, 64
    h = h_all[:n]
    w = compact_windows(h, k)
    for qlen in (64, 256, 1024):
        qm, qe = oph_sketch(h[5000 : 5000 + qlen], k)
        got = align_sketch(qm, qe, w, k, (1, 2), 8)
        ms = best_of(partial(align_sketch, qm, qe, w, k, (1, 2), 8), reps)
        print(f"n={n} k={k} query={qlen:>5} tokens: {len(got)} results, {ms:.2f} ms")


if __name__ == "__main__":
    main()
