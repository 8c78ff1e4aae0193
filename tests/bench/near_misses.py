"""Why the near engine misses or wrongly reports pairs on two releases of Debian docs.

The truth and the pages are bench_scan's (word 5-shingle Jaccard >= 0.85 between a later
page and its same-path earlier page, on the extracted text). One near-only run of the
engine (``Engine.process``, one thread) with the configuration given; then, reading the
store it left:

- for each truth page it did not pair with a page of Jaccard >= 0.85, the cause: a page
  not near-indexed (fewer than ``near.min_tokens`` tokens), the pair's stored fingerprints
  more than ``near.hamming`` bits apart (and how far they would be under one idf table: the
  earlier page's fingerprint is the one of the idf table in force when it came), within the
  radius but not probed (the budget), or probed and rejected by the verification (its
  estimate over all K min-hashes shown), or an exact match to a page outside the truth;
- for the pairs beyond h, whether min-hash banding over the stored verification sketches
  (b bands of r min-hashes) would make them candidates, and what it costs in candidates;
- each reported pair below the truth threshold, with its 5- and 3-shingle Jaccard, its
  Hamming distance and its estimate.

Run: python -m tests.bench.near_misses [--corpus llvm|boost] [--hamming H]
     [--probe-budget B] [--show N]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from dupalign.config import EngineConfig, NearConfig, PassageConfig, TextConfig
from dupalign.errors import PageRejected
from dupalign.page import Page
from dupalign.runtime.engine import Engine
from dupalign.stages.sketch import Sketcher
from dupalign.store import tables
from dupalign.text.tokens import tokenize
from tests.bench.bench_scan import TRUTH_J, jaccard, main_text, shingles
from tests.corpora import DOCS_CORPORA, LLVM_DOCS, docs_releases


def shingles_n(tokens: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i:i + n]) for i in range(max(0, len(tokens) - n + 1))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", choices=sorted(DOCS_CORPORA), default="llvm")
    ap.add_argument("--hamming", type=int, default=NearConfig.hamming)
    ap.add_argument("--probe-budget", type=int, default=NearConfig.probe_budget)
    ap.add_argument("--cws-threshold", type=float, default=NearConfig.cws_threshold)
    ap.add_argument("--sweep", action="store_true",
                    help="also recall and precision over (hamming, threshold) from the store")
    ap.add_argument("--show", type=int, default=15, help="rows of each list to print")
    args = ap.parse_args()
    old, new = docs_releases(args.corpus, LLVM_DOCS)
    a, b = (r.label for r in DOCS_CORPORA[args.corpus])
    text = [Page(id=p.id, body=main_text(p), content_type="text/plain") for p in old + new]
    toks = {p.id: tokenize(str(p.body)).tokens for p in text}
    sh = {k: shingles(v) for k, v in toks.items()}
    old_ids = {p.id for p in old}
    truth = {p.id: a + p.id[len(b):] for p in new}
    truth = {x: y for x, y in truth.items() if y in sh and jaccard(sh[x], sh[y]) >= TRUTH_J}
    cfg = EngineConfig(text=TextConfig(main_content=True), passage=PassageConfig(enabled=False),
                       near=dataclasses.replace(NearConfig(), hamming=args.hamming,
                                                probe_budget=args.probe_budget,
                                                cws_threshold=args.cws_threshold)).validate()
    tmp = Path(tempfile.mkdtemp(prefix="near-misses-"))
    pairs: dict[tuple[str, str], tuple[str, int | None, float | None]] = {}
    try:
        with Engine.open(tmp / "store", cfg) as engine:
            for page in text:
                with contextlib.suppress(PageRejected):
                    for m in engine.process(page):
                        if m.kind in ("exact", "near"):
                            pairs[(m.doc_id, m.match_doc_id)] = (m.kind, m.hamming,
                                                                 m.est_jaccard)
            report(engine, cfg, text, toks, sh, old_ids, truth, pairs, args.show)
            if args.sweep:
                sweep(engine, text, sh, old_ids, truth, pairs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def report(engine: Engine, cfg: EngineConfig, text: list[Page], toks: dict[str, list[str]],
           sh: dict[str, set[tuple[str, ...]]], old_ids: set[str], truth: dict[str, str],
           pairs: dict[tuple[str, str], tuple[str, int | None, float | None]],
           show: int) -> None:
    store, near = engine.store, engine.near
    fps, ords = tables.simhash.load(store)
    fp_of = dict(zip(ords.tolist(), fps.tolist(), strict=True))
    ordinal = {p.id: tables.ids.get(store, p.id) for p in text}
    sketcher = Sketcher(cfg)
    by_id = {p.id: p for p in text}
    good = {(x, y) for (x, y) in pairs if x not in old_ids and jaccard(sh[x], sh[y]) >= TRUTH_J}
    found = {x for x, _ in good} & set(truth)
    missed = sorted(set(truth) - found)
    h = cfg.near.hamming
    causes: Counter[str] = Counter()
    rows = []
    for x in missed:
        y = truth[x]
        ox, oy = ordinal[x], ordinal[y]
        j5 = jaccard(sh[x], sh[y])
        if any(k[0] == x and v[0] == "exact" for k, v in pairs.items()):
            cause, detail = "exact match elsewhere", ""
        elif ox is None or oy is None or ox not in fp_of or oy not in fp_of:
            cause, detail = "not near-indexed", f"tokens {len(toks[x])}/{len(toks[y])}"
        else:
            dist = (fp_of[ox] ^ fp_of[oy]).bit_count()
            # both under the idf table in force at the later page's turn
            sy = sketcher.sketch(by_id[y], near.idf).near
            sx = sketcher.sketch(by_id[x], near.idf).near
            same = (int(sx.fingerprint) ^ int(sy.fingerprint)).bit_count()
            kx, ky = near.sketch_of(ox), near.sketch_of(oy)
            est = float(np.count_nonzero(kx == ky)) / len(kx)
            j3 = jaccard(shingles_n(toks[x], 3), shingles_n(toks[y], 3))
            detail = f"hamming {dist} (one idf: {same}) est {est:.3f} J3 {j3:.3f}"
            if dist > h:
                cause = "hamming > h"
            elif near.filter.compare(kx, ky).decision != "similar":
                cause = "rejected by verification"
            else:
                cause = "within h, not probed (budget)"
        causes[cause] += 1
        rows.append((cause, x, j5, detail))
    print(f"truth {len(truth)}, found {len(found)}, recall {len(found) / len(truth):.3f}; "
          f"missed {len(missed)} by cause: {dict(causes)}")
    for cause, x, j5, detail in rows[:show]:
        print(f"  {cause:<28} J5 {j5:.3f} {detail}  {x}")
    beyond = [r[3].split() for r in rows if r[0] == "hamming > h"]
    if beyond:
        dists = Counter(int(d[1]) for d in beyond)
        one_idf = sum(1 for d in beyond if int(d[4].rstrip(")")) <= h)
        print(f"  hamming of the pairs beyond h: {sorted(dists.items())}; {one_idf} of them "
              f"within h under one idf table")
    bands(near, ordinal, truth, [r[1] for r in rows if r[0] == "hamming > h"], ords_of=fp_of)
    new_pairs = {k: v for k, v in pairs.items() if k[0] not in old_ids}
    bad = [(k, v) for k, v in new_pairs.items() if jaccard(sh[k[0]], sh[k[1]]) < TRUTH_J]
    print(f"reported {len(new_pairs)} pairs, {len(bad)} below J5 {TRUTH_J}: precision "
          f"{1 - len(bad) / max(1, len(new_pairs)):.3f}")
    for (x, y), (kind, ham, est) in bad[:show]:
        j3 = jaccard(shingles_n(toks[x], 3), shingles_n(toks[y], 3))
        print(f"  {kind:<5} J5 {jaccard(sh[x], sh[y]):.3f} J3 {j3:.3f} hamming {ham} est {est} "
              f"tokens {len(toks[x])}/{len(toks[y])}  {x} ~ {y}")


def bands(near: object, ordinal: dict[str, int | None], truth: dict[str, str], beyond: list[str],
          ords_of: dict[int, int]) -> None:
    """Min-hash banding over the stored verification sketches (b bands of r rows) as a second
    candidate source: how many of the pairs beyond h share a whole band, and how many
    candidate pairs (a page and an earlier one sharing a band) it gives over the store."""
    sketch_of = near.sketch_of  # type: ignore[attr-defined]
    stored = sorted(ords_of)
    sk = {o: sketch_of(o) for o in stored}
    for b, r in ((16, 8), (32, 4), (10, 12)):
        hit = sum(1 for x in beyond if any(np.array_equal(
            sk[ordinal[x]][i * r:(i + 1) * r], sk[ordinal[truth[x]]][i * r:(i + 1) * r])  # type: ignore[index]
            for i in range(b)))
        seen: dict[tuple[int, bytes], list[int]] = {}
        cand = 0
        for o in stored:
            mates: set[int] = set()
            for i in range(b):
                key = (i, sk[o][i * r:(i + 1) * r].tobytes())
                mates.update(seen.get(key, ()))
                seen.setdefault(key, []).append(o)
            cand += len(mates)
        print(f"  banding b = {b}, r = {r}: {hit} of the {len(beyond)} pairs beyond h share a "
              f"band; {cand} candidate pairs over {len(stored)} pages "
              f"({cand / len(stored):.2f} a page)")


def sweep(engine: Engine, text: list[Page], sh: dict[str, set[tuple[str, ...]]],
          old_ids: set[str], truth: dict[str, str],
          pairs: dict[tuple[str, str], tuple[str, int | None, float | None]]) -> None:
    """Recall and precision if every stored page within Hamming h were a candidate (exact
    search: what PSM gives with an unlimited budget) and a candidate were accepted when its
    estimate over all K min-hashes reaches t; the run's exact matches kept as they are."""
    store, near = engine.store, engine.near
    fps, ords = tables.simhash.load(store)
    order = np.argsort(ords)
    fps, ords = fps[order], ords[order]
    sk = np.stack([near.sketch_of(int(o)) for o in ords])
    name = {tables.ids.get(store, p.id): p.id for p in text}
    exact = {k for k, v in pairs.items() if v[0] == "exact" and k[0] not in old_ids}
    exact_pages = {x for x, _ in exact}
    cands = []  # (hamming, est, good, x)
    for i, o in enumerate(ords.tolist()):
        x = name[o]
        if x in old_ids or x in exact_pages:
            continue
        d = np.bitwise_count(fps[:i] ^ fps[i]).astype(np.int64)
        for j in np.flatnonzero(d <= 7).tolist():
            y = name[int(ords[j])]
            est = float(np.count_nonzero(sk[i] == sk[j])) / sk.shape[1]
            cands.append((int(d[j]), est, jaccard(sh[x], sh[y]) >= TRUTH_J, x))
    good_exact = {x for x, y in exact if jaccard(sh[x], sh[y]) >= TRUTH_J}
    print("sweep (exact Hamming search, full estimate): h t recall precision reported")
    for h in range(3, 8):
        for t in (0.80, 0.82, 0.84, 0.85, 0.86, 0.88):
            got = [c for c in cands if c[0] <= h and c[1] >= t]
            found = ({c[3] for c in got if c[2]} | good_exact) & set(truth)
            n = len(got) + len(exact)
            bad = sum(1 for c in got if not c[2]) + len(exact) - len(
                [1 for x, y in exact if jaccard(sh[x], sh[y]) >= TRUTH_J])
            print(f"  {h} {t:.2f} {len(found) / len(truth):.3f} {1 - bad / max(1, n):.3f} {n}")


if __name__ == "__main__":
    sys.exit(main())
