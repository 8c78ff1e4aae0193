"""The list stage partitioned by (bin, min-hash) (dupalign.stages.list_shard), behind the
page directory's shards, the ledger and the exact stage, against the oracle: the single
``Indexer`` on the same stream (tests/stages/streams.py, with passages: replays, unchanged
and changed revisits, exact copies, deletes, retention sweeps), with stop lists, the
``max_list_read`` cut and ``max_candidates`` small enough to decide.

Per page the engine queries the lists for: exactly one partial from each of 1, 2 and 3 list
shards, whose union (``combine_lists``) is the engine's list heads (stop-list flags, head
lengths, heads), and the alignment tasks selected from it (``PassageIndex.tasks_of``, with
the engine's near matches and replaced version excluded) are the engine's; no partial for
any other page. Each list shard runs its own ledger and applies a whole segment between
sweep points before the next shard starts (it never waits for a peer), every message
through its wire form. On the corpora (``answer_as_the_engine``, 3 list shards): the
partitioned pipeline's list shards, in tests/stages/test_partitioned.py (the stages'
corpora oracles share one engine run).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings

from dupalign.config import EngineConfig, PassageConfig
from dupalign.page import Page
from dupalign.passage.index import PassageCounters, PassageIndex
from dupalign.passage.sketch import PassageState, query_lists
from dupalign.passage.tasks import Tasks
from dupalign.runtime.engine import Engine
from dupalign.stages.directory import DirectoryEntry, DirectoryShard
from dupalign.stages.exact import ExactAnswer, ExactShard
from dupalign.stages.ledger import Ledger
from dupalign.stages.list_shard import (
    ListPartial,
    ListShard,
    ListWindows,
    Step,
    combine_lists,
    copy_heads,
    list_windows,
)
from tests.reused_stores import Stores, temporary_stores
from tests.stages.streams import (
    CONFIG,
    SHARED_TEXTS,
    Sweep,
    engine_pages,
    ops,
    pages_of,
    segments,
)

# passages on the streams' 8-word pages: 7 units of 2 words, query passages of 4; every
# list of more than 2 pages a stop list, heads of 1 entry, 2 candidates a passage
LISTS = replace(CONFIG, passage=PassageConfig(k=8, query_len=4, stride=2, min_len=2,
                                              max_list=2, max_list_read=1,
                                              max_candidates=2)).validate()
Item = tuple[int, Page | tuple[int, int]]
Heads = tuple[list[bool], list[int], list[int]]


@pytest.fixture(scope="module")
def stores() -> Iterator[Stores]:
    with temporary_stores("lists-") as stores:
        yield stores


def _heads(h: tuple[Any, Any, Any, Any]) -> Heads:
    long, start, n, ords = h
    return long.tolist(), n.tolist(), copy_heads(start, n, ords).tolist()


def _tasks(t: Tasks | None) -> list[Any] | None:
    return None if t is None else [a.tolist() for a in (t.t_p, t.t_o, t.lid, t.list_bin,
                                                        t.list_key)]


Queries = dict[int, tuple[Heads, frozenset[int], Any]]


def recorded_queries(engine: Engine) -> Queries:
    """The engine's list queries from now on, by the query page's store ordinal: its heads,
    what it excluded, its tasks (filled as it indexes)."""
    queries: Queries = {}
    passages = engine.indexer.passages
    find_tasks, list_heads = passages.find_tasks, passages.list_heads
    seen: list[Heads] = []

    def heads_spy(bins: Any, keys: Any, before: int, replaced: int | None = None) -> Any:
        out = list_heads(bins, keys, before, replaced)
        seen.append(_heads(out))
        return out

    def spy(state: PassageState, before: int, exclude: frozenset[int] = frozenset(),
            replaced: int | None = None) -> Tasks | None:
        seen.clear()
        tasks = find_tasks(state, before, exclude, replaced)
        assert before not in queries and len(seen) == 1
        queries[before] = (seen[0], exclude, _tasks(tasks))
        return tasks

    passages.find_tasks, passages.list_heads = spy, heads_spy  # type: ignore[method-assign]
    return queries


def single(engine: Engine, items: list[Item], align: bool = True) -> tuple[
        Queries, list[DirectoryEntry], list[PassageState | None]]:
    """The single engine's list queries (``recorded_queries``), and the pages' directory
    entries and passage states."""
    queries = recorded_queries(engine)
    entries: list[DirectoryEntry] = []
    states: list[PassageState | None] = []
    for entry, sk, _, _ in engine_pages(engine, items, align):
        entries.append(entry)
        states.append(sk.passage)
    return queries, entries, states


def inputs(stores: Stores, n: int, items: list[Item], entries: list[DirectoryEntry],
           states: list[PassageState | None], config: EngineConfig = LISTS
           ) -> Iterator[tuple[list[list[Step]], Sweep | None]]:
    """The stream through 2 directory shards and 2 exact shards, one segment between sweep
    points at a time: each of ``n`` list shards' steps (decision, place in its own ledger,
    exact answer, windows: through their wire forms), and the sweep after the segment
    (None at the end), which the list shards' ledgers have applied when the next comes."""
    params = config.frozen_params()
    dirs = [DirectoryShard(stores.store(f"dir{k}", params), config, k, 2) for k in range(2)]
    exacts = [ExactShard(stores.store(f"exact{k}", params), k, 2) for k in range(2)]
    exact_ledgers, ledgers = [Ledger(), Ledger()], [Ledger() for _ in range(n)]
    # what the sketch stage sends each list shard, through its wire form
    windows: list[dict[int, ListWindows]] = [{} for _ in range(n)]
    for seq, state in enumerate(states):
        for w in list_windows(seq, state, n):
            windows[w.shard][seq] = ListWindows.from_bytes(w.to_bytes())
    for decided, sweep in segments(items, entries, dirs):
        answers: dict[int, ExactAnswer] = {}
        for exact, ledger in zip(exacts, exact_ledgers, strict=True):
            for d in decided:
                a = exact.apply(d, ledger.apply(d))
                if a is not None:
                    answers[a.seq] = ExactAnswer.from_bytes(a.to_bytes())
            if sweep is not None:
                exact.forget(sweep.apply(ledger))
        yield [[(d, ledger.apply(d), answers.get(d.seq), windows[s].get(d.seq))
                 for d in decided] for s, ledger in enumerate(ledgers)], sweep
        if sweep is not None:
            for ledger in ledgers:
                sweep.apply(ledger)


def sharded(stores: Stores, n: int, items: list[Item], entries: list[DirectoryEntry],
            states: list[PassageState | None], config: EngineConfig = LISTS,
            runs: bool = False) -> dict[int, list[ListPartial]]:
    """The same stream (``inputs``) through ``n`` list shards: the partials of every query
    page, by store ordinal. ``runs``: each shard applies a segment's steps as one run
    (``ListShard.apply_run``), not one by one."""
    params = config.frozen_params()
    shards = [ListShard(stores.store(f"lists{k}of{n}", params), config, k, n)
              for k in range(n)]
    partials: dict[int, list[ListPartial]] = {}
    for steps, sweep in inputs(stores, n, items, entries, states, config):
        for shard, mine in zip(shards, steps, strict=True):
            got = shard.apply_run(mine) if runs else [shard.apply(*step) for step in mine]
            for p in got:
                if p is not None:
                    assert p.shard == shard.shard
                    partials.setdefault(p.ordinal, []).append(
                        ListPartial.from_bytes(p.to_bytes()))
            if sweep is not None:
                shard.forget(sweep.swept)
    return partials


def check(stores: Stores, items: list[Item], config: EngineConfig = LISTS,
          counts: tuple[int, ...] = (1, 2, 3), align: bool = True, runs: bool = False
          ) -> tuple[Queries, PassageCounters]:
    """The list shards against the engine on ``items`` (``runs``: in the run form); returns
    the engine's queries and its passage counters."""
    engine = Engine(stores.store("engine", config.frozen_params()), config)
    queries, entries, states = single(engine, items, align)
    combine = PassageIndex(stores.store("combine", config.frozen_params()), config)
    for n in counts:
        answer_as_the_engine(queries, sharded(stores, n, items, entries, states, config,
                                              runs), states, combine, n)
    return queries, engine.indexer.passages.counters


def answer_as_the_engine(queries: Queries, partials: dict[int, list[ListPartial]],
                         states: list[PassageState | None], combine: PassageIndex, n: int
                         ) -> None:
    """Exactly one partial from each of ``n`` list shards for every page the engine
    queried for, none for another; their union is the engine's list heads, and the tasks
    selected from it (``combine``'s) are the engine's."""
    assert sorted(partials) == sorted(queries), n  # the pages the engine queried for
    for ordinal, (heads, exclude, tasks) in queries.items():
        got = partials[ordinal]
        assert sorted(p.shard for p in got) == list(range(n))
        state = states[got[0].seq]
        assert state is not None
        _, _, l_bins, l_keys, _ = query_lists(state)
        joined = combine_lists(got, l_bins, l_keys, n)
        assert _heads(joined) == heads, (n, ordinal)
        assert _tasks(combine.tasks_of(state, joined, exclude)) == tasks, (n, ordinal)


# the worked streams (tests/stages/streams.py SHARED_TEXTS): T0 on d0, then its copy on d2
# (queries nothing), d0 deleted, a changed revisit of the copy (its replaced version has no
# windows), T0 again on d4 (a new page: no copy alive); and T0, T2, T3 on three ids (one
# list of all three, read with its head cut to 1), T1 on a fourth (the list is a stop list
# now), a sweep to 2 pages, a copy, then T2 on d0 (the stop list stays one)
COPIES = [("page", 0, 0, 0, True), ("page", 2, 1, 0, True), ("delete", 0),
          ("page", 2, 2, 0, True), ("page", 4, 2, 0, True)]
STOPS = [("page", 0, 0, 0, True), ("page", 1, 0, 0, True), ("page", 4, 0, 0, True),
         ("page", 3, 0, 0, True), ("sweep", 2, 0), ("page", 2, 2, 0, True),
         ("page", 0, 2, 0, True)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=ops)
@example(COPIES)
@example(STOPS)
def test_list_shards_answer_as_the_single_indexer(stores: Stores, stream: list[Any]) -> None:
    check(stores, list(pages_of(stream, SHARED_TEXTS)))


def test_the_worked_streams_query_stop_lists_cut_heads_and_find_tasks(stores: Stores
                                                                      ) -> None:
    """The worked streams exercise what they claim."""
    queries, counters = check(stores, list(pages_of(STOPS, SHARED_TEXTS)))
    assert any(any(long) for (long, _, _), _, _ in queries.values())  # a stop list
    assert counters.entries_cut and counters.long_lists
    assert any(tasks is not None for _, _, tasks in queries.values())
    copies, _ = check(stores, list(pages_of(COPIES, SHARED_TEXTS)))
    assert len(copies) == 3  # d0, the revisit of the copy, d4: not the copy


def test_partials_and_windows_read_back_as_sent() -> None:
    state = PassageState(None, 0)
    assert list_windows(0, state, 2) == []
    p = ListPartial(3, 2, 1, np.array([True, False]), np.array([0, 2]),
                    np.array([5, 1 << 40]))
    q = ListPartial.from_bytes(p.to_bytes())
    assert (q.seq, q.ordinal, q.shard) == (3, 2, 1)
    assert [a.tolist() for a in (q.long, q.n, q.ords)] == [[True, False], [0, 2], [5, 1 << 40]]
    small = ListPartial.from_bytes(replace(p, ords=np.array([5, 7])).to_bytes())
    assert small.ords.tolist() == [5, 7]
