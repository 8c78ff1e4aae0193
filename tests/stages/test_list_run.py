"""The run form of a list shard (``ListShard.apply_run``, dupalign.passage.list_run)
against the single engine's per-page index code and against the single engine, on the
random streams of tests/stages/streams.py (replays, revisits, exact copies, deletes,
retention sweeps) with stop lists, the ``max_list_read`` cut and packed runs small
enough to decide.

The same decisions, exact answers and windows go to two shards over their own stores: one
page by page through the single engine's per-page code (``PassageIndex.list_heads``,
``stage_removal``, ``stage``, ``commit``: ``PageByPage`` below), one in runs cut where
hypothesis draws (a sweep cuts every run: it comes between two pages; a removal ends one).
Every partial is the same bytes, and after each run the stores hold the same lists (the
marked stop lists, and every other list's entries), forward records and next ordinal.
Then the run form with every segment between sweeps in one run answers as the single
``Indexer`` does (tests/stages/test_list_shard.py ``answer_as_the_engine``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import fields, replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dupalign.config import EngineConfig
from dupalign.passage import forward
from dupalign.passage.index import PassageCounters
from dupalign.passage.list_run import _forward_records
from dupalign.passage.sketch import PassageState, Rects
from dupalign.runtime.engine import Engine
from dupalign.stages.directory import Decision
from dupalign.stages.exact import ExactAnswer
from dupalign.stages.ledger import Placed
from dupalign.stages.list_shard import ListPartial, ListShard, ListWindows, Step, copy_heads
from dupalign.store import lists, tables
from dupalign.store.database import Store
from tests.reused_stores import Stores, temporary_stores
from tests.stages.streams import SHARED_TEXTS, ops, pages_of
from tests.stages.test_list_shard import COPIES, LISTS, STOPS, Item, check, inputs, single

# lists packed from 2 keys on (``pack_min``), so that runs are written and read back
PACK_MIN = 2


@pytest.fixture(scope="module")
def stores() -> Iterator[Stores]:
    with temporary_stores("list-run-") as stores:
        yield stores


class PageByPage(ListShard):
    """A list shard driven page by page through the per-page methods of ``PassageIndex``
    (those of the single engine's index stage), as list shards were before the run form:
    the reference the run form is held to."""

    def apply(self, d: Decision, placed: Placed, exact: ExactAnswer | None = None,
              page: ListWindows | None = None) -> ListPartial | None:
        query = self._query(d, placed, exact, page)
        if query is None and placed.removed is None:
            return None
        p = self.passages
        partial, state = None, None
        if query is not None:
            assert placed.ordinal is not None
            long, start, n, ords = p.list_heads(query.bins, query.keys, placed.ordinal,
                                                placed.removed)
            partial = ListPartial(d.seq, placed.ordinal, self.shard, long.copy(), n.copy(),
                                  copy_heads(start, n, ords))
            state = _state(query)
        batch = self.store.batch()
        removal = None if placed.removed is None else p.stage_removal(batch, [placed.removed])
        if query is not None:
            assert placed.ordinal is not None
            p.stage(batch, placed.ordinal, state)
        tables.next_ordinal.put_count(batch, d.seq + 1)
        self.store.write(batch)
        if removal is not None:
            p.commit_removal(removal)
        if query is not None:
            assert placed.ordinal is not None
            p.commit(placed.ordinal, state)
        return partial


def _state(w: ListWindows) -> PassageState | None:
    """The windows as ``PassageIndex.stage`` takes them (zero rectangles, as a list
    shard's)."""
    if not len(w.w_bins):
        return None
    z = np.zeros(len(w.w_bins), dtype=np.int64)
    return PassageState(Rects(w.w_bins, w.w_keys, z, z, z, z,
                              np.zeros(len(z), dtype=np.bool_)), w.n_units)


def stored_lists(store: Store) -> dict[bytes, Any]:
    """The lists as a query reads them: "stop" for a marked list, else its entries
    (ordinals, one per window, ascending), whether packed in a run or one key a page."""
    out: dict[bytes, Any] = {}
    for key, value in store.items(lists.FAMILY):
        prefix = key[:10]
        if len(key) == 10:
            out[prefix] = "stop"
            continue
        if out.get(prefix) == "stop":
            continue
        got = out.setdefault(prefix, [])
        if key.endswith(lists.RUN_SEQ):
            got += lists.decode_run(np.frombuffer(value, dtype=np.uint8)).tolist()
        else:
            got += [int.from_bytes(key[10:18], "big")] * (
                1 if not value else lists.COUNT.unpack(value)[0])
    return {k: v if v == "stop" else sorted(v) for k, v in out.items()}


def state_of(shard: ListShard) -> tuple[Any, ...]:
    store = shard.store
    return (stored_lists(store), dict(tables.forward.items(store)),
            tables.next_ordinal.count(store))


def _cut(steps: list[Step], cuts: list[int]) -> list[list[Step]]:
    at = sorted({c % (len(steps) + 1) for c in cuts} | {0, len(steps)})
    return [steps[a:b] for a, b in itertools.pairwise(at)]


def run_against_pages(stores: Stores, items: list[Item], cuts: list[int], n: int = 2,
                      config: EngineConfig = LISTS, reread: bool = False
                      ) -> tuple[int, PassageCounters]:
    """Per-page and run forms side by side (module docstring): the partials compared, and
    the counters of the run form's shards (summed). ``reread``: both forget the lists in
    memory after each part, and read them from the store again (packing them)."""
    engine = Engine(stores.store("engine", config.frozen_params()), config)
    _, entries, states = single(engine, items, align=False)
    params = config.frozen_params()
    pairs = [(PageByPage(stores.store(f"page{k}", params), config, k, n),
              ListShard(stores.store(f"run{k}", params), config, k, n)) for k in range(n)]
    for by_page, by_run in pairs:
        by_page.passages.pack_min = by_run.passages.pack_min = PACK_MIN
    compared = 0
    for steps, sweep in inputs(stores, n, items, entries, states, config):
        for (by_page, by_run), mine in zip(pairs, steps, strict=True):
            for part in _cut(mine, cuts):
                want = [by_page.apply(*step) for step in part]
                got = by_run.apply_run(part)
                assert [None if p is None else p.to_bytes() for p in got] == [
                    None if p is None else p.to_bytes() for p in want]
                compared += sum(p is not None for p in got)
                assert state_of(by_run) == state_of(by_page)
                if reread:
                    by_page.passages.cache.clear()
                    by_run.passages.cache.clear()
            if sweep is not None:
                for shard in (by_page, by_run):
                    shard.forget(sweep.swept)
                assert state_of(by_run) == state_of(by_page)
    total = PassageCounters()
    for _, by_run in pairs:
        for f in fields(total):
            setattr(total, f.name, getattr(total, f.name) + getattr(by_run.passages.counters,
                                                                     f.name))
    return compared, total


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=ops, cuts=st.lists(st.integers(0, 40), max_size=4))
@example(COPIES, [])
@example(STOPS, [])
@example(STOPS, [2])
def test_runs_give_the_per_page_partials_and_lists(stores: Stores, stream: list[Any],
                                                    cuts: list[int]) -> None:
    run_against_pages(stores, list(pages_of(stream, SHARED_TEXTS)), cuts)


def test_a_run_meets_stop_lists_cut_heads_and_packed_runs(stores: Stores) -> None:
    """The worked stream of stop lists (tests/stages/test_list_shard.py ``STOPS``: four
    pages that share a list, then a sweep) in one run a segment, and with ``max_list`` 1:
    lists become stop lists in the middle of the run, and the pages after that in the run
    leave their windows out of them; heads are cut, lists read again packed."""
    items = list(pages_of(STOPS, SHARED_TEXTS))
    compared, c = run_against_pages(stores, items, [2], n=1, reread=True)
    assert compared == 5 and c.long_lists and c.entries_cut

    def with_max_list(n: int) -> EngineConfig:
        return replace(LISTS, passage=replace(LISTS.passage, max_list=n)).validate()

    compared, c = run_against_pages(stores, items, [], n=1, config=with_max_list(1))
    assert compared == 5 and c.long_lists and c.stop_entries_skipped
    compared, c = run_against_pages(stores, items, [3], n=1, config=with_max_list(8),
                                    reread=True)
    assert compared == 5 and c.runs_written and not c.long_lists


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=ops)
@example(STOPS)
def test_runs_answer_as_the_single_indexer(stores: Stores, stream: list[Any]) -> None:
    check(stores, list(pages_of(stream, SHARED_TEXTS)), counts=(1, 3), runs=True)


@settings(max_examples=80, deadline=None)
@given(pages=st.lists(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 2**64 - 1),
                                         st.booleans()), max_size=12), min_size=1, max_size=5))
def test_a_runs_forward_records_are_those_stage_packs(
        pages: list[list[tuple[int, int, bool]]]) -> None:
    """``_forward_records`` (one kernel for the run) gives each page's record as
    ``forward.pack_rects`` packs it with zero rectangles, its windows in stop lists left
    out; a page with no windows has none."""
    w_page = np.zeros(len(pages) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in pages], out=w_page[1:])
    flat = [w for p in pages for w in p]
    bins = np.array([b for b, _, _ in flat], dtype=np.int64)
    keys = np.array([k for _, k, _ in flat], dtype=np.uint64)
    live = np.array([not s for _, _, s in flat], dtype=np.bool_)
    w_list = np.arange(len(flat), dtype=np.int64)  # (one list a window: the kernel's input)
    buf, rec_off = _forward_records(w_page, keys, bins, w_list, live)
    raw = buf.astype("<u8").tobytes()
    for m in range(len(pages)):
        got = raw[8 * rec_off[m]:8 * rec_off[m + 1]]
        a, b = int(w_page[m]), int(w_page[m + 1])
        if a == b:
            assert got == b""
            continue
        z = np.zeros(b - a, dtype=np.int64)
        want = forward.pack_rects(bins[a:b], keys[a:b], z, z, z, z,
                                  np.zeros(b - a, dtype=np.bool_), np.flatnonzero(live[a:b]))
        assert got == want
