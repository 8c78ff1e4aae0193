"""Rule changes of the align stage tried on a run's recorded requests (``align_replay
record``), before any is built: what each saves of the align stage's CPU and what it keeps
of the recorded passage matches.

- ``--caps C,...``: ``passage.max_candidates`` lowered to C (the index's rule: per passage,
  the candidates with the most collided bins, ties to the earlier page), applied to the
  recorded tasks (recorded with 16);
- ``--sandwich``: in two rounds, the tasks of even passages first; then a task (p, o) of
  an odd passage is skipped when (p - 1, o) and (p + 1, o) both hit. Passage p's units lie
  inside its two neighbours' (stride ≤ half a passage), so the pages hit and the units
  each covers (``rank_keys``' first key) cannot change; the best estimate and the spans
  (seeded from every hit's box) can.
- ``--infer S,...``: tests.bench.align_infer's rule with stride S (tasks between two
  scanned tasks of a page that hit it in as many ranges inferred, unscanned).

Each request is aligned by both paths in one process, alternating which goes first.

    python -m tests.bench.align_rules R --caps 8,4 --sandwich --infer 16
"""

from __future__ import annotations

import argparse
import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np

from dupalign.passage import batch_align as passage_align
from dupalign.passage.tasks import Tasks
from dupalign.stages.align import Aligner, RankedPage
from dupalign.stages.messages import AlignRequest
from tests.bench.align_infer import InferAligner
from tests.bench.align_replay import config

I64 = np.ndarray


def collided_bins(t: Tasks) -> I64:
    """Per task: the distinct lists of its passage holding its page (the index's count)."""
    big = np.int64(1 << 40)
    pairs = [x * big + np.unique(t.ords[t.start[x]:t.start[x] + t.count[x]])
             for x in range(len(t.count)) if t.count[x]]
    keys = np.unique(np.concatenate(pairs)) if pairs else np.zeros(1, np.int64)
    lid = t.lid[t.t_p]
    want = lid.astype(np.int64) * big + t.t_o[:, None]
    at = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
    return np.asarray(((lid >= 0) & (keys[at] == want)).sum(axis=1), dtype=np.int64)


def capped(req: AlignRequest, cap: int) -> AlignRequest:
    """``req`` with at most ``cap`` candidates a passage (and the forward data of the pages
    left)."""
    t = req.tasks
    order = np.lexsort((t.t_o, -collided_bins(t), t.t_p))
    p_sorted = t.t_p[order]
    rank = np.empty(len(t), dtype=np.int64)
    rank[order] = np.arange(len(t)) - np.searchsorted(p_sorted, p_sorted, side="left")
    keep = np.flatnonzero(rank < cap)
    before = t.pages.tolist()
    t.t_p, t.t_o = t.t_p[keep], t.t_o[keep]
    left = set(t.pages.tolist())
    sel = [x for x, o in enumerate(before) if o in left]
    req.other_ids = [req.other_ids[x] for x in sel]
    req.other_positions = [req.other_positions[x] for x in sel]
    return req


class SandwichAligner(Aligner):
    """``Aligner`` whose scan skips an odd passage's task when both neighbours hit its page."""

    skipped = 0
    viable = 0

    def scan(self, t: Tasks) -> tuple[Any, Any, Any, Any]:
        w = self.weights
        keep = np.flatnonzero(passage_align.viable_tasks(
            t.t_p, t.t_o, t.lid, t.count, t.start, t.ords, t.rects, t.q_empty, w.w_match,
            w.w_empty, w.need, self.cfg.max_repeats))
        t.gather_empty(keep)

        def run(idx: I64) -> list[I64]:
            h_t, h_s, h_e, h_x = passage_align.scan_tasks(
                t.t_p[idx], t.t_o[idx], t.lid, t.count, t.start, t.ords, t.rects, t.q_empty,
                t.empty_keys, t.empty_off, t.empty_lr, w.w_match, w.w_empty, w.need,
                self.cfg.min_len, self.spans.k, self.cfg.max_repeats)
            return [idx[h_t], h_s, h_e, h_x]

        even, odd = keep[t.t_p[keep] % 2 == 0], keep[t.t_p[keep] % 2 == 1]
        first = run(even)
        hit = set(zip(t.t_p[first[0]].tolist(), t.t_o[first[0]].tolist(), strict=True))
        skip = np.array([(p - 1, o) in hit and (p + 1, o) in hit for p, o in zip(
            t.t_p[odd].tolist(), t.t_o[odd].tolist(), strict=True)], dtype=np.bool_)
        self.skipped += int(skip.sum())
        self.viable += len(keep)
        hits = [np.concatenate(pair) for pair in zip(first, run(odd[~skip]), strict=True)]
        order = np.argsort(hits[0], kind="stable")
        return hits[0][order], hits[1][order], hits[2][order], hits[3][order]


def covered_tokens(spans: list[Any]) -> set[int]:
    """The query tokens a page's spans cover."""
    return {x for sp in spans for x in range(*sp.tokens)}


def compare(requests: list[tuple[bytes, Any]], rule: str, cap: int | None,
            infer: int = 1) -> None:
    cfg = config()
    base = Aligner(cfg)
    other: Aligner = (SandwichAligner(cfg) if cap is None and infer == 1
                      else InferAligner(cfg, infer) if infer > 1 else Aligner(cfg))
    for al in (base, other):  # (kernels loaded before any clock)
        al.align_ranked(AlignRequest.from_bytes(requests[0][0]))
    cpu = {id(base): 0.0, id(other): 0.0}
    same = same_pages = same_keys = 0
    kept = total = reported = 0
    spans_same = spans_want = 0
    tokens_want = tokens_kept = tokens_have = 0
    for n, (raw, _) in enumerate(requests):
        got: dict[int, list[RankedPage]] = {}
        for al in (base, other) if n % 2 else (other, base):
            req = AlignRequest.from_bytes(raw)
            if al is other and cap is not None:
                req = capped(req, cap)
            c0 = time.thread_time()
            got[id(al)] = al.align_ranked(req)
            cpu[id(al)] += time.thread_time() - c0
        a, b = got[id(base)], got[id(other)]
        same += a == b
        same_pages += [p.ordinal for p in a] == [p.ordinal for p in b]
        same_keys += [(p.ordinal, p.covered) for p in a] == [(p.ordinal, p.covered) for p in b]
        want = {p.ordinal for p in a if p.spans}
        have = {p.ordinal for p in b if p.spans}
        kept += len(want & have)
        total += len(want)
        reported += len(have)
        theirs = {p.ordinal: p.spans for p in b}
        spans_want += sum(len(p.spans) for p in a)
        spans_same += sum(len(set(map(repr, p.spans)) & set(map(repr, theirs.get(
            p.ordinal, [])))) for p in a)
        for p in a:  # the query tokens main's spans of a page cover, and this rule's
            mine = covered_tokens(p.spans)
            other_tokens = covered_tokens(theirs.get(p.ordinal, []))
            tokens_want += len(mine)
            tokens_kept += len(mine & other_tokens)
            tokens_have += len(other_tokens) if p.ordinal in theirs else 0
    extra = (f"; viable tasks skipped {other.skipped:,} of {other.viable:,}"
             if isinstance(other, SandwichAligner) else "")
    print(f"| {rule} | {cpu[id(base)]:.2f} → {cpu[id(other)]:.2f} s "
          f"({cpu[id(other)] / cpu[id(base)]:.2f}×) | {kept:,} of {total:,} "
          f"({kept / max(1, total):.1%}); {reported:,} reported | {same_pages:,} / {same_keys:,}"
          f" / {same:,} of {len(requests):,}{extra}; spans kept identical {spans_same:,} of "
          f"{spans_want:,}; query tokens of main's spans covered {tokens_kept:,} of "
          f"{tokens_want:,} ({tokens_kept / max(1, tokens_want):.2%}), this rule's "
          f"{tokens_have:,} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--caps", default="", help="max_candidates values to try, e.g. 8,4")
    ap.add_argument("--sandwich", action="store_true")
    ap.add_argument("--infer", default="", help="strides of align_infer's rule, e.g. 16,64")
    ap.add_argument("--limit", type=int, default=None, help="requests")
    args = ap.parse_args()
    requests = pickle.loads(args.path.read_bytes())[0][:args.limit]
    print("| rule | align CPU, main's rule → this one | matched pages kept | requests with the "
          "same pages / and covered / identical ranked pages and spans |")
    print("|---|---|---|---|")
    for cap in [int(c) for c in args.caps.split(",") if c]:
        compare(requests, f"max_candidates {cap}", cap)
    if args.sandwich:
        compare(requests, "skip sandwiched odd passages", None)
    for stride in [int(c) for c in args.infer.split(",") if c]:
        compare(requests, f"infer_stride {stride}", None, stride)


if __name__ == "__main__":
    main()
