"""Benchmark: bias and variance of the weighted OPH estimator (dupalign.passage.weighted_oph)
next to MonoActive's k-independent ICWS estimator (weighted mode), against exact weighted
Jaccard (tf weights, idf 1: what the engine uses).

Pairs of unit sequences (A, B) of three kinds:

* ``rfc``: 48-unit passages of the RFCs (2-word shingles, as the engine's units), B = the
  same words with 10 %, 30 % or 50 % of them replaced — real text, the benchmark's sets;
* ``text``: 48-unit passages drawn from a Zipf vocabulary (some units repeat, as 2-word
  shingles do), B = A with a fraction of its units replaced (0.1, 0.3, 0.5) — the sets
  the passage index compares;
* ``repeats``: 48 units from a small vocabulary (each unit ~4 times: weights differ);
* ``random``: random multisets, each token 1-8 times in A and independently in B (~50 %
  shared), the adversarial case for a per-bin estimator.

Each pair is sketched under ``--salts`` independent hashings (every unit rehashed with a
salt: new bins and new ICWS randomness for both sides), both estimators with k = 64. Per
kind and tf mode: the mean signed bias (mean over pairs of mean estimate − exact), the mean
|bias| per pair, and the mean per-pair variance over salts. ``gaps bias``: the weighted OPH
estimate with the text's empty bins counted as its windows before steps counted them (no
element present at count 1 in the bin: the gaps between positions), for comparison.

Run: .venv/bin/python -m tests.bench.bench_woph_bias [--pairs 40] [--salts 200] [--k 64]
"""

from __future__ import annotations

import argparse

import numpy as np

from dupalign.passage import monoactive_query
from dupalign.passage import weighted_oph as W
from dupalign.passage.oph import oph_bins
from dupalign.text.hashing import mix64
from tests.oracles.weighted_oph import weighted_jaccard


def rfc_pairs(n: int, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    from dupalign.config import EngineConfig
    from dupalign.passage.sketch import PassageSketcher
    from dupalign.text.hashing import token_hashes
    from dupalign.text.tokens import tokenize
    from tests import corpora

    sk = PassageSketcher(EngineConfig())
    words = [w for r in corpora.rfc_numbers()[:20]
             for w in tokenize(corpora.rfc_text(r)).tokens]
    out = []
    for x in range(n):
        at = int(rng.integers(0, len(words) - 49))
        a = words[at : at + 49]
        b = list(a)
        for y in np.flatnonzero(rng.random(49) < [0.1, 0.3, 0.5][x % 3]).tolist():
            b[y] = f"edit{x}_{y}"
        out.append((sk.units(token_hashes(a, 0)), sk.units(token_hashes(b, 0))))
    return out


def pairs(kind: str, n: int, rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    if kind == "rfc":
        return rfc_pairs(n, rng)
    out = []
    for x in range(n):
        if kind == "text":
            a = rng.zipf(1.3, size=48) % 5000
            b = a.copy()
            edit = [0.1, 0.3, 0.5][x % 3]
            at = rng.random(48) < edit
            b[at] = 10_000 + rng.integers(0, 5000, size=int(at.sum()))
        elif kind == "repeats":
            a = rng.integers(0, 12, size=48)
            b = a.copy()
            at = rng.random(48) < 0.3
            b[at] = rng.integers(0, 24, size=int(at.sum()))
        else:
            toks = np.arange(30)
            ca, cb = rng.integers(0, 9, size=30), rng.integers(0, 9, size=30)
            cb[rng.random(30) < 0.5] = 0
            a, b = np.repeat(toks, ca), np.repeat(toks, cb)
            if not len(a) or not len(b):
                a, b = np.append(a, 99), np.append(b, 99)
        out.append((a.astype(np.uint64) + np.uint64(1), b.astype(np.uint64) + np.uint64(1)))
    return out


def gaps_estimate(query: W.Sketch, text: W.Sketch, text_units: np.ndarray, k: int) -> float:
    """The estimate with a text bin counted empty when none of its tokens' first elements
    (m = 1: w(1) = 1 in every tf mode) is in it."""
    (kq, eq), (kt, et) = query, text
    u = mix64(mix64(np.unique(text_units), W.ELEM_SALT) ^ np.uint64(1), W.ELEM_SALT + 1)
    no_first = np.ones(k, dtype=np.bool_)
    no_first[oph_bins(u, k)] = False
    n_mat = np.count_nonzero(~eq & ~et & (kq == kt))
    return float(n_mat / (k - np.count_nonzero(eq & no_first)))


def measure(kind: str, tf: str, n_pairs: int, n_salts: int, k: int) -> dict[str, float]:
    rng = np.random.default_rng(46)
    salts = [int(s) for s in rng.integers(1, 2**62, size=n_salts)]
    bias = {"woph": [], "mono": [], "gaps": []}  # type: dict[str, list[float]]
    var = {"woph": [], "mono": [], "gaps": []}  # type: dict[str, list[float]]
    for a, b in pairs(kind, n_pairs, rng):
        exact = weighted_jaccard(a.tolist(), b.tolist(), tf)
        ests = {"woph": [], "mono": [], "gaps": []}  # type: dict[str, list[float]]
        for s in salts:
            sa, sb = mix64(a, s), mix64(b, s)
            qs, ts = W.sketch(sa, k, tf), W.sketch(sb, k, tf)  # type: ignore[arg-type]
            ests["woph"].append(W.estimate(qs, ts))
            ests["gaps"].append(gaps_estimate(qs, ts, sb, k))
            ka = monoactive_query.query_minhashes(sa, k, "weighted", tf=tf)  # type: ignore[arg-type]
            kb = monoactive_query.query_minhashes(sb, k, "weighted", tf=tf)  # type: ignore[arg-type]
            ests["mono"].append(float(np.count_nonzero(ka == kb)) / k)
        for m, e in ests.items():
            bias[m].append(float(np.mean(e)) - exact)
            var[m].append(float(np.var(e)))
    out = {}
    for m in ("woph", "mono", "gaps"):
        out[f"{m}_bias"] = float(np.mean(bias[m]))
        out[f"{m}_absbias"] = float(np.mean(np.abs(bias[m])))
        out[f"{m}_var"] = float(np.mean(var[m]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--salts", type=int, default=200)
    ap.add_argument("--k", type=int, default=64)
    args = ap.parse_args()
    print(f"\n## weighted OPH vs MonoActive estimator, k = {args.k}: {args.pairs} pairs per "
          f"row, {args.salts} salts per pair")
    head = (f"{'sets':<8} {'tf':<8} {'woph bias':>10} {'woph |bias|':>12} {'woph var':>9} "
            f"{'mono bias':>10} {'mono |bias|':>12} {'mono var':>9} {'gaps bias':>10}")
    print(head)
    print("-" * len(head))
    for kind, tf in (("rfc", "log"), ("rfc", "raw"), ("text", "log"), ("text", "raw"),
                     ("repeats", "log"), ("repeats", "raw"), ("random", "log"), ("random", "raw")):
        r = measure(kind, tf, args.pairs, args.salts, args.k)
        print(f"{kind:<8} {tf:<8} {r['woph_bias']:>+10.4f} {r['woph_absbias']:>12.4f} "
              f"{r['woph_var']:>9.5f} {r['mono_bias']:>+10.4f} {r['mono_absbias']:>12.4f} "
              f"{r['mono_var']:>9.5f} {r['gaps_bias']:>+10.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
