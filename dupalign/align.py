"""The align stage: a page's alignment tasks → its passage matches, with no index state.

Input: an ``AlignRequest`` (dupalign.index), the tasks of one page against its earlier
candidate pages. Steps: the candidates' windows in the page's lists and empty bins
gathered from their forward records (dupalign.forward: read from the store or a secondary
instance of it, or carried by the request), per task the viability cut and the interval
scan (``passage_align.scan_tasks``), then the earlier pages hit ranked (``rank_pages``) and
only the best ``passage.max_matches`` kept, and their hits merged into maximal spans with
token and character ranges (``PassageIndex._spans``, the same code as the one-thread
query). Runs anywhere: other threads, other processes, later other machines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import msgpack
import numpy as np
import numpy.typing as npt

from dupalign import forward, span_refine
from dupalign.config import EngineConfig
from dupalign.match import Span
from dupalign.passages import PassageIndex, _unpack_positions, has_units
from dupalign.store import Store, read_u64, u64
from dupalign.text import Tokens

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


def spans_of_hits(index: PassageIndex, hits: list[Hit], starts: Any, ends: Any,
                  tokens: Tokens, units: Any) -> list[tuple[int, list[Span]]]:
    """``spans_of_hit_arrays`` of hits given as tuples."""
    cols = np.array(hits, dtype=np.float64).reshape(-1, 5)
    h_p, h_o, h_s, h_e = (cols[:, c].astype(np.int64) for c in range(4))
    return spans_of_hit_arrays(index, (h_p, h_o, h_s, h_e, cols[:, 4]), starts, ends,
                               tokens, units)


def spans_of_hit_arrays(
    index: PassageIndex, hits: tuple[I64, I64, I64, I64, npt.NDArray[np.float64]],
    starts: Any, ends: Any, tokens: Tokens, units: Any,
    counters: AlignCounters | None = None,
) -> list[tuple[int, list[Span]]]:
    """Hits (passage, earlier page, start, end, estimate: one array each) turned into
    spans per earlier page, in page order (``units``: the query page's unit hashes, low 32
    bits, as in its positions record). Only the best ``passage.max_matches`` pages
    (``rank_pages``) get spans: the span work of a page stays bounded however many earlier
    pages its passages hit; pages whose spans come out empty are left out."""
    return [(r.ordinal, r.spans) for r in ranked_spans(index, hits, starts, ends, tokens,
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
    index: PassageIndex, hits: tuple[I64, I64, I64, I64, npt.NDArray[np.float64]],
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
    top = np.argsort(pages[: index.cfg.max_matches], kind="stable")
    kept = pages[top]
    if counters is not None:
        counters.hits += len(h_p)
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
    if index.cfg.refine and index.cfg.mode == "oph":
        found = _refined_spans(index, groups, tokens, q_units)
    else:
        found = {other: index._spans(other, boxes, ests, tokens, q_units)
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


def _refined_spans(index: PassageIndex, groups: list[tuple[int, I64, npt.NDArray[np.float64]]],
                   tokens: Tokens, q_units: npt.NDArray[np.uint64]) -> dict[int, list[Span]]:
    """``PassageIndex._spans`` of every kept page (refined, OPH), the pages' seeds, chains,
    estimates and similarities in one kernel (``span_refine.refine_pages``): the same spans,
    without the per-page Python and numpy calls around small kernels that cost more than
    the scan itself on the dense stream. Pages indexed before units were kept go the old
    way (they have the scan's spans only)."""
    out: dict[int, list[Span]] = {}
    batch = []  # (other, boxes, its positions record)
    for other, boxes, ests in groups:
        raw = index.store.get("positions", u64(other))
        if raw is None:
            out[other] = []
        elif not has_units(raw):  # no units: the scan's spans
            out[other] = index._spans(other, boxes, ests, tokens, q_units)
        else:
            batch.append((other, boxes, _unpack_positions(raw)))
    if not batch:
        return out
    a = np.ascontiguousarray(q_units & np.uint64(0xFFFFFFFF))
    b_units = [cast(npt.NDArray[np.uint32], pos[2]) for _, _, pos in batch]
    b_off = np.zeros(len(batch) + 1, dtype=np.int64)
    np.cumsum([len(u) for u in b_units], out=b_off[1:])
    box_off = np.zeros(len(batch) + 1, dtype=np.int64)
    np.cumsum([len(boxes) for _, boxes, _ in batch], out=box_off[1:])
    params = index.chain_params
    rows, sims = span_refine.refine_pages(
        a, np.concatenate(b_units).astype(np.uint64),
        b_off, np.ascontiguousarray(np.concatenate([boxes for _, boxes, _ in batch]),
                                    dtype=np.int64),
        box_off, params.margin, params.max_occ, params.match, params.gap, params.max_gap,
        params.min_score, index.k)
    shingle = index.cfg.shingle
    g_rows = np.searchsorted(rows[:, 0], np.arange(len(batch) + 1)).tolist()
    rows_l, sims_l = rows.tolist(), sims.tolist()
    for g, (other, _, (o_starts, o_ends, _)) in enumerate(batch):
        spans = []
        for x in range(g_rows[g], g_rows[g + 1]):
            _, q0, q1, t0, t1 = rows_l[x]
            est, jac, cont, m_cont = (round(v, 4) for v in sims_l[x])
            qs, qe = q0, q1 - 1 + shingle
            ts, te = t0, t1 - 1 + shingle
            if x + 1 < g_rows[g + 1]:  # pieces are disjoint in units, and in words too:
                qe = min(qe, rows_l[x + 1][1])  # a last shingle's tail is cut
            spans.append(Span(
                tokens=(qs, qe), chars=tokens.char_range(qs, qe), match_tokens=(ts, te),
                match_chars=(int(o_starts[ts]), int(o_ends[te - 1])) if te > ts else (0, 0),
                est_jaccard=est, jaccard=jac, containment=cont, match_containment=m_cont))
        spans.sort(key=lambda s: s.tokens)
        out[other] = spans
    return out


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


class _ForwardRecords:
    """What ``PassageIndex._spans`` reads of the candidate pages: their positions records,
    from the request when it carries them (``AlignRequest.to_bytes(forward=True)``), else
    from the store."""

    def __init__(self, store: Store | None) -> None:
        self.store = store
        self.positions: dict[int, bytes] | None = None

    def get(self, family: str, key: bytes) -> bytes | None:
        if self.positions is not None and family == "positions":
            return self.positions.get(read_u64(key))
        if self.store is None:
            raise KeyError(f"the align stage has no store to read {family!r} records from")
        return self.store.get(family, key)


class Aligner:
    """The align stage for one engine configuration (cheap; one per process or thread).
    ``store``: where the candidates' forward records are read (the store, or a secondary
    instance of it that catches up with the writer when a record is not there yet);
    without one, only requests that carry them can be aligned."""

    def __init__(self, config: EngineConfig, store: Store | None = None) -> None:
        self.store = store
        self.forward = _ForwardRecords(store)
        # a passage index over the forward records only: its span code, no lists
        self.spans = PassageIndex(self.forward, config)  # type: ignore[arg-type]
        self.cfg = config.passage
        self.counters = AlignCounters()
        # candidates' forward records kept between requests (templated pages keep naming
        # the same candidates)
        self.records = forward.RecordCache(config.cache.forward_mb << 20)

    def read_forward(self, ordinals: list[int]) -> list[bytes | None]:
        """The candidates' windows values; a secondary instance catches up once if some
        are newer than what it has seen."""
        if self.store is None:
            raise KeyError("the request carries no forward data and the align stage has no "
                           "store (Indexer.with_forward attaches it)")
        keys = [u64(o) for o in ordinals]
        found = self.store.multi_get("forward", keys)
        if any(v is None for v in found) and self.store.catch_up():
            found = self.store.multi_get("forward", keys)
        return found

    def align(self, request: Any) -> list[tuple[str, list[Span]]]:
        """Passage matches of ``request`` (an ``index.AlignRequest``): (earlier page id,
        spans) per earlier page, in ordinal order."""
        return [(p.doc_id, p.spans) for p in self.align_ranked(request) if p.spans]

    def align_ranked(self, request: Any) -> list[RankedPage]:
        """The best ``passage.max_matches`` earlier pages of ``request`` with their rank
        keys and spans (empty ones too), in ordinal order: a part of a request split by
        earlier page (``AlignRequest.split``) answers with these (``merge_ranked``)."""
        idx = self.spans
        carried = request.has_forward
        t = request.tasks.gather(self.read_forward, self.records, empty_later=True)
        h_t, h_s, h_e, h_x = idx.scan(t)
        self.counters.pages += 1
        self.counters.tasks += len(t)
        others = request.others.tolist()
        if carried:
            self.forward.positions = dict(zip(others, request.other_positions, strict=True))
        q_starts, q_ends, q_units = _unpack_positions(request.positions)
        tokens = Tokens("", None, q_starts.astype(np.int64), q_ends.astype(np.int64))
        try:
            found = ranked_spans(idx, (t.t_p[h_t], t.t_o[h_t], h_s, h_e, h_x),
                                 request.starts, request.ends, tokens, q_units,
                                 self.counters)
        finally:
            self.forward.positions = None
        ids = dict(zip(others, request.other_ids, strict=True)) if carried else None
        for page in found:
            page.doc_id = ids[page.ordinal] if ids is not None else self._doc_id(page.ordinal)
        return found

    def _doc_id(self, ordinal: int) -> str:
        assert self.store is not None
        raw = self.store.get("docs", u64(ordinal))
        if raw is None:
            raise KeyError(f"no document with ordinal {ordinal}")
        return str(msgpack.unpackb(raw)["id"])
