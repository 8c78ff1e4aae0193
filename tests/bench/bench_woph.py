"""Benchmark: the three passage modes side by side in one run (oph, weighted, weighted_oph).

1. Cost as the store grows: the same page stream (tests.bench.bench_passages.page_stream:
   300-1000-word real-text pages, 10 % with a planted edited copy of an earlier page) through
   one engine per mode (near duplicates off: passage cost only, default passage config
   otherwise), the engines taking turns on each segment of pages so that the load of the
   shared machine falls on all of them alike. At each checkpoint: CPU ms per page over the
   segment (process time: RocksDB's threads too), store bytes per token (whole store, and
   the passage index: lists and forward records, after flush), and the share of planted
   copies whose source page is among the page's matches. ``weighted`` stops at
   ``--weighted-max`` pages (it costs ~25x the others).
2. Precision and recall against exact weighted Jaccard (tf = log, the engine's): for a
   128-word RFC passage Q and a 1000-word text T holding an edited copy of it
   (bench_passages.planted_pairs), the truth ⊕S is every position of T inside some
   subsequence T[i..j] with exact weighted Jaccard J_w(Q, T[i..j]) ≥ θ (brute force, no
   length limit); ⊕R the positions of the ranges each mode's pairwise aligner reports
   (k = 64, word bigrams: "raw", the scan's longest ranges), and of the refined spans
   inside them (dupalign.passage.span_refine with the engine's defaults, the scan's ranges
   as boxes against the whole query: what a user gets); P, R per pair, averaged (as
   bench_passages' accuracy table).
3. PAN measures on planted copies per edit level (bench_passages.planted_pan_docs): every
   suspicious text queried against a store of the sources, per mode (refined spans).

Run: .venv/bin/python -m tests.bench.bench_woph [--scale 1000,10000] [--weighted-max 1000]
     [--pairs 30] [--pan 20] [--only cost|accuracy|pan]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import Counter
from fractions import Fraction

import numpy as np
import numpy.typing as npt
from numba import njit

from dupalign.config import EngineConfig, NearConfig, PassageConfig
from dupalign.page import Page
from dupalign.passage import monoactive_query, span_refine, weighted_oph
from dupalign.passage.interval_scan import align
from dupalign.passage.oph import compact_windows, oph_values
from dupalign.passage.sketch import PassageSketcher
from dupalign.runtime.engine import Engine
from dupalign.text.hashing import token_hashes
from tests.bench.bench_passages import (
    EDIT_LEVELS,
    _git_state,
    family_bytes,
    page_stream,
    planted_pairs,
    planted_pan_docs,
    range_positions,
)
from tests.bench.pan import Alignment, pan_scores

MODES = ("oph", "weighted", "weighted_oph")
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def config(mode: str) -> EngineConfig:
    return EngineConfig(near=NearConfig(enabled=False),
                        passage=PassageConfig(mode=mode)).validate()


# -- 1. cost ---------------------------------------------------------------------------------

def cost(checkpoints: list[int], weighted_max: int) -> None:
    rng = np.random.default_rng(46)
    pages = list(page_stream(checkpoints[-1], rng, use_docs=True))
    print(f"## Cost per mode as the store grows ({_git_state()}); engines take turns per "
          "segment")
    head = (f"{'pages':>6} {'mode':<13} {'CPU ms/page':>11} {'x oph':>6} {'B/token':>8} "
            f"{'index B/token':>13} {'x oph':>6} {'planted found':>13}")
    print(head)
    print("-" * len(head))
    dirs = {m: tempfile.mkdtemp(prefix=f"bench-woph-{m}-") for m in MODES}
    engines = {m: Engine.open(dirs[m], config(m)) for m in MODES}
    try:
        words = [f"w{(i * 7919) % 1009}" for i in range(600)]
        for eng in engines.values():  # kernels compiled before the clock starts
            for n, text in enumerate((words, [*words[:-3], "x", "y", "z"],
                                      [f"v{i}" for i in range(300)] + words[200:500])):
                eng.process(Page(f"warm-up-{n}", " ".join(text)))
        tokens = {m: 0 for m in MODES}
        found = {m: 0 for m in MODES}
        planted = {m: 0 for m in MODES}
        done = 0
        for cp in checkpoints:
            cpu: dict[str, float] = {}
            for m, eng in engines.items():
                if done >= weighted_max and m == "weighted":
                    continue
                t = time.process_time()
                for x in range(done, cp):
                    text, source = pages[x]
                    got = eng.process(Page(f"p{x}", text))
                    tokens[m] += text.count(" ") + 1
                    if source is not None:
                        planted[m] += 1
                        found[m] += any(g.match_doc_id == f"p{source[0]}" for g in got)
                cpu[m] = (time.process_time() - t) / (cp - done)
            size: dict[str, tuple[float, float]] = {}
            for m in cpu:
                eng = engines[m]
                pending = getattr(eng.passages, "pending", None)
                if pending is not None:
                    pending.drain(into_file=True)
                eng.store.flush()
                index = sum(family_bytes(eng, f) for f in ("oph", "forward"))
                size[m] = (eng.store.size_bytes() / tokens[m], index / tokens[m])
            for m in cpu:
                print(f"{cp:>6} {m:<13} {1e3 * cpu[m]:>11.2f} {cpu[m] / cpu['oph']:>6.2f} "
                      f"{size[m][0]:>8.1f} {size[m][1]:>13.1f} "
                      f"{size[m][1] / size['oph'][1]:>6.2f} "
                      f"{found[m] / max(1, planted[m]):>13.3f}", flush=True)
            done = cp
    finally:
        for eng in engines.values():
            eng.close()
        for d in dirs.values():
            shutil.rmtree(d, ignore_errors=True)
    print("CPU: the segment since the previous checkpoint; index: the lists and forward "
          "records; planted found: pages with a planted copy whose source is matched.\n")


# -- 2. precision and recall against exact weighted Jaccard -----------------------------------

@njit(cache=True)
def _weighted_truth_ends(text: I64, wq: F64, theta: float, log_tf: bool) -> I64:
    """For each start i, the largest j with J_w(Q, T[i..j]) ≥ θ (-1 if none): O(n^2).
    ``wq[t]``: the query's weight of token t (0 if absent)."""
    n = text.shape[0]
    cnt = np.zeros(wq.shape[0], dtype=np.int64)
    best = np.full(n, -1, dtype=np.int64)
    total_q = wq.sum()
    for i in range(n):
        lo, hi = 0.0, total_q
        for j in range(i, n):
            t = text[j]
            c = cnt[t]
            old = 0.0 if c == 0 else (1.0 + np.log(c) if log_tf else float(c))
            new = 1.0 + np.log(c + 1) if log_tf else float(c + 1)
            cnt[t] = c + 1
            lo += min(wq[t], new) - min(wq[t], old)
            hi += max(wq[t], new) - max(wq[t], old)
            if lo >= theta * hi - 1e-12:
                best[i] = j
        for j in range(i, n):
            cnt[text[j]] = 0
    return best


def weighted_truth(q_units: npt.NDArray[np.uint64], t_units: npt.NDArray[np.uint64],
                   theta: float) -> npt.NDArray[np.bool_]:
    """⊕S: positions of T inside some subsequence with exact weighted Jaccard ≥ θ."""
    _, inv = np.unique(np.concatenate((q_units, t_units)), return_inverse=True)
    qi, ti = inv[: len(q_units)], inv[len(q_units):].astype(np.int64)
    qc = np.bincount(qi, minlength=int(inv.max()) + 1).astype(np.float64)
    wq = np.where(qc > 0, 1.0 + np.log(np.maximum(qc, 1.0)), 0.0)
    ends = _weighted_truth_ends(ti, wq, theta, True)
    cover = np.zeros(len(t_units) + 1, dtype=np.int64)
    starts = np.flatnonzero(ends >= 0)
    np.add.at(cover, starts, 1)
    np.add.at(cover, ends[starts] + 1, -1)
    return np.cumsum(cover[:-1]) > 0


def reported(mode: str, q: npt.NDArray[np.uint64], t: npt.NDArray[np.uint64], k: int,
             theta: tuple[int, int]) -> list[tuple[int, int]]:
    if mode == "oph":
        return align(oph_values(q), compact_windows(oph_values(t), k), k, theta)
    if mode == "weighted":
        return monoactive_query.align_weighted(q, t, k, theta, "weighted", tf="log")
    return weighted_oph.align(q, weighted_oph.compact_windows(t, k, "log"), k, theta, "log")


def refined(q: npt.NDArray[np.uint64], t: npt.NDArray[np.uint64],
            ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The text ranges of the refined spans inside the scan's ranges (the align stage's
    boxes: the whole query against each range)."""
    if not ranges:
        return []
    boxes = np.array([(0, len(q), s, e) for s, e in ranges], dtype=np.int64)
    return [(p.t_start, p.t_end) for p in span_refine.refine(q, t, boxes)]


def _p_r(got: list[npt.NDArray[np.bool_]], truths: list[npt.NDArray[np.bool_]]
         ) -> tuple[float, float, float, int]:
    """Mean P over the pairs with a report, mean R over those with a truth, F1, and the
    pairs with no report."""
    ps, rs, empty = [], [], 0
    for g, truth in zip(got, truths, strict=True):
        both = int(np.count_nonzero(g & truth))
        if g.any():
            ps.append(both / int(g.sum()))
        else:
            empty += 1
        if truth.any():
            rs.append(both / int(truth.sum()))
    p, r = float(np.mean(ps)) if ps else 0.0, float(np.mean(rs)) if rs else 0.0
    return p, r, 2 * p * r / (p + r) if p + r else 0.0, empty


def accuracy(n_pairs: int, thetas: list[Fraction]) -> None:
    pairs = planted_pairs(n_pairs, np.random.default_rng(47))
    sk = PassageSketcher(EngineConfig())  # word bigrams, the engine's units
    print(f"## Precision and recall against exact weighted Jaccard (tf log), {len(pairs)} "
          "planted pairs (128-word query, 5-15 % edits, 1000-word host), k = 64, bigrams")
    head = (f"{'θ':>5} {'mode':<13} {'raw P':>6} {'raw R':>6} {'raw F1':>6} {'ref P':>6} "
            f"{'ref R':>6} {'ref F1':>6} {'no R':>5} {'ms/pair':>8}")
    print(head)
    print("-" * len(head))
    for th in thetas:
        p_q = (th.numerator, th.denominator)
        units = [(sk.units(token_hashes(p.query, 0)), sk.units(token_hashes(p.text, 0)))
                 for p in pairs]
        truths = [weighted_truth(q, t, float(th)) for q, t in units]
        for mode in MODES:
            raw, ref, cpu = [], [], 0.0
            for q, t in units:
                c = time.process_time()
                ranges = reported(mode, q, t, 64, p_q)
                cpu += time.process_time() - c
                raw.append(range_positions(ranges, len(t)))
                ref.append(range_positions(refined(q, t, ranges), len(t)))
            p, r, f1, empty = _p_r(raw, truths)
            rp, rr, rf1, _ = _p_r(ref, truths)
            print(f"{th!s:>5} {mode:<13} {p:>6.3f} {r:>6.3f} {f1:>6.3f} {rp:>6.3f} {rr:>6.3f} "
                  f"{rf1:>6.3f} {empty:>5} {1e3 * cpu / len(pairs):>8.1f}", flush=True)
    print("raw: the scan's ranges; ref: the refined spans inside them. no R: pairs where the "
          "mode reported nothing (left out of P). ms: pairwise alignment CPU per pair, "
          "windows included (refinement not).\n")


# -- 3. PAN measures on planted copies ------------------------------------------------------

def pan(n: int) -> None:
    sources, docs = planted_pan_docs(n, np.random.default_rng(48))
    print(f"## PAN measures on planted copies, {n} per edit level "
          f"({', '.join(f'{k} {lo:.0%}-{hi:.0%}' for k, (lo, hi) in EDIT_LEVELS.items())}), "
          "refined spans, character level")
    head = (f"{'level':<7} {'mode':<13} {'P':>6} {'R':>6} {'gran':>5} {'plagdet':>7} "
            f"{'found':>5}")
    print(head)
    print("-" * len(head))
    for mode in MODES:
        with tempfile.TemporaryDirectory() as d, Engine.open(d, config(mode)) as eng:
            for name, text in sources.items():
                eng.process(Page(id=name, body=text))
            cases: dict[str, list[Alignment]] = {}
            dets: dict[str, list[Alignment]] = {}
            found: Counter[str] = Counter()
            for doc in docs:
                cases.setdefault(doc.group, []).extend(
                    Alignment(doc.name, doc.src, a, b) for a, b in doc.cases)
                matches = [m for m in eng.query_text(doc.text) if m.match_doc_id == doc.src]
                found[doc.group] += bool(matches)
                dets.setdefault(doc.group, []).extend(
                    Alignment(doc.name, doc.src, sp.chars, sp.match_chars)
                    for m in matches for sp in m.spans or ())
            for level in EDIT_LEVELS:
                sc = pan_scores(cases[level], dets[level])
                print(f"{level:<7} {mode:<13} {sc.precision:>6.3f} {sc.recall:>6.3f} "
                      f"{sc.granularity:>5.2f} {sc.plagdet:>7.3f} {found[level]:>5}",
                      flush=True)
    print()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", default="1000,10000")
    ap.add_argument("--weighted-max", type=int, default=1000)
    ap.add_argument("--pairs", type=int, default=30)
    ap.add_argument("--pan", type=int, default=20)
    ap.add_argument("--thetas", default="3/10,1/2")
    ap.add_argument("--only", choices=("cost", "accuracy", "pan"))
    args = ap.parse_args()
    if args.only in (None, "accuracy"):
        accuracy(args.pairs, [Fraction(t) for t in args.thetas.split(",")])
    if args.only in (None, "pan"):
        pan(args.pan)
    if args.only in (None, "cost"):
        cost([int(x) for x in args.scale.split(",")], args.weighted_max)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
