"""Span refinement (dupalign.passage.span_refine) against brute-force twins on small random
inputs."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.passage.span_refine import (
    ChainParams,
    Piece,
    best_chain,
    chains,
    hash_order,
    oph_estimates,
    refine,
    refine_pages,
    seeds,
    similarity,
)

Box = tuple[int, int, int, int]


def brute_seeds(a: list[int], b: list[int], boxes: list[Box],
                max_occ: int) -> list[tuple[int, int]]:
    """Per query unit: the page positions covered by its boxes, cut into maximal runs; a
    run with more than max_occ equal units gives none."""
    out = []
    for i in range(len(a)):
        covered = [any(q0 <= i < q1 and t0 <= j < t1 for q0, q1, t0, t1 in boxes)
                   for j in range(len(b))]
        j = 0
        while j < len(b):
            if not covered[j]:
                j += 1
                continue
            run_end = j
            while run_end < len(b) and covered[run_end]:
                run_end += 1
            js = [y for y in range(j, run_end) if b[y] == a[i]]
            if len(js) <= max_occ:
                out += [(i, y) for y in js]
            j = run_end
    return out


def chain_score(chain: list[tuple[int, int]], p: ChainParams) -> int | None:
    """Score of a chain of seeds, or None if it is not one (not increasing, gap too long)."""
    total = p.match * len(chain)
    for (i0, j0), (i1, j1) in itertools.pairwise(chain):
        skip = max(i1 - i0, j1 - j0) - 1
        if i1 <= i0 or j1 <= j0 or skip > p.max_gap:
            return None
        total -= p.gap * skip
    return total


def brute_best(pts: list[tuple[int, int]], p: ChainParams,
               taken: list[tuple[int, int]] = []) -> int:  # noqa: B006 (never mutated)
    """The best score over every subset of seeds that is a chain whose query range is
    disjoint from the ``taken`` ranges (0 if none)."""
    best = 0
    for r in range(1, len(pts) + 1):
        for sub in itertools.combinations(sorted(pts), r):
            if any(sub[0][0] < e and s <= sub[-1][0] for s, e in taken):
                continue
            s = chain_score(list(sub), p)
            if s is not None:
                best = max(best, s)
    return best


units = st.lists(st.integers(0, 5), min_size=1, max_size=30)
params = st.builds(ChainParams, match=st.integers(1, 4), gap=st.integers(0, 3),
                   max_gap=st.integers(0, 6), min_score=st.integers(1, 10),
                   max_occ=st.integers(1, 6))


@st.composite
def boxes_for(draw: st.DrawFn, n_a: int, n_b: int) -> list[Box]:
    out = []
    for _ in range(draw(st.integers(1, 3))):
        q0 = draw(st.integers(0, n_a - 1))
        t0 = draw(st.integers(0, n_b - 1))
        out.append((q0, draw(st.integers(q0 + 1, n_a)), t0, draw(st.integers(t0 + 1, n_b))))
    return out


@given(units, units, st.data(), st.integers(1, 6))
@settings(max_examples=300, deadline=None)
def test_seeds_equal_brute_force(a: list[int], b: list[int], data: st.DataObject,
                                 max_occ: int) -> None:
    boxes = data.draw(boxes_for(len(a), len(b)))
    si, sj = seeds(np.array(a, dtype=np.uint64), np.array(b, dtype=np.uint64),
                   np.array(boxes, dtype=np.int64), max_occ)
    assert list(zip(si.tolist(), sj.tolist(), strict=True)) == brute_seeds(a, b, boxes, max_occ)


seed_sets = st.lists(st.tuples(st.integers(0, 14), st.integers(0, 14)), max_size=11,
                     unique=True)


@given(seed_sets, params)
@settings(max_examples=300, deadline=None)
def test_best_chain_is_optimal(pts: list[tuple[int, int]], p: ChainParams) -> None:
    pts = sorted(pts)
    si = np.array([x for x, _ in pts], dtype=np.int64)
    sj = np.array([y for _, y in pts], dtype=np.int64)
    chain, score = best_chain(si, sj, np.ones(len(pts), dtype=np.bool_), p)
    assert score == brute_best(pts, p)
    if pts:
        assert chain_score([pts[c] for c in chain], p) == score


@given(seed_sets, params)
@settings(max_examples=300, deadline=None)
def test_chains_are_greedy_optimal_and_disjoint(pts: list[tuple[int, int]],
                                                p: ChainParams) -> None:
    """Each chain taken is a best chain among those whose query range is disjoint from the
    earlier ones'; taking stops exactly when the best left is below min_score (the first
    is always taken); so the pieces never overlap on the query side."""
    pts = sorted(pts)
    si = np.array([x for x, _ in pts], dtype=np.int64)
    sj = np.array([y for _, y in pts], dtype=np.int64)
    got = chains(si, sj, p)
    taken: list[tuple[int, int]] = []
    for n, piece in enumerate(got):
        assert piece.score == brute_best(pts, p, taken)
        assert n == 0 or piece.score >= p.min_score
        assert (piece.q_start, piece.t_start) in pts and (piece.q_end - 1, piece.t_end - 1) in pts
        taken.append((piece.q_start, piece.q_end))
    assert (not pts) == (not got)
    if got:
        assert brute_best(pts, p, taken) < p.min_score
    for x, y in itertools.combinations(got, 2):
        assert x.q_end <= y.q_start or y.q_end <= x.q_start


def rescored_chains(si: np.ndarray, sj: np.ndarray, p: ChainParams) -> list[Piece]:
    """``chains`` with every seed scored again after each chain taken (``best_chain``):
    the twin of the kernel's refill, which stops where the scores stop changing."""
    alive = np.ones(len(si), dtype=np.bool_)
    blocked = np.zeros(int(si.max()) + 3 if len(si) else 1, dtype=np.int64)
    out: list[Piece] = []
    while True:
        chain, score = best_chain(si, sj, alive, p, blocked)
        if not chain or (out and score < p.min_score):
            return out
        q0, q1 = int(si[chain[0]]), int(si[chain[-1]])
        out.append(Piece(q0, q1 + 1, int(sj[chain[0]]), int(sj[chain[-1]]) + 1, len(chain),
                         score))
        alive &= ~((si >= q0) & (si <= q1))
        x = np.arange(len(blocked))
        blocked += np.where(x > q0, np.minimum(x, q1 + 1) - q0, 0)


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), max_size=80, unique=True),
       params)
@settings(max_examples=300, deadline=None)
def test_chains_equal_rescoring_everything(pts: list[tuple[int, int]],
                                           p: ChainParams) -> None:
    """Longer seed sets than the brute force can take: the same pieces, ties included."""
    pts = sorted(pts)
    si = np.array([x for x, _ in pts], dtype=np.int64)
    sj = np.array([y for _, y in pts], dtype=np.int64)
    assert chains(si, sj, p) == rescored_chains(si, sj, p)


def test_verbatim_copy_is_trimmed_to_the_copy() -> None:
    """A copy of b[300:400] at a[100:200], both inside wide boxes of unrelated units that
    share a few common ones: the piece is exactly the copy."""
    rng = np.random.default_rng(3)
    b = rng.integers(0, 1 << 40, size=600).astype(np.uint64)
    a = rng.integers(0, 1 << 40, size=300).astype(np.uint64)
    a[100:200] = b[300:400]
    common = np.uint64(7)
    a[[20, 60, 230, 260]] = common  # a common unit near the copy on both sides
    b[[250, 280, 420, 470]] = common
    got = refine(a, b, np.array([[40, 260, 200, 500]], dtype=np.int64))
    # the common unit's seeds make no chain worth reporting next to the copy
    assert [(p.q_start, p.q_end, p.t_start, p.t_end) for p in got] == [(100, 200, 300, 400)]


def test_edited_copy_stays_one_piece() -> None:
    """Small edits every ~6 units do not split a copy; a gap longer than max_gap does."""
    rng = np.random.default_rng(4)
    b = rng.integers(0, 1 << 40, size=400).astype(np.uint64)
    a = b[100:300].copy()
    a[::6] = rng.integers(0, 1 << 40, size=len(a[::6])).astype(np.uint64)
    got = refine(a, b, np.array([[0, len(a), 0, len(b)]], dtype=np.int64))
    assert [(p.q_start, p.q_end, p.t_start, p.t_end) for p in got] == [(1, 200, 101, 300)]
    a[80:100] = rng.integers(0, 1 << 40, size=20).astype(np.uint64)
    got = refine(a, b, np.array([[0, len(a), 0, len(b)]], dtype=np.int64))
    assert [(p.q_start, p.q_end, p.t_start, p.t_end) for p in got] == [
        (1, 80, 101, 180), (100, 200, 200, 300)]


def test_one_region_is_reported_once_against_its_best_match() -> None:
    """Templated page: the query region occurs twice in the page, once verbatim and once
    with edits; it is reported once, against the verbatim occurrence."""
    rng = np.random.default_rng(5)
    region = rng.integers(0, 1 << 40, size=60).astype(np.uint64)
    edited = region.copy()
    edited[::4] = rng.integers(0, 1 << 40, size=15).astype(np.uint64)
    filler = rng.integers(0, 1 << 40, size=(3, 50)).astype(np.uint64)
    b = np.concatenate((filler[0], edited, filler[1], region, filler[2]))
    got = refine(region, b, np.array([[0, 60, 0, len(b)]], dtype=np.int64))
    assert [(p.q_start, p.q_end, p.t_start, p.t_end) for p in got] == [(0, 60, 160, 220)]


def test_similarity() -> None:
    a = np.array([1, 2, 3, 3, 4], dtype=np.uint64)
    b = np.array([3, 4, 5, 6, 7, 7], dtype=np.uint64)
    s = similarity(a, b)
    assert (s.shared, s.jaccard, s.containment, s.match_containment) == (2, 2 / 7, 2 / 4, 2 / 5)


@given(st.lists(st.integers(0, 12), max_size=25), st.lists(st.integers(0, 12), max_size=25))
@settings(max_examples=300, deadline=None)
def test_similarity_equals_python_sets(a: list[int], b: list[int]) -> None:
    s = similarity(np.array(a, dtype=np.uint64), np.array(b, dtype=np.uint64))
    sa, sb = set(a), set(b)
    assert s.shared == len(sa & sb)
    assert s.jaccard == (len(sa & sb) / len(sa | sb) if sa | sb else 0.0)
    assert s.containment == (len(sa & sb) / len(sa) if sa else 0.0)
    assert s.match_containment == (len(sa & sb) / len(sb) if sb else 0.0)


@given(st.lists(st.integers(0, 9), min_size=1, max_size=40), st.data(),
       st.integers(0, 8), params, st.sampled_from([4, 16, 64]))
@settings(max_examples=200, deadline=None)
def test_refine_pages_equals_refine_per_page(a: list[int], data: st.DataObject, margin: int,
                                             p: ChainParams, k: int) -> None:
    """The one-kernel span work of the align stage (every earlier page at once) gives the
    pieces, OPH estimates and similarities of ``refine``, ``oph_estimates`` and
    ``similarity`` page by page, pages without boxes included."""
    p = ChainParams(p.match, p.gap, p.max_gap, p.min_score, p.max_occ, margin)
    pages = data.draw(st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=40),
                               min_size=1, max_size=4))
    page_boxes = [data.draw(st.one_of(st.just([]), boxes_for(len(a), len(b))))
                  for b in pages]
    qa = np.array(a, dtype=np.uint64)
    want = []
    for g, (b, boxes) in enumerate(zip(pages, page_boxes, strict=True)):
        if not boxes:
            continue
        tb = np.array(b, dtype=np.uint64)
        pieces = refine(qa, tb, np.array(boxes, dtype=np.int64), p)
        rows = [(pc.q_start, pc.q_end, pc.t_start, pc.t_end) for pc in pieces]
        ests = oph_estimates(qa, tb, np.array(rows, dtype=np.int64), k)
        for (q0, q1, t0, t1), est in zip(rows, ests, strict=True):
            sim = similarity(qa[q0:q1], tb[t0:t1])
            want.append((g, q0, q1, t0, t1, est, sim.jaccard, sim.containment,
                         sim.match_containment))
    b_off = np.cumsum([0] + [len(b) for b in pages])
    box_off = np.cumsum([0] + [len(bx) for bx in page_boxes])
    all_boxes = np.array([x for bx in page_boxes for x in bx], dtype=np.int64).reshape(-1, 4)
    rows, sims = refine_pages(qa, np.array([u for b in pages for u in b], dtype=np.uint64),
                              b_off.astype(np.int64), all_boxes, box_off.astype(np.int64),
                              p.margin, p.max_occ, p.match, p.gap, p.max_gap, p.min_score, k)
    got = [(*r, *x) for r, x in zip(rows.tolist(), sims.tolist(), strict=True)]
    assert got == want


@given(st.lists(st.one_of(st.integers(0, 9), st.integers(0, (1 << 32) - 1),
                          st.integers(0, (1 << 64) - 1)), min_size=1, max_size=300), st.data())
@settings(max_examples=200, deadline=None)
def test_hash_order_equals_stable_argsort(b: list[int], data: st.DataObject) -> None:
    """The radix-sorted (hash, position) order of a page range, and the argsort it falls
    back to for hashes over 32 bits, are ``seeds``' stable argsort."""
    lo = data.draw(st.integers(0, len(b)))
    hi = data.draw(st.integers(lo, len(b)))
    arr = np.array(b, dtype=np.uint64)
    order = lo + np.argsort(arr[lo:hi], kind="stable")
    got_b, got_pos = hash_order(arr, lo, hi)
    assert got_pos.tolist() == order.tolist()
    assert got_b.tolist() == arr[order].tolist()
