"""Tight spans: the alignment a reader would mark inside the interval scan's detections.

The interval scan (dupalign.passage.interval_scan) reports, for each query passage, the *longest*
subsequences of an earlier page whose estimated Jaccard is still ≥ θ. That is its guarantee
(nothing similar is missed) and also why its spans are padded: a copied paragraph is
extended into the surrounding text until the similarity falls to θ, and one copy comes
back as several overlapping ranges. This module keeps the scan as the detector and only
decides *where* the copy is, from the units themselves:

1. **Seeds** (``seeds``): the unit pairs (i, j) with equal hashes, a[i] == b[j], inside the
   scan's boxes (query range × page range of each raw hit), grown by ``margin`` units on
   every side: a copied sentence too short to lift its query passage to θ, next to a
   detected copy, is found with it. A unit repeated more than ``max_occ`` times in the page
   range a query unit is seeded against gives no seeds there (on templated text it would
   make quadratically many, and it locates nothing).
2. **Chains** (``best_chain``): a chain is a sequence of seeds strictly increasing on both
   sides, each step skipping at most ``max_gap`` units (the larger skip of the two sides);
   its score is ``match`` per seed minus ``gap`` per skipped unit. The best chain is a local
   alignment (Smith-Waterman on seeds, as chaining in minimap2): extending a chain across a
   stretch pays off only while seeds are denser than gap / (match + gap) (one in three
   units by default), so it starts and ends where the local similarity drops, runs across
   small edits (a substituted word breaks two word bigrams: a skip of 2 units), and breaks
   at gaps longer than ``max_gap``.
3. **One detection per region** (``chains``): the best chain is taken, then the best of
   the chains whose query range is disjoint from it, and so on while the score reaches
   ``min_score``. So a query region is reported once, against the page region it matches
   best, and overlapping detections of one copy collapse into one (the overlap filtering
   of PAN's best text-alignment systems, e.g. Sanchez-Perez et al. 2014, done here by
   construction). Page ranges may overlap: a query that uses one source passage twice, or
   reorders sentences whose matches end in shared stock phrases ("is the", "of the"), is
   still reported where it is.

Why this design: PAN's strongest systems seed with exact matches, extend seeds into
passages while the local similarity stays high, merge across small gaps, and filter
overlapping and short detections; with the scan as the detector, the seeds can be
restricted to its boxes, which keeps this step cheap and never adds a page the scan did
not find. The first chain of a pair is always reported, so the set of matched pages is the
scan's (no recall is lost at the page level); only the spans change. Scores are integers,
so the fast chaining and the brute-force oracle (tests/passage/test_span_refine.py) agree exactly.
On planted copies (tests/bench/bench_passages.py, PAN measures) character precision goes
from about 0.5 to 1.0, recall from 1.0 / 1.0 / 0.87 to 1.0 / 0.99 / 0.83 (no, light,
heavy edits: a heavily edited copy's sparse edges are cut), for about a tenth more CPU
per page.

The reported spans then get their similarity here too: the OPH estimate of the two ranges
(``oph_estimates``) and the exact Jaccard and containments of their unit sets
(``similarity``).

``refine_pages`` does all of it (seeds, chains, estimates, similarities) for every earlier
page of a query page in one kernel: the align stage's span work was per-page Python around
small kernels, which cost more than the scan that found the hits (dense stream, 3,000
pages: 5.0 ms per page against the scan's 4.6 ms).

Positions are unit indices, 0-based; boxes and returned ranges are half-open.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dupalign.kernel_cache import njit
from dupalign.passage.interval_scan import radix_sort
from dupalign.passage.oph import OPH_SALT, oph_bins, oph_sketch_kernel, oph_values
from dupalign.text.hashing import mix_one, salt_key

I64 = npt.NDArray[np.int64]
U64 = npt.NDArray[np.uint64]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True)
class ChainParams:
    match: int = 2  # score of a seed (a matched unit)
    gap: int = 1  # cost of each unit skipped between two seeds of a chain
    max_gap: int = 16  # a chain never skips more units than this in one step
    # chains after a pair's first are reported from this score on (6 matched units: a
    # copied sentence fragment, not a stock phrase)
    min_score: int = 12
    max_occ: int = 32  # a unit repeated more often in a box's page range gives no seeds
    # units added on every side of the scan's boxes before seeding (seed extension): a copy
    # shorter than a query passage, next to a detected one, is found with it
    margin: int = 24


DEFAULT = ChainParams()


@dataclass(frozen=True)
class Piece:
    """One reported alignment: units [q_start, q_end) of the query, [t_start, t_end) of the
    page, the chain's number of seeds and its score."""

    q_start: int
    q_end: int
    t_start: int
    t_end: int
    seeds: int
    score: int


# -- seeds ------------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _union_same_rows(boxes: I64) -> I64:
    """Boxes sorted by (q_start, q_end, t_start) with overlapping or touching page ranges
    on the same query range merged (the union of the boxes is unchanged)."""
    out = np.empty_like(boxes)
    n = 0
    for x in range(boxes.shape[0]):
        if (n and out[n - 1, 0] == boxes[x, 0] and out[n - 1, 1] == boxes[x, 1]
                and boxes[x, 2] <= out[n - 1, 3]):
            out[n - 1, 3] = max(out[n - 1, 3], boxes[x, 3])
        else:
            out[n] = boxes[x]
            n += 1
    return out[:n]


@njit(cache=True, nogil=True)
def _seeds(a: U64, b_sorted: U64, b_pos: I64, boxes: I64, max_occ: int) -> tuple[I64, I64]:
    """Seeds in the boxes, sorted by (i, j) and made once each: a sweep over the query
    units keeps the boxes holding the current one, in page range order, and merges their
    page ranges. ``b_sorted``/``b_pos`` are b's hashes and positions in (hash, position)
    order."""
    cap = 1024
    si = np.empty(cap, dtype=np.int64)
    sj = np.empty(cap, dtype=np.int64)
    n = 0
    n_box = boxes.shape[0]
    if n_box == 0:
        return si[:0], sj[:0]
    by_start = np.argsort(boxes[:, 0], kind="mergesort")
    active = np.empty(n_box, dtype=np.int64)  # boxes holding unit i, by page range start
    n_act = 0
    nxt = 0
    for i in range(boxes[by_start[0], 0], boxes[:, 1].max()):
        while nxt < n_box and boxes[by_start[nxt], 0] <= i:
            x = by_start[nxt]
            nxt += 1
            y = n_act  # insertion in page range order
            while y > 0 and boxes[active[y - 1], 2] > boxes[x, 2]:
                active[y] = active[y - 1]
                y -= 1
            active[y] = x
            n_act += 1
        kept = 0
        for y in range(n_act):
            if boxes[active[y], 1] > i:
                active[kept] = active[y]
                kept += 1
        n_act = kept
        if n_act == 0:
            continue
        h0 = np.searchsorted(b_sorted, a[i], side="left")
        h1 = np.searchsorted(b_sorted, a[i], side="right")
        if h0 == h1:
            continue
        y = 0
        while y < n_act:
            t0, t1 = boxes[active[y], 2], boxes[active[y], 3]
            y += 1
            while y < n_act and boxes[active[y], 2] <= t1:
                t1 = max(t1, boxes[active[y], 3])
                y += 1
            # within one hash, positions ascend: the range is a sub-run
            first = h0 + np.searchsorted(b_pos[h0:h1], t0, side="left")
            last = h0 + np.searchsorted(b_pos[h0:h1], t1, side="left")
            if last - first > max_occ:
                continue
            for z in range(first, last):
                if n == cap:
                    cap *= 2
                    si2 = np.empty(cap, dtype=np.int64)
                    sj2 = np.empty(cap, dtype=np.int64)
                    si2[:n] = si[:n]
                    sj2[:n] = sj[:n]
                    si, sj = si2, sj2
                si[n] = i
                sj[n] = b_pos[z]
                n += 1
    return si[:n], sj[:n]


def seeds(a: U64, b: U64, boxes: I64, max_occ: int = DEFAULT.max_occ) -> tuple[I64, I64]:
    """The distinct unit pairs (i, j) with ``a[i] == b[j]`` inside some box
    ``(q_start, q_end, t_start, t_end)``, sorted by (i, j). For each query unit i, the page
    ranges of the boxes holding it are merged (overlapping or touching); a unit occurring
    more than ``max_occ`` times in such a range gives no seeds in it."""
    boxes = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)
    # the scan reports many overlapping page ranges per query passage: one union each
    boxes = _union_same_rows(np.ascontiguousarray(
        boxes[np.lexsort((boxes[:, 2], boxes[:, 1], boxes[:, 0]))]))
    if not len(boxes):
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    lo, hi = int(boxes[:, 2].min()), int(boxes[:, 3].max())  # only this part of b is seen
    order = lo + np.argsort(b[lo:hi], kind="stable")  # equal hashes keep positions in order
    return _seeds(np.ascontiguousarray(a, dtype=np.uint64), b[order].astype(np.uint64),
                  order.astype(np.int64), boxes, max_occ)


# -- chains -----------------------------------------------------------------------------------

@njit(cache=True, nogil=True)
def _unit_starts(si: I64, top: int) -> I64:
    """``out[u]``: the first seed on query unit u or later (seeds sorted by i), u ≤ top."""
    return np.searchsorted(si, np.arange(top + 1)).astype(np.int64)


@njit(cache=True, nogil=True)
def _fill_scores(si: I64, sj: I64, alive: npt.NDArray[np.bool_], blocked: I64, match: int,
                 gap: int, max_gap: int, score: I64, pred: I64, start: int,
                 unit_start: I64, settled: int = -1) -> None:
    """For seeds sorted by (i, j), from seed ``start`` on: the best score of a chain of
    alive seeds ending at each seed (-1 for dead ones), and its predecessor (-1: the chain
    starts there); ties keep the shorter chain. ``blocked[x]``: the number of blocked
    query units before x; no step crosses one. Scores before ``start`` are kept.

    ``settled`` ≥ 0: the scores are being refreshed after a change at query units up to
    ``settled`` only (seeds killed, units blocked), and those after it still hold the
    previous fill. A seed's score and predecessor depend only on the seeds of the
    ``max_gap + 1`` units before it, so once that many units past ``settled`` and past the
    last seed whose result changed have gone by, nothing later changes: the fill stops.
    ``unit_start``: ``_unit_starts`` of ``si`` (through unit ``si[-1] + 1``); a seed's
    possible predecessors are, on each of the units before it, the run of seeds whose j is
    less than its own by at most ``max_gap + 1``, visited in seed order."""
    changed = settled  # the last query unit with a seed whose result changed
    for s in range(start, si.shape[0]):
        if settled >= 0 and si[s] - max_gap - 1 > changed:
            return
        was_score, was_pred = score[s], pred[s]
        score[s] = -1
        pred[s] = -1
        if not alive[s]:
            if was_score != -1 or was_pred != -1:
                changed = si[s]
            continue
        i, j = si[s], sj[s]
        best = 0
        arg = -1
        for u in range(max(0, i - max_gap - 1), i):
            if blocked[i] != blocked[u + 1]:  # a step from unit u would cross a blocked one
                continue
            a, z = unit_start[u], unit_start[u + 1]
            while a < z:  # the first seed of unit u with j ≥ sj[s] - max_gap - 1
                mid = (a + z) // 2
                if sj[mid] < j - max_gap - 1:
                    a = mid + 1
                else:
                    z = mid
            for p in range(a, unit_start[u + 1]):
                if sj[p] >= j:
                    break
                if not alive[p]:
                    continue
                v = score[p] - gap * (max(i - u, j - sj[p]) - 1)
                if v > best:
                    best = v
                    arg = p
        score[s] = match + best
        pred[s] = arg
        if score[s] != was_score or arg != was_pred:
            changed = si[s]


@njit(cache=True, nogil=True)
def _chain_scores(si: I64, sj: I64, alive: npt.NDArray[np.bool_], blocked: I64, match: int,
                  gap: int, max_gap: int) -> tuple[I64, I64]:
    """``_fill_scores`` for every seed."""
    score = np.empty(si.shape[0], dtype=np.int64)
    pred = np.empty(si.shape[0], dtype=np.int64)
    _fill_scores(si, sj, alive, blocked, match, gap, max_gap, score, pred, 0,
                 _unit_starts(si, si[-1] + 1 if si.shape[0] else 0))
    return score, pred


def best_chain(si: I64, sj: I64, alive: npt.NDArray[np.bool_],
               params: ChainParams = DEFAULT, blocked: I64 | None = None) -> tuple[list[int], int]:
    """A maximum-score chain of alive seeds (seed indices in order) and its score; the
    first maximum in (i, j) order of its last seed. ``blocked``: cumulative counts of
    query units no chain may span (see ``chains``). ``([], 0)`` when no seed is alive."""
    if not alive.any():
        return [], 0
    if blocked is None:
        blocked = np.zeros(int(si.max()) + 2, dtype=np.int64)
    score, pred = _chain_scores(si, sj, alive, blocked, params.match, params.gap,
                                params.max_gap)
    end = int(np.argmax(score))
    chain = [end]
    while pred[chain[-1]] >= 0:
        chain.append(int(pred[chain[-1]]))
    return chain[::-1], int(score[end])


@njit(cache=True, nogil=True)
def _chains(si: I64, sj: I64, match: int, gap: int, max_gap: int, min_score: int) -> I64:
    """``chains`` in one kernel: rows (q_start, q_end, t_start, t_end, seeds, score). After
    a chain over query units [q0, q1] is taken, only the seeds from q0 on are scored again
    (a chain ending before q0 neither uses a seed in it nor steps across it), and only as
    far as their results change (``_fill_scores``): on a long templated page the scoring
    is done about once, not once per chain taken."""
    n = si.shape[0]
    out = np.empty((n, 6), dtype=np.int64)
    if n == 0:
        return out
    alive = np.ones(n, dtype=np.bool_)
    top = si.max() + 2
    blocked = np.zeros(top + 1, dtype=np.int64)
    score = np.empty(n, dtype=np.int64)
    pred = np.empty(n, dtype=np.int64)
    start = 0
    settled = -1  # the first fill scores every seed; later ones stop where nothing changes
    unit_start = _unit_starts(si, top)
    m = 0
    while True:
        _fill_scores(si, sj, alive, blocked, match, gap, max_gap, score, pred, start,
                     unit_start, settled)
        end = np.argmax(score)
        if score[end] < 0 or (m > 0 and score[end] < min_score):
            return out[:m]
        first = end
        length = 1
        while pred[first] >= 0:
            first = pred[first]
            length += 1
        q0, q1 = si[first], si[end]
        out[m, 0], out[m, 1], out[m, 2], out[m, 3] = q0, q1 + 1, sj[first], sj[end] + 1
        out[m, 4], out[m, 5] = length, score[end]
        m += 1
        start = int(first)  # seeds are sorted by (i, j): those on units q0..q1 are contiguous
        while start > 0 and si[start - 1] == q0:
            start -= 1
        s = start
        while s < n and si[s] <= q1:
            alive[s] = False
            s += 1
        for x in range(q0 + 1, top + 1):  # units q0..q1 are blocked from now on
            blocked[x] += min(x, q1 + 1) - q0
        settled = q1


def chains(si: I64, sj: I64, params: ChainParams = DEFAULT) -> list[Piece]:
    """Greedy one-detection-per-region chaining: the best chain, then the best chain of the
    seeds outside its query range that does not span it, and so on while the score reaches
    ``params.min_score`` (the first chain is always taken). In the order taken; their query
    ranges are disjoint."""
    rows = _chains(np.ascontiguousarray(si, dtype=np.int64),
                   np.ascontiguousarray(sj, dtype=np.int64), params.match, params.gap,
                   params.max_gap, params.min_score)
    return [Piece(*r) for r in rows.tolist()]


def refine(a: U64, b: U64, boxes: I64, params: ChainParams = DEFAULT) -> list[Piece]:
    """Tight alignments of query units ``a`` with page units ``b`` inside the raw boxes
    grown by ``params.margin``, sorted by query position. Empty only when those hold no
    shared unit."""
    grown = np.asarray(boxes, dtype=np.int64).reshape(-1, 4) + np.array(
        [-params.margin, params.margin, -params.margin, params.margin], dtype=np.int64)
    np.clip(grown, 0, [len(a), len(a), len(b), len(b)], out=grown)
    si, sj = seeds(a, b, grown, params.max_occ)
    return sorted(chains(si, sj, params), key=lambda p: (p.q_start, p.t_start))


# -- similarity of the reported units ------------------------------------------------------

@njit(cache=True, nogil=True)
def _oph_estimates(ha: U64, ba: I64, hb: U64, bb: I64, boxes: I64, k: int) -> F64:
    out = np.empty(boxes.shape[0], dtype=np.float64)
    for x in range(boxes.shape[0]):
        ka, ea = oph_sketch_kernel(ha[boxes[x, 0] : boxes[x, 1]], ba[boxes[x, 0] : boxes[x, 1]], k)
        kb, eb = oph_sketch_kernel(hb[boxes[x, 2] : boxes[x, 3]], bb[boxes[x, 2] : boxes[x, 3]], k)
        out[x] = _oph_estimate(ka, ea, kb, eb)
    return out


@njit(cache=True, nogil=True, inline="always")
def _oph_estimate(ka: U64, ea: npt.NDArray[np.bool_], kb: U64,
                  eb: npt.NDArray[np.bool_]) -> float:
    """N_mat / (k - N_emp) of two OPH sketches."""
    k = ka.shape[0]
    n_emp = 0
    n_mat = 0
    for f in range(k):
        if ea[f] and eb[f]:
            n_emp += 1
        elif not ea[f] and not eb[f] and ka[f] == kb[f]:
            n_mat += 1
    return n_mat / (k - n_emp) if k > n_emp else 0.0


def oph_estimates(a: U64, b: U64, boxes: I64, k: int) -> list[float]:
    """The OPH estimate N_mat / (k - N_emp) of each box's unit ranges ``a[q0:q1]`` and
    ``b[t0:t1]`` (each side hashed and binned once, over the part the boxes cover)."""
    boxes = np.asarray(boxes, dtype=np.int64).reshape(-1, 4)
    if not len(boxes):
        return []
    qa, ta = int(boxes[:, 0].min()), int(boxes[:, 2].min())
    ha = oph_values(a[qa : int(boxes[:, 1].max())])
    hb = oph_values(b[ta : int(boxes[:, 3].max())])
    shifted = boxes - np.array([qa, qa, ta, ta], dtype=np.int64)
    return _oph_estimates(ha, oph_bins(ha, k), hb, oph_bins(hb, k), shifted, k).tolist()


@dataclass(frozen=True)
class Similarity:
    jaccard: float  # |A ∩ B| / |A ∪ B| of the two spans' unit sets
    containment: float  # |A ∩ B| / |A|: share of the query span's units in the page span
    match_containment: float  # |A ∩ B| / |B|
    shared: int  # |A ∩ B|


@njit(cache=True, nogil=True)
def _set_counts(a: U64, b: U64) -> tuple[int, int, int]:
    """Distinct values of sorted ``a``, of sorted ``b``, and shared ones (a merge)."""
    na = nb = shared = 0
    x = y = 0
    while x < a.shape[0] or y < b.shape[0]:
        if y == b.shape[0] or (x < a.shape[0] and a[x] < b[y]):
            v = a[x]
            na += 1
        elif x == a.shape[0] or b[y] < a[x]:
            v = b[y]
            nb += 1
        else:
            v = a[x]
            na += 1
            nb += 1
            shared += 1
        while x < a.shape[0] and a[x] == v:
            x += 1
        while y < b.shape[0] and b[y] == v:
            y += 1
    return na, nb, shared


def similarity(a: U64, b: U64) -> Similarity:
    """Exact set similarity of two unit sequences (their distinct hashes)."""
    na, nb, shared = _set_counts(np.sort(a), np.sort(b))
    union = na + nb - shared
    return Similarity(shared / union if union else 0.0, shared / na if na else 0.0,
                      shared / nb if nb else 0.0, shared)


# -- every earlier page of a query page in one kernel ---------------------------------------

_OPH_KEY = salt_key(OPH_SALT)


@njit(cache=True, inline="always")
def _oph_value(v: np.uint64) -> np.uint64:
    """``oph.oph_values`` of one unit (``hashing.mix64`` with ``OPH_SALT``)."""
    return mix_one(v, _OPH_KEY)


@njit(cache=True, inline="always")
def _oph_bin(h: np.uint64, k: int) -> int:
    """``oph.oph_bins`` of one value."""
    kk = np.uint64(k)
    s32 = np.uint64(32)
    return int(((h >> s32) * kk + (((h & np.uint64(0xFFFFFFFF)) * kk) >> s32)) >> s32)


@njit(cache=True, nogil=True)
def _oph_sketch_of(units: U64, k: int) -> tuple[U64, npt.NDArray[np.bool_]]:
    """``oph_sketch_kernel`` of the units' OPH values."""
    mins = np.zeros(k, dtype=np.uint64)
    empty = np.ones(k, dtype=np.bool_)
    for x in range(units.shape[0]):
        h = _oph_value(units[x])
        b = _oph_bin(h, k)
        if empty[b] or h < mins[b]:
            mins[b] = h
            empty[b] = False
    return mins, empty


@njit(cache=True, nogil=True)
def _stable_rows(rows: I64, cols: I64) -> I64:
    """``rows`` sorted by its columns ``cols[0]``, then ``cols[1]``, ... (``np.lexsort`` of
    the reversed columns: stable)."""
    order = np.arange(rows.shape[0])
    for c in range(cols.shape[0] - 1, -1, -1):
        order = order[np.argsort(rows[order, cols[c]], kind="mergesort")]
    return rows[order]


@njit(cache=True, nogil=True)
def hash_order(b: U64, lo: int, hi: int) -> tuple[U64, I64]:
    """``b[lo:hi]`` in (hash, position) order: the hashes and their positions, as ``seeds``
    gets them from a stable argsort. The units are 32-bit hashes, so (hash, position)
    packs into one int64 key and a radix sort does it (the keys are distinct: any sort
    gives this order), 0.3x the time of the argsort on a 3,300-unit page; an argsort
    when they do not fit."""
    n = hi - lo
    bits = 1
    while (1 << bits) < n:
        bits += 1
    top = np.uint64(0)
    for x in range(lo, hi):
        top = max(top, b[x])
    if top >= np.uint64(1) << np.uint64(62 - bits):
        pos = lo + np.argsort(b[lo:hi], kind="mergesort")
        return b[pos], pos
    keys = np.empty(n, dtype=np.int64)
    for x in range(n):
        keys[x] = (np.int64(b[lo + x]) << bits) | x
    radix_sort(keys, np.empty(n, dtype=np.int64))
    out = np.empty(n, dtype=np.uint64)
    pos = np.empty(n, dtype=np.int64)
    mask = (1 << bits) - 1
    for x in range(n):
        out[x] = np.uint64(keys[x] >> bits)
        pos[x] = lo + (keys[x] & mask)
    return out, pos


@njit(cache=True, nogil=True)
def refine_pages(
    a: U64, b_all: U64, b_off: I64, boxes_all: I64, box_off: I64, margin: int, max_occ: int,
    match: int, gap: int, max_gap: int, min_score: int, k: int,
) -> tuple[I64, F64]:  # fmt: skip
    """``refine``, then ``oph_estimates`` and ``similarity`` of every piece, for each earlier
    page g of one query page (query units ``a``; the page's units ``b_all[b_off[g]:b_off[g +
    1]]``, the scan's boxes ``boxes_all[box_off[g]:box_off[g + 1]]``). Returns ``(rows,
    sims)``: rows (g, q_start, q_end, t_start, t_end) by page, then query position, and per
    row (estimate, jaccard, containment, match containment)."""
    cap = 64
    rows = np.empty((cap, 5), dtype=np.int64)
    sims = np.empty((cap, 4), dtype=np.float64)
    n = 0
    la = a.shape[0]
    for g in range(b_off.shape[0] - 1):
        b = b_all[b_off[g]:b_off[g + 1]]
        lb = b.shape[0]
        raw = boxes_all[box_off[g]:box_off[g + 1]]
        if raw.shape[0] == 0:
            continue
        grown = np.empty_like(raw)
        for x in range(raw.shape[0]):  # the margin, clipped as in ``refine``
            grown[x, 0] = min(max(raw[x, 0] - margin, 0), la)
            grown[x, 1] = min(max(raw[x, 1] + margin, 0), la)
            grown[x, 2] = min(max(raw[x, 2] - margin, 0), lb)
            grown[x, 3] = min(max(raw[x, 3] + margin, 0), lb)
        boxes = _union_same_rows(_stable_rows(grown, np.array([0, 1, 2])))
        lo, hi = boxes[:, 2].min(), boxes[:, 3].max()  # (as ``seeds``)
        b_sorted, b_pos = hash_order(b, lo, hi)
        si, sj = _seeds(a, b_sorted, b_pos, boxes, max_occ)
        pieces = _chains(si, sj, match, gap, max_gap, min_score)
        pieces = _stable_rows(pieces, np.array([0, 2]))
        for x in range(pieces.shape[0]):
            q0, q1, t0, t1 = pieces[x, 0], pieces[x, 1], pieces[x, 2], pieces[x, 3]
            if n == cap:
                cap *= 2
                rows2 = np.empty((cap, 5), dtype=np.int64)
                sims2 = np.empty((cap, 4), dtype=np.float64)
                rows2[:n] = rows[:n]
                sims2[:n] = sims[:n]
                rows, sims = rows2, sims2
            rows[n, 0], rows[n, 1], rows[n, 2], rows[n, 3], rows[n, 4] = g, q0, q1, t0, t1
            ka, ea = _oph_sketch_of(a[q0:q1], k)
            kb, eb = _oph_sketch_of(b[t0:t1], k)
            sims[n, 0] = _oph_estimate(ka, ea, kb, eb)
            na, nb, shared = _set_counts(np.sort(a[q0:q1]), np.sort(b[t0:t1]))
            union = na + nb - shared
            sims[n, 1] = shared / union if union else 0.0
            sims[n, 2] = shared / na if na else 0.0
            sims[n, 3] = shared / nb if nb else 0.0
            n += 1
    return rows[:n].copy(), sims[:n].copy()
