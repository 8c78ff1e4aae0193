"""Bounded work under dense duplication: ``passage.max_candidates`` (earlier pages aligned
per passage) and ``passage.max_matches`` (earlier pages given spans and reported per page)
bind, keep the best by their documented rules, and bound a page's work however many
earlier copies of its text there are."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig, NearConfig, PassageConfig
from dupalign.match import Match
from dupalign.page import Page
from dupalign.passage import batch_align as pa
from dupalign.runtime.engine import Engine
from dupalign.stages.align import rank_pages
from tests.passage.test_passage_align import Batch, word_lists
from tests.runtime.test_engine import edit, rfc_words


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 5),
                          st.sampled_from([0.25, 0.5, 1.0])), max_size=30),
       st.integers(1, 20), st.integers(1, 30))
def test_rank_pages_equals_brute_force(hits: list[tuple[int, int, float]], length: int,
                                       stride: int) -> None:
    """Most query units covered by the passages that hit the page, then highest
    estimate, then earliest page."""
    starts = np.arange(8, dtype=np.int64) * stride
    ends = starts + length
    ends[-1] = max(ends[-1], ends[-2])  # ends never decrease (the last passage is flush right)
    h_p = np.array([p for p, _, _ in hits], dtype=np.int64)
    h_o = np.array([o for _, o, _ in hits], dtype=np.int64)
    h_x = np.array([x for *_, x in hits], dtype=np.float64)
    covered: dict[int, set[int]] = {}
    best: dict[int, float] = {}
    for p, o, x in hits:
        covered.setdefault(o, set()).update(range(int(starts[p]), int(ends[p])))
        best[o] = max(best.get(o, x), x)
    want = sorted(covered, key=lambda o: (-len(covered[o]), -best[o], o))
    assert rank_pages(h_p, h_o, h_x, starts, ends).tolist() == want


@settings(max_examples=150, deadline=None)
@given(pages=st.lists(word_lists, min_size=1, max_size=6), data=st.data(),
       k=st.integers(2, 12), max_candidates=st.integers(1, 4))
def test_select_candidates_keeps_the_most_collided(
    pages: list[list[int]], data: st.DataObject, k: int, max_candidates: int
) -> None:
    """Per passage, the pages that can reach θ = 3/10 if every empty bin collided (not
    excluded), the ``max_candidates`` with most collided bins kept, ties to the earliest
    page; tasks sorted by passage, then page."""
    passages = [pages[data.draw(st.integers(0, len(pages) - 1))][:data.draw(
        st.integers(1, 70))] + data.draw(st.lists(st.integers(0, 9), max_size=4))
        for _ in range(data.draw(st.integers(1, 3)))]
    stopped = set(data.draw(st.lists(st.integers(0, 3 * k), max_size=2)))
    exclude = sorted(set(data.draw(st.lists(st.integers(0, len(pages) - 1), max_size=2))))
    b = Batch(pages, passages, k, stopped)
    w_match, w_empty, need = 10, 3, 3 * k
    t_p, t_o, _ = pa.select_candidates(b.lid, b.n_before, b.start, b.ords, b.q_empty,
                                       np.array(exclude, dtype=np.int64), w_match, w_empty,
                                       need, max_candidates)
    want = []
    for p in range(len(passages)):
        lists = [x for x in b.lid[p] if x >= 0]
        n_empty = int(np.count_nonzero(b.q_empty[p] & (b.lid[p] < 0)))
        hits = {o: sum(o in b.ords[b.start[x]:b.start[x] + b.n_before[x]] for x in lists)
                for o in range(len(pages))}
        ok = [o for o, h in hits.items()
              if h and w_match * h + w_empty * n_empty >= need and o not in exclude]
        kept = sorted(ok, key=lambda o: (-hits[o], o))[:max_candidates]
        want += [(p, o) for o in sorted(kept)]
    assert list(zip(t_p.tolist(), t_o.tolist(), strict=True)) == want
    # the same pages far apart in a long crawl (ordinals up to ~10^12): the same choice
    spread = data.draw(st.sampled_from([1, 10**6 + 3, 10**11 + 7]))
    t_p2, t_o2, _ = pa.select_candidates(
        b.lid, b.n_before, b.start, b.ords * spread + 5, b.q_empty,
        np.array(exclude, dtype=np.int64) * spread + 5, w_match, w_empty, need, max_candidates)
    assert t_p2.tolist() == t_p.tolist() and t_o2.tolist() == (t_o * spread + 5).tolist()


def dense_pages(n: int, seed: int) -> list[Page]:
    """Random 150-300-word chunks of one 700-word text, a few words edited: every page
    copies regions that earlier pages copied too, more often as the stream grows."""
    words = rfc_words("rfc2821.txt", 0, 700)
    rng = random.Random(seed)
    out = []
    for x in range(n):
        ln = rng.randrange(150, 301)
        s = rng.randrange(0, len(words) - ln)
        out.append(Page(id=f"d{x}", body=" ".join(edit(words[s:s + ln], 0.02, x))))
    return out


def work_per_page(store: Path, pages: list[Page], max_candidates: int,
                  max_matches: int) -> tuple[list[dict[str, int]], list[list[Match]]]:
    """Work units of every page (no timing): passages, alignment tasks, distinct candidate
    pages (whose forward records the index reads), earlier pages hit by the scan, pages
    given spans; and its passage matches."""
    cfg = EngineConfig(near=NearConfig(enabled=False), passage=PassageConfig(
        max_candidates=max_candidates, max_matches=max_matches)).validate()
    work, matches = [], []
    with Engine.open(store, cfg) as engine:
        c = engine.aligner.counters
        for page in pages:
            before = (c.pages_hit, c.pages_spanned)
            result = engine.index(engine.sketch(page))
            found = engine.indexer.finish(result, engine.align(result))
            r = result.align
            work.append({
                "passages": 0 if r is None else len(r.starts),
                "tasks": 0 if r is None else len(r.tasks),
                "candidates": 0 if r is None else len(r.others),
                "pages_hit": c.pages_hit - before[0],
                "pages_spanned": c.pages_spanned - before[1],
            })
            matches.append([m for m in found if m.kind == "passage"])
    return work, matches


def test_a_pages_work_stays_bounded_as_copies_grow(tmp_path: Path) -> None:
    pages = dense_pages(40, seed=3)
    free, free_matches = work_per_page(tmp_path / "free", pages, 100_000, 100_000)
    capped, capped_matches = work_per_page(tmp_path / "capped", pages, 2, 3)
    # without caps the work grows with the copies: the caps below do bind
    assert max(w["pages_hit"] for w in free[30:]) > 3 * 2
    assert max(w["tasks"] - 2 * w["passages"] for w in free[30:]) > 0
    assert np.mean([w["pages_hit"] for w in free[30:]]) > 2 * np.mean(
        [w["pages_hit"] for w in free[5:15]])
    for w in capped:
        assert w["tasks"] <= 2 * w["passages"]
        assert w["candidates"] <= 2 * w["passages"]
        assert w["pages_spanned"] <= 3
    assert all(len(m) <= 3 for m in capped_matches)
    assert sum(map(len, capped_matches[30:])) >= 3 * 10 - 2  # still finds copies
    assert max(map(len, free_matches[30:])) > 3


def test_max_matches_keeps_a_subset_of_the_uncapped_matches(tmp_path: Path) -> None:
    """Only the spans' pages are cut: every match kept is the uncapped one, unchanged, and
    as many as the cap allows are kept (when it does not bind, the output is the same)."""
    pages = dense_pages(30, seed=5)
    _, free = work_per_page(tmp_path / "free", pages, 100_000, 100_000)
    _, capped = work_per_page(tmp_path / "capped", pages, 100_000, 4)
    assert any(len(m) > 4 for m in free)
    for want, got in zip(free, capped, strict=True):
        assert len(got) == min(4, len(want))
        assert all(m in want for m in got)
        if len(want) <= 4:
            assert got == want


def _query_tasks(store: Path, pages: list[Page], query: Page, max_list_read: int,
                 small_cache: bool) -> tuple[list[tuple[int, int]], dict[int, Any], Any, int]:
    """Index ``pages``, then the tasks ``find_tasks`` gives the passages of ``query``: the
    (passage, earlier page) pairs, the pages' windows by ordinal, the query's passage state
    and the list entries cut."""
    cfg = EngineConfig(near=NearConfig(enabled=False), passage=PassageConfig(
        max_candidates=100_000, max_list_read=max_list_read)).validate()
    windows: dict[int, Any] = {}
    with Engine.open(store, cfg) as engine:
        if small_cache:  # every list is read again from the store by every page
            engine.passages.cache.budget = 0
        for page in pages:
            ordinal = engine.next_ordinal
            sketched = engine.sketch(page).passage
            assert sketched is not None
            windows[ordinal] = sketched.rects
            engine.process(page)
        state = engine.sketch(query).passage
        assert state is not None
        tasks = engine.passages.find_tasks(state, engine.next_ordinal)
        pairs = [] if tasks is None else list(zip(tasks.t_p.tolist(), tasks.t_o.tolist(),
                                                  strict=True))
        return pairs, windows, state, engine.passages.counters.entries_cut


def _brute_force_tasks(pages: dict[int, Any], state: Any, max_list_read: int,
                       cfg: PassageConfig) -> list[tuple[int, int]]:
    """The inverted lists rebuilt from every page's windows (one entry per window, in
    ordinal order); per passage, a page collides in a bin when it is among the first
    ``max_list_read`` entries of the bin's list (stop lists: neither a collision nor an
    empty bin), and is a candidate if it can reach θ with every empty bin."""
    lists: dict[tuple[int, int], list[int]] = {}
    for o, r in sorted(pages.items()):
        for b, key, e in zip(r.bin.tolist(), r.key.tolist(), r.empty.tolist(), strict=True):
            if not e:
                lists.setdefault((b, key), []).append(o)
    theta = cfg.theta_fraction
    want = []
    for p in range(state.keys.shape[0]):
        n_empty = int(np.count_nonzero(state.empty[p]))
        hits: dict[int, int] = {}
        for b in np.flatnonzero(~state.empty[p]).tolist():
            entries = lists.get((b, int(state.keys[p, b])), [])
            if len(entries) > cfg.max_list:
                continue
            for o in set(entries[:max_list_read]):
                hits[o] = hits.get(o, 0) + 1
        want += [(p, o) for o in sorted(hits) if theta.denominator * hits[o]
                 + theta.numerator * n_empty >= cfg.k * theta.numerator]
    return want


def test_max_list_read_counts_the_earliest_entries_of_each_list(tmp_path: Path) -> None:
    """Candidates come from the first ``max_list_read`` entries (earliest pages) of each
    list, as a brute force over every page's windows says, with the lists in memory and
    read from the store every time (so the cut does not depend on the list cache)."""
    pages = dense_pages(31, seed=7)
    for n, small in ((3, False), (3, True), (100_000, False)):
        got, windows, state, cut = _query_tasks(tmp_path / f"{n}{small}", pages[:-1],
                                              pages[-1], n, small)
        assert got == _brute_force_tasks(windows, state, n, PassageConfig())
        assert (cut > 0) == (n == 3)  # the cut binds in these lists, and only when small
        if n == 3:
            capped = got
    assert capped and set(capped) < set(got)  # fewer candidates, all uncapped ones


def test_max_list_read_keeps_a_subset_of_the_uncapped_matches(tmp_path: Path) -> None:
    """With the other caps off, counting fewer entries only drops candidates: every
    page matched with the cut is matched without it (its spans may come from fewer of
    the query's passages)."""
    pages = dense_pages(30, seed=5)
    found = {}
    for n in (4, 100_000):
        cfg = EngineConfig(near=NearConfig(enabled=False), passage=PassageConfig(
            max_candidates=100_000, max_matches=100_000, max_list_read=n)).validate()
        with Engine.open(tmp_path / str(n), cfg) as engine:
            found[n] = [[m for m in engine.process(p) if m.kind == "passage"] for p in pages]
    assert sum(map(len, found[4])) < sum(map(len, found[100_000]))
    assert sum(map(len, found[4][20:])) >= 10 * 4  # still finds the earliest copies
    for got, want in zip(found[4], found[100_000], strict=True):
        assert {m.match_doc_id for m in got} <= {m.match_doc_id for m in want}


def _repeated_copy_work(store: Path, repeats: int, max_repeats: int
                        ) -> tuple[float, list[Match]]:
    """A page that is one 300-word block written ``repeats`` times, then an edited copy
    of it: the interval scan's hits per task of the copy's align, and the copy's
    matches."""
    block = rfc_words("rfc5321.txt", 2000, 300)
    page = block * repeats
    copy = edit(page, 0.03, seed=12)
    cfg = EngineConfig(near=NearConfig(enabled=False),
                       passage=PassageConfig(max_repeats=max_repeats)).validate()
    with Engine.open(store, cfg) as engine:
        engine.process(Page("page", " ".join(page)))
        c = engine.aligner.counters
        found = engine.process(Page("copy", " ".join(copy)))
    return c.hits / c.tasks, found


def test_max_repeats_keeps_the_work_on_text_repeated_inside_a_page_flat(
        tmp_path: Path) -> None:
    """Each passage of a copy of a page made of one block repeated N times meets the page's
    windows at every repeat: its scan's work grew with N, a page's with N squared. With
    ``passage.max_repeats`` = 2 a passage meets a list's first 2 windows of the page (and
    those where its rarer units place it), so the hits per passage stay flat as N doubles,
    and the copy is still found."""
    hits = {}
    for cap in (2, 100_000):
        (few, found_few), (many, found_many) = (
            _repeated_copy_work(tmp_path / f"{cap}-{n}", n, cap) for n in (6, 12))
        for found in (found_few, found_many):
            assert [(m.kind, m.match_doc_id) for m in found] == [("passage", "page")]
        hits[cap] = (few, many)
    (few, many), (few_all, many_all) = hits[2], hits[100_000]
    assert many <= few and many_all > 1.3 * few_all, hits  # uncapped they grow with N
    assert many < many_all / 4, hits
