"""The partitioned pipeline in one process (dupalign.stages.partitioned) against its oracle,
the single engine (``Engine.process``: ``scan``), on the same streams: every page's matches
(revisit, exact, near, passage), rejections, deletes and retention sweeps, for several
partition shapes; and the router's fingerprint and probes of every page the engine looks
up (dupalign.stages.router), through idf freezes and the volatility model's warm-up.
Every message between the stages goes through its wire form. On the corpora, the list and
exact stages' oracles (test_list_shard.py, test_exact.py) check against the same engine run
(one run costs about a minute of CPU)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import dupalign.near.index as near_index
from dupalign.config import EngineConfig
from dupalign.errors import PageRejected
from dupalign.match import Match
from dupalign.near.psm_probes import probe_headers
from dupalign.page import Page
from dupalign.passage.index import PassageIndex
from dupalign.passage.sketch import PassageState
from dupalign.runtime.engine import Engine
from dupalign.stages.directory import DirectoryEntry
from dupalign.stages.list_shard import ListPartial
from dupalign.stages.partitioned import Partitioned, Shape
from tests.reused_stores import Stores, temporary_stores
from tests.stages.streams import SHARED_TEXTS, engine_pages, ops, pages_of
from tests.stages.test_exact import Outcome as ExactOutcome
from tests.stages.test_list_shard import LISTS, STOPS, answer_as_the_engine, recorded_queries

Item = tuple[int, Page | tuple[int, int]]
Outcome = list[dict[str, Any]] | tuple[str, str]
Probes = dict[int, tuple[int, int, int, list[int]]]  # ordinal -> fingerprint, rows, t, probes
SHAPES = [Shape(), Shape(2, 2, 4, 3, 2, 2), Shape(3, 1, 2, 2, 3, 3)]


@pytest.fixture(scope="module")
def stores() -> Iterator[Stores]:
    with temporary_stores("partitioned-") as stores:
        yield stores


def _outcome(process: Callable[[Page], list[Match]], page: Page) -> Outcome:
    try:
        return [m.to_dict() for m in process(page)]
    except PageRejected as exc:
        return (exc.reason, exc.detail)


@contextlib.contextmanager
def recorded_probes() -> Iterator[Probes]:
    """The fingerprint and probes of every lookup an engine makes meanwhile (those of one
    table: ``probe_headers`` at its width, with its volatility model, at the lookup)."""
    probes: Probes = {}
    real = near_index.psm_search_one

    def spy(table: Any, fp: int, W: Any, h: int, budget: int, first: bool, model: Any,
            before: int) -> Any:
        t = table.probe_bits
        _, headers = probe_headers([fp], W[None, :], t, h, budget, model)
        probes[before] = (fp, len(table), t, headers.tolist())
        return real(table, fp, W, h, budget, first, model, before)

    near_index.psm_search_one = spy  # type: ignore[assignment]
    try:
        yield probes
    finally:
        near_index.psm_search_one = real  # type: ignore[assignment]


def single(engine: Engine, items: list[Item]) -> tuple[list[Outcome], Probes]:
    """The engine on the stream (sweeps 2 pages a batch), and its ``recorded_probes``."""
    with recorded_probes() as probes:
        out = []
        for step, item in items:
            if isinstance(item, Page):
                out.append(_outcome(engine.process, item))
            else:
                while expired := engine.expired(item[0], item[1], step * 1000, 2):
                    engine.indexer.remove(expired)
    return out, probes


def partitioned(stores: Stores, config: EngineConfig, shape: Shape, items: list[Item],
                partials: dict[int, list[ListPartial]] | None = None
                ) -> tuple[list[Outcome], Probes]:
    """The partitioned pipeline on the stream, and the router's fingerprint and probes of
    every page it routes (the probes of all shards by rank); ``partials``: filled with the
    list shards' partials, by the query page's store ordinal."""
    params = config.frozen_params()
    p = Partitioned(config, shape, lambda name: stores.store(name, params))
    probes: Probes = {}

    def spy(router: Any, real: Any, *args: Any) -> Any:
        rows = len(router.rows)  # (the rows at the query: a removal comes after it)
        ops = real(*args)
        queries = [o for o in ops if o.query is not None]
        if queries:
            by_rank: dict[int, int] = {}
            for o in queries:
                assert o.rank is not None and o.header is not None
                by_rank.update(zip(o.rank.tolist(), o.header.tolist(), strict=True))
            assert sorted(by_rank) == list(range(len(by_rank)))
            q = queries[0]
            assert q.query is not None and len(queries) == shape.near
            probes[q.query.before] = (q.query.fingerprint, rows, q.t,
                                      [by_rank[r] for r in range(len(by_rank))])
        return ops

    def list_spy(real: Any, *args: Any) -> Any:
        got = real(*args)
        for partial in got:
            if partial is not None and partials is not None:
                partials.setdefault(partial.ordinal, []).append(
                    ListPartial.from_bytes(partial.to_bytes()))
        return got

    for router, _ in p.routers:
        router.route = functools.partial(spy, router, router.route)  # type: ignore[method-assign]
    for shard, _ in p.lists:
        shard.apply_run = functools.partial(  # type: ignore[method-assign]
            list_spy, shard.apply_run)
    out = []
    for step, item in items:
        if isinstance(item, Page):
            out.append(_outcome(p.process, item))
        else:
            p.sweep(item[0], item[1], step * 1000)
    return out, probes


def check(stores: Stores, items: list[Item], config: EngineConfig, shapes: list[Shape]
          ) -> tuple[list[Outcome], Probes]:
    want, want_probes = single(stores.engine("engine", config), items)
    for shape in shapes:
        got, got_probes = partitioned(stores, config, shape, items)
        assert got_probes == want_probes, shape
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g == w, (shape, i)
    return want, want_probes


# near-indexed 8-word pages with passages (the list stage's oracle's), an idf freeze at 4
# pages, PSM_A or PSM_F with a budget that leaves probes out
NEAR = replace(LISTS, near=replace(LISTS.near, hamming=7, probe_budget=6)).validate()
FIRST = replace(NEAR, near=replace(NEAR.near, mode="first")).validate()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=ops, config=st.sampled_from([LISTS, NEAR, FIRST]),
       shape=st.sampled_from(SHAPES[1:]))
@example(STOPS, NEAR, SHAPES[1])
def test_the_partitioned_pipeline_finds_what_the_engine_finds(
        stores: Stores, stream: list[Any], config: EngineConfig, shape: Shape) -> None:
    check(stores, list(pages_of(stream, SHARED_TEXTS)), config, [shape])


def test_a_worked_stream_has_every_kind_of_match(stores: Stores) -> None:
    stream = [("page", 0, 0, 0, True), ("page", 1, 0, 0, True), ("page", 4, 0, 0, True),
              ("page", 3, 0, 0, True), ("sweep", 2, 0), ("page", 2, 2, 0, True),
              ("page", 0, 2, 0, True), ("page", 0, 1, 1, True), ("delete", 2),
              ("page", 2, 2, 0, True), ("page", 1, 0, 1, True), ("reject", 3, True),
              ("page", 4, 0, 0, True), ("page", 4, 0, 0, True)]
    want, probes = check(stores, list(pages_of(stream, SHARED_TEXTS)), NEAR, SHAPES)
    kinds = {m["kind"] for w in want if isinstance(w, list) for m in w}
    assert kinds >= {"revisit", "exact", "passage"} and probes
    assert any(isinstance(w, tuple) for w in want)


def test_partitions_parse() -> None:
    assert Shape.parse("2,2,4,3,2") == Shape(2, 2, 4, 3, 2)
    assert Shape.parse("2,2,4,3,2,3") == Shape(2, 2, 4, 3, 2, 3)
    assert Shape.parse("2,2,4,3,2,3,2") == Shape(2, 2, 4, 3, 2, 3, 2)
    for bad in ("1,1,1,1", "1,1,3,1,1", "0,1,1,1,1", "a,1,1,1,1", "1,1,1,1,1,0",
                "1,1,1,1,1,1,0", "1,1,1,1,1,1,1,1"):
        with pytest.raises(ValueError):
            Shape.parse(bad)


def _outcome_of(found: list[Match] | PageRejected) -> Outcome:
    return (found.reason, found.detail) if isinstance(found, PageRejected) else [
        m.to_dict() for m in found]


@pytest.mark.testdata
def test_the_stages_find_what_the_engine_finds_on_corpora(stores: Stores) -> None:
    """The 5,000-page synthetic stream, the RFCs and Clough with new versions, deletes and
    sweeps (tests/stages/test_exact.py ``corpus_items``), with the default engine but three
    idf freezes within the stream (so the learner stops learning), stop lists, cut heads,
    and fewer candidates and passage matches a page (align's work, the same in both, is
    most of the time), against one run of the engine (about a minute of CPU a run: the
    stages' corpora oracles share it):

    * the partitioned pipeline, at one shape (the random streams take the others), finds
      its matches and the router its probes;
    * 3 list shards answer each of its list queries as the engine (test_list_shard.py
      ``answer_as_the_engine``: heads, stop lists, tasks): the pipeline's, and 3 behind 2
      directory and 2 exact shards, each a whole segment before the next (``sharded``);
    * 1 and 3 exact shards behind 2 directory shards name its exact originals
      (test_exact.py ``sharded``: each shard a whole segment before the next)."""
    from tests.stages.test_exact import corpus_items, exact_outcome
    from tests.stages.test_exact import sharded as exact_sharded
    from tests.stages.test_list_shard import sharded as list_sharded

    base = EngineConfig()
    config = replace(base, near=replace(base.near, idf_freeze_at=(300, 1500, 4000)),
                     passage=replace(base.passage, max_list=64, max_list_read=16,
                                     max_candidates=8, max_matches=4)).validate()
    items = corpus_items()
    engine = stores.engine("engine", config)
    queries = recorded_queries(engine)
    want: list[Outcome] = []
    exact: list[ExactOutcome] = []
    entries: list[DirectoryEntry] = []
    states: list[PassageState | None] = []
    with recorded_probes() as probes:
        for entry, sk, result, found in engine_pages(engine, items):
            want.append(_outcome_of(found))
            exact.append(exact_outcome(engine, result))
            entries.append(entry)
            states.append(sk.passage)
    counters = engine.indexer.passages.counters

    partials: dict[int, list[ListPartial]] = {}
    got, got_probes = partitioned(stores, config, SHAPES[1], items, partials)
    assert got_probes == probes
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, i
    combine = PassageIndex(stores.store("combine", config.frozen_params()), config)
    answer_as_the_engine(queries, partials, states, combine, SHAPES[1].lists)
    # and as test_list_shard.py runs them: each shard a whole segment before the next
    answer_as_the_engine(queries, list_sharded(stores, 3, items, entries, states, config),
                         states, combine, 3)
    for n in (1, 3):
        assert exact_sharded(stores, n, items, entries, config) == exact, n

    # (so that the comparisons mean something)
    kinds: dict[str, int] = {}
    for w in want:
        for m in w if isinstance(w, list) else []:
            kinds[m["kind"]] = kinds.get(m["kind"], 0) + 1
    assert len(probes) > 3000 and min(kinds.get(k, 0) for k in (
        "revisit", "exact", "near", "passage")) > 100, kinds
    assert len({t for _, _, t, _ in probes.values()}) > 3  # the width grows with the rows
    assert len(queries) > 4000 and counters.long_lists and counters.entries_cut
    assert sum(tasks is not None for _, _, tasks in queries.values()) > 1000
    assert len([o for o in exact if o is not None and o[1] is not None]) > 300
