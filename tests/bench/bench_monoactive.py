"""Benchmark MonoActive: window counts and generation time vs n and k; alignment vs brute force.

Run from the repo root:  .venv/bin/python -m tests.bench.bench_monoactive [--quick]

Text: lower-cased word tokens (\\w+) of the IETF RFCs in $DUPALIGN_SHARED/testdata/rfc (read in
file-name order, truncated to n tokens, as the paper truncates texts), plus a synthetic text
of n tokens drawn uniformly from 10 symbols (maximum frequency f ≈ n/10).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dupalign.passage import monoactive as M
from dupalign.passage import monoactive_query as Q
from dupalign.text.hashing import token_hashes
from tests.corpora import RFC
from tests.oracles import monoactive as O

MODES: list[tuple[M.Mode, M.TfMode]] = [
    ("multiset", "raw"),
    ("weighted", "binary"),
    ("weighted", "log"),
    ("weighted", "raw"),
    ("weighted", "squared"),
]


def rfc_words(n: int) -> list[str]:
    words: list[str] = []
    for f in sorted(RFC.glob("*.txt")):
        words += re.findall(r"\w+", f.read_text(errors="replace").lower())
        if len(words) >= n:
            break
    return words[:n]


def generation(quick: bool) -> None:
    ns = [1_000, 10_000] if quick else [1_000, 10_000, 100_000]
    words = rfc_words(max(ns))
    rng = np.random.default_rng(0)
    uniform10 = rng.integers(0, 10, max(ns)).astype(np.uint64)
    M.compact_windows(token_hashes(words[:50]), 2, "weighted")  # numba warm-up
    M.compact_windows(token_hashes(words[:50]), 2)
    print("\n## window generation (k hash functions, one text)")
    print(f"{'text':>9} {'n':>7} {'f':>6} {'k':>3} {'mode':>17} {'windows':>10} "
          f"{'win/(n·k)':>9} {'|X|/n fn0':>9} {'time s':>8} {'ms/fn':>8}")  # fmt: skip
    for text in ("rfc", "uniform10"):
        for n in ns:
            th = token_hashes(words[:n]) if text == "rfc" else uniform10[:n]
            f = int(np.unique(th, return_counts=True)[1].max())
            ks = [1, 16] if n >= 100_000 else [1, 16, 64]
            if text == "uniform10" and n >= 100_000:
                continue
            for k in ks:
                for mode, tf in MODES:
                    t0 = time.perf_counter()
                    w = M.compact_windows(th, k, mode, tf)
                    dt = time.perf_counter() - t0
                    lay = M.layout(th)
                    if mode == "multiset":
                        eh = M.multiset_entries(lay, 0)
                    else:
                        eh = M.weighted_entries(lay, M.entry_weights(lay, tf), 0)
                    x = M.count_active_keys(lay, eh)
                    name = mode if mode == "multiset" else f"weighted/{tf}"
                    print(f"{text:>9} {n:>7} {f:>6} {k:>3} {name:>17} {len(w):>10} "
                          f"{len(w) / (n * k):>9.2f} {x / n:>9.2f} {dt:>8.3f} "
                          f"{dt / k * 1000:>8.1f}")  # fmt: skip
                    del w


def alignment(quick: bool) -> None:
    print("\n## alignment: MonoActive (windows + query + scan) vs brute force over subsequences")
    print(f"{'n':>4} {'k':>3} {'mode':>13} {'results':>7} {'monoactive ms':>13} "
          f"{'brute ms':>9} {'same':>5}")  # fmt: skip
    words = rfc_words(400)
    hashes = token_hashes(words)
    k, theta = 16, (1, 2)
    for mode, tf in (("multiset", "raw"), ("weighted", "log")):  # numba warm-up
        Q.align_weighted(hashes[:8], hashes[:20], k, theta, mode, tf)  # type: ignore[arg-type]
    for n in [20, 40] if quick else [20, 40, 80]:
        text = hashes[100 : 100 + n]
        query = np.concatenate([text[5:9], hashes[:1], text[10:13]])  # 8 tokens, one edited
        for mode, tf in (("multiset", "raw"), ("weighted", "log")):
            weighted = mode == "weighted"
            t0 = time.perf_counter()
            got = Q.align_weighted(query, text, k, theta, mode, tf)  # type: ignore[arg-type]
            t1 = time.perf_counter()
            values = [
                O.weighted_value(fn, tf) if weighted else O.multiset_value(fn) for fn in range(k)
            ]
            want = O.brute_align(
                [int(h) for h in query], [int(h) for h in text], values, theta, weighted
            )
            t2 = time.perf_counter()
            name = mode if not weighted else f"weighted/{tf}"
            print(f"{n:>4} {k:>3} {name:>13} {len(got):>7} {(t1 - t0) * 1000:>13.2f} "
                  f"{(t2 - t1) * 1000:>9.1f} {got == want!s:>5}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip n = 10^5")
    args = ap.parse_args()
    generation(args.quick)
    alignment(args.quick)


if __name__ == "__main__":
    main()
