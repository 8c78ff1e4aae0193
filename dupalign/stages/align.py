"""The align stage: a page's alignment tasks → its passage matches, with no index state.

Input: an ``AlignRequest`` (dupalign.stages.messages), the tasks of one page against its earlier
candidate pages. Steps: the candidates' windows in the page's lists and empty bins
gathered from their forward records (dupalign.passage.forward: read from the store or a secondary
instance of it, or carried by the request), per task the viability cut and the interval
scan (``passage_align.scan_tasks``), then the earlier pages hit ranked (``rank_pages``) and
only the best ``passage.max_matches`` kept, and their hits merged into maximal spans with
token and character ranges (``PassageSpans``; with ``refine``, the default, the tight
alignments inside them, dupalign.passage.span_refine, each with the exact Jaccard and
containments of its units). Runs anywhere: other threads, other processes, later other
machines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from dupalign.config import EngineConfig
from dupalign.match import Span
from dupalign.passage import batch_align as passage_align
from dupalign.passage import forward, monoactive, monoactive_query, span_refine, weighted_oph
from dupalign.passage.positions import has_units, unpack_positions
from dupalign.passage.sketch import U64, word_range
from dupalign.passage.tasks import Tasks, Weights
from dupalign.store.forward_reader import ForwardReader
from dupalign.text.tokens import Tokens

Hit = tuple[int, int, int, int, float]  # passage, earlier page, start, end, estimate
I64 = npt.NDArray[np.int64]


@dataclass
class AlignCounters:
    """Work units of the align stage (summed over pages): what a page's cost is made of,
    bounded by ``passage.max_candidates`` (tasks) and ``passage.max_matches`` (pages
    given spans) however many earlier copies of its text there are."""

    pages: int = 0
    tasks: int = 0  # (passage, earlier page) pairs received
    hits: int = 0  # ranges the scan reported
    pages_hit: int = 0  # earlier pages with a hit (before the max_matches cap)
    pages_spanned: int = 0  # earlier pages whose hits were turned into spans


@dataclass
class HitBox:
    """A hit (or a span merged from hits): query units ``[q_start, q_end)`` against the
    earlier page's ``[t_start, t_end)``, with its estimate."""

    q_start: int
    q_end: int
    t_start: int
    t_end: int
    est: float


class PassageSpans:
    """The spans of a page's hits on earlier pages (their units' boxes turned into token and
    character ranges, refined, with their similarities); ``positions`` reads an earlier
    page's positions record (dupalign.passage.positions) by ordinal."""

    def __init__(self, config: EngineConfig, positions: Callable[[int], bytes | None]) -> None:
        self.cfg = config.passage
        self.k = self.cfg.k
        self._tf = cast(monoactive.TfMode, self.cfg.tf_mode)  # validated by PassageConfig
        self.positions = positions
        self.chain_params = span_refine.DEFAULT  # how spans are refined (reporting only)

    def _word_range(self, start: int, end: int) -> tuple[int, int]:
        return word_range(start, end, self.cfg.shingle)

    def spans(self, other: int, hit_boxes: I64, hit_ests: npt.NDArray[np.float64],
               tokens: Tokens, units: U64) -> list[Span]:
        """The spans reported against one earlier page: the scan's hits (rows (q_start,
        q_end, t_start, t_end) of ``hit_boxes``, estimates ``hit_ests``) merged into maximal spans
        or, with ``refine``, the tight alignments inside them (dupalign.passage.span_refine); each
        with its estimate and the exact similarity of its units."""
        raw = self.positions(other)
        if raw is None:
            return []
        o_starts, o_ends, o_units = unpack_positions(raw)
        # both sides' units as stored: their hashes' low 32 bits
        q_units = units & np.uint64(0xFFFFFFFF)
        t_units = None if o_units is None else o_units.astype(np.uint64)
        refined = self.cfg.refine and t_units is not None
        if self.cfg.refine and t_units is not None:
            # never empty: a hit's estimate reaches θ only through a unit both sides share
            pieces = span_refine.refine(q_units, t_units, hit_boxes, self.chain_params)
            boxes = [(p.q_start, p.q_end, p.t_start, p.t_end) for p in pieces]
            ests = self.estimates(q_units, t_units, boxes)
        else:  # (pages indexed before units were kept have the scan's spans only)
            merged = merge_hits([HitBox(q0, q1, t0, t1, x) for (q0, q1, t0, t1), x in zip(
                hit_boxes.tolist(), hit_ests.tolist(), strict=True)])
            boxes = [(h.q_start, h.q_end, h.t_start, h.t_end) for h in merged]
            ests = [h.est for h in merged]
        spans = []
        for x, ((q0, q1, t0, t1), est) in enumerate(zip(boxes, ests, strict=True)):
            qs, qe = self._word_range(q0, q1)
            ts, te = self._word_range(t0, t1)
            if refined and x + 1 < len(boxes):  # pieces are disjoint in units, and in
                qe = min(qe, boxes[x + 1][0])  # words too: a last shingle's tail is cut
            sim = (None if t_units is None
                   else span_refine.similarity(q_units[q0:q1], t_units[t0:t1]))
            spans.append(Span(
                tokens=(qs, qe), chars=tokens.char_range(qs, qe),
                match_tokens=(ts, te),
                match_chars=(int(o_starts[ts]), int(o_ends[te - 1])) if te > ts else (0, 0),
                est_jaccard=round(est, 4),
                jaccard=None if sim is None else round(sim.jaccard, 4),
                containment=None if sim is None else round(sim.containment, 4),
                match_containment=None if sim is None else round(sim.match_containment, 4),
            ))
        spans.sort(key=lambda s: s.tokens)
        return spans

    def estimates(self, a: U64, b: U64, boxes: list[tuple[int, int, int, int]]) -> list[float]:
        """The sketch estimate of each box's two unit ranges ``a[q0:q1]``, ``b[t0:t1]`` (as
        the scan's, without stop lists): OPH and weighted OPH N_mat / (k - N_emp), MonoActive
        matched hash functions / k."""
        if self.cfg.mode == "oph":
            return span_refine.oph_estimates(a, b, np.array(boxes, dtype=np.int64), self.k)
        if self.cfg.mode == "weighted_oph":
            return weighted_oph.estimates(a, b, np.array(boxes, dtype=np.int64), self.k,
                                          self._tf).tolist()
        r = np.array(boxes, dtype=np.int64).reshape(-1, 4)
        many = monoactive_query.query_minhashes_many
        ka = many(a, r[:, 0], r[:, 1], self.k, "weighted", tf=self._tf)
        kb = many(b, r[:, 2], r[:, 3], self.k, "weighted", tf=self._tf)
        return (np.count_nonzero(ka == kb, axis=1) / self.k).tolist()

def merge_hits(hits: list[HitBox]) -> list[HitBox]:
    """Maximal spans: hits whose query ranges and text ranges both overlap or touch are
    merged, transitively (repeated sweeps until nothing merges; each sweep keeps the spans
    still open on the text axis and merges a hit into every open one it overlaps)."""
    spans = [HitBox(h.q_start, h.q_end, h.t_start, h.t_end, h.est) for h in hits]
    while True:
        spans.sort(key=lambda h: (h.t_start, h.q_start))
        merged: list[HitBox] = []
        open_: list[HitBox] = []
        for h in spans:
            open_ = [o for o in open_ if o.t_end >= h.t_start]
            into = [o for o in open_ if h.q_start <= o.q_end and h.q_end >= o.q_start]
            if not into:
                merged.append(h)
                open_.append(h)
                continue
            target = into[0]
            for o in [h, *into[1:]]:
                target.q_start = min(target.q_start, o.q_start)
                target.q_end = max(target.q_end, o.q_end)
                target.t_start = min(target.t_start, o.t_start)
                target.t_end = max(target.t_end, o.t_end)
                target.est = max(target.est, o.est)
            for o in into[1:]:
                merged.remove(o)
                open_.remove(o)
        if len(merged) == len(spans):
            return merged
        spans = merged


def spans_of_hits(spans: PassageSpans, hits: list[Hit], starts: Any, ends: Any,
                  tokens: Tokens, units: Any) -> list[tuple[int, list[Span]]]:
    """``spans_of_hit_arrays`` of hits given as tuples."""
    cols = np.array(hits, dtype=np.float64).reshape(-1, 5)
    h_p, h_o, h_s, h_e = (cols[:, c].astype(np.int64) for c in range(4))
    return spans_of_hit_arrays(spans, (h_p, h_o, h_s, h_e, cols[:, 4]), starts, ends,
                               tokens, units)


def spans_of_hit_arrays(
    spans: PassageSpans, hits: tuple[I64, I64, I64, I64, npt.NDArray[np.float64]],
    starts: Any, ends: Any, tokens: Tokens, units: Any,
    counters: AlignCounters | None = None,
) -> list[tuple[int, list[Span]]]:
    """Hits (passage, earlier page, start, end, estimate: one array each) turned into
    spans per earlier page, in page order (``units``: the query page's unit hashes, low 32
    bits, as in its positions record). Only the best ``passage.max_matches`` pages
    (``rank_pages``) get spans: the span work of a page stays bounded however many earlier
    pages its passages hit; pages whose spans come out empty are left out."""
    return [(r.ordinal, r.spans) for r in ranked_spans(spans, hits, starts, ends, tokens,
                                                       units, counters) if r.spans]


@dataclass
class RankedPage:
    """An earlier page among the best ``passage.max_matches`` a request's hits name, with
    the keys ``rank_pages`` orders by (its spans may be empty). The keys of a page depend
    on its own hits only, so the best pages of a request split by earlier page are the
    best of its parts' best (``merge_ranked``)."""

    ordinal: int
    covered: int
    best_est: float
    spans: list[Span]
    doc_id: str = ""


def ranked_spans(
    spans: PassageSpans, hits: tuple[I64, I64, I64, I64, npt.NDArray[np.float64]],
    starts: Any, ends: Any, tokens: Tokens, units: Any,
    counters: AlignCounters | None = None,
) -> list[RankedPage]:
    """``spans_of_hit_arrays`` keeping the pages whose spans come out empty, and the rank
    keys of each, in page order."""
    h_p, h_o, h_s, h_e, h_x = hits
    if not len(h_p):  # (a page too short for passages has no starts either)
        return []
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    pages, covered, best_est = rank_keys(h_p, h_o, h_x, starts, ends)
    top = np.argsort(pages[: spans.cfg.max_matches], kind="stable")
    kept = pages[top]
    if counters is not None:  # (hits: counted by the caller, as the scan reported them)
        counters.pages_hit += len(pages)
        counters.pages_spanned += len(kept)
    order = np.argsort(h_o, kind="stable")  # each page's hits in the scan's order
    lo = np.searchsorted(h_o[order], kept, side="left").tolist()
    hi = np.searchsorted(h_o[order], kept, side="right").tolist()
    q_units = np.asarray(units, np.uint64)
    # per kept page: the boxes (query passage × page range) and estimates of its hits
    groups = []
    for other, a, z in zip(kept.tolist(), lo, hi, strict=True):
        rows = order[a:z]
        boxes = np.stack((starts[h_p[rows]], ends[h_p[rows]], h_s[rows], h_e[rows]), axis=1)
        groups.append((other, boxes, h_x[rows]))
    if spans.cfg.refine and spans.cfg.mode == "oph":
        found = _refined_spans(spans, groups, tokens, q_units)
    else:
        found = {other: spans.spans(other, boxes, ests, tokens, q_units)
                 for other, boxes, ests in groups}
    return [RankedPage(other, c, x, found[other]) for other, c, x in zip(
        kept.tolist(), covered[top].tolist(), best_est[top].tolist(), strict=True)]


def merge_ranked(parts: list[list[RankedPage]], max_matches: int
                 ) -> list[tuple[str, list[Span]]]:
    """The passage matches of a request aligned in parts (split by earlier page, each part
    giving its best ``max_matches`` pages): the best ``max_matches`` of them all, those
    with spans, in page order: what one ``Aligner.align`` of the whole request returns."""
    pages = sorted((p for part in parts for p in part),
                   key=lambda p: (-p.covered, -p.best_est, p.ordinal))[:max_matches]
    return [(p.doc_id, p.spans) for p in sorted(pages, key=lambda p: p.ordinal) if p.spans]


def _refined_spans(spans: PassageSpans, groups: list[tuple[int, I64, npt.NDArray[np.float64]]],
                   tokens: Tokens, q_units: npt.NDArray[np.uint64]) -> dict[int, list[Span]]:
    """``PassageSpans.spans`` of every kept page (refined, OPH), the pages' seeds, chains,
    estimates and similarities in one kernel (``span_refine.refine_pages``): the same spans,
    without the per-page Python and numpy calls around small kernels that cost more than
    the scan itself on the dense stream. Pages indexed before units were kept go the old
    way (they have the scan's spans only)."""
    out: dict[int, list[Span]] = {}
    batch = []  # (other, boxes, its positions record)
    for other, boxes, ests in groups:
        raw = spans.positions(other)
        if raw is None:
            out[other] = []
        elif not has_units(raw):  # no units: the scan's spans
            out[other] = spans.spans(other, boxes, ests, tokens, q_units)
        else:
            batch.append((other, boxes, unpack_positions(raw)))
    if not batch:
        return out
    a = np.ascontiguousarray(q_units & np.uint64(0xFFFFFFFF))
    b_units = [cast(npt.NDArray[np.uint32], pos[2]) for _, _, pos in batch]
    b_off = np.zeros(len(batch) + 1, dtype=np.int64)
    np.cumsum([len(u) for u in b_units], out=b_off[1:])
    box_off = np.zeros(len(batch) + 1, dtype=np.int64)
    np.cumsum([len(boxes) for _, boxes, _ in batch], out=box_off[1:])
    params = spans.chain_params
    rows, sims = span_refine.refine_pages(
        a, np.concatenate(b_units).astype(np.uint64),
        b_off, np.ascontiguousarray(np.concatenate([boxes for _, boxes, _ in batch]),
                                    dtype=np.int64),
        box_off, params.margin, params.max_occ, params.match, params.gap, params.max_gap,
        params.min_score, spans.k)
    shingle = spans.cfg.shingle
    g_rows = np.searchsorted(rows[:, 0], np.arange(len(batch) + 1)).tolist()
    rows_l, sims_l = rows.tolist(), sims.tolist()
    for g, (other, _, (o_starts, o_ends, _)) in enumerate(batch):
        found = []
        for x in range(g_rows[g], g_rows[g + 1]):
            _, q0, q1, t0, t1 = rows_l[x]
            est, jac, cont, m_cont = (round(v, 4) for v in sims_l[x])
            qs, qe = q0, q1 - 1 + shingle
            ts, te = t0, t1 - 1 + shingle
            if x + 1 < g_rows[g + 1]:  # pieces are disjoint in units, and in words too:
                qe = min(qe, rows_l[x + 1][1])  # a last shingle's tail is cut
            found.append(Span(
                tokens=(qs, qe), chars=tokens.char_range(qs, qe), match_tokens=(ts, te),
                match_chars=(int(o_starts[ts]), int(o_ends[te - 1])) if te > ts else (0, 0),
                est_jaccard=est, jaccard=jac, containment=cont, match_containment=m_cont))
        found.sort(key=lambda s: s.tokens)
        out[other] = found
    return out


def union_hits(h_t: I64, h_s: I64, h_e: I64, h_x: npt.NDArray[np.float64]
               ) -> tuple[I64, I64, I64, npt.NDArray[np.float64]]:
    """A task's hits (in the scan's order: by task, then start) whose page ranges
    overlap or touch, merged into one: their union, with the highest estimate. Spans
    depend on the hits only through that (``rank_keys``: which passages hit a page and
    the best estimate; ``span_refine.refine_pages`` and ``merge_hits``: the union of the
    boxes of a passage), and the scan reports about ten overlapping ranges a task on
    templated text (Boost: 2.27 M for 232 k tasks)."""
    if len(h_t) < 2:
        return h_t, h_s, h_e, h_x
    # the running end of each task's hits (a task's starts ascend; its ends may not)
    width = int(h_e.max()) + 1
    reach = np.maximum.accumulate(h_t * width + h_e) - h_t * width
    first = np.flatnonzero(np.concatenate((
        [True], (h_t[1:] != h_t[:-1]) | (h_s[1:] > reach[:-1]))))
    last = np.concatenate((first[1:], [len(h_t)])) - 1
    return (h_t[first], h_s[first], reach[last],
            np.maximum.reduceat(h_x, first))


def rank_pages(h_p: I64, h_o: I64, h_x: npt.NDArray[np.float64], starts: I64,
               ends: I64) -> I64:
    """``rank_keys``' pages only."""
    return rank_keys(h_p, h_o, h_x, starts, ends)[0]


def rank_keys(h_p: I64, h_o: I64, h_x: npt.NDArray[np.float64], starts: I64, ends: I64
              ) -> tuple[I64, I64, npt.NDArray[np.float64]]:
    """The earlier pages named by the hits, best first: most units of the query page
    covered by its passages that hit the page, then the highest estimate of a hit, then
    the earliest page. Deterministic (a function of the hits alone), and cheap: the cap
    on matches is applied before any span is computed."""
    if not len(h_o):
        return (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64),
                np.empty(0, dtype=np.float64))
    n_p = len(starts)
    pairs = np.unique(h_o * n_p + h_p)  # by page, then passage
    o, p = pairs // n_p, pairs % n_p
    # passages ascend in start and in end: a passage adds what lies past the previous one
    prev_end = np.concatenate(([-1], ends[p[:-1]]))
    prev_end[np.concatenate(([True], o[1:] != o[:-1]))] = -1
    gain = np.maximum(0, ends[p] - np.maximum(starts[p], prev_end))
    pages, first = np.unique(o, return_index=True)
    covered = np.add.reduceat(gain, first)
    best_est = np.full(len(pages), -np.inf)
    np.maximum.at(best_est, np.searchsorted(pages, h_o), h_x)
    order = np.lexsort((pages, -best_est, -covered))
    return pages[order], covered[order], best_est[order]


class Aligner:
    """The align stage for one engine configuration (cheap; one per process or thread).
    ``store``: where the candidates' forward records are read (the store, or a secondary
    instance of it that catches up with the writer when a record is not there yet, as a
    ``StoreForward``; or an align partition's store);
    without one, only requests that carry them can be aligned."""

    def __init__(self, config: EngineConfig, store: ForwardReader | None = None) -> None:
        self.store = store
        # the positions records a request carries (``AlignRequest.to_bytes(forward=True)``),
        # while it is aligned: read instead of the store's
        self._carried: dict[int, bytes] | None = None
        self.spans = PassageSpans(config, self._positions)
        self.cfg = config.passage
        self.weights = Weights.of(self.cfg)
        self.counters = AlignCounters()
        # candidates' forward records kept between requests (templated pages keep naming
        # the same candidates)
        self.records = forward.RecordCache(config.cache.budgets_mb()["forward"] << 20)

    def _positions(self, ordinal: int) -> bytes | None:
        if self._carried is not None:
            return self._carried.get(ordinal)
        if self.store is None:
            raise KeyError("the align stage has no store to read 'positions' records from")
        return self.store.positions(ordinal)

    def read_forward(self, ordinals: list[int]) -> list[bytes | None]:
        """The candidates' windows values; a secondary instance catches up once if some
        are newer than what it has seen."""
        if self.store is None:
            raise KeyError("the request carries no forward data and the align stage has no "
                           "store (Indexer.with_forward attaches it)")
        found = self.store.windows(ordinals)
        if any(v is None for v in found) and self.store.catch_up():
            found = self.store.windows(ordinals)
        return found

    def scan(self, t: Tasks) -> tuple[I64, I64, I64, npt.NDArray[np.float64]]:
        """The align stage's kernels: the viability filter (from the matched windows alone:
        on llvm-13/14 it drops 62 % of the tasks before their empty windows are gathered),
        then the interval scan of the tasks left; hits name tasks of ``t``."""
        w = self.weights
        keep = np.flatnonzero(passage_align.viable_tasks(
            t.t_p, t.t_o, t.lid, t.count, t.start, t.ords, t.rects, t.q_empty, w.w_match,
            w.w_empty, w.need, self.cfg.max_repeats))
        t.gather_empty(keep)  # (when gathered with empty_later)
        h_t, h_s, h_e, h_x = passage_align.scan_tasks(
            t.t_p[keep], t.t_o[keep], t.lid, t.count, t.start, t.ords, t.rects, t.q_empty,
            t.empty_keys, t.empty_off, t.empty_lr, w.w_match, w.w_empty, w.need,
            self.cfg.min_len, self.spans.k, self.cfg.max_repeats)
        return keep[h_t], h_s, h_e, h_x

    def align(self, request: Any) -> list[tuple[str, list[Span]]]:
        """Passage matches of ``request`` (an ``index.AlignRequest``): (earlier page id,
        spans) per earlier page, in ordinal order."""
        return [(p.doc_id, p.spans) for p in self.align_ranked(request) if p.spans]

    def align_ranked(self, request: Any) -> list[RankedPage]:
        """The best ``passage.max_matches`` earlier pages of ``request`` with their rank
        keys and spans (empty ones too), in ordinal order: a part of a request split by
        earlier page (``AlignRequest.split``) answers with these (``merge_ranked``)."""
        carried = request.has_forward
        t = request.tasks.gather(self.read_forward, self.records, empty_later=True)
        h_t, h_s, h_e, h_x = self.scan(t)
        self.counters.pages += 1
        self.counters.tasks += len(t)
        self.counters.hits += len(h_t)
        h_t, h_s, h_e, h_x = union_hits(h_t, h_s, h_e, h_x)
        others = request.others.tolist()
        if carried:
            self._carried = dict(zip(others, request.other_positions, strict=True))
        q_starts, q_ends, q_units = unpack_positions(request.positions)
        tokens = Tokens("", None, q_starts.astype(np.int64), q_ends.astype(np.int64))
        try:
            found = ranked_spans(self.spans, (t.t_p[h_t], t.t_o[h_t], h_s, h_e, h_x),
                                 request.starts, request.ends, tokens, q_units,
                                 self.counters)
        finally:
            self._carried = None
        ids = dict(zip(others, request.other_ids, strict=True)) if carried else None
        for page in found:
            page.doc_id = ids[page.ordinal] if ids is not None else self._doc_id(page.ordinal)
        return found

    def _doc_id(self, ordinal: int) -> str:
        assert self.store is not None
        doc_id = self.store.doc_id(ordinal)
        if doc_id is None:
            raise KeyError(f"no document with ordinal {ordinal}")
        return doc_id
